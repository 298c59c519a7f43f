"""Shared by the v1_* drivers (vLLM 0.25.1, V1 logits processors).

Run only in a subprocess with ``PYTHONPATH=<vllm-0.25.1 target>:<repo>/python`` (two vLLM
versions exist; the pytest process imports neither). Every driver ends by printing one line
``RESULT <json>`` with counts that ``tests/test_vllm_v1.py`` checks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests" / "vllm_drivers"), str(REPO / "examples")]
torch.set_num_threads(1)  # small tensors on 2 shared cores

OUR_IMPORTS = (
    "from logitsproc_rs import AdapterLogitsProcessor, BatchUpdate, LogitsProcessor, "
    "process_dict_updates\n"
)
VLLM_IMPORTS = (
    "from vllm.v1.sample.logits_processor import (AdapterLogitsProcessor, BatchUpdate,\n"
    "                                             LogitsProcessor)\n"
    "from vllm.v1.sample.logits_processor.builtin import process_dict_updates\n"
)


def vllm_form_of_example(folder: Path, module: str, entry_point: str | None = None) -> Any:
    """``examples/vllm_target_token.py`` with its import block swapped for vLLM's, written as
    ``<folder>/<module>.py`` and importable; with ``entry_point`` ("name = module:Class") also
    an installed distribution registering it in vLLM's entry-point group."""
    source = (REPO / "examples" / "vllm_target_token.py").read_text()
    head, rest = source.split("# --- imports ---\n", 1)
    block, tail = rest.split("# --- end imports ---\n", 1)
    assert block.strip() == OUR_IMPORTS.strip(), "the example's import block changed"
    (folder / f"{module}.py").write_text(
        head + "# --- imports ---\n" + VLLM_IMPORTS + "# --- end imports ---\n" + tail
    )
    if entry_point is not None:
        info = folder / f"{module}-0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.0\n")
        (info / "entry_points.txt").write_text(f"[vllm.logits_processors]\n{entry_point}\n")
    sys.path.insert(0, str(folder))
    return __import__(module)


def apply_all(procs: Any, logits: torch.Tensor) -> torch.Tensor:
    """vLLM's sampler order: every non-argmax-invariant processor, then the invariant ones
    (as for a batch with randomly sampled rows)."""
    for p in procs.non_argmax_invariant:
        logits = p.apply(logits)
    for p in procs.argmax_invariant:
        logits = p.apply(logits)
    return logits


def result(**counts: Any) -> None:
    print("RESULT " + json.dumps(counts), flush=True)


def import_vllm() -> Any:
    """vLLM 0.25.1's V1 logits-processor package. The one shim: its CUDA wheel on a machine
    without a GPU takes pinned memory as available (an unspecified platform says so) and its
    built-ins' host→device helper then fails; pinned memory is turned off there, as vLLM's own
    CPU platform does."""
    import vllm.utils.torch_utils as torch_utils
    import vllm.v1.sample.logits_processor as lp

    if not torch.cuda.is_available():
        torch_utils.PIN_MEMORY = False
    return lp

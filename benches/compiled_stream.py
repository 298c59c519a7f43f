"""Does vLLM 0.25.1's ``compiled_random_sample`` (``torch.compile``d softmax → ``q.exponential_()``
→ argmax, what its CPU engine runs for a batch with an unseeded row) draw the stream of torch's
eager ``exponential_``, which ``sampling="exact"`` reproduces? (issue 41, ``docs/sampling.md``)

From the same ``torch.manual_seed``: its tokens and the default generator's state afterwards
against the eager function's, under inductor's defaults and with
``torch._inductor.config.fallback_random = True``. Needs ``make extras`` (vLLM's modules) and a
C++ compiler (inductor). Run alone: ``python benches/compiled_stream.py`` (about a minute).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

import torch
from torch._inductor import config as inductor_config

VLLM = Path(
    os.environ.get("LOGITSPROC_VLLM_0251", Path.home() / ".cache/logitsproc_rs/vllm-0.25.1")
)


def eager(logits: torch.Tensor) -> torch.Tensor:
    """``compiled_random_sample``'s body, not compiled."""
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs)
    q.exponential_()
    return probs.div(q).argmax(dim=-1).view(-1)


def compare(compiled, fallback_random: bool) -> tuple[int, int, int]:
    """(rows with equal tokens, rows, trials leaving the generator in the same state)."""
    torch._dynamo.reset()
    inductor_config.fallback_random = fallback_random
    gen = torch.Generator().manual_seed(3)
    equal = rows = states = 0
    for trial in range(6):
        x = torch.randn(8, 32_000, generator=gen)
        torch.manual_seed(100 + trial)
        a = compiled(x.clone())
        state_a = torch.get_rng_state()
        torch.manual_seed(100 + trial)
        b = eager(x.clone())
        equal += int((a == b).sum())
        rows += a.numel()
        states += int(torch.equal(state_a, torch.get_rng_state()))
    return equal, rows, states


def main() -> int:
    torch.set_num_threads(1)
    # benches/kernels.py would shadow the `kernels` package vLLM looks for.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    sys.path.insert(0, str(VLLM))
    from vllm.v1.sample.ops.topk_topp_sampler import (  # type: ignore[import-not-found]
        compiled_random_sample,
    )

    print(f"torch {torch.__version__}")
    for fallback in (False, True):
        equal, rows, states = compare(compiled_random_sample, fallback)
        print(
            f"fallback_random={fallback}: tokens equal on {equal}/{rows} rows, generator state "
            f"equal after {states}/6 calls"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

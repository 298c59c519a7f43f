"""Shared by the v2_* drivers: vLLM 0.33.0's own MRV2 logits-processor modules, a simulated
runner state, and one engine step as MRV2's model runner and sampler make it.

Run only in a subprocess with ``PYTHONPATH=<vllm-0.33.0 target>:<repo>/python`` (two vLLM
versions exist; the pytest process imports neither).

One shim, where wanted: MRV2's loader takes one name, ``STR_POOLING_REJECTS_LOGITSPROCS``, from
``vllm.v1.sample.logits_processor`` (vLLM's V1 sampler package), whose ``__init__`` imports
the V1 sampler stack and ``vllm.sampling_params`` → ``vllm.config`` → aiohttp, zmq,
transformers, ... (3.5 s; nothing MRV2's processors use; tests/extras/vllm_v1.sh installs
them for the 0.25.1 tests). ``v1_package(real=False)`` puts a module holding only that
constant in its place, its text read from the installed wheel's own file; with
``real=True`` vLLM's own package is used when it imports. Everything else is vLLM's own
code: the interface module (``LogitsProcessor``, ``LogitsContext``,
``LogitsProcRequestState``) and the loader (``build_custom_logits_processors``, plugins,
``module:Class`` names).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))  # the churn helpers of the pytest suite


def v1_package(real: bool) -> bool:
    """Makes ``vllm.v1.sample.logits_processor`` importable: vLLM's own (``real``, when its
    imports are installed) or the shim. Returns whether it is vLLM's own."""
    if real:
        try:
            import vllm.v1.sample.logits_processor  # noqa: F401

            return True
        except ImportError:
            pass
    _install_shim()
    return False


def _install_shim() -> None:
    import vllm  # noqa: F401  (the real package; the shim is one submodule below it)

    spec = importlib.util.find_spec("vllm.v1.sample")
    assert spec is not None and spec.submodule_search_locations
    init = Path(next(iter(spec.submodule_search_locations))) / "logits_processor" / "__init__.py"
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "STR_POOLING_REJECTS_LOGITSPROCS" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            break
    else:
        raise RuntimeError(f"STR_POOLING_REJECTS_LOGITSPROCS not found in {init}")
    shim = types.ModuleType("vllm.v1.sample.logits_processor")
    shim.STR_POOLING_REJECTS_LOGITSPROCS = value
    shim.__file__ = "<shim: see tests/vllm_drivers/v2_harness.py>"
    sys.modules[shim.__name__] = shim


import vllm  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor import (  # noqa: E402
    LogitsContext,
    LogitsProcRequestState,
    build_custom_logits_processors,
)

assert vllm.__file__ and "vllm-0.33.0" in vllm.__file__, vllm.__file__
# The MRV2 modules are import-light: importing them did not import the V1 package.
assert "vllm.v1.sample.logits_processor" not in sys.modules


class _Host:
    """A host array with a device mirror (vLLM's ``UvaBackedTensor``: ``.np`` and ``.gpu``)."""

    def __init__(self, n: int) -> None:
        self.np = np.zeros(n, dtype=np.int32)
        self.gpu = torch.from_numpy(self.np)  # on the CPU the "device" view is the same memory


class _Device:
    """A device tensor (vLLM's ``StagedWriteTensor``: ``.gpu``)."""

    def __init__(self, *shape: int) -> None:
        self.gpu = torch.zeros(shape, dtype=torch.int32)


class RunnerState:
    """What MRV2's ``RequestState`` exposes to processors, and its slot free list: a freed
    slot goes to the end of the list and ``pop()`` takes from the end (recycled first)."""

    def __init__(self, max_num_reqs: int, max_model_len: int, vocab_size: int) -> None:
        self.device = torch.device("cpu")
        self.max_num_reqs = max_num_reqs
        self.vocab_size = vocab_size
        self.all_token_ids = _Device(max_num_reqs, max_model_len)
        self.prompt_len = _Host(max_num_reqs)
        self.prefill_len = _Host(max_num_reqs)
        self.total_len = _Device(max_num_reqs)
        self.free_indices = list(range(max_num_reqs))

    def add_request(self, prompt: list[int], output: list[int]) -> int:
        slot = self.free_indices.pop()
        tokens = prompt + output
        self.prompt_len.np[slot] = len(prompt)
        self.prefill_len.np[slot] = len(tokens)
        self.all_token_ids.gpu[slot].fill_(-7)  # stale garbage beyond the request's tokens
        self.all_token_ids.gpu[slot, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
        self.total_len.gpu[slot] = len(tokens)
        return slot

    def commit(self, slot: int, output: list[int]) -> None:
        """MRV2's post_update: the tokens sampled for ``slot`` land in ``all_token_ids``."""
        p = int(self.prompt_len.np[slot])
        n = p + len(output)
        old = int(self.total_len.gpu[slot])
        if n > old:
            self.all_token_ids.gpu[slot, old:n] = torch.tensor(output[old - p :], dtype=torch.int32)
            self.total_len.gpu[slot] = n

    def remove_request(self, slot: int) -> None:
        self.free_indices.append(slot)


def build(config: Any, rs: RunnerState, names: list[Any]) -> list[Any]:
    """MRV2's loader, as the model runner calls it."""
    return build_custom_logits_processors(config, rs, False, names)


def lp_state(rs: RunnerState) -> Any:
    return LogitsProcRequestState.from_request_state(rs)


# Where the bridged built-ins read their fields: "namespace" (the default, what a request
# sends to ours under vLLM: the Python form, a dict), "wire" (the same fields as flat
# "logitsproc_rs.<field>" keys, what arrives over HTTP in vllm_xargs) or "plain" (bridges
# built with namespace=None).
FIELDS = os.environ.get("LOGITSPROC_V2_FIELDS", "namespace")

# Our SamplingParams fields that the namespace carries (vLLM's names).
_ROUTED = (
    "min_p",
    "logit_bias",
    "min_tokens",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "bad_words_token_ids",
    "allowed_token_ids",
    "thinking_token_budget",
)


def namespaced(sp: Any, tables: Any = None) -> Any:
    """The same request as it reaches our bridges in namespace mode: the built-ins' fields in
    ``extra_args["logitsproc_rs"]`` (only those set), the ordinary fields left at vLLM's
    defaults, the rest (EOS, temperature, column fields in extra_args) unchanged. ``tables``:
    only the fields those tables read (for a runner that loaded only their processors, which
    refuses a field of any other)."""
    from logitsproc_rs import SamplingParams
    from logitsproc_rs.registry import FIELD_TABLE

    plain = SamplingParams()
    ns = {
        f: getattr(sp, f)
        for f in _ROUTED
        if getattr(sp, f) != getattr(plain, f) and (tables is None or FIELD_TABLE[f] in tables)
    }
    extra = dict(sp.extra_args or {})
    if ns and FIELDS == "wire":
        from logitsproc_rs.vllm._fields import to_wire

        extra.update(to_wire(ns))
    elif ns:
        extra["logitsproc_rs"] = ns
    return SamplingParams(
        temperature=sp.temperature,
        max_tokens=None,
        eos_token_id=sp.eos_token_id,
        ignore_eos=sp.ignore_eos,
        extra_args=extra or None,
    )


def v2_params(sp: Any) -> Any:
    return sp if FIELDS == "plain" else namespaced(sp)


def add_to_sampler(procs: list[Any], needs: np.ndarray, slot: int, params: Any) -> None:
    """``Sampler.add_request``: every processor in turn; the slot needs processing when any
    acts on it."""
    acts = False
    for p in procs:
        acts |= bool(p.add_request(slot, params))
    needs[slot] = acts


def apply_staged_writes(procs: list[Any]) -> None:
    for p in procs:
        p.apply_staged_writes()


def context(
    rs: RunnerState,
    slots: list[int],
    drafts: list[int],
    tokens: list[list[int]] | None = None,
) -> LogitsContext:
    """One step's layout: request ``k`` (slot ``slots[k]``) owns ``1 + drafts[k]``
    consecutive rows; ``input_ids`` at local position 0 is its last committed token, at
    ``j >= 1`` its draft ``tokens[k][j - 1]`` (0 without ``tokens``)."""
    expanded, local, pos, inputs, bound = [], [], [], [], []
    for k, (s, d) in enumerate(zip(slots, drafts, strict=True)):
        total = int(rs.total_len.gpu[s])
        for j in range(1 + d):
            expanded.append(s)
            local.append(j)
            pos.append(total - 1 + j)
            if j == 0:
                inputs.append(int(rs.all_token_ids.gpu[s, total - 1]))
            else:
                inputs.append(tokens[k][j - 1] if tokens is not None else 0)
        bound.append(total + d)
    idx = np.asarray(slots, dtype=np.int32)
    return LogitsContext(
        expanded_idx_mapping=torch.tensor(expanded, dtype=torch.int32),
        idx_mapping=torch.from_numpy(idx.copy()),
        idx_mapping_np=idx,
        expanded_local_pos=torch.tensor(local, dtype=torch.int32),
        input_ids=torch.tensor(inputs, dtype=torch.int32),
        pos=torch.tensor(pos, dtype=torch.int64),
        seq_lens_upper_bound_np=np.asarray(bound, dtype=np.int32),
    )


def sample_apply(procs: list[Any], needs: np.ndarray, logits: torch.Tensor, ctx: Any):
    """``Sampler.apply_sampling_params``' processor part: skipped when no request of the
    batch needs processing, else every processor in order on a float32 copy."""
    if not np.any(needs[ctx.idx_mapping_np]):
        return logits
    logits = torch.empty_like(logits, dtype=torch.float32).copy_(logits)
    for p in procs:
        logits = p.apply(logits, ctx)
    return logits


def report(result: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(result))

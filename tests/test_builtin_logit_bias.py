"""LogitBias (``builtin/logit_bias.py``) on tiny, hand-checkable tensors."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    LogitBiasLogitsProcessor,
    SamplingParams,
)

V = 16
CFG = EngineConfig(max_num_seqs=8, vocab_size=V)
CPU = torch.device("cpu")
NEG_INF = float("-inf")


def upd(batch_size: int, removed=(), added=(), moved=()) -> BatchUpdate:
    return BatchUpdate(
        batch_size=batch_size, removed=list(removed), added=list(added), moved=list(moved)
    )


TABLE = {
    "MinPLogitsProcessor": "min_p",
    "LogitBiasLogitsProcessor": "logit_bias",
    "MinTokensLogitsProcessor": "min_tokens",
}


def active(proc: Any) -> int:
    """Requests the processor's table tracks in the Rust core (MinP: slots with min_p != 0)."""
    return dict(proc.pipeline.core.active())[TABLE[type(proc).__name__]]


def _vparams(min_p=0.0, logit_bias=None, min_tokens=0, stop=()):
    return SimpleNamespace(
        min_p=min_p, logit_bias=logit_bias, min_tokens=min_tokens, all_stop_token_ids=set(stop)
    )


def test_logit_bias_adds() -> None:
    proc = LogitBiasLogitsProcessor(CFG, CPU, False)
    sp = SamplingParams(logit_bias={0: 1.5, 7: -100.0, 15: 0.25})
    proc.update_state(upd(2, added=[(1, sp, None, [])]))
    x = torch.randn(2, V)
    want = x.clone()
    want[1, 0] += 1.5
    want[1, 7] += -100.0
    want[1, 15] += 0.25
    y = proc.apply(x.clone())
    assert torch.equal(y, want)
    # -inf stays -inf; applied every step (not only once).
    z = torch.full((2, V), NEG_INF)
    assert torch.equal(proc.apply(z.clone()), z)
    assert torch.equal(proc.apply(x.clone()), want)


def test_logit_bias_empty_dict_is_no_bias() -> None:
    proc = LogitBiasLogitsProcessor(CFG, CPU, False)
    proc.update_state(upd(1, added=[(0, _vparams(logit_bias={}), None, [])]))
    assert active(proc) == 0
    x = torch.randn(1, V)
    assert proc.apply(x) is x

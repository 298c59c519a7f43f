"""LogitBias (``builtin/logit_bias.py``) on tiny, hand-checkable tensors."""

from __future__ import annotations

import torch
from _helpers import _vparams, active, upd

from logitsproc_rs import (
    EngineConfig,
    LogitBiasLogitsProcessor,
    SamplingParams,
)

V = 16
CFG = EngineConfig(max_num_seqs=8, vocab_size=V)
CPU = torch.device("cpu")
NEG_INF = float("-inf")


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

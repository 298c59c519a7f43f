"""MinTokens (``builtin/min_tokens.py``) on tiny, hand-checkable tensors."""

from __future__ import annotations

import pytest
import torch
from _helpers import _vparams, active, upd

from logitsproc_rs import (
    EngineConfig,
    MinTokensLogitsProcessor,
    SamplingParams,
)

V = 16
CFG = EngineConfig(max_num_seqs=8, vocab_size=V)
CPU = torch.device("cpu")
NEG_INF = float("-inf")


def test_min_tokens_masks_until_live_output_reaches_min() -> None:
    proc = MinTokensLogitsProcessor(CFG, CPU, False)
    out0: list[int] = []
    out1: list[int] = []
    sp = SamplingParams(min_tokens=3, stop_token_ids=[5], eos_token_id=2, ignore_eos=True)
    proc.update_state(upd(2, added=[(0, sp, [1], out0), (1, SamplingParams(), [1], out1)]))
    masked = torch.zeros(2, V)
    masked[0, 2] = masked[0, 5] = NEG_INF
    for step in range(3):
        assert len(out0) == step
        y = proc.apply(torch.zeros(2, V))
        assert torch.equal(y, masked), step
        out0.append(7)  # the engine appends to the live list in place
        out1.append(7)
        proc.update_state(None)
    # len(out0) == 3 == min_tokens: the entry is gone, also without a batch change.
    assert active(proc) == 0
    x = torch.zeros(2, V)
    assert proc.apply(x) is x and torch.equal(x, torch.zeros(2, V))
    # Shrinking the list afterwards does not revive it (vLLM drops the entry).
    del out0[:]
    proc.update_state(None)
    assert active(proc) == 0


def test_min_tokens_rechecked_on_batch_change_steps_too() -> None:
    proc = MinTokensLogitsProcessor(CFG, CPU, False)
    out: list[int] = [1]
    proc.update_state(upd(1, added=[(0, _vparams(min_tokens=2, stop=[3]), None, out)]))
    assert proc.apply(torch.zeros(1, V))[0, 3].item() == NEG_INF
    out.append(1)
    proc.update_state(upd(2, added=[(1, _vparams(), None, [])]))
    x = torch.zeros(2, V)
    assert proc.apply(x) is x


@pytest.mark.parametrize("n_out", [3, 4, 10])
def test_min_tokens_entry_never_created_when_output_long_enough(n_out: int) -> None:
    proc = MinTokensLogitsProcessor(CFG, CPU, False)
    out = list(range(n_out))
    proc.update_state(upd(1, added=[(0, _vparams(min_tokens=3, stop=[1]), None, out)]))
    assert active(proc) == 0
    x = torch.zeros(1, V)
    assert proc.apply(x) is x
    # Even if the list later shrinks (KV-load failure), no entry appears.
    del out[1:]
    proc.update_state(None)
    assert active(proc) == 0


def test_min_tokens_empty_stop_set_masks_nothing() -> None:
    proc = MinTokensLogitsProcessor(CFG, CPU, False)
    proc.update_state(upd(1, added=[(0, _vparams(min_tokens=3), None, [])]))
    assert active(proc) == 1
    x = torch.randn(1, V)
    assert torch.equal(proc.apply(x.clone()), x)

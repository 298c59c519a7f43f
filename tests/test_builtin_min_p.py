"""MinP (``builtin/min_p.py``) on tiny, hand-checkable tensors: the threshold, ties, -inf and +inf
rows, its counts and storage, ``get_min_p_by_index``."""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import _vparams, active, upd

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    MinPLogitsProcessor,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.reference import RefMinPLogitsProcessor

V = 16
CFG = EngineConfig(max_num_seqs=8, vocab_size=V)
CPU = torch.device("cpu")
NEG_INF = float("-inf")


def _softmax_keep(row: torch.Tensor, min_p: float) -> torch.Tensor:
    p = row.softmax(-1)
    return p >= min_p * p.max()


@pytest.mark.parametrize("min_p", [0.01, 0.1, 0.3, 0.5, 0.9])
def test_min_p_keeps_p_at_least_min_p_times_pmax(min_p: float) -> None:
    proc = MinPLogitsProcessor(CFG, CPU, False)
    proc.update_state(
        upd(3, added=[(0, _vparams(min_p=min_p), None, []), (2, _vparams(min_p=min_p), None, [])])
    )
    g = torch.Generator().manual_seed(int(min_p * 100))
    x = torch.randn(3, V, generator=g) * 3
    y = proc.apply(x.clone())
    assert torch.equal(y[1], x[1])  # min_p 0: untouched
    for r in (0, 2):
        keep = _softmax_keep(x[r], min_p)
        ratio = x[r].softmax(-1) / x[r].softmax(-1).max()
        clear = (ratio - min_p).abs() > 1e-5  # away from the float-rounding band
        assert torch.equal((y[r] > NEG_INF)[clear], keep[clear])
        assert torch.equal(y[r][keep & clear], x[r][keep & clear])  # kept values unchanged
        assert keep[x[r].argmax()] and y[r].max() == x[r].max()


def test_min_p_tie_at_threshold_is_kept() -> None:
    proc = MinPLogitsProcessor(CFG, CPU, False)
    proc.update_state(
        upd(2, added=[(0, _vparams(min_p=1.0), None, []), (1, _vparams(min_p=0.5), None, [])])
    )
    # min_p = 1.0: every token tied with the max is kept, every other one masked.
    row0 = torch.tensor([2.0, 2.0, 1.0, 2.0] + [0.0] * (V - 4))
    # min_p = 0.5: a logit exactly max + ln(0.5) (float32, as stored) is kept; one ulp below is not.
    thr = float(proc.pipeline.section("min_p.log_min_p")[1])
    assert thr == pytest.approx(math.log(0.5))
    below = float(torch.nextafter(torch.tensor(thr), torch.tensor(-math.inf)))
    assert below < thr
    row1 = torch.tensor([0.0, thr, below, -5.0] + [-1.0] * (V - 4))
    x = torch.stack([row0, row1])
    y = proc.apply(x.clone())
    assert (y[0, :4] > NEG_INF).tolist() == [True, True, False, True]
    assert (y[0, 4:] == NEG_INF).all()
    assert (y[1, :4] > NEG_INF).tolist() == [True, True, False, False]
    assert (y[1, 4:] == NEG_INF).all()


def test_min_p_all_neg_inf_row_unchanged() -> None:
    proc = MinPLogitsProcessor(CFG, CPU, False)
    proc.update_state(
        upd(2, added=[(0, _vparams(min_p=0.5), None, []), (1, _vparams(min_p=0.1), None, [])])
    )
    x = torch.randn(2, V)
    x[0] = NEG_INF
    y = proc.apply(x.clone())
    assert torch.equal(y[0], x[0])
    assert not torch.isnan(y).any()


def test_min_p_count_and_storage() -> None:
    proc = MinPLogitsProcessor(CFG, CPU, False)
    proc.update_state(
        upd(
            3,
            added=[
                (0, _vparams(min_p=0.1), None, []),
                (1, _vparams(), None, []),
                (2, _vparams(min_p=1.0), None, []),
            ],
        )
    )
    assert active(proc) == 2
    assert proc.get_min_p_by_index(0) == float(torch.tensor(0.1, dtype=torch.float32))
    assert proc.get_min_p_by_index(1) == 0.0
    proc.update_state(upd(2, removed=[2]))
    assert active(proc) == 1 and proc.get_min_p_by_index(2) == 0.0
    proc.update_state(upd(2, added=[(0, _vparams(), None, [])]))
    assert active(proc) == 0
    x = torch.randn(2, V)
    assert proc.apply(x) is x


def test_get_min_p_by_index_out_of_range_is_index_error() -> None:
    # vLLM: float(self.min_p_cpu[index]) on a [max_num_seqs] numpy array -> IndexError.
    proc = MinPLogitsProcessor(CFG, CPU, False)
    with pytest.raises(IndexError):
        proc.get_min_p_by_index(CFG.max_num_seqs)


def test_min_p_leaves_a_row_holding_plus_inf_alone_like_vllm() -> None:
    cfg = EngineConfig(max_num_seqs=2, vocab_size=6)
    ours_host = MinPLogitsProcessor(cfg, "cpu", False)
    ours_torch = build_logitsprocs(cfg, "cpu", False, emulate_device=True)
    ref = RefMinPLogitsProcessor(cfg, "cpu", False)
    u = BatchUpdate(2, [], [(i, SamplingParams(min_p=0.5), None, []) for i in range(2)], [])
    ours_host.update_state(u)
    ours_torch.update_state(u)
    ref.update_state(u)
    x = torch.tensor([[0.0, float("inf"), 1.0, -3.0, 2.0, 0.5], [0.0, 5.0, 1.0, -3.0, 2.0, 0.5]])
    want = ref.apply(x.clone())
    assert torch.equal(want[0], x[0])
    assert torch.equal(ours_host.apply(x.clone()), want)
    minp = next(p for p in ours_torch.argmax_invariant if isinstance(p, MinPLogitsProcessor))
    assert torch.equal(minp.apply(x.clone()), want)

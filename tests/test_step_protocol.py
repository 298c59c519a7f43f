"""The step protocol (``_step_protocol.py``): processors that share one pipeline run one step per
``update_state`` round of vLLM's loop; a reused update object is read afresh, an update changed
between processors is refused, and two pipelines are independent."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    MoveDirectionality,
    SamplingParams,
    build_logitsprocs,
)

SWAP = MoveDirectionality.SWAP


def _two_rows() -> tuple[Any, list[Any]]:
    cfg = EngineConfig(max_num_seqs=4, vocab_size=16)
    procs = build_logitsprocs(cfg, "cpu", False)
    return procs, list(procs.all)


def _bias_rows(procs: Any) -> list[int]:
    x = torch.zeros(procs.pipeline.count("batch_size"), 16)
    for p in procs.non_argmax_invariant:
        x = p.apply(x)
    return [int(i) for i in (x[:, 5] > 0).nonzero().flatten()]


def test_a_reused_update_object_is_read_afresh() -> None:
    """The same SWAP update passed on two steps swaps twice, through both routes."""
    for route in ("container", "loop"):
        procs, all_ = _two_rows()
        add = BatchUpdate(2, [], [(0, SamplingParams(logit_bias={5: 1.0}), None, [])], [])
        swap = BatchUpdate(2, [], [], [(0, 1, SWAP)])
        for u, want in ((add, [0]), (swap, [1]), (None, [1]), (swap, [0]), (swap, [1])):
            if route == "container":
                procs.update_state(u)
            else:
                for p in all_:
                    p.update_state(u)
            assert _bias_rows(procs) == want, route


def test_an_update_changed_between_processors_is_refused() -> None:
    _, all_ = _two_rows()
    added = [(0, SamplingParams(logit_bias={5: 1.0}), None, [])]
    u = BatchUpdate(2, [], added, [])
    all_[0].update_state(u)
    added.append((1, SamplingParams(logit_bias={5: 1.0}), None, []))
    with pytest.raises(RuntimeError, match="different batch updates in one step"):
        all_[1].update_state(u)
    other = BatchUpdate(2, [], [], [])
    with pytest.raises(RuntimeError, match="different batch updates in one step"):
        all_[1].update_state(other)


def test_two_pipelines_are_independent() -> None:
    a, _ = _two_rows()
    b, _ = _two_rows()
    a.update_state(BatchUpdate(2, [], [(1, SamplingParams(logit_bias={5: 1.0}), None, [])], []))
    b.update_state(BatchUpdate(2, [], [], []))
    assert _bias_rows(a) == [1] and _bias_rows(b) == []

"""The move rule on each of vLLM's built-ins: unidirectional moves discard the destination's
state, one-sided SWAPs move state, added requests use pre-move indices, no active request returns
the same tensor."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _helpers import _vparams, active, upd

from logitsproc_rs import (
    EngineConfig,
    MoveDirectionality,
    build_logitsprocs,
)

V = 16
CFG = EngineConfig(max_num_seqs=8, vocab_size=V)
CPU = torch.device("cpu")
SWAP = MoveDirectionality.SWAP
UNI = MoveDirectionality.UNIDIRECTIONAL
NEG_INF = float("-inf")


def builtins(cfg: EngineConfig = CFG) -> dict[str, Any]:
    procs = build_logitsprocs(cfg, CPU, False, sampler_transforms=False)
    return {type(p).__name__: p for p in procs.all}


def expected(kind: str, params: SimpleNamespace | None, output: list[int], row: torch.Tensor):
    """What one built-in does to one row (vLLM semantics; MinP in logit space, float32)."""
    row = row.clone()
    if params is None:
        return row
    if kind == "MinTokensLogitsProcessor":
        if params.min_tokens and len(output) < params.min_tokens:
            for t in params.all_stop_token_ids:
                row[t] = NEG_INF
    elif kind == "LogitBiasLogitsProcessor":
        for t, b in (params.logit_bias or {}).items():
            row[t] += b
    elif kind == "MinPLogitsProcessor" and params.min_p:
        log_min_p = torch.tensor(params.min_p, dtype=torch.float32).log()
        row[row < row.max() + log_min_p] = NEG_INF
    return row


KINDS = ["MinTokensLogitsProcessor", "LogitBiasLogitsProcessor", "MinPLogitsProcessor"]


REQ = {
    "a": _vparams(min_p=0.5, logit_bias={1: 2.0, 9: -1.0}, min_tokens=4, stop=[2, 3]),
    "b": _vparams(min_p=0.9, logit_bias={3: 10.0}, min_tokens=5, stop=[4]),
    "c": _vparams(),  # nothing for any processor
    "d": _vparams(min_p=0.2, logit_bias={0: -3.0}, min_tokens=2, stop=[0, 15]),
}


def check_rows(kind: str, proc: Any, layout: list[str | None], seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(layout), V, generator=g) * 2
    got = proc.apply(x.clone())
    want = torch.stack(
        [expected(kind, REQ[r] if r else None, [], x[i]) for i, r in enumerate(layout)]
    )
    assert torch.equal(got, want), (kind, layout)


@pytest.mark.parametrize("kind", KINDS)
def test_unidirectional_move_discards_destination_state(kind: str) -> None:
    proc = builtins()[kind]
    proc.update_state(
        upd(3, added=[(0, REQ["a"], None, []), (1, REQ["b"], None, []), (2, REQ["c"], None, [])])
    )
    check_rows(kind, proc, ["a", "b", "c"])
    # b (slot 1) finished; condense moves c (no state) from 2 into 1: b's stale state must go.
    proc.update_state(upd(2, moved=[(2, 1, UNI)]))
    check_rows(kind, proc, ["a", "c"])
    # Growing back exposes slot 2 empty (the source of the move was emptied).
    proc.update_state(upd(3, added=[(2, REQ["c"], None, [])]))
    check_rows(kind, proc, ["a", "c", "c"])
    assert active(proc) == 1
    # And a state-holding source overwrites the destination.
    proc.update_state(upd(3, added=[(2, REQ["d"], None, [])]))
    proc.update_state(upd(2, moved=[(2, 0, UNI)]))
    check_rows(kind, proc, ["d", "c"])


@pytest.mark.parametrize("kind", KINDS)
def test_swap_with_one_side_empty_moves_state(kind: str) -> None:
    proc = builtins()[kind]
    proc.update_state(upd(2, added=[(0, REQ["a"], None, []), (1, REQ["c"], None, [])]))
    proc.update_state(upd(2, moved=[(0, 1, SWAP)]))
    check_rows(kind, proc, ["c", "a"])
    proc.update_state(upd(3, added=[(2, REQ["b"], None, [])], moved=[(2, 0, SWAP)]))
    check_rows(kind, proc, ["b", "a", "c"])
    # Both sides hold state: exchanged.
    proc.update_state(upd(3, moved=[(1, 0, SWAP)]))
    check_rows(kind, proc, ["a", "b", "c"])


@pytest.mark.parametrize("kind", KINDS)
def test_added_moves_use_pre_move_indices_and_removed_clears(kind: str) -> None:
    proc = builtins()[kind]
    proc.update_state(
        upd(3, added=[(0, REQ["a"], None, []), (1, REQ["b"], None, []), (2, REQ["d"], None, [])])
    )
    # Slot 2 removed (tail, stays empty); a new request replaces slot 0; then swap 0 <-> 1.
    proc.update_state(upd(2, removed=[2], added=[(0, REQ["d"], None, [])], moved=[(0, 1, SWAP)]))
    check_rows(kind, proc, ["b", "d"])
    proc.update_state(upd(3, added=[(2, REQ["c"], None, [])]))
    check_rows(kind, proc, ["b", "d", "c"])


@pytest.mark.parametrize("kind", KINDS)
def test_no_active_request_returns_same_object(kind: str) -> None:
    proc = builtins()[kind]
    x = torch.randn(3, V)
    x0 = x.clone()
    assert proc.apply(x[:0]) is not None
    proc.update_state(None)
    proc.update_state(upd(3, added=[(i, REQ["c"], None, []) for i in range(3)]))
    # Nothing active: the same object comes back untouched (no work). Its shape is still
    # checked against the batch (test_misuse.py), so it must have the batch's rows.
    assert proc.apply(x) is x and torch.equal(x, x0)
    proc.update_state(upd(3, added=[(1, REQ["a"], None, [])]))
    assert proc.apply(x.clone()) is not None
    proc.update_state(upd(1, removed=[2, 1]))
    y = x[:1]
    assert proc.apply(y) is y and torch.equal(y, x0[:1])

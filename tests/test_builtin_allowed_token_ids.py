"""Allowed token ids (``builtin/allowed_token_ids.py``): the mask, SWAPs and condense moves
(vLLM 0.25.1's bugs not reproduced), values kept."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import torch
from _helpers import applied, assert_same, step, upd

from logitsproc_rs import (
    AllowedTokenIdsLogitsProcessor,
    EngineConfig,
    MoveDirectionality,
)
from logitsproc_rs.reference import (
    RefAllowedTokenIdsLogitsProcessor,
)

INF = math.inf
SWAP = MoveDirectionality.SWAP
UNI = MoveDirectionality.UNIDIRECTIONAL
V = 8
CFG = EngineConfig(max_num_seqs=4, vocab_size=V)


def make(cls: type, cfg: EngineConfig = CFG) -> Any:
    return cls(cfg, torch.device("cpu"), False)


def allow(ids) -> SimpleNamespace:
    return SimpleNamespace(allowed_token_ids=None if ids is None else list(ids))


def allowed_sets(proc, rows: int) -> list[set[int]]:
    x = applied(proc, torch.zeros(rows, V))
    return [set(torch.nonzero(x[r] != -INF).flatten().tolist()) for r in range(rows)]


ALL_IDS = set(range(V))


def test_allowed_ids_mask_everything_else():
    ours, ref = make(AllowedTokenIdsLogitsProcessor), make(RefAllowedTokenIdsLogitsProcessor)
    step((ours, ref), upd(2, added=[(0, allow([3, 1, 3]), None, []), (1, allow(None), None, [])]))
    logits = torch.arange(2 * V, dtype=torch.float32).view(2, V)
    got = applied(ours, logits)
    expected = logits.clone()
    expected[0, [0, 2, 4, 5, 6, 7]] = -INF
    assert_same(got, expected)
    assert_same(applied(ref, logits), expected)


def test_allowed_swap_of_two_rows_with_different_sets_exchanges_them():
    """vLLM 0.25.1 bug 1 (swap_states aliases two row views: both rows end with one mask)."""
    ours, ref = make(AllowedTokenIdsLogitsProcessor), make(RefAllowedTokenIdsLogitsProcessor)
    step((ours, ref), upd(3, added=[(0, allow([1, 2]), None, []), (1, allow([5]), None, [])]))
    step((ours, ref), upd(3, moved=[(0, 1, SWAP)]))
    assert allowed_sets(ours, 3) == allowed_sets(ref, 3) == [{5}, {1, 2}, ALL_IDS]
    # One side without a set: the set moves, the other row becomes unrestricted.
    step((ours, ref), upd(3, moved=[(1, 2, SWAP)]))
    assert allowed_sets(ours, 3) == allowed_sets(ref, 3) == [{5}, ALL_IDS, {1, 2}]


def test_allowed_condense_then_new_request_at_source_inherits_nothing():
    """vLLM 0.25.1 bug 2 (condense copies the mask row without clearing the source): slot 0
    finishes, slot 1 (with a set) is condensed into it, and the next request added at slot 1
    without allowed ids must not be restricted."""
    ours, ref = make(AllowedTokenIdsLogitsProcessor), make(RefAllowedTokenIdsLogitsProcessor)
    step((ours, ref), upd(2, added=[(0, allow(None), None, []), (1, allow([4, 6]), None, [])]))
    step((ours, ref), upd(1, moved=[(1, 0, UNI)]))
    assert allowed_sets(ours, 1) == allowed_sets(ref, 1) == [{4, 6}]
    step((ours, ref), upd(2, added=[(1, allow(None), None, [])]))
    assert allowed_sets(ours, 2) == allowed_sets(ref, 2) == [{4, 6}, ALL_IDS]
    # and the restricted request can itself be replaced by an unrestricted one
    step((ours, ref), upd(2, added=[(0, SimpleNamespace(), None, [])]))
    assert allowed_sets(ours, 2) == allowed_sets(ref, 2) == [ALL_IDS, ALL_IDS]


def test_allowed_keeps_values_and_neg_inf():
    ours = make(AllowedTokenIdsLogitsProcessor)
    ours.update_state(upd(1, added=[(0, allow([0, 1, 2]), None, [])]))
    logits = torch.tensor([[-INF, -5.5, 7.25, 1.0, 2.0, 3.0, 4.0, 5.0]])
    assert_same(applied(ours, logits), torch.tensor([[-INF, -5.5, 7.25] + [-INF] * 5]))

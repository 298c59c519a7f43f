"""Bad words (``builtin/bad_words.py``): single and multi-token words, prefix matches on the live
output, re-evaluation on ``None`` steps, moves, prefixes filled before ``apply``."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from _helpers import applied, built, step, upd

from logitsproc_rs import (
    BadWordsLogitsProcessor,
    EngineConfig,
    MoveDirectionality,
)
from logitsproc_rs.reference import (
    RefBadWordsLogitsProcessor,
)

INF = math.inf
SWAP = MoveDirectionality.SWAP
UNI = MoveDirectionality.UNIDIRECTIONAL
V = 8
CFG = EngineConfig(max_num_seqs=4, vocab_size=V)


def bw(*words: list[int]) -> SimpleNamespace:
    return SimpleNamespace(bad_words_token_ids=[list(w) for w in words])


def banned(proc, rows: int) -> list[set[int]]:
    x = applied(proc, torch.zeros(rows, V))
    return [set(torch.nonzero(x[r] == -INF).flatten().tolist()) for r in range(rows)]


def test_single_token_bad_word_always_banned():
    ours, ref = built(BadWordsLogitsProcessor, CFG), built(RefBadWordsLogitsProcessor, CFG)
    out = []
    step((ours, ref), upd(1, added=[(0, bw([3], [6]), [3, 6], out)]))
    for _ in range(3):
        assert banned(ours, 1) == banned(ref, 1) == [{3, 6}]
        out.append(1)
        step((ours, ref), None)


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ([], set()),
        ([5], set()),  # prefix [5, 6] not matched yet; [6, 7] neither
        ([5, 6], {7}),
        ([1, 5, 6], {7}),
        ([5, 6, 1], set()),
        ([6], {7}),  # word [6, 7]: prefix [6]
        ([5, 6, 6], {7}),  # [6, 7] matches via its own prefix
        ([5, 6, -1], set()),  # an async placeholder never matches
    ],
)
def test_multi_token_bad_word_only_on_prefix_match(output, expected):
    ours, ref = built(BadWordsLogitsProcessor, CFG), built(RefBadWordsLogitsProcessor, CFG)
    step((ours, ref), upd(1, added=[(0, bw([5, 6, 7], [6, 7]), None, list(output))]))
    assert banned(ours, 1) == banned(ref, 1) == [expected]


def test_bad_word_longer_than_output_plus_one_is_skipped():
    """vLLM skips a word longer than ``len(output) + 1``: [2, 3, 4] with output [3] bans
    nothing even though the output ends with part of its prefix."""
    ours, ref = built(BadWordsLogitsProcessor, CFG), built(RefBadWordsLogitsProcessor, CFG)
    out = [3]
    step((ours, ref), upd(1, added=[(0, bw([2, 3, 4]), None, out)]))
    assert banned(ours, 1) == banned(ref, 1) == [set()]
    out[0] = 2
    out.append(3)
    step((ours, ref), None)
    assert banned(ours, 1) == banned(ref, 1) == [{4}]


def test_bad_words_reevaluated_on_none_steps():
    ours, ref = built(BadWordsLogitsProcessor, CFG), built(RefBadWordsLogitsProcessor, CFG)
    out0, out1 = [], [9 % V]
    step(
        (ours, ref),
        upd(2, added=[(0, bw([1, 2], [4]), None, out0), (1, bw([1, 2, 3]), None, out1)]),
    )
    assert banned(ours, 2) == banned(ref, 2) == [{4}, set()]
    for tok0, tok1, exp in [
        (1, 1, [{4, 2}, set()]),
        (0, 2, [{4}, {3}]),
        (1, 0, [{4, 2}, set()]),
    ]:
        out0.append(tok0)
        out1.append(tok1)
        step((ours, ref), None)
        assert banned(ours, 2) == banned(ref, 2) == exp


def test_bad_words_move_with_request():
    ours, ref = built(BadWordsLogitsProcessor, CFG), built(RefBadWordsLogitsProcessor, CFG)
    step((ours, ref), upd(3, added=[(0, bw([1]), None, []), (2, bw([2]), None, [])]))
    step((ours, ref), upd(3, moved=[(0, 1, SWAP)]))
    assert banned(ours, 3) == banned(ref, 3) == [set(), {1}, {2}]
    step((ours, ref), upd(2, moved=[(2, 0, UNI)]))
    assert banned(ours, 2) == banned(ref, 2) == [{2}, {1}]
    step((ours, ref), upd(3, added=[(2, SimpleNamespace(), None, [])]))
    assert banned(ours, 3) == banned(ref, 3) == [{2}, {1}, set()]


def test_bad_word_prefix_filled_between_update_state_and_apply_bans():
    """vLLM's async order: the output's last token is a ``-1`` placeholder at
    ``update_state`` and is filled in place before the sampler; vLLM matches bad words at
    sampling time, so [5, 6] bans 6 right after 5 was generated. Expected: 6 banned."""
    ours, ref = built(BadWordsLogitsProcessor, CFG), built(RefBadWordsLogitsProcessor, CFG)
    out = [1]
    step((ours, ref), upd(1, added=[(0, bw([5, 6]), None, out)]))
    out.append(-1)
    step((ours, ref), None)  # update_state: the tail is still -1
    out[-1] = 5  # the engine fills the placeholder, then samples
    assert banned(ref, 1) == [{6}]
    assert banned(ours, 1) == [{6}]

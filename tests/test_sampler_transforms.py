"""The sampler transforms (penalties, bad words, allowed token ids) as a group: no active request
returns the same tensor, and a request reusing a slot starts fresh."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _helpers import applied, assert_same, upd

from logitsproc_rs import (
    AllowedTokenIdsLogitsProcessor,
    BadWordsLogitsProcessor,
    EngineConfig,
    PenaltiesLogitsProcessor,
)

INF = math.inf
V = 8
CFG = EngineConfig(max_num_seqs=4, vocab_size=V)


def make(cls: type, cfg: EngineConfig = CFG) -> Any:
    return cls(cfg, torch.device("cpu"), False)


def pen(rep: float = 1.0, freq: float = 0.0, pres: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres)


@pytest.mark.parametrize(
    ("cls", "params"),
    [
        (PenaltiesLogitsProcessor, pen(1.0, 1.0, 0.0)),
        (BadWordsLogitsProcessor, SimpleNamespace(bad_words_token_ids=[[1]])),
        (AllowedTokenIdsLogitsProcessor, SimpleNamespace(allowed_token_ids=[1])),
    ],
)
def test_no_active_request_returns_same_object_and_slot_reuse_starts_fresh(cls, params):
    p = make(cls)
    assert p.apply(torch.zeros(0, V)) is not None
    x = torch.zeros(1, V)
    p.update_state(upd(1, added=[(0, SimpleNamespace(), [1], [])]))  # nothing set
    p.update_state(None)
    assert p.apply(x) is x and bool((x == 0).all())
    p.update_state(upd(1, added=[(0, params, None, [1, 1])]))
    assert not torch.equal(applied(p, x), x)
    p.update_state(upd(0, removed=[0]))  # the only request finishes
    p.update_state(None)
    x = torch.zeros(0, V)
    assert p.apply(x) is x
    # A new request at the same slot: nothing of the old one's state (counts) survives.
    out = [2]
    p.update_state(upd(1, added=[(0, params, None, out)]))
    expected = torch.zeros(1, V)
    if cls is PenaltiesLogitsProcessor:
        expected[0, 2] = -1
    elif cls is BadWordsLogitsProcessor:
        expected[0, 1] = -INF
    else:
        expected[0] = -INF
        expected[0, 1] = 0
    assert_same(applied(p, torch.zeros(1, V)), expected)

"""Bad per-request params of the sampler transforms (penalties, bad words, allowed token ids): a
``ValueError`` naming the request and the field, and the processor's state untouched (a twin that
never saw the bad update behaves the same on the next step)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _helpers import applied, assert_same, built, upd

from logitsproc_rs import (
    AllowedTokenIdsLogitsProcessor,
    BadWordsLogitsProcessor,
    BatchUpdate,
    EngineConfig,
    MoveDirectionality,
    PenaltiesLogitsProcessor,
)

INF = math.inf
SWAP = MoveDirectionality.SWAP
V = 8
CFG = EngineConfig(max_num_seqs=4, vocab_size=V)


BASE_OUT = [1, 2, 2]


def _world(cls: type):
    """A processor with two valid requests and one grown output list."""
    p = built(cls, CFG)
    full = SimpleNamespace(
        repetition_penalty=1.5,
        frequency_penalty=0.5,
        presence_penalty=0.25,
        bad_words_token_ids=[[3], [2, 4]],
        allowed_token_ids=[1, 2, 4],
    )
    p.update_state(upd(2, added=[(0, full, [5, 6], list(BASE_OUT)), (1, full, [0], [])]))
    return p


def _bad_update(bad_params: Any, prompt: Any = None) -> BatchUpdate:
    """A valid add and a SWAP besides the bad request at index 2: all must be rejected."""
    ok = SimpleNamespace(repetition_penalty=2.0, bad_words_token_ids=[[1]], allowed_token_ids=[0])
    return upd(3, added=[(1, ok, [1], []), (2, bad_params, prompt, [])], moved=[(0, 1, SWAP)])


BAD_CASES = [
    (PenaltiesLogitsProcessor, dict(presence_penalty=2.5), None, "presence_penalty"),
    (PenaltiesLogitsProcessor, dict(presence_penalty=-2.01), None, "presence_penalty"),
    (PenaltiesLogitsProcessor, dict(presence_penalty=math.nan), None, "presence_penalty"),
    (PenaltiesLogitsProcessor, dict(frequency_penalty=3.0), None, "frequency_penalty"),
    (PenaltiesLogitsProcessor, dict(frequency_penalty=-INF), None, "frequency_penalty"),
    (PenaltiesLogitsProcessor, dict(frequency_penalty=math.nan), None, "frequency_penalty"),
    (PenaltiesLogitsProcessor, dict(repetition_penalty=0.0), None, "repetition_penalty"),
    (PenaltiesLogitsProcessor, dict(repetition_penalty=-1.0), None, "repetition_penalty"),
    (PenaltiesLogitsProcessor, dict(repetition_penalty=INF), None, "repetition_penalty"),
    (PenaltiesLogitsProcessor, dict(repetition_penalty=math.nan), None, "repetition_penalty"),
    (PenaltiesLogitsProcessor, dict(repetition_penalty=1.5), [1, V], "prompt_tok_ids"),
    (PenaltiesLogitsProcessor, dict(frequency_penalty=1.0), [-2], "prompt_tok_ids"),
    (BadWordsLogitsProcessor, dict(bad_words_token_ids=[[1], []]), None, "bad_words"),
    (BadWordsLogitsProcessor, dict(bad_words_token_ids=[[1, V]]), None, "bad_words"),
    (BadWordsLogitsProcessor, dict(bad_words_token_ids=[[-1]]), None, "bad_words"),
    (AllowedTokenIdsLogitsProcessor, dict(allowed_token_ids=[]), None, "allowed_token_ids"),
    (AllowedTokenIdsLogitsProcessor, dict(allowed_token_ids=[0, V]), None, "allowed_token_ids"),
    (AllowedTokenIdsLogitsProcessor, dict(allowed_token_ids=[-1]), None, "allowed_token_ids"),
]


@pytest.mark.parametrize(
    ("cls", "fields", "prompt", "field"),
    BAD_CASES,
    ids=[f"{c.__name__[:8]}-{f}-{i}" for i, (c, _, _, f) in enumerate(BAD_CASES)],
)
def test_new_processors_reject_bad_params_and_keep_state(cls, fields, prompt, field):
    p = _world(cls)
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(5))
    before = applied(p, logits)
    with pytest.raises(ValueError) as e:
        p.update_state(_bad_update(SimpleNamespace(**fields), prompt))
    msg = str(e.value)
    assert "index 2" in msg and field in msg, msg
    assert_same(applied(p, logits), before)
    # and it keeps working: the next (valid) step behaves like a twin's that never saw it
    twin = _world(cls)
    for q in (p, twin):
        q.update_state(upd(2, moved=[(0, 1, SWAP)]))
    assert_same(applied(p, logits), applied(twin, logits))

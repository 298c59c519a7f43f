"""Speculative decoding: only MinTokens is built (plus the sampler transforms), custom
processors and min_p / logit_bias requests are rejected, and MinTokens and bad words apply over
draft rows exactly as vLLM's rejection-sampler path (checked against the plain reference)."""

from __future__ import annotations

import random

import pytest
import torch

import logitsproc_rs as L
from logitsproc_rs.reference import ref_bad_words_with_drafts, ref_min_tokens_with_drafts

VOCAB = 24
SPEC = 3


def _cfg(batch: int) -> L.EngineConfig:
    return L.EngineConfig(max_num_seqs=batch, vocab_size=VOCAB, num_speculative_tokens=SPEC)


def _procs(batch: int):
    procs = L.build_logitsprocs(_cfg(batch), "cpu", False)
    by_name = {type(p).__name__: p for p in procs.all}
    return procs, by_name


def test_spec_mode_builds_min_tokens_and_the_sampler_transforms_only():
    _, by_name = _procs(4)
    assert "MinTokensLogitsProcessor" in by_name
    assert "LogitBiasLogitsProcessor" not in by_name and "MinPLogitsProcessor" not in by_name
    assert [
        type(p).__name__
        for p in L.build_logitsprocs(_cfg(4), "cpu", False, sampler_transforms=False).all
    ] == ["MinTokensLogitsProcessor"]
    with pytest.raises(ValueError, match="speculative decoding"):
        L.build_logitsprocs(_cfg(4), "cpu", False, custom_logitsprocs=[L.MinPLogitsProcessor])


@pytest.mark.parametrize(
    "params",
    [L.SamplingParams(min_p=0.1), L.SamplingParams(logit_bias={1: 1.0})],
)
def test_spec_mode_rejects_min_p_and_logit_bias(params):
    with pytest.raises(ValueError, match=L.STR_SPEC_DEC_REJECTS_MIN_P_LOGIT_BIAS):
        L.validate_sampling_params(_cfg(4), params)
    L.validate_sampling_params(_cfg(4), L.SamplingParams(min_p=1e-6))  # vLLM's 1e-5 floor


@pytest.mark.parametrize("seed", range(6))
def test_draft_rows_match_reference(seed):
    rng = random.Random(seed)
    batch = rng.randint(1, 6)
    _, by_name = _procs(batch)
    min_tok, bad = by_name["MinTokensLogitsProcessor"], by_name["BadWordsLogitsProcessor"]
    added, ref_min, ref_bad, outputs = [], {}, {}, {}
    for r in range(batch):
        out = [rng.randrange(4) for _ in range(rng.randint(0, 5))]
        outputs[r] = out
        stop = rng.sample(range(10, 14), rng.randint(0, 2))
        words = [
            [rng.randrange(4) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(0, 3))
        ]
        p = L.SamplingParams(
            max_tokens=None,
            min_tokens=rng.choice((0, 2, 5, 8)),
            stop_token_ids=stop,
            eos_token_id=15,
            bad_words_token_ids=words or None,
        )
        added.append((r, p, None, out))
        if p.min_tokens and len(out) < p.min_tokens:
            ref_min[r] = (p.min_tokens, p.all_stop_token_ids, out)
        if words:
            ref_bad[r] = words
    update = L.BatchUpdate(batch_size=batch, removed=[], added=added, moved=[])
    for p in (min_tok, bad):
        p.update_state(update)
    for _ in range(4):
        num_draft = [rng.randint(0, SPEC) for _ in range(batch)]
        drafts = [[rng.randrange(4) for _ in range(n)] for n in num_draft]
        rows = sum(num_draft)
        logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed))
        ours = bad.apply_with_spec_decode(
            min_tok.apply_with_spec_decode(logits.clone(), num_draft), num_draft, drafts
        )
        ref = ref_bad_words_with_drafts(
            ref_min_tokens_with_drafts(logits.clone(), ref_min, num_draft),
            ref_bad,
            outputs,
            num_draft,
            drafts,
        )
        assert torch.equal(ours, ref)
        for out in outputs.values():
            out.append(rng.randrange(4))
        for p in (min_tok, bad):
            p.update_state(None)


def test_draft_rows_reject_a_layout_that_does_not_match():
    _, by_name = _procs(2)
    min_tok = by_name["MinTokensLogitsProcessor"]
    update = L.BatchUpdate(
        batch_size=2,
        removed=[],
        added=[(0, L.SamplingParams(min_tokens=3, stop_token_ids=[1], max_tokens=None), None, [])],
        moved=[],
    )
    min_tok.update_state(update)
    with pytest.raises(ValueError, match="apply_with_spec_decode"):
        min_tok.apply_with_spec_decode(torch.zeros(3, VOCAB), [2, 2])  # 4 rows expected

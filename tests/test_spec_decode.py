"""Speculative decoding in vLLM's mode (``EngineConfig(draft_rows="vllm")``): only MinTokens
is built (plus the sampler transforms), custom processors and min_p / logit_bias requests are
rejected, and MinTokens and bad words apply over draft rows exactly as vLLM's rejection-sampler
path (checked against the plain reference). The default mode, every processor per draft
position: below, and tests/test_draft_rows.py."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

import logitsproc_rs as L
from logitsproc_rs.reference import ref_bad_words_with_drafts, ref_min_tokens_with_drafts

VOCAB = 24
SPEC = 3


def _cfg(batch: int, draft_rows: str = "vllm") -> L.EngineConfig:
    return L.EngineConfig(
        max_num_seqs=batch, vocab_size=VOCAB, num_speculative_tokens=SPEC, draft_rows=draft_rows
    )


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


# --- the default mode: every processor per draft position --------------------------------------


class _V1Boost(L.LogitsProcessor):
    """A vLLM V1-style processor (its own ``apply`` over batch rows): +1 on token 0 of the
    rows of requests that set ``extra_args["boost"]``."""

    def __init__(self, vllm_config, device, is_pin_memory):
        self.rows: set[int] = set()

    @classmethod
    def validate_params(cls, sampling_params):
        pass

    def is_argmax_invariant(self):
        return False

    def update_state(self, batch_update):
        if batch_update is None:
            return
        for r in batch_update.removed:
            self.rows.discard(r)
        for r, params, _, _ in batch_update.added:
            (self.rows.add if (params.extra_args or {}).get("boost") else self.rows.discard)(r)

    def apply(self, logits):
        for r in self.rows:
            if r < logits.shape[0]:
                logits[r, 0] += 1.0
        return logits


class _V1BoostOptedIn(_V1Boost):
    APPLIES_TO_DRAFT_ROWS = True


def test_per_position_mode_builds_every_processor_and_accepts_min_p_and_logit_bias():
    cfg = _cfg(4, draft_rows="per_position")
    names = {type(p).__name__ for p in L.build_logitsprocs(cfg, "cpu", False).all}
    assert {"MinTokensLogitsProcessor", "LogitBiasLogitsProcessor", "MinPLogitsProcessor"} <= names
    L.validate_sampling_params(cfg, L.SamplingParams(min_p=0.1, logit_bias={1: 1.0}))
    assert L.EngineConfig(num_speculative_tokens=SPEC).draft_rows == "per_position"
    with pytest.raises(ValueError, match="draft_rows"):
        L.EngineConfig(draft_rows="later")


def test_per_position_mode_keeps_vllms_rejection_of_v1_processors_unless_they_opt_in():
    cfg = _cfg(2, draft_rows="per_position")
    with pytest.raises(ValueError, match=L.STR_SPEC_DEC_REJECTS_LOGITSPROCS) as e:
        L.build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=[_V1Boost])
    assert "_V1Boost" in str(e.value)
    procs = L.build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=[_V1BoostOptedIn])
    boost = next(p for p in procs.all if isinstance(p, _V1BoostOptedIn))
    params = L.SamplingParams(extra_args={"boost": True})
    procs.update_state(L.BatchUpdate(2, [], [(1, params, [5], [])], []))
    # Request 0 has no drafts (one row), request 1 has two (three rows): every row of request 1
    # gets the boost, as a committed request at each draft position; request 0's row does not.
    out = procs.apply_drafts([boost], torch.zeros(4, VOCAB), [[], [3, 4]])
    assert out[:, 0].tolist() == [0.0, 1.0, 1.0, 1.0]
    assert out[:, 1:].abs().sum() == 0


def test_apply_drafts_refuses_a_bad_layout_and_changes_nothing():
    cfg = _cfg(2, draft_rows="per_position")
    procs = L.build_logitsprocs(cfg, "cpu", False)
    words = L.SamplingParams(bad_words_token_ids=[[3, 4]], max_tokens=None)
    # (A batch of one: spec_token_ids holds one entry per request of the batch.)
    procs.update_state(L.BatchUpdate(1, [], [(0, words, [5], [])], []))
    views = list(procs.non_argmax_invariant)
    good = procs.apply_drafts(views, torch.zeros(3, VOCAB), [[3, 1]])
    assert good[1, 4] == float("-inf") and good[0, 4] == 0 and good[2, 4] == 0
    bad = [
        ([[3, VOCAB]], None, None),  # a draft outside the vocabulary
        ([[3, -1]], None, None),
        ([[3, True]], None, None),  # a bool is no token id
        ([[3, 1.5]], None, None),
        ([[3, 1]], [0, 0], [0, 3]),  # a position past the request's drafts
        ([[3, 1]], [0, 0], [0, SPEC + 1]),  # beyond the configured drafts
        ([[3, 1]], [0, 0], None),  # positions without a row map
        ([[3, 1]], [0, 5], [0, 1]),  # a request past the pipeline
        ([[1] * (SPEC + 1)], None, None),  # more drafts than configured: a row beyond them
    ]
    for drafts, rows, pos in bad:
        n = len(rows) if rows is not None else len(drafts[0]) + 1
        with pytest.raises(ValueError):
            procs.apply_drafts(views, torch.zeros(n, VOCAB), drafts, rows, pos)
    for rows, pos in ((5, [0, 1]), ([0, 0], "01"), ([0, True], [0, 1])):  # not int sequences
        with pytest.raises(ValueError):
            procs.apply_drafts(views, torch.zeros(2, VOCAB), [[3, 1]], rows, pos)
    again = procs.apply_drafts(views, torch.zeros(3, VOCAB), [[3, 1]])
    assert torch.equal(again, good)
    # The committed state is untouched: a step without drafts sees none of them.
    plain = procs.apply_drafts(views, torch.zeros(1, VOCAB), [[]])
    assert plain[0, 4] == 0


class _Endless:
    def __iter__(self):
        return itertools.repeat([1])


class _Raising:
    def __iter__(self):
        raise RuntimeError("boom")


def _two_requests(cfg: L.EngineConfig):
    procs = L.build_logitsprocs(cfg, "cpu", False)
    words = L.SamplingParams(bad_words_token_ids=[[3, 4]], min_tokens=2, stop_token_ids=[5])
    procs.update_state(L.BatchUpdate(2, [], [(0, words, [5], []), (1, words, [6], [])], []))
    return procs


@pytest.mark.parametrize(
    ("spec_ids", "rows", "pos", "field"),
    [
        ([[3, 1]], None, None, "spec_token_ids"),  # shorter than the batch: request 1 had none
        ([[3], [1], [2]], None, None, "spec_token_ids"),  # longer than the batch
        ([[3]] * 10**6, None, None, "spec_token_ids"),
        (_Endless(), None, None, "spec_token_ids"),
        (_Raising(), None, None, "spec_token_ids"),
        ({(3,), (1,)}, None, None, "spec_token_ids"),  # a set has no order
        ({0: [3], 1: [1]}, None, None, "spec_token_ids"),
        (None, None, None, "spec_token_ids"),  # was a TypeError
        (5, None, None, "spec_token_ids"),
        ("31", None, None, "spec_token_ids"),
        ([[3], []], [0, 0, 2], [0, 1, 0], "row_to_request"),  # a request past the batch
        ([[3], []], [0, 0, -1], [0, 1, 0], "row_to_request"),
        ([[3], []], [0, 0, 1], 7, "positions"),
    ],
    ids=lambda v: repr(v)[:20],
)
def test_apply_drafts_refuses_a_layout_that_is_not_the_batchs(spec_ids, rows, pos, field):
    """Each was taken (a short list gave request 1 no row and request 0's draft row its
    place; a row of a request past the batch read a free slot) or escaped as a TypeError."""
    procs, twin = _two_requests(_cfg(4, "per_position")), _two_requests(_cfg(4, "per_position"))
    views = list(procs.non_argmax_invariant)
    n = 3 if rows is None else len(rows)
    with pytest.raises(L.RequestError) as e:
        procs.apply_drafts(views, torch.zeros(n, VOCAB), spec_ids, rows, pos)
    assert e.value.field == field, str(e.value)
    good = [[3, 4], []]
    assert torch.equal(
        procs.apply_drafts(views, torch.zeros(4, VOCAB), good),
        twin.apply_drafts(list(twin.non_argmax_invariant), torch.zeros(4, VOCAB), good),
    )


def test_apply_drafts_before_any_update_state_is_refused():
    procs = L.build_logitsprocs(_cfg(4, "per_position"), "cpu", False)
    with pytest.raises(L.RequestError, match="before any update_state") as e:
        procs.apply_drafts(list(procs.non_argmax_invariant), torch.zeros(1, VOCAB), [[]])
    assert e.value.field == "spec_token_ids"

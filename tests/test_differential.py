"""The differential harness: our processors and ``Sampler`` against ``logitsproc_rs.reference``,
under seeded churn, parametrised by processor set.

A seeded ``ChurnSimulator`` drives a persistent batch through adds into freed slots, tail
removals, condense (UNIDIRECTIONAL) moves, reorder SWAPs, ``None`` steps and output lists that
grow every step. Every step both sides get the same ``update_state`` call and then the same fresh
logits:

* the non-argmax-invariant phase must agree exactly (``torch.equal``, ``-inf`` positions
  included);
* MinP applied to that must agree everywhere except at documented ties (see ``TIE_TOL``);
* every few steps the full ``Sampler`` and ``ReferenceSampler`` must sample the same tokens,
  with an identically seeded ``torch.Generator`` per request on each side.

The processor sets (``PROCESSOR_SETS``):

* ``builtins``: vLLM's own three (MinTokens, LogitBias, MinP), output lists often ending in stop
  tokens (``run_churn``);
* ``full``: every processor at once (allowed ids, bad words, MinTokens, LogitBias, MinP,
  penalties, thinking budget) against ``build_reference_logitsprocs`` (the plain per-request
  versions, which rebuild penalty counts and bad-word matches from the live lists on every
  ``apply``; ``run_full_churn``). The token stream keeps hitting bad-word prefixes, stop tokens
  and prompt ids; some tokens arrive as async ``-1`` placeholders that are filled in place on
  the next step; now and then an output list shrinks in place (vLLM's order: after the step's
  append, before ``update_state``). The sampler check also compares the processed logits and
  the logprobs tensors (all four logprobs modes in turn), with a grammar bitmask on some rows
  (with or without ``indices``).

Each set also has tests that a corrupted reference is caught (the comparison can fail).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    MoveDirectionality,
    Sampler,
    SamplingMetadata,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.reference import (
    RefAllowedTokenIdsLogitsProcessor,
    RefBadWordsLogitsProcessor,
    ReferenceSampler,
    RefLogitBiasLogitsProcessor,
    RefLogitsProcessors,
    RefMinPLogitsProcessor,
    RefMinTokensLogitsProcessor,
    RefPenaltiesLogitsProcessor,
    build_reference_logitsprocs,
)
from logitsproc_rs.sampler import LOGPROBS_MODES
from logitsproc_rs.simulate import ChurnSimulator, Request

# Our MinP keeps a token iff logit >= max + ln(min_p) (logit space, float32); the reference
# keeps it iff softmax p >= min_p * p_max (vLLM's form). The two agree except for tokens
# within float rounding of the threshold: a differing position counts as a tie iff
#   |logit - (max + ln(min_p))| <= TIE_TOL * max(1, |max|)
# (computed in float64 from the float32 inputs). Float32 rounding of exp / the softmax sum /
# max + ln(min_p) is a few ulp, i.e. ~1e-6 relative; 1e-5 leaves margin and is still far
# below any real disagreement.
TIE_TOL = 1e-5

EOS = 1

STOP_POOL = (2, 3, 5, 7, 11, 13)

HOT_TOKENS = tuple(range(24))  # shared by many logit_bias dicts (duplicates across requests)

MIN_P_VALUES = (0.0, 0.05, 0.1, 0.3, 1.0)

MIN_TOKENS_VALUES = (0, 1, 3, 10, 40)

# Powers of two (and greedy 0): dividing the 1/8-quantised sampler logits stays exact.
TEMPERATURES = (0.0, 0.25, 0.5, 1.0, 1.0, 2.0)

# Multiples of 1/8, plus 0.1 (not representable in float32; exercises the float32 rounding).
BIAS_VALUES = (5.0, -5.0, 0.5, -0.5, 2.25, -100.0, 0.1)


# Bad words are drawn from these ids, and the token stream returns to them often, so
# multi-token prefixes match all the time.
HOT_IDS = (20, 21, 22, 23, 24, 25)

# Grid values only: dividing / multiplying the 1/8-quantised sampler logits by these, and
# subtracting multiples of them, keeps every logit difference far (>= ~1e-4) from
# T·ln(min_p), so the two MinP forms cannot disagree in the full-sampler comparison.
REPETITION_VALUES = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)

FREQ_PRES_VALUES = (-2.0, -1.0, -0.5, 0.0, 0.0, 0.25, 0.5, 1.0, 2.0)

LOGPROBS_VALUES = (None, None, None, 0, 1, 3, 5)

PLACEHOLDER_PROB = 0.08


def random_logits(rng: random.Random, g: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    """Gaussian logits at a random scale / offset, sometimes with ties (copied columns),
    scattered -inf entries, or a whole -inf row."""
    scale = rng.choice((1.0, 4.0, 20.0))
    offset = rng.choice((0.0, 0.0, 40.0, -500.0))
    x = torch.randn(rows, vocab, generator=g) * scale + offset
    if rows and rng.random() < 0.5:
        src = torch.randint(vocab, (vocab // 8,), generator=g)
        dst = torch.randint(vocab, (vocab // 8,), generator=g)
        x[:, dst] = x[:, src]
    if rows and rng.random() < 0.3:
        x.masked_fill_(torch.rand(rows, vocab, generator=g) < 0.05, -math.inf)
    if rows and rng.random() < 0.1:
        x[rng.randrange(rows)] = -math.inf
    return x


def quantised_logits(g: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    """Distinct multiples of 1/8 per row, for the full-sampler comparison.

    The two MinP forms only disagree within float rounding of max + ln(min_p). Logit
    differences here are multiples of 1/8 (biases are multiples of 1/8 or 0.1, temperatures
    powers of two), which stay >= ~4e-3 away from T·ln(min_p) for min_p in {0.05, 0.1, 0.3}
    and are exactly 0 for min_p = 1 (kept by both), so sampled tokens must match exactly."""
    out = torch.empty(rows, vocab)
    for i in range(rows):
        out[i] = (torch.randperm(2 * vocab, generator=g)[:vocab] - vocab).float() / 8
    return out


def classify_min_p_diffs(
    inp: torch.Tensor, ours: torch.Tensor, ref: torch.Tensor, min_p: torch.Tensor
) -> tuple[int, int]:
    """(ties, bad): positions where ``ours`` and ``ref`` differ, split into allowed ties
    (see ``TIE_TOL``; one side kept the input value, the other masked it) and the rest."""
    diff = ours != ref
    if not bool(diff.any()):
        return 0, 0
    r, c = diff.nonzero(as_tuple=True)
    x = inp[r, c].double()
    row_max = inp.amax(dim=-1).double()[r]
    mp = min_p.double()[r]
    thr = row_max + torch.log(mp)
    near = (x - thr).abs() <= TIE_TOL * torch.clamp(row_max.abs(), min=1.0)
    kept_or_masked = ((ours[r, c] == inp[r, c]) & (ref[r, c] == -math.inf)) | (
        (ref[r, c] == inp[r, c]) & (ours[r, c] == -math.inf)
    )
    tie = near & (mp > 0) & kept_or_masked
    n_tie = int(tie.sum())
    return n_tie, int(diff.sum()) - n_tie


def nan_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``torch.equal`` that counts NaN == NaN (a fully masked row has NaN logprobs)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def grammar_bitmask(
    rng: random.Random, g: torch.Generator, batch: int, vocab: int
) -> tuple[object, object]:
    """A bitmask for some rows: either one row per logits row (``indices=None``, most rows
    ``-1``) or a subset of rows with ``indices`` as a list, numpy array or tensor. Words are
    ``ceil(V/32)``, or sometimes fewer (columns past ``32 * words`` untouched)."""
    words = (vocab + 31) // 32
    if rng.random() < 0.25 and words > 1:
        words -= 1
    if rng.random() < 0.4:
        rows = batch
        indices = None
    else:
        rows = rng.randint(1, batch)  # 0 rows: see test_transforms (bitmask bug)
        chosen = sorted(rng.sample(range(batch), rows))
        kind = rng.choice(("list", "numpy", "tensor"))
        if kind == "list":
            indices = chosen
        elif kind == "numpy":
            indices = np.array(chosen, dtype=np.int64)
        else:
            indices = torch.tensor(chosen, dtype=rng.choice((torch.int32, torch.int64)))
    bits = torch.rand(rows, words * 32, generator=g) < 0.75
    weights = 2 ** torch.arange(32, dtype=torch.int64)
    packed = (bits.view(rows, words, 32).long() * weights).sum(-1)  # in [0, 2**32)
    mask = torch.from_numpy(packed.numpy().astype(np.uint32).view(np.int32))
    full = torch.rand(rows, generator=g) < (0.6 if indices is None else 0.2)
    mask[full] = -1
    if rng.random() < 0.3:
        return mask.numpy(), indices
    return mask, indices


# --- builtins: vLLM's MinTokens, LogitBias, MinP ----------------------------------------------


def builtin_params_factory(vocab: int):
    def make_params(rng: random.Random) -> SamplingParams:
        logit_bias = None
        if rng.random() < 0.3:
            logit_bias = {}
            for _ in range(rng.randint(1, 20)):
                tok = rng.choice(HOT_TOKENS) if rng.random() < 0.5 else rng.randrange(vocab)
                logit_bias[tok] = rng.choice(BIAS_VALUES)
        elif rng.random() < 0.03:
            logit_bias = {}  # an empty dict counts as "no bias"
        return SamplingParams(
            temperature=rng.choice(TEMPERATURES),
            min_p=rng.choice(MIN_P_VALUES),
            min_tokens=rng.choice(MIN_TOKENS_VALUES),
            stop_token_ids=rng.sample(STOP_POOL, rng.randint(0, 3)),
            eos_token_id=EOS if rng.random() < 0.8 else None,
            ignore_eos=rng.random() < 0.1,
            logit_bias=logit_bias,
            top_k=rng.choice((0, 0, 0, 1, 5, 40)),
            top_p=rng.choice((1.0, 1.0, 1.0, 0.9, 0.5)),
            max_tokens=None,
        )

    return make_params


def builtin_next_token(vocab: int):
    """The token stream hits a stop token (or EOS) of the request ~40% of the time."""

    def next_token(rng: random.Random, req: Request) -> int:
        stops = req.params.all_stop_token_ids
        if stops and rng.random() < 0.4:
            return rng.choice(sorted(stops))
        return rng.randrange(vocab)

    return next_token


@dataclass
class ChurnStats:
    steps: int = 0
    none_steps: int = 0
    added: int = 0
    removed: int = 0
    uni_moves: int = 0
    swaps: int = 0
    one_sided_bias_swaps: int = 0  # SWAPs where exactly one side has a logit_bias
    min_tokens_expiries: int = 0
    min_tokens_expiries_on_none: int = 0
    max_batch: int = 0
    stop_masks: int = 0  # (row, stop token) pairs masked, summed over steps
    bias_rows: int = 0
    min_p_rows: int = 0
    min_p_masked: int = 0  # positions MinP newly set to -inf
    phase1_mismatch_steps: int = 0
    min_p_elems: int = 0
    min_p_ties: int = 0
    min_p_bad: int = 0
    sampler_checks: int = 0
    sampled_rows: int = 0
    random_rows: int = 0
    token_mismatches: int = 0
    sampler_logits_mismatches: int = 0
    failures: list[str] = field(default_factory=list)

    def fail(self, msg: str) -> None:
        if len(self.failures) < 10:
            self.failures.append(msg)


def count_one_sided_swaps(biases: dict[int, Any], update: BatchUpdate) -> int:
    """Replays ``update`` on the set of slots holding a logit_bias and counts SWAPs where
    exactly one side had one (the case vLLM's dict helper must still exchange)."""
    keys = set(biases)
    for idx, params, _, _ in update.added:
        (keys.add if params.logit_bias else keys.discard)(idx)
    keys.difference_update(update.removed)
    n = 0
    for a, b, d in update.moved:
        ina, inb = a in keys, b in keys
        keys.discard(a)
        keys.discard(b)
        if d.name == "SWAP":
            n += ina != inb
            if inb:
                keys.add(a)
        if ina:
            keys.add(b)
    return n


def run_churn(
    seed: int,
    max_num_seqs: int,
    vocab: int,
    steps: int,
    *,
    target_batch: int | None = None,
    finish_prob: float = 1 / 48,
    sampler_every: int = 7,
    ref_procs: RefLogitsProcessors | None = None,
    ref_generator_seed_offset: int = 0,
) -> ChurnStats:
    """Drive ours and the reference through ``steps`` churn steps; returns what was
    exercised and every disagreement (the caller asserts)."""
    cfg = EngineConfig(max_num_seqs=max_num_seqs, vocab_size=vocab)
    ours = build_logitsprocs(cfg, "cpu", False)
    ref = ref_procs if ref_procs is not None else build_reference_logitsprocs(cfg, "cpu")
    ref_by_type = {type(p): p for p in ref.all}
    ref_bias = ref_by_type.get(RefLogitBiasLogitsProcessor)
    sampler, ref_sampler = Sampler(ours), ReferenceSampler(ref)
    sim = ChurnSimulator(
        max_num_seqs,
        vocab,
        seed,
        builtin_params_factory(vocab),
        target_batch=target_batch,
        finish_prob=finish_prob,
        max_tokens=(4, 160),
        next_token=builtin_next_token(vocab),
    )
    rng = random.Random(seed + 10_000)
    g = torch.Generator().manual_seed(seed)
    gens: dict[int, tuple[torch.Generator, torch.Generator]] = {}
    st = ChurnStats()

    for step in range(steps):
        update = sim.step()
        rows = sim.batch.rows()
        batch = len(rows)
        st.steps += 1
        st.max_batch = max(st.max_batch, batch)
        if update is None:
            st.none_steps += 1
        else:
            st.added += len(update.added)
            st.removed += len(update.removed)
            for _, _, d in update.moved:
                st.uni_moves += d is MoveDirectionality.UNIDIRECTIONAL
                st.swaps += d is MoveDirectionality.SWAP
            if ref_bias is not None:
                st.one_sided_bias_swaps += count_one_sided_swaps(ref_bias.biases, update)
        for r in rows:  # outputs grow by one per step, so this is the step a request expires
            if r.params.min_tokens and len(r.output_token_ids) == r.params.min_tokens:
                st.min_tokens_expiries += 1
                st.min_tokens_expiries_on_none += update is None

        for p in ours.all:
            p.update_state(update)
        for p in ref.all:
            p.update_state(update)

        # Phase 1: MinTokens, LogitBias. Exactly equal.
        logits = random_logits(rng, g, batch, vocab)
        a, b = logits.clone(), logits.clone()
        for p in ours.non_argmax_invariant:
            a = p.apply(a)
        for p in ref.non_argmax_invariant:
            b = p.apply(b)
        if not torch.equal(a, b):
            st.phase1_mismatch_steps += 1
            n = int((a != b).sum())
            st.fail(f"step {step}: phase 1 differs at {n} positions (batch {batch})")
        for r in rows:
            pr = r.params
            if pr.min_tokens and len(r.output_token_ids) < pr.min_tokens:
                st.stop_masks += len(pr.all_stop_token_ids)
            st.bias_rows += bool(pr.logit_bias)

        # Phase 2 in isolation: MinP on the phase-1 output. Equal up to ties.
        min_p = torch.tensor([float(np.float32(r.params.min_p)) for r in rows])
        st.min_p_rows += int((min_p > 0).sum())
        x, y = a.clone(), a.clone()
        for p in ours.argmax_invariant:
            x = p.apply(x)
        for p in ref.argmax_invariant:
            y = p.apply(y)
        ties, bad = classify_min_p_diffs(a, x, y, min_p)
        st.min_p_elems += a.numel()
        st.min_p_ties += ties
        st.min_p_bad += bad
        st.min_p_masked += int(((x == -math.inf) & (a != -math.inf)).sum())
        if bad:
            st.fail(f"step {step}: MinP differs at {bad} non-tie positions")

        # The whole pipeline, every few steps, with a seeded generator per request.
        if batch and step % sampler_every == 0:
            gen_ours, gen_ref = {}, {}
            for i, r in enumerate(rows):
                if r.req_id not in gens:
                    s = seed * 1_000_003 + r.req_id
                    gens[r.req_id] = (
                        torch.Generator().manual_seed(s),
                        torch.Generator().manual_seed(s + ref_generator_seed_offset),
                    )
                gen_ours[i], gen_ref[i] = gens[r.req_id]
            params = [r.params for r in rows]
            md_ours = SamplingMetadata.from_params(params, vocab, generators=gen_ours)
            md_ref = SamplingMetadata.from_params(params, vocab, generators=gen_ref)
            q = quantised_logits(g, batch, vocab)
            out = sampler(q.clone(), md_ours)
            out_ref = ref_sampler(q.clone(), md_ref)
            st.sampler_checks += 1
            st.sampled_rows += batch
            st.random_rows += sum(p.temperature > 0 for p in params)
            mism = int((out.sampled_token_ids != out_ref.sampled_token_ids).sum())
            st.token_mismatches += mism
            if mism:
                st.fail(f"step {step}: sampler tokens differ in {mism}/{batch} rows")
            if not torch.equal(out.logits, out_ref.logits):
                st.sampler_logits_mismatches += 1
                st.fail(f"step {step}: sampler processed logits differ")
    return st


def assert_builtins_clean(st: ChurnStats) -> None:
    assert not st.failures, "\n".join(st.failures)
    assert st.phase1_mismatch_steps == 0
    assert st.min_p_bad == 0
    assert st.token_mismatches == 0
    assert st.sampler_logits_mismatches == 0
    # Ties are rare with continuous random logits: at most a handful per million positions.
    assert st.min_p_ties <= max(3, st.min_p_elems // 200_000), st


# --- full: every processor --------------------------------------------------------------------


def full_params_factory(vocab: int):
    def make_params(rng: random.Random) -> SamplingParams:
        logit_bias = None
        if rng.random() < 0.25:
            logit_bias = {rng.randrange(vocab): rng.choice(BIAS_VALUES) for _ in range(5)}
        penalties = {}
        if rng.random() < 0.6:
            penalties = dict(
                repetition_penalty=rng.choice(REPETITION_VALUES),
                frequency_penalty=rng.choice(FREQ_PRES_VALUES),
                presence_penalty=rng.choice(FREQ_PRES_VALUES),
            )
        allowed = None
        if rng.random() < 0.15:
            pool = [*HOT_IDS, *STOP_POOL, *(rng.randrange(vocab) for _ in range(30))]
            allowed = rng.sample(pool, rng.randint(1, 12))
        bad_words = None
        if rng.random() < 0.35:
            bad_words = [
                [rng.choice(HOT_IDS) for _ in range(rng.choice((1, 2, 2, 3, 3, 4)))]
                for _ in range(rng.randint(1, 4))
            ]
        return SamplingParams(
            temperature=rng.choice(TEMPERATURES),
            min_p=rng.choice(MIN_P_VALUES),
            min_tokens=rng.choice(MIN_TOKENS_VALUES),
            stop_token_ids=rng.sample(STOP_POOL, rng.randint(0, 3)),
            eos_token_id=EOS if rng.random() < 0.8 else None,
            logit_bias=logit_bias,
            allowed_token_ids=allowed,
            bad_words_token_ids=bad_words,
            top_k=rng.choice((0, 0, 0, 1, 5, 40)),
            top_p=rng.choice((1.0, 1.0, 1.0, 0.9, 0.5)),
            logprobs=rng.choice(LOGPROBS_VALUES),
            max_tokens=None,
            thinking_token_budget=rng.choice((None, None, -1, 0, 2, 5, 20)),
            **penalties,
        )

    return make_params


def full_next_token(vocab: int):
    """Hot (bad-word) ids ~40%, the request's stop ids ~15%, its prompt ids ~10%, an async
    ``-1`` placeholder ~8%, otherwise uniform."""

    def next_token(rng: random.Random, req: Request) -> int:
        u = rng.random()
        if u < PLACEHOLDER_PROB:
            return -1
        if u < 0.48:
            return rng.choice(HOT_IDS)
        stops = req.params.all_stop_token_ids
        if u < 0.63 and stops:
            return rng.choice(sorted(stops))
        if u < 0.73 and req.prompt_token_ids:
            return rng.choice(req.prompt_token_ids)
        return rng.randrange(vocab)

    return next_token


def make_prompt_ids(sim: ChurnSimulator) -> None:
    """Prompts share ids with the outputs: mix hot ids into the simulator's prompts."""
    orig = sim._new_request

    def new_request() -> Request:
        req = orig()
        if req.prompt_token_ids:
            rng = sim.rng
            for i in range(len(req.prompt_token_ids)):
                if rng.random() < 0.3:
                    req.prompt_token_ids[i] = rng.choice(HOT_IDS)
        return req

    sim._new_request = new_request  # type: ignore[method-assign]


@dataclass
class FullStats:
    steps: int = 0
    none_steps: int = 0
    added: int = 0
    removed: int = 0
    uni_moves: int = 0
    swaps: int = 0
    max_batch: int = 0
    allowed_rows: int = 0
    allowed_swaps_one_sided: int = 0  # SWAPs exchanging a set with no set (vLLM bug #1)
    allowed_swaps_two_sets: int = 0  # SWAPs of two rows with different sets (vLLM bug #1)
    allowed_condense_moves: int = 0  # UNI moves carrying a set (vLLM bug #2 territory)
    bad_word_rows: int = 0
    single_bans: int = 0
    prefix_bans: int = 0  # multi-token words whose prefix matched the output
    penalty_rows: int = 0
    prompt_output_overlap: int = 0  # penalized rows whose output repeats a prompt id
    placeholders_seen: int = 0  # -1 at an output tail at update_state time
    placeholders_filled: int = 0
    shrinks: int = 0
    phase1_mismatch_steps: int = 0
    min_p_elems: int = 0
    min_p_ties: int = 0
    min_p_bad: int = 0
    sampler_checks: int = 0
    sampler_modes: set[str] = field(default_factory=set)
    bitmask_checks: int = 0
    bitmask_index_kinds: set[str] = field(default_factory=set)
    logprobs_checks: int = 0
    random_rows: int = 0
    token_mismatches: int = 0
    sampler_logits_mismatches: int = 0
    logprobs_mismatches: int = 0
    failures: list[str] = field(default_factory=list)

    def fail(self, msg: str) -> None:
        if len(self.failures) < 10:
            self.failures.append(msg)


def _count_allowed_moves(allowed: dict[int, frozenset[int]], update, st: FullStats) -> None:
    """Replays ``update`` on a copy of the reference's slot → set dict and counts the moves
    that vLLM 0.25.1 gets wrong."""
    cur = dict(allowed)
    for idx, params, _, _ in update.added:
        ids = params.allowed_token_ids
        if ids is None:
            cur.pop(idx, None)
        else:
            cur[idx] = frozenset(ids)
    for idx in update.removed:
        cur.pop(idx, None)
    for a, b, d in update.moved:
        sa, sb = cur.pop(a, None), cur.pop(b, None)
        if d is MoveDirectionality.SWAP:
            if (sa is None) != (sb is None):
                st.allowed_swaps_one_sided += 1
            elif sa is not None and sa != sb:
                st.allowed_swaps_two_sets += 1
            if sb is not None:
                cur[a] = sb
        elif sa is not None:
            st.allowed_condense_moves += 1
        if sa is not None:
            cur[b] = sa


def run_full_churn(
    seed: int,
    max_num_seqs: int,
    vocab: int,
    steps: int,
    *,
    target_batch: int | None = None,
    finish_prob: float = 1 / 40,
    sampler_every: int = 5,
    shrink_prob: float = 0.02,
) -> FullStats:
    # Thinking markers among the hot ids (a 1-token start, a 2-token end), so sections open,
    # close and get forced often.
    cfg = EngineConfig(
        max_num_seqs=max_num_seqs,
        vocab_size=vocab,
        reasoning_start_token_ids=[HOT_IDS[0]],
        reasoning_end_token_ids=[HOT_IDS[1], HOT_IDS[2]],
    )
    ours = build_logitsprocs(cfg, "cpu", False)
    ref = build_reference_logitsprocs(cfg, "cpu")
    assert [type(p).__name__ for p in ours.non_argmax_invariant] == [
        "AllowedTokenIdsLogitsProcessor",
        "BadWordsLogitsProcessor",
        "MinTokensLogitsProcessor",
        "LogitBiasLogitsProcessor",
        "PenaltiesLogitsProcessor",
        "ThinkingBudgetLogitsProcessor",
    ]
    assert [type(p).__name__ for p in ref.non_argmax_invariant] == [
        "RefAllowedTokenIdsLogitsProcessor",
        "RefBadWordsLogitsProcessor",
        "RefMinTokensLogitsProcessor",
        "RefLogitBiasLogitsProcessor",
        "RefPenaltiesLogitsProcessor",
        "RefThinkingBudgetLogitsProcessor",
    ]
    by_type = {type(p): p for p in ref.all}
    ref_allowed = by_type[RefAllowedTokenIdsLogitsProcessor]
    ref_bad = by_type[RefBadWordsLogitsProcessor]
    ref_pen = by_type[RefPenaltiesLogitsProcessor]
    sim = ChurnSimulator(
        max_num_seqs,
        vocab,
        seed,
        full_params_factory(vocab),
        target_batch=target_batch,
        finish_prob=finish_prob,
        max_tokens=(4, 120),
        next_token=full_next_token(vocab),
        prompt_len=(1, 24),
    )
    make_prompt_ids(sim)
    rng = random.Random(seed + 20_000)
    g = torch.Generator().manual_seed(seed)
    gens: dict[int, tuple[torch.Generator, torch.Generator]] = {}
    # req_id -> (live output list, position of its pending -1 placeholder)
    pending: dict[int, tuple[list[int], int]] = {}
    st = FullStats()

    for step in range(steps):
        update = sim.step()  # appends one token per live request, then churns
        rows = sim.batch.rows()
        batch = len(rows)
        # Async placeholders from the previous step become real tokens, in place: also for a
        # request that left the batch this step (its token was sampled and still arrives), so
        # a list that comes back on a resume holds placeholders only as a suffix, the engine
        # contract the processors check (docs/semantics.md, "Bad input").
        for rid, (out, pos) in list(pending.items()):
            del pending[rid]
            if pos < len(out) and out[pos] == -1:
                out[pos] = rng.choice(HOT_IDS) if rng.random() < 0.5 else rng.randrange(vocab)
                st.placeholders_filled += 1
        # Occasional in-place shrink (KV-load failure / spec over-allocation in vLLM).
        for r in rows:
            if r.output_token_ids and rng.random() < shrink_prob:
                del r.output_token_ids[-rng.choice((1, 2)) :]
                st.shrinks += 1
        for r in rows:
            out = r.output_token_ids
            if out and out[-1] == -1:
                pending[r.req_id] = (out, len(out) - 1)
                st.placeholders_seen += 1

        st.steps += 1
        st.max_batch = max(st.max_batch, batch)
        if update is None:
            st.none_steps += 1
        else:
            st.added += len(update.added)
            st.removed += len(update.removed)
            for _, _, d in update.moved:
                st.uni_moves += d is MoveDirectionality.UNIDIRECTIONAL
                st.swaps += d is MoveDirectionality.SWAP
            _count_allowed_moves(ref_allowed.allowed, update, st)

        for p in ours.all:
            p.update_state(update)
        for p in ref.all:
            p.update_state(update)

        st.allowed_rows += len(ref_allowed.allowed)
        st.bad_word_rows += len(ref_bad.bad_words)
        for words, out in ref_bad.bad_words.values():
            for w in words:
                if len(w) == 1:
                    st.single_bans += 1
                elif len(w) <= len(out) + 1 and out[len(out) - len(w) + 1 :] == w[:-1]:
                    st.prefix_bans += 1
        st.penalty_rows += len(ref_pen.penalties)
        for _, prompt, out in ref_pen.penalties.values():
            st.prompt_output_overlap += bool(prompt and set(prompt) & set(out))

        # Phase 1: every non-argmax-invariant processor. Exactly equal.
        logits = random_logits(rng, g, batch, vocab)
        a, b = logits.clone(), logits.clone()
        for p in ours.non_argmax_invariant:
            a = p.apply(a)
        for p in ref.non_argmax_invariant:
            b = p.apply(b)
        if not torch.equal(a, b):
            st.phase1_mismatch_steps += 1
            diff = (a != b).nonzero()[:3].tolist()
            st.fail(
                f"step {step}: phase 1 differs at {int((a != b).sum())} positions "
                f"(batch {batch}), e.g. {[(r, c, float(a[r, c]), float(b[r, c])) for r, c in diff]}"
            )

        # Phase 2 in isolation: MinP on the phase-1 output. Equal up to ties.
        min_p = torch.tensor([float(np.float32(r.params.min_p)) for r in rows])
        x, y = a.clone(), a.clone()
        for p in ours.argmax_invariant:
            x = p.apply(x)
        for p in ref.argmax_invariant:
            y = p.apply(y)
        ties, bad = classify_min_p_diffs(a, x, y, min_p)
        st.min_p_elems += a.numel()
        st.min_p_ties += ties
        st.min_p_bad += bad
        if bad:
            st.fail(f"step {step}: MinP differs at {bad} non-tie positions")

        if batch and step % sampler_every == 0:
            _check_sampler(st, step, seed, rows, vocab, ours, ref, gens, rng, g)
    return st


def _check_sampler(st, step, seed, rows, vocab, ours, ref, gens, rng, g) -> None:
    """The whole pipeline on both sides: tokens, processed logits and logprobs tensors."""
    batch = len(rows)
    mode = LOGPROBS_MODES[st.sampler_checks % len(LOGPROBS_MODES)]
    gen_ours, gen_ref = {}, {}
    for i, r in enumerate(rows):
        if r.req_id not in gens:
            s = seed * 1_000_003 + r.req_id
            gens[r.req_id] = (torch.Generator().manual_seed(s), torch.Generator().manual_seed(s))
        gen_ours[i], gen_ref[i] = gens[r.req_id]
    params = [r.params for r in rows]
    md_ours = SamplingMetadata.from_params(params, vocab, generators=gen_ours)
    md_ref = SamplingMetadata.from_params(params, vocab, generators=gen_ref)
    q = quantised_logits(g, batch, vocab)
    bitmask = indices = None
    if rng.random() < 0.6:
        bitmask, indices = grammar_bitmask(rng, g, batch, vocab)
        st.bitmask_checks += 1
        st.bitmask_index_kinds.add(
            "none" if indices is None else type(indices).__name__ + f"/{type(bitmask).__name__}"
        )
    out = Sampler(ours, mode)(q.clone(), md_ours, bitmask, indices)
    out_ref = ReferenceSampler(ref, mode)(q.clone(), md_ref, bitmask, indices)
    st.sampler_checks += 1
    st.sampler_modes.add(mode)
    st.random_rows += sum(p.temperature > 0 for p in params)
    mism = int((out.sampled_token_ids != out_ref.sampled_token_ids).sum())
    st.token_mismatches += mism
    if mism:
        st.fail(f"step {step}: sampler tokens differ in {mism}/{batch} rows ({mode})")
    if not torch.equal(out.logits, out_ref.logits):
        st.sampler_logits_mismatches += 1
        st.fail(f"step {step}: sampler processed logits differ ({mode})")
    lp, lp_ref = out.logprobs_tensors, out_ref.logprobs_tensors
    if md_ours.max_num_logprobs is None:
        if lp is not None or lp_ref is not None:
            st.logprobs_mismatches += 1
            st.fail(f"step {step}: logprobs returned without being asked for")
        return
    st.logprobs_checks += 1
    if lp is None or lp_ref is None:
        st.logprobs_mismatches += 1
        st.fail(f"step {step}: logprobs missing ({mode})")
        return
    same = (
        torch.equal(lp.logprob_token_ids, lp_ref.logprob_token_ids)
        and nan_equal(lp.logprobs, lp_ref.logprobs)
        and torch.equal(lp.selected_token_ranks, lp_ref.selected_token_ranks)
    )
    n = md_ours.max_num_logprobs
    if lp.logprobs.shape != (batch, n + 1) or lp.logprob_token_ids.dtype != torch.int32:
        same = False
    if not same:
        st.logprobs_mismatches += 1
        st.fail(f"step {step}: logprobs tensors differ ({mode}, n={n})")


def assert_full_clean(st: FullStats) -> None:
    assert not st.failures, "\n".join(st.failures)
    assert st.phase1_mismatch_steps == 0
    assert st.min_p_bad == 0
    assert st.token_mismatches == 0
    assert st.sampler_logits_mismatches == 0
    assert st.logprobs_mismatches == 0
    assert st.min_p_ties <= max(3, st.min_p_elems // 200_000), st


# --- the harness, parametrised by processor set -----------------------------------------------


BUILTIN_CONFIGS = [
    # seed, max_num_seqs, vocab, steps, target_batch
    pytest.param(0, 8, 257, 1500, None, id="B8-s0"),
    pytest.param(1, 8, 300, 1000, 5, id="B8-s1-target5"),
    pytest.param(2, 64, 512, 500, None, id="B64-s2"),
    pytest.param(3, 64, 257, 400, 40, id="B64-s3-target40"),
    pytest.param(4, 256, 384, 150, None, id="B256-s4"),
    pytest.param(5, 1024, 257, 40, None, id="B1024-s5"),
]


FULL_CONFIGS = [
    # seed, max_num_seqs, vocab, steps, target_batch
    pytest.param(0, 8, 64, 3000, None, id="B8-V64-s0"),
    pytest.param(1, 16, 300, 1800, 12, id="B16-V300-s1"),
    pytest.param(2, 32, 64, 1200, 24, id="B32-V64-s2"),
    pytest.param(3, 64, 257, 600, None, id="B64-V257-s3"),
    pytest.param(4, 128, 96, 300, 100, id="B128-V96-s4"),
    pytest.param(5, 256, 128, 200, None, id="B256-V128-s5"),
    pytest.param(6, 256, 300, 160, 200, id="B256-V300-s6"),
    pytest.param(7, 1024, 200, 40, None, id="B1024-V200-s7"),
]


@dataclass(frozen=True)
class ProcessorSet:
    """A processor set's churn (seed, max_num_seqs, vocab, steps, target_batch -> stats) and
    the check that its stats are clean."""

    churn: Callable[[int, int, int, int, int | None], Any]
    assert_clean: Callable[[Any], None]
    configs: list[Any]


PROCESSOR_SETS = {
    "builtins": ProcessorSet(
        lambda seed, max_num_seqs, vocab, steps, target: run_churn(
            seed, max_num_seqs, vocab, steps, target_batch=target
        ),
        assert_builtins_clean,
        BUILTIN_CONFIGS,
    ),
    "full": ProcessorSet(
        lambda seed, max_num_seqs, vocab, steps, target: run_full_churn(
            seed,
            max_num_seqs,
            vocab,
            steps,
            target_batch=target,
            sampler_every=5 if steps > 20 else 3,
        ),
        assert_full_clean,
        FULL_CONFIGS,
    ),
}

CONFIGS = [
    pytest.param(name, *c.values, id=f"{name}-{c.id}")
    for name, s in PROCESSOR_SETS.items()
    for c in s.configs
]


@pytest.mark.parametrize(
    ("processors", "seed", "max_num_seqs", "vocab", "steps", "target"), CONFIGS
)
def test_churn_matches_reference(processors, seed, max_num_seqs, vocab, steps, target):
    s = PROCESSOR_SETS[processors]
    st = s.churn(seed, max_num_seqs, vocab, steps, target)
    s.assert_clean(st)
    assert st.max_batch >= min(max_num_seqs, target or max_num_seqs) * 3 // 4
    assert st.sampler_checks > 0 and st.random_rows > 0


@pytest.mark.parametrize("processors", list(PROCESSOR_SETS))
def test_churn_exercises_everything(processors):
    """The churn is not vacuous: every kind of batch change happened and every processor of
    the set fired."""
    if processors == "builtins":
        st = run_churn(11, 16, 257, 800, sampler_every=10)
        assert_builtins_clean(st)
        assert st.none_steps > 20, st
        assert st.added > 50, st
        assert st.removed > 5, st
        assert st.uni_moves > 10, st
        assert st.swaps > 20, st
        assert st.one_sided_bias_swaps > 0, st
        assert st.min_tokens_expiries > 20, st
        assert st.min_tokens_expiries_on_none > 0, st
        assert st.stop_masks > 100, st
        assert st.bias_rows > 100, st
        assert st.min_p_rows > 100 and st.min_p_masked > 1000, st
        assert st.sampler_checks > 50 and st.random_rows > 200, st
    else:
        st = run_full_churn(31, 16, 96, 1000, sampler_every=4)
        assert_full_clean(st)
        assert st.none_steps > 10, st
        assert st.added > 50 and st.removed > 5, st
        assert st.uni_moves > 10 and st.swaps > 20, st
        assert st.allowed_rows > 200, st
        assert st.allowed_swaps_one_sided > 0 and st.allowed_swaps_two_sets > 0, st
        assert st.allowed_condense_moves > 0, st
        assert st.bad_word_rows > 500 and st.single_bans > 200 and st.prefix_bans > 200, st
        assert st.penalty_rows > 1000 and st.prompt_output_overlap > 200, st
        assert st.placeholders_seen > 100 and st.placeholders_filled > 50, st
        assert st.shrinks > 20, st
        assert st.sampler_modes == set(LOGPROBS_MODES), st
        assert st.bitmask_checks > 20 and st.logprobs_checks > 20, st
        assert {
            "none",
            "list/Tensor",
            "ndarray/Tensor",
            "Tensor/Tensor",
        } <= st.bitmask_index_kinds, st


# --- the comparison can fail: builtins --------------------------------------------------------


class _WrongBias(RefLogitBiasLogitsProcessor):
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, bias in self.biases.items():
            for token, value in bias.items():
                logits[index, token] += value + 0.5
        return logits


class _NoRecheckOnNone(RefMinTokensLogitsProcessor):
    """Forgets to re-check output lengths on ``update_state(None)``."""

    def update_state(self, batch_update):
        if batch_update is not None:
            super().update_state(batch_update)


class _WrongMinP(RefMinPLogitsProcessor):
    @staticmethod
    def new_state(params, _prompt, _output):
        return float(np.float32(params.min_p)) * 0.5 or None


def _refs_with(cls: type) -> RefLogitsProcessors:
    cfg = EngineConfig(max_num_seqs=8, vocab_size=257)
    base = [RefMinTokensLogitsProcessor, RefLogitBiasLogitsProcessor, RefMinPLogitsProcessor]
    for i, b in enumerate(base):
        if issubclass(cls, b):
            base[i] = cls
    return RefLogitsProcessors(c(cfg, torch.device("cpu"), False) for c in base)


@pytest.mark.parametrize("broken", [_WrongBias, _NoRecheckOnNone])
def test_corrupted_reference_is_caught_phase1(broken):
    st = run_churn(21, 8, 257, 300, sampler_every=10**9, ref_procs=_refs_with(broken))
    assert st.phase1_mismatch_steps > 0


def test_corrupted_reference_is_caught_min_p():
    st = run_churn(22, 8, 257, 60, sampler_every=10**9, ref_procs=_refs_with(_WrongMinP))
    assert st.min_p_bad > 0


def test_corrupted_generators_are_caught():
    st = run_churn(23, 8, 257, 30, sampler_every=3, ref_generator_seed_offset=1)
    assert st.token_mismatches > 0


def test_direct_corruption_torch_equal_false():
    """The simplest form: a reference with a wrong bias gives different logits."""
    cfg = EngineConfig(max_num_seqs=4, vocab_size=32)
    ours = build_logitsprocs(cfg, "cpu", False)
    ref = _refs_with(_WrongBias)
    p = SamplingParams(logit_bias={3: 1.0}, max_tokens=None)
    upd = BatchUpdate(batch_size=1, removed=[], added=[(0, p, [1], [])], moved=[])
    for procs in (ours, ref):
        for proc in procs.all:
            proc.update_state(upd)
    logits = torch.zeros(1, 32)
    a = logits.clone()
    for proc in ours.non_argmax_invariant:
        a = proc.apply(a)
    b = logits.clone()
    for proc in ref.non_argmax_invariant:
        b = proc.apply(b)
    assert not torch.equal(a, b)


# --- the comparison can fail: full ------------------------------------------------------------


def test_reference_counting_placeholders_is_caught(monkeypatch):
    """A reference that counts the async ``-1`` placeholder as a token (instead of ignoring it,
    as vLLM does) must disagree with ours: the placeholder handling is really exercised."""

    def apply_counting_minus_one(self, logits):
        vocab = logits.shape[1]
        for index, ((rep, freq, pres), prompt, output) in self.penalties.items():
            row = logits[index]
            counts = torch.zeros(vocab, dtype=torch.float32)
            for t in output:
                counts[t if t >= 0 else vocab - 1] += 1  # wrong: -1 counted as the last id
            mask = counts > 0
            for t in prompt or ():
                mask[t] = True
            new = torch.where(mask, torch.where(row > 0, row / rep, row * rep), row)
            new -= torch.tensor(freq) * counts
            new -= torch.tensor(pres) * (counts > 0)
            row.copy_(new)
        return logits

    monkeypatch.setattr(RefPenaltiesLogitsProcessor, "apply", apply_counting_minus_one)
    st = run_full_churn(41, 8, 64, 150, sampler_every=10**9)
    assert st.phase1_mismatch_steps > 0


def test_reference_with_vllm_allowed_swap_bug_is_caught(monkeypatch):
    """A reference with vLLM 0.25.1's allowed-mask SWAP aliasing (both rows end up with the
    second row's set) must disagree with ours."""
    from logitsproc_rs import reference

    orig = reference.process_dict_updates

    def buggy(entries, update, new_state):
        if new_state is not RefAllowedTokenIdsLogitsProcessor.new_state or update is None:
            return orig(entries, update, new_state)
        swaps = [m for m in update.moved if m[2] is MoveDirectionality.SWAP]
        changed = orig(entries, update, new_state)
        for a, b, _ in swaps:  # after the exchange a holds b's old set: copy it onto b too
            if a in entries:
                entries[b] = entries[a]
            else:
                entries.pop(b, None)
        return changed

    monkeypatch.setattr(reference, "process_dict_updates", buggy)
    st = run_full_churn(42, 16, 96, 300, sampler_every=10**9)
    assert st.phase1_mismatch_steps > 0


def test_reference_matching_bad_words_once_is_caught(monkeypatch):
    """A reference that matches bad words against a snapshot of the output taken when the
    request was added (not the live list) must disagree: re-evaluation is really exercised."""

    def frozen(params, _prompt, output):
        words = getattr(params, "bad_words_token_ids", None)
        return ([list(w) for w in words], list(output)) if words else None

    monkeypatch.setattr(RefBadWordsLogitsProcessor, "new_state", staticmethod(frozen))
    st = run_full_churn(43, 8, 64, 150, sampler_every=10**9)
    assert st.phase1_mismatch_steps > 0


# --- focused cases the churn cannot reach -----------------------------------------------------


def test_min_p_ties_are_classified():
    """Values planted exactly at max + ln(min_p): any disagreement is a tie, never 'bad'."""
    cfg = EngineConfig(max_num_seqs=64, vocab_size=257)
    ours = build_logitsprocs(cfg, "cpu", False)
    ref = build_reference_logitsprocs(cfg, "cpu")
    g = torch.Generator().manual_seed(5)
    min_ps = [0.05, 0.1, 0.3, 0.77] * 16
    added = [(i, SamplingParams(min_p=m, max_tokens=None), None, []) for i, m in enumerate(min_ps)]
    upd = BatchUpdate(batch_size=64, removed=[], added=added, moved=[])
    for procs in (ours, ref):
        for proc in procs.all:
            proc.update_state(upd)
    x = torch.randn(64, 257, generator=g) * 3
    mp = torch.tensor(min_ps, dtype=torch.float32)
    thr = x.amax(dim=-1) + torch.log(mp)
    for k in range(8):  # the threshold and its float32 neighbours
        x[:, 100 + k] = torch.nextafter(thr, thr + (1 if k % 2 else -1) * math.inf)
        if k >= 4:
            x[:, 100 + k] = thr
    a = next(iter(ours.argmax_invariant)).apply(x.clone())
    b = next(iter(ref.argmax_invariant)).apply(x.clone())
    ties, bad = classify_min_p_diffs(x, a, b, mp)
    assert bad == 0
    assert ties > 0  # the two forms really do disagree at the threshold (about 1 in 3 here)
    assert torch.equal(a[:, :100], b[:, :100]) and torch.equal(a[:, 108:], b[:, 108:])


class _Dir:
    """A vLLM-like enum member: only ``name`` matters."""

    def __init__(self, name: str) -> None:
        self.name = name


def test_vllm_shaped_objects_and_prefilled_output():
    """Duck-typed params / moves, and a MinTokens entry that is never created because the
    (resumed) request already has >= min_tokens outputs."""
    cfg = EngineConfig(max_num_seqs=4, vocab_size=16)
    ours = build_logitsprocs(cfg, "cpu", False)
    ref = build_reference_logitsprocs(cfg, "cpu")

    def params(**kw):
        base = dict(min_p=0.0, logit_bias=None, min_tokens=0, all_stop_token_ids=set())
        base.update(kw)
        return SimpleNamespace(**base)

    long_out, short_out = [4, 4, 4], [4]
    added = [
        (0, params(min_tokens=3, all_stop_token_ids={2}), [1], long_out),  # already done
        (1, params(min_tokens=3, all_stop_token_ids={2, 3}), None, short_out),
        (2, params(logit_bias={5: -2.0}, min_p=0.5), [1], []),
    ]
    steps = [
        SimpleNamespace(batch_size=3, removed=[], added=added, moved=[]),
        # one-sided SWAP: slot 0 has no state anywhere, slot 2 has a bias and a min_p
        SimpleNamespace(batch_size=3, removed=[], added=[], moved=[(2, 0, _Dir("SWAP"))]),
        None,  # slot 1's output reaches min_tokens: MinTokens expires on a None step
        # slot 0 finishes, slot 2 is condensed into it: its stale state must be discarded
        SimpleNamespace(batch_size=2, removed=[], added=[], moved=[(2, 0, _Dir("UNIDIRECTIONAL"))]),
    ]
    g = torch.Generator().manual_seed(0)
    ref_by_type = {type(p): p for p in ref.all}
    for i, upd in enumerate(steps):
        if upd is None:
            short_out.extend([4, 4])
        for procs in (ours, ref):
            for proc in procs.all:
                proc.update_state(upd)
        n = upd.batch_size if upd is not None else 3
        logits = torch.randn(n, 16, generator=g)
        outs = []
        for procs in (ours, ref):
            y = logits.clone()
            for proc in [*procs.non_argmax_invariant, *procs.argmax_invariant]:
                y = proc.apply(y)
            outs.append(y)
        assert torch.equal(outs[0], outs[1]), f"step {i}"
        if i == 0:
            assert list(ref_by_type[RefMinTokensLogitsProcessor].min_toks) == [1]
            assert outs[0][1, 2] == outs[0][1, 3] == -math.inf and outs[0][0, 2] != -math.inf
        if i == 1:
            assert list(ref_by_type[RefLogitBiasLogitsProcessor].biases) == [0]
        if i == 2:
            assert not ref_by_type[RefMinTokensLogitsProcessor].min_toks
    assert not ref_by_type[RefLogitBiasLogitsProcessor].biases
    assert not ref_by_type[RefMinPLogitsProcessor].min_p

"""Differential churn test of the whole pipeline: every processor at once against the reference.

``build_logitsprocs`` (allowed ids, bad words, MinTokens, LogitBias, MinP, penalties) against
``build_reference_logitsprocs`` (the plain per-request versions, which rebuild penalty counts
and bad-word matches from the live lists on every ``apply``), driven by a seeded
``ChurnSimulator`` through adds into freed slots, tail removals, condense (UNIDIRECTIONAL)
moves, reorder SWAPs and ``None`` steps. Output lists grow every step from a token stream that
keeps hitting bad-word prefixes, stop tokens and prompt ids; some tokens arrive as async
``-1`` placeholders that are filled in place on the next step; now and then an output list
shrinks in place (vLLM's order: after the step's append, before ``update_state``).

Every step both sides get the same ``update_state`` call and then the same fresh logits:

* the non-argmax-invariant phase must agree exactly (``torch.equal``, ``-inf`` included);
* MinP applied to that must agree up to the ties of ``test_differential.TIE_TOL``;
* every few steps the full ``Sampler`` and ``ReferenceSampler`` must agree on the sampled
  tokens, the processed logits and the logprobs tensors (all four logprobs modes in turn),
  with a grammar bitmask on some rows (with or without ``indices``) and an identically
  seeded generator per request on each side.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from test_differential import (
    BIAS_VALUES,
    EOS,
    MIN_P_VALUES,
    MIN_TOKENS_VALUES,
    STOP_POOL,
    TEMPERATURES,
    classify_min_p_diffs,
    quantised_logits,
    random_logits,
)

from logitsproc_rs import (
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
    RefPenaltiesLogitsProcessor,
    build_reference_logitsprocs,
)
from logitsproc_rs.sampler import LOGPROBS_MODES
from logitsproc_rs.simulate import ChurnSimulator, Request

# Bad words are drawn from these ids, and the token stream returns to them often, so
# multi-token prefixes match all the time.
HOT_IDS = (20, 21, 22, 23, 24, 25)
# Grid values only: dividing / multiplying the 1/8-quantised sampler logits by these, and
# subtracting multiples of them, keeps every logit difference far (>= ~1e-4) from
# T·ln(min_p), so the two MinP forms cannot disagree in the full-sampler comparison.
REPETITION_VALUES = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
FREQ_PRES_VALUES = (-2.0, -1.0, -0.5, 0.0, 0.0, 0.25, 0.5, 1.0, 2.0)
LOGPROBS_VALUES = (None, None, None, 0, 1, 3, 5)


def make_params_factory(vocab: int):
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


PLACEHOLDER_PROB = 0.08


def make_next_token(vocab: int):
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


def nan_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``torch.equal`` that counts NaN == NaN (a fully masked row has NaN logprobs)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


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
        make_params_factory(vocab),
        target_batch=target_batch,
        finish_prob=finish_prob,
        max_tokens=(4, 120),
        next_token=make_next_token(vocab),
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
        live = {r.req_id for r in rows}
        # Async placeholders from the previous step become real tokens, in place.
        for rid, (out, pos) in list(pending.items()):
            del pending[rid]
            if rid in live and pos < len(out) and out[pos] == -1:
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


def assert_clean(st: FullStats) -> None:
    assert not st.failures, "\n".join(st.failures)
    assert st.phase1_mismatch_steps == 0
    assert st.min_p_bad == 0
    assert st.token_mismatches == 0
    assert st.sampler_logits_mismatches == 0
    assert st.logprobs_mismatches == 0
    assert st.min_p_ties <= max(3, st.min_p_elems // 200_000), st


CONFIGS = [
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


@pytest.mark.parametrize(("seed", "max_num_seqs", "vocab", "steps", "target"), CONFIGS)
def test_full_churn_matches_reference(seed, max_num_seqs, vocab, steps, target):
    st = run_full_churn(
        seed, max_num_seqs, vocab, steps, target_batch=target, sampler_every=5 if steps > 20 else 3
    )
    assert_clean(st)
    assert st.max_batch >= min(max_num_seqs, target or max_num_seqs) * 3 // 4
    assert st.sampler_checks > 0 and st.random_rows > 0


def test_full_churn_exercises_everything():
    """The churn is not vacuous: every processor fired and every kind of change happened."""
    st = run_full_churn(31, 16, 96, 1000, sampler_every=4)
    assert_clean(st)
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
    assert {"none", "list/Tensor", "ndarray/Tensor", "Tensor/Tensor"} <= st.bitmask_index_kinds, st


# --- the comparison can fail -------------------------------------------------------------------


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

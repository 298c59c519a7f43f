"""Differential churn test: our processors and ``Sampler`` against ``logitsproc_rs.reference``.

A seeded ``ChurnSimulator`` drives a persistent batch through adds into freed slots, tail
removals, condense (UNIDIRECTIONAL) moves, reorder SWAPs, ``None`` steps and output lists that
grow every step (often with stop tokens). Every step both sides get the same ``update_state``
call and then the same fresh logits:

* the non-argmax-invariant phase (MinTokens, LogitBias) must agree exactly (``torch.equal``,
  ``-inf`` positions included);
* MinP applied to that must agree everywhere except at documented ties (see ``TIE_TOL``);
* every few steps the full ``Sampler`` and ``ReferenceSampler`` must sample the same tokens,
  with an identically seeded ``torch.Generator`` per request on each side.
"""

from __future__ import annotations

import math
import random
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
    ReferenceSampler,
    RefLogitBiasLogitsProcessor,
    RefMinPLogitsProcessor,
    RefMinTokensLogitsProcessor,
    build_reference_logitsprocs,
)
from logitsproc_rs.simulate import ChurnSimulator, Request
from logitsproc_rs.state import LogitsProcessors

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


def make_params_factory(vocab: int):
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


def make_next_token(vocab: int):
    """The token stream hits a stop token (or EOS) of the request ~40% of the time."""

    def next_token(rng: random.Random, req: Request) -> int:
        stops = req.params.all_stop_token_ids
        if stops and rng.random() < 0.4:
            return rng.choice(sorted(stops))
        return rng.randrange(vocab)

    return next_token


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
    ref_procs: LogitsProcessors | None = None,
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
        make_params_factory(vocab),
        target_batch=target_batch,
        finish_prob=finish_prob,
        max_tokens=(4, 160),
        next_token=make_next_token(vocab),
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


def assert_clean(st: ChurnStats) -> None:
    assert not st.failures, "\n".join(st.failures)
    assert st.phase1_mismatch_steps == 0
    assert st.min_p_bad == 0
    assert st.token_mismatches == 0
    assert st.sampler_logits_mismatches == 0
    # Ties are rare with continuous random logits: at most a handful per million positions.
    assert st.min_p_ties <= max(3, st.min_p_elems // 200_000), st


CONFIGS = [
    # seed, max_num_seqs, vocab, steps, target_batch
    pytest.param(0, 8, 257, 1500, None, id="B8-s0"),
    pytest.param(1, 8, 300, 1000, 5, id="B8-s1-target5"),
    pytest.param(2, 64, 512, 500, None, id="B64-s2"),
    pytest.param(3, 64, 257, 400, 40, id="B64-s3-target40"),
    pytest.param(4, 256, 384, 150, None, id="B256-s4"),
    pytest.param(5, 1024, 257, 40, None, id="B1024-s5"),
]


@pytest.mark.parametrize(("seed", "max_num_seqs", "vocab", "steps", "target"), CONFIGS)
def test_churn_matches_reference(seed, max_num_seqs, vocab, steps, target):
    st = run_churn(seed, max_num_seqs, vocab, steps, target_batch=target)
    assert_clean(st)
    assert st.max_batch >= min(max_num_seqs, target or max_num_seqs) * 3 // 4
    assert st.sampler_checks > 0 and st.random_rows > 0


def test_churn_exercises_everything():
    """The churn is not vacuous: every kind of batch change and every processor fired."""
    st = run_churn(11, 16, 257, 800, sampler_every=10)
    assert_clean(st)
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


# --- the comparison can fail ---------------------------------------------------------------


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


def _refs_with(cls: type) -> LogitsProcessors:
    cfg = EngineConfig(max_num_seqs=8, vocab_size=257)
    base = [RefMinTokensLogitsProcessor, RefLogitBiasLogitsProcessor, RefMinPLogitsProcessor]
    for i, b in enumerate(base):
        if issubclass(cls, b):
            base[i] = cls
    return LogitsProcessors(c(cfg, torch.device("cpu"), False) for c in base)


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


# --- focused cases the churn cannot reach ------------------------------------------------------


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

"""The fused ``exact`` tail (``rust/src/sampling/exact.rs``, ``_tail.fused_exponential_``,
issue 41): temperature, min-p, top-k / top-p and vLLM 0.25.1's exponential race in one Rust pass
per row, torch's softmax only for rows the race cannot certify without it. Against ``sampling=
"sort"`` (vLLM's torch code as it is): the same tokens, the same processed logits, the same
generator states after, over long churn with persistent seeded generators; the rows the race
leaves to torch's softmax (forced here with a margin no race meets) and the rows only the sort
can mask give the same too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from logitsproc_rs import BatchUpdate, EngineConfig, SamplingParams, build_logitsprocs
from logitsproc_rs import _tail as tail
from logitsproc_rs import sampler as sampler_module
from logitsproc_rs.builtin.epsilon_cutoff import EpsilonCutoffLogitsProcessor
from logitsproc_rs.builtin.eta_cutoff import EtaCutoffLogitsProcessor
from logitsproc_rs.builtin.top_n_sigma import TopNSigmaLogitsProcessor
from logitsproc_rs.builtin.typical_p import TypicalPLogitsProcessor
from logitsproc_rs.builtin.xtc import XTCLogitsProcessor
from logitsproc_rs.sampler import Sampler, SamplingMetadata

CFG = EngineConfig(max_num_seqs=24, vocab_size=3_000)


OPT_IN = [
    TopNSigmaLogitsProcessor,
    TypicalPLogitsProcessor,
    EpsilonCutoffLogitsProcessor,
    EtaCutoffLogitsProcessor,
    XTCLogitsProcessor,
]


def _params(rng: np.random.Generator, steps: str) -> SamplingParams:
    """``steps``: ``"plain"`` (min-p, top-k, top-p), ``"certified"`` (and the truncations the
    pass certifies: top-n-sigma, epsilon, eta), ``"all"`` (and typical-p, XTC)."""
    kind = int(rng.integers(0, 4))
    extra: dict[str, float] = {}
    if steps != "plain":
        extra = {
            "top_n_sigma": float(rng.choice([0.0, 0.0, 1.0, 2.5])),
            "epsilon_cutoff": float(rng.choice([0.0, 0.0, 3e-4, 0.01])),
            "eta_cutoff": float(rng.choice([0.0, 0.0, 3e-4, 0.01])),
        }
    if steps == "all":
        extra |= {
            "typical_p": float(rng.choice([1.0, 1.0, 0.9, 0.5])),
            "xtc_probability": float(rng.choice([0.0, 0.0, 0.5, 1.0])),
            "xtc_threshold": float(rng.choice([0.1, 0.01, 0.002])),
        }
    return SamplingParams(
        temperature=0.0 if kind == 0 else float(rng.uniform(0.3, 1.5)),
        top_k=int(rng.choice([0, 0, 1, 5, 40, 2_999])),
        top_p=float(rng.choice([1.0, 1.0, 0.95, 0.5, 0.1])),
        min_p=float(rng.choice([0.0, 0.0, 0.05, 0.3])),
        seed=int(rng.integers(0, 1_000)) if kind == 3 else None,
        logprobs=int(rng.choice([0, 3])) if rng.random() < 0.3 else None,
        **extra,
    )


def _logits(rng: np.random.Generator, rows: int) -> torch.Tensor:
    """Peaked rows, flat rows (top-p boundaries the sort must decide), and rows of few distinct
    values (ties everywhere)."""
    x = rng.normal(0, 3, (rows, CFG.vocab_size)).astype(np.float32)
    for r in range(rows):
        kind = r % 5
        if kind == 1:
            x[r] *= np.float32(0.05)
        elif kind == 2:
            x[r] = np.round(x[r])
    return torch.from_numpy(x)


def _churn(steps: int, seed: int, kinds: str) -> tuple[int, int]:
    """Two samplers, ``sort`` and ``exact``, over the same churn; each keeps its own seeded
    generators (made once per request) and draws its unseeded rows from torch's default
    generator, both sides from the same state. Returns the steps with a randomly sampled row
    (an all-greedy batch stops at the argmax) and the rows drawn."""
    rng = np.random.default_rng(seed)
    sides = {}
    for sampling in ("sort", "exact"):
        extra = [] if kinds == "plain" else OPT_IN
        procs = build_logitsprocs(CFG, "cpu", False, custom_logitsprocs=extra)
        sides[sampling] = (procs, Sampler(procs, "processed_logprobs", sampling=sampling), {})
    params: list[SamplingParams] = []
    serial: list[int] = []
    made = 0
    sampled = drawn = 0
    for step in range(steps):
        added = []
        if len(params) < 20:
            n = int(rng.integers(1, 5))
            for _ in range(n):
                params.append(_params(rng, kinds))
                serial.append(made)
                made += 1
                added.append((len(params) - 1, params[-1], [1, 2], []))
        else:
            r = int(rng.integers(0, len(params)))
            params[r] = _params(rng, kinds)
            serial[r] = made
            made += 1
            added.append((r, params[r], [3], []))
        update = BatchUpdate(len(params), [], added, [])
        logits = _logits(rng, len(params))
        sampled += any(p.temperature > 0 for p in params)
        drawn += sum(p.temperature > 0 for p in params)
        start = torch.get_rng_state()
        outs, after = {}, {}
        for sampling, (procs, sampler, gens) in sides.items():
            procs.update_state(update)
            for r, p in enumerate(params):
                if p.seed is not None and serial[r] not in gens:
                    gens[serial[r]] = torch.Generator().manual_seed(p.seed)
            row_gens = {
                r: gens[serial[r]]
                for r, p in enumerate(params)
                if p.seed is not None and p.temperature > 0
            }
            md = SamplingMetadata.from_params(params, CFG.vocab_size, "cpu", row_gens)
            torch.set_rng_state(start)
            outs[sampling] = sampler(logits.clone(), md)
            after[sampling] = torch.get_rng_state()
        a, b = outs["sort"], outs["exact"]
        assert torch.equal(a.sampled_token_ids, b.sampled_token_ids), step
        assert torch.equal(a.logits, b.logits), step
        assert a.logprobs_tensors is not None or b.logprobs_tensors is None
        if a.logprobs_tensors is not None:
            assert b.logprobs_tensors is not None
            assert torch.equal(a.logprobs_tensors.logprobs, b.logprobs_tensors.logprobs)
        assert torch.equal(after["sort"], after["exact"]), step
        for key, g in sides["sort"][2].items():
            assert torch.equal(g.get_state(), sides["exact"][2][key].get_state()), (step, key)
    return sampled, drawn


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the fused exact pass's calls (the Sampler's own name for it)."""
    calls: list[int] = []
    real = sampler_module.fused_exponential_

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sampler_module, "fused_exponential_", counting)
    return calls


def test_fused_exact_equals_the_sort_over_churn(spy: list[int]) -> None:
    before = (tail.TAIL_STATS.rows_sorted, tail.TAIL_STATS.rows_softmax)
    sampled, _ = _churn(60, 11, "plain")
    assert len(spy) == sampled > 50  # every step that samples went through the fused pass
    assert tail.TAIL_STATS.rows_sorted > before[0]  # flat rows: the sort decided some
    # Torch's softmax is the exception: the rows the sort masked and a rare close race.
    sorted_rows = tail.TAIL_STATS.rows_sorted - before[0]
    assert tail.TAIL_STATS.rows_softmax - before[1] <= sorted_rows + 10


def test_certified_truncations_stay_in_the_pass(spy: list[int]) -> None:
    """top-n-sigma, epsilon and eta are decided in Rust where no entry is near their threshold
    (nearly always): few rows need torch's softmax, and ``exact`` equals the sort."""
    before = (tail.TAIL_STATS.rows_softmax, tail.TAIL_STATS.rows_sorted)
    sampled, drawn = _churn(40, 7, "certified")
    assert len(spy) == sampled > 30
    softmax = tail.TAIL_STATS.rows_softmax - before[0]
    sorted_rows = tail.TAIL_STATS.rows_sorted - before[1]
    # The flat and tied rows of ``_logits`` sit on thresholds on purpose; most rows do not.
    assert softmax - sorted_rows < drawn // 4, (softmax, sorted_rows, drawn)


def test_typical_p_and_xtc_rows_are_left_to_the_processors(spy: list[int]) -> None:
    """typical-p and a firing XTC are not certified in Rust: their rows leave the pass after
    min-p and go through the processors' own torch steps (XTC with the draws the plan took),
    then top-k / top-p and torch's softmax; ``exact`` still equals the sort, the XTC streams
    included."""
    before = tail.TAIL_STATS.rows_softmax
    sampled, _ = _churn(30, 5, "all")
    assert len(spy) == sampled > 20
    assert tail.TAIL_STATS.rows_softmax - before > 30


def _separate(logits: torch.Tensor, temp, log_min_p, top_k, top_p, gens, need) -> torch.Tensor:
    """The separate steps as the ``Sampler`` runs them (min-p: its processor's rule, which
    leaves a row holding +inf alone, as vLLM's NaN softmax does)."""
    logits.div_(torch.tensor(temp).unsqueeze(1))
    if log_min_p is not None:
        top = logits.amax(dim=-1, keepdim=True)
        cut = (top + torch.tensor(log_min_p).unsqueeze(1)).masked_fill(top == float("inf"), -1e38)
        logits.masked_fill_(logits < cut, float("-inf"))
    tail.mask_top_k_top_p_(logits, top_k, top_p)
    return tail.random_sample_exact(logits.softmax(dim=-1), gens, need)


@pytest.mark.parametrize("margin", [None, 1e300])
def test_rows_left_to_torch_softmax_give_the_same(margin: float | None) -> None:
    """Direct calls, with rows whose softmax is NaN (a NaN, +inf, all -inf), a greedy row that
    only advances its stream, a generator serving two rows; ``margin=1e300`` sends every
    drawn row to torch's softmax and the replay from its stream's state."""
    rng = np.random.default_rng(2)
    rows, vocab = 9, 700
    for trial in range(6):
        x = torch.from_numpy(rng.normal(0, 2, (rows, vocab)).astype(np.float32))
        x[1, 3] = float("nan")
        x[2, 10] = float("inf")
        x[3] = float("-inf")
        temp = [float(t) for t in rng.uniform(0.5, 1.5, rows)]
        log_min_p = [float(np.log(np.float32(0.05)))] * rows
        top_k = torch.tensor([0, 5, 0, 40, 0, 700, 3, 0, 50])
        top_p = torch.tensor([1.0, 0.9, 0.5, 1.0, 0.2, 0.95, 1.0, 0.7, 0.9])
        need = [True] * rows
        need[6] = False
        shared = 100 + trial
        seeds = {4: shared, 7: shared, 8: 9}
        gens_a = {r: torch.Generator().manual_seed(s) for r, s in seeds.items()}
        gens_a[7] = gens_a[4]
        gens_b = {r: torch.Generator().manual_seed(s) for r, s in seeds.items()}
        gens_b[7] = gens_b[4]
        start = torch.get_rng_state()
        want_logits = x.clone()
        want = _separate(want_logits, temp, log_min_p, top_k, top_p, gens_a, need)
        want_state = torch.get_rng_state()
        torch.set_rng_state(start)
        got_logits = x.clone()
        before = tail.TAIL_STATS.rows_softmax
        got = tail.fused_exponential_(
            got_logits, temp, {"log_min_p": log_min_p}, top_k, top_p, gens_b, need, margin=margin
        )
        assert torch.equal(got, want), trial
        torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(torch.get_rng_state(), want_state)
        for r in seeds:
            assert torch.equal(gens_a[r].get_state(), gens_b[r].get_state())
        left = tail.TAIL_STATS.rows_softmax - before
        assert left >= 3  # the NaN, +inf and all -inf rows at least
        if margin is not None:  # all but rows with one finite entry: no rival to beat
            alone = [
                r
                for r in range(rows)
                if need[r]
                and int(torch.isfinite(want_logits[r]).sum()) == 1
                and not bool(want_logits[r].isnan().any() | (want_logits[r] == float("inf")).any())
            ]
            assert left == sum(need) - len(alone)


def test_a_step_the_pass_does_not_have_is_refused() -> None:
    """The bindings read the plan's steps by keyword: one they have no step for is a
    ``ValueError`` naming it, before any row is touched."""
    x = torch.randn(2, 50)
    before = x.clone()
    for call in (
        lambda: tail.fused_exponential_(x, None, {"top_q": [0.5, 0.5]}, None, None, {}, [True] * 2),
        lambda: tail.fused_gumbel_(
            x, None, {"top_q": [0.5, 0.5]}, None, None, [1, 2], [0, 0], [True] * 2
        ),
    ):
        with pytest.raises(ValueError, match="top_q"):
            call()
        assert torch.equal(x, before)

"""The sort-free sampling tail (``_tail.py``, ``rust/src/sampling/``) against vLLM 0.25.1's
torch code (``sampler.apply_top_k_top_p`` + ``random_sample``, the ``sort`` mode):

- kept sets: equal to the sort's on every row (``exact``: the rows the float64 decision cannot
  settle go to the sort, counted), and in ``batch_invariant`` different only on rows the core
  reports as uncertain;
- the margin that decision keeps is checked against torch's own float32 cumulative sums;
- the exact race reads torch's CPU generators: the same tokens as ``random_sample`` and the
  generators left in the same state, with default and seeded streams, shared generators,
  greedy rows that only advance the stream;
- the ``Sampler`` in ``exact`` mode equals ``sort`` mode over many steps (tokens, processed
  logits, logprobs);
- ``batch_invariant``: a request's token does not depend on its batch, the noise equals its
  spec (re-implemented here in numpy), and the sampled distribution is the kept set's
  softmax (chi-square).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_spec_distribution import chi2_quantile

from logitsproc_rs import (
    EngineConfig,
    LogitsProcessors,
    Sampler,
    SamplingMetadata,
    SamplingParams,
    _core,
    build_logitsprocs,
)
from logitsproc_rs import _tail as tail
from logitsproc_rs.errors import InputError
from logitsproc_rs.sampler import apply_top_k_top_p, random_sample

NEG_INF = float("-inf")


def _rows(gen: torch.Generator, rows: int, vocab: int, sigma: float) -> torch.Tensor:
    x = torch.randn(rows, vocab, generator=gen) * sigma
    x[1::5] = x[1::5].round()  # runs of equal values
    x[2::7, ::3] = NEG_INF  # masked entries (min-p, bad words)
    x[3::11] *= 40  # a range past float32's exp: p = 1 still masks the zero probabilities
    return x


def _params(gen: torch.Generator, rows: int, vocab: int):
    k = torch.randint(1, vocab, (rows,), generator=gen)
    k[::3] = vocab  # off
    k[1::9] = 1
    p = torch.rand(rows, generator=gen) * 0.98 + 0.01
    p[1::4] = 1.0  # off
    return k, p


def _kept(x: torch.Tensor) -> torch.Tensor:
    return x > NEG_INF


@pytest.mark.parametrize("vocab", [7, 300, 32_000])
@pytest.mark.parametrize("sigma", [0.5, 2.0, 5.0])
def test_strict_kept_sets_equal_the_sort(vocab: int, sigma: float) -> None:
    gen = torch.Generator().manual_seed(vocab + int(sigma * 10))
    rows = 48 if vocab < 32_000 else 16
    for _ in range(3):
        x = _rows(gen, rows, vocab, sigma)
        k, p = _params(gen, rows, vocab)
        for kk, pp in ((k, p), (k, None), (None, p)):
            want = apply_top_k_top_p(x.clone(), kk, pp, None if kk is None else int(kk.max()))
            before = tail.TAIL_STATS.rows_sorted
            got = tail.mask_top_k_top_p_(x.clone(), kk, pp)
            assert torch.equal(_kept(got), _kept(want))
            assert torch.equal(got, want)  # kept entries keep their values
            if pp is None:
                assert tail.TAIL_STATS.rows_sorted == before  # top-k alone never needs it


def test_flat_rows_are_decided_from_their_sorted_values() -> None:
    """Rows only torch's float32 arithmetic on the sorted row can decide (flat rows, the
    boundary within the margin) are masked from their values sorted in Rust and vLLM's torch
    steps on them, not torch's sort: the same kept sets, bitwise. Rows with a run of equal
    values across the boundary still go to torch's sort."""
    gen = torch.Generator().manual_seed(5)
    for vocab in (32_000, 151_936):
        x = torch.randn(32, vocab, generator=gen) * 0.2
        x[30:] = (x[30:] * 4).round()  # few distinct values: ties at any boundary
        x[3, ::4] = NEG_INF
        k = torch.full((32,), vocab)
        k[4] = vocab // 2
        p = torch.rand(32, generator=gen) * 0.8 + 0.1
        want = apply_top_k_top_p(x.clone(), k, p, int(k.max()))
        before = (tail.TAIL_STATS.rows_sorted, tail.TAIL_STATS.rows_torch_sorted)
        got = tail.mask_top_k_top_p_(x.clone(), k, p)
        assert torch.equal(got, want)
        sorted_rows = tail.TAIL_STATS.rows_sorted - before[0]
        torch_sorted = tail.TAIL_STATS.rows_torch_sorted - before[1]
        assert sorted_rows >= 8  # the case under test: the float64 decision could not stand
        assert 2 <= torch_sorted < sorted_rows  # the tied rows, and only a few others


def test_torch_cumsums_stay_well_inside_the_margin() -> None:
    """The float64 decision stands for torch's only if torch's float32 cumulative sums are
    within the margin of the exact ones: measured here on flat rows at the largest vocabulary
    (the worst case: the most float32 terms), at the masses top-p compares with."""
    gen = torch.Generator().manual_seed(3)
    worst = 0.0
    for vocab, sigma in ((151_936, 0.5), (151_936, 2.0), (32_000, 1.0)):
        x = torch.randn(4, vocab, generator=gen) * sigma
        xs = x.sort(dim=-1).values
        torch_cum = xs.softmax(dim=-1).cumsum(dim=-1).double()
        e = (xs.double() - xs.double().amax(-1, keepdim=True)).exp()
        exact = (e / e.sum(-1, keepdim=True)).cumsum(dim=-1)
        for thr in (0.01, 0.1, 0.5, 0.9, 0.99):
            near = (exact - thr).abs() < 0.01
            diff = (torch_cum - exact).abs()[near].max().item()
            worst = max(worst, diff / _core.top_p_margin(thr))
    assert worst < 0.25, f"torch's cumsum error reached {worst:.2f} of the margin"


def test_non_strict_differs_only_on_uncertain_rows() -> None:
    gen = torch.Generator().manual_seed(11)
    differing = uncertain_total = 0
    for sigma in (0.5, 1.0, 3.0):
        x = _rows(gen, 64, 20_000, sigma)
        k, p = _params(gen, 64, 20_000)
        want = apply_top_k_top_p(x.clone(), k, p, int(k.max()))
        got = x.clone()
        left, uncertain = _core.unsafe_mask_top_k_top_p(
            got.data_ptr(), 64, 20_000, 20_000, k.tolist(), p.tolist(), False
        )
        assert left == []
        diff = (_kept(got) != _kept(want)).any(dim=1).nonzero().flatten().tolist()
        assert set(diff) <= set(uncertain), (diff, uncertain)
        differing += len(diff)
        uncertain_total += len(uncertain)
    assert uncertain_total > 0  # the flat rows do reach the margin: the check has teeth


def test_rows_sent_to_the_sort_read_top_k_off_as_the_sort_free_path() -> None:
    """k <= 0 and k above the vocabulary are off on the sort-free path; a row handed to the
    sort (a run of ties cut by the top-p boundary) reads them the same way, not as an index."""
    vocab = 40
    x = torch.zeros(4, vocab)  # all tied: top-p 0.5 cuts the run, so every row goes to the sort
    x[:, :3] = torch.tensor([3.0, 2.0, 1.0])
    p = torch.full((4,), 0.5)
    before = tail.TAIL_STATS.rows_sorted
    got = tail.mask_top_k_top_p_(x.clone(), torch.tensor([0, vocab + 7, -1, vocab]), p)
    assert tail.TAIL_STATS.rows_sorted - before == 4  # the case under test: the sort path
    want = tail.mask_top_k_top_p_(x.clone(), torch.full((4,), vocab), p)
    assert torch.equal(_kept(got), _kept(want))


def test_torch_stream_reproduced_mid_block() -> None:
    tail.check_torch_stream()
    g = torch.Generator().manual_seed(99)
    torch.empty(1_001).exponential_(generator=g)  # leave the state mid-block
    state = bytes(g.get_state().numpy())
    want = torch.empty(3_000).exponential_(generator=g)
    assert torch.equal(torch.tensor(_core.exponential_draws(state, 3_000)), want)


def _gens(seeds: dict[int, int]) -> dict[int, torch.Generator]:
    return {r: torch.Generator().manual_seed(s) for r, s in seeds.items()}


@pytest.mark.parametrize(
    ("rows", "vocab", "seeded"),
    [
        (1, 50, {}),
        (6, 1_000, {1: 5, 4: 7}),
        (5, 3_000, {0: 1, 1: 2, 2: 3, 3: 4, 4: 5}),
        (9, 32_000, {8: 3}),
    ],
)
def test_exact_race_equals_random_sample(rows: int, vocab: int, seeded: dict[int, int]) -> None:
    gen = torch.Generator().manual_seed(rows * vocab)
    for step in range(3):
        x = _rows(gen, rows, vocab, 3.0)
        k, p = _params(gen, rows, vocab)
        x = apply_top_k_top_p(x, k, p, int(k.max()))
        x[x.isinf().all(dim=1)] = 0.0  # a fully masked row is NaN in both; not a case here
        probs = x.softmax(dim=-1)
        need = [(r + step) % 3 != 0 for r in range(rows)]
        g_want, g_got = _gens(seeded), _gens(seeded)
        torch.manual_seed(step)
        want = random_sample(probs.clone(), g_want)
        default_want = torch.get_rng_state()
        torch.manual_seed(step)
        got = tail.random_sample_exact(probs.clone(), g_got, need)
        assert torch.equal(torch.get_rng_state(), default_want)
        for r in seeded:
            assert torch.equal(g_got[r].get_state(), g_want[r].get_state())
        wanted = torch.tensor(need)
        assert torch.equal(got[wanted], want[wanted])


def test_exact_race_with_one_generator_for_two_rows() -> None:
    probs = torch.randn(4, 500, generator=torch.Generator().manual_seed(1)).mul(3).softmax(-1)
    shared_a, shared_b = torch.Generator().manual_seed(8), torch.Generator().manual_seed(8)
    torch.manual_seed(0)
    want = random_sample(probs.clone(), {2: shared_a, 0: shared_a})
    torch.manual_seed(0)
    got = tail.random_sample_exact(probs.clone(), {2: shared_b, 0: shared_b}, [True] * 4)
    assert torch.equal(got, want)
    assert torch.equal(shared_a.get_state(), shared_b.get_state())


CFG = EngineConfig(max_num_seqs=24, vocab_size=2_000)


def _random_params(rng: np.random.Generator) -> SamplingParams:
    kind = rng.integers(0, 4)
    return SamplingParams(
        temperature=0.0 if kind == 0 else float(rng.uniform(0.3, 1.5)),
        top_k=int(rng.choice([0, 1, 5, 40, 1_999])),
        top_p=float(rng.choice([1.0, 0.95, 0.5, 0.1])),
        min_p=float(rng.choice([0.0, 0.0, 0.05])),
        seed=int(rng.integers(0, 1_000)) if kind == 3 else None,
        logprobs=int(rng.choice([0, 3])) if rng.random() < 0.3 else None,
    )


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs", "processed_logits"])
def test_sampler_exact_equals_sort_over_steps(mode: str) -> None:
    from logitsproc_rs import BatchUpdate

    rng = np.random.default_rng(7)
    samplers = {}
    for sampling in ("sort", "exact"):
        procs = build_logitsprocs(CFG, "cpu", False)
        samplers[sampling] = (procs, Sampler(procs, mode, sampling=sampling))
    rows = 0
    params: list[SamplingParams] = []
    for step in range(40):
        added = []
        if rows < 20:
            n = int(rng.integers(1, 5))
            for j in range(n):
                sp = _random_params(rng)
                added.append((rows + j, sp, [1, 2], []))
                params.append(sp)
            rows += n
        else:  # replace one request
            r = int(rng.integers(0, rows))
            params[r] = _random_params(rng)
            added.append((r, params[r], [3], []))
        update = BatchUpdate(rows, [], added, [])
        logits = torch.from_numpy(rng.normal(0, 3, (rows, CFG.vocab_size)).astype(np.float32))
        outs = {}
        for sampling, (procs, sampler) in samplers.items():
            procs.update_state(update)
            gens = {
                r: torch.Generator().manual_seed(p.seed + step)
                for r, p in enumerate(params)
                if p.seed is not None and p.temperature > 0
            }
            md = SamplingMetadata.from_params(params, CFG.vocab_size, "cpu", gens)
            torch.manual_seed(step)
            outs[sampling] = sampler(logits.clone(), md)
        a, b = outs["sort"], outs["exact"]
        assert torch.equal(a.sampled_token_ids, b.sampled_token_ids), step
        assert torch.equal(a.logits, b.logits), step
        if a.logprobs_tensors is not None:
            assert b.logprobs_tensors is not None
            assert torch.equal(a.logprobs_tensors.logprobs, b.logprobs_tensors.logprobs)
            assert torch.equal(
                a.logprobs_tensors.logprob_token_ids, b.logprobs_tensors.logprob_token_ids
            )


def _fmix32(h: np.ndarray) -> np.ndarray:
    h = h.astype(np.uint64)
    m = np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & m
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & m
    h ^= h >> np.uint64(16)
    return h


def test_noise_is_its_spec() -> None:
    """The bits re-implemented from the spec in the module docs of ``noise.rs`` (the Triton
    kernel's too)."""
    tokens = np.arange(0, 152_000, 37, dtype=np.uint64)
    for seed, pos in ((0, 0), (2**63 - 1, 5), (-1, 2**40 + 3), (123456789, 77)):
        s, q = seed % 2**64, pos % 2**64
        m = 0xFFFFFFFF
        h = _fmix32(np.array([(s & m) ^ 0x9E3779B9]))
        h = _fmix32(h ^ np.uint64(s >> 32))
        h = _fmix32(h ^ np.uint64(q & m))
        key = _fmix32(h ^ np.uint64(q >> 32))[0]
        want = _fmix32((_fmix32(tokens ^ key) + key) & np.uint64(m))
        bits, g = _core.gumbel_noise(seed, pos, tokens.tolist())
        assert bits == want.tolist()
        u = ((want >> np.uint64(9)).astype(np.float64) + 0.5) / 2**23
        np.testing.assert_allclose(g, -np.log(-np.log(u)), rtol=2e-6, atol=2e-6)


def _invariant_md(params, positions, keys):
    return SamplingMetadata.from_params(params, CFG.vocab_size, "cpu", None, positions, keys)


def test_batch_invariant_token_ignores_the_batch() -> None:
    """The same request (logits, seed, position) alone, in a batch of 3 at row 2, in a batch
    of 17 at row 9: the same token, step after step; a second run repeats it."""
    sampler = Sampler(LogitsProcessors([]), sampling="batch_invariant")  # the tail alone
    rng = np.random.default_rng(3)
    me = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, seed=1234)
    for position in range(30):
        row = torch.from_numpy(rng.normal(0, 3, CFG.vocab_size).astype(np.float32))
        tokens = []
        for size, at in ((1, 0), (3, 2), (17, 9)):
            params = [_random_params(rng) for _ in range(size)]
            params[at] = me
            logits = torch.from_numpy(rng.normal(0, 3, (size, CFG.vocab_size)).astype(np.float32))
            logits[at] = row
            keys = [7] * size
            positions = [int(rng.integers(0, 99)) for _ in range(size)]
            positions[at] = position
            out = sampler(logits, _invariant_md(params, positions, keys))
            tokens.append(int(out.sampled_token_ids[at]))
        assert len(set(tokens)) == 1, (position, tokens)


def test_batch_invariant_distribution_is_the_kept_softmax() -> None:
    """Chi-square over 6,000 positions of one request: the kept set's softmax (top-k 6 then
    top-p 0.9 of a 12-token row), nothing outside it."""
    vocab = 12
    logits = torch.tensor([[2.0, 1.5, 1.4, 0.3, 0.2, 0.1, -0.5, -1.0, -2.0, 1.0, 0.9, -3.0]])
    k, p = torch.tensor([6]), torch.tensor([0.9])
    kept = apply_top_k_top_p(logits.clone(), k, p, 6)
    probs = kept.softmax(dim=-1)[0]
    n = 6_000
    batch = logits.expand(n, vocab).contiguous()
    tail.mask_top_k_top_p_(batch, k.expand(n), p.expand(n), strict=False)
    tokens = tail.gumbel_race(batch, [42] * n, list(range(n)), [True] * n)
    counts = torch.bincount(tokens, minlength=vocab).double()
    assert counts[probs == 0].sum() == 0
    expected = probs[probs > 0].double() * n
    chi2 = (((counts[probs > 0] - expected) ** 2) / expected).sum().item()
    df = int((probs > 0).sum()) - 1
    assert chi2 < chi2_quantile(df, 1e-4), (chi2, counts.tolist(), expected.tolist())
    # teeth: against the untruncated softmax the same counts fail
    full = logits.softmax(dim=-1)[0].double() * n
    assert (((counts - full) ** 2) / full).sum().item() > chi2_quantile(vocab - 1, 1e-4)
    assert math.isfinite(chi2)


def test_batch_invariant_needs_positions_and_keys() -> None:
    sampler = Sampler(LogitsProcessors([]), sampling="batch_invariant")
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.0)]
    logits = torch.randn(2, CFG.vocab_size)
    with pytest.raises(InputError, match="positions and seeds"):
        sampler(logits.clone(), SamplingMetadata.from_params(params, CFG.vocab_size))
    with pytest.raises(InputError, match=r"rows \[0\]"):
        sampler(logits.clone(), _invariant_md(params, [0, 0], None))
    out = sampler(logits.clone(), _invariant_md(params, [0, 0], [5, None]))
    assert int(out.sampled_token_ids[1]) == int(logits[1].argmax())
    with pytest.raises(InputError, match="sampling must be one of"):
        Sampler(LogitsProcessors([]), sampling="fast")

"""XTC (``builtin/xtc.py``, llama.cpp's ``llama_sampler_xtc_apply``): against the plain reference
under seeded churn on every route (global generator state driven identically for each apply),
against a literal transcription of llama.cpp's loop given the same ``u``, reproducible draws per
seed whatever the batch, greedy rows untouched, the removal rate against ``xtc_probability``,
its place in the sampler, and its bad input."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import routes_match_reference, upd

from logitsproc_rs import (
    EngineConfig,
    EtaCutoffLogitsProcessor,
    RequestError,
    Sampler,
    SamplingMetadata,
    SamplingParams,
    TopKTopPLogitsProcessor,
    TopNSigmaLogitsProcessor,
    XTCLogitsProcessor,
    build_logitsprocs,
)
from logitsproc_rs.builtin.xtc import xtc_mask_, xtc_seed
from logitsproc_rs.reference import RefXTCLogitsProcessor
from logitsproc_rs.simulate import ChurnSimulator

V = 24
CAP = 6
NEG_INF = float("-inf")
CFG = EngineConfig(max_num_seqs=CAP, vocab_size=V)


def make_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(
        xtc_probability=rng.choice((0.0, 0.3, 0.5, 0.5, 1.0, 1.0)),
        xtc_threshold=rng.choice((0.02, 0.05, 0.1, 0.1, 0.2, 0.6)),
        seed=rng.choice((None, None, rng.randrange(2**63), -rng.randrange(2**40))),
        temperature=rng.choice((0.0, 0.7, 1.0, 1.0)),
        max_tokens=None,
    )


def peaked_logits(seed: int) -> Any:
    """Rows with a few strong tokens (so several pass the thresholds) and -inf holes."""
    g = torch.Generator().manual_seed(seed)

    def make(_step: int, rows: int) -> torch.Tensor:
        x = torch.randn(rows, V, generator=g)
        top = torch.rand(rows, V, generator=g) < 0.2
        x = x + top * (3 + 2 * torch.rand(rows, 1, generator=g))
        x[torch.rand(rows, V, generator=g) < 0.1] = NEG_INF
        return x

    return make


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_route_matches_the_reference_under_churn(seed: int) -> None:
    sim = ChurnSimulator(CAP, V, seed, make_params, max_tokens=(2, 40), prompt_len=(0, 4))
    masked = routes_match_reference(
        XTCLogitsProcessor,
        RefXTCLogitsProcessor,
        sim,
        CAP,
        V,
        peaked_logits(seed),
        before_apply=lambda k: torch.manual_seed(10_000 * seed + k),
    )
    assert masked > 50  # the churn did remove top choices


def llama_cpp_xtc(
    logits: list[float], probability: float, threshold: float, chance: float, min_keep: int = 1
) -> list[float]:
    """A literal transcription of llama.cpp's ``llama_sampler_xtc_apply`` (with its
    ``llama_sampler_softmax_impl``: sort by logit, descending; float32 ``expf`` and sums), on
    a full row, given the ``chance`` its ``std::uniform_real_distribution`` would draw.
    Returns the row with the removed candidates at -inf."""
    f32 = np.float32
    cur = sorted(((i, f32(x)) for i, x in enumerate(logits)), key=lambda t: -t[1])
    out = [float(f32(x)) for x in logits]
    if probability <= 0.0 or threshold > 0.5 or len(cur) < 2:
        return out
    if chance > probability:
        return out
    max_l = cur[0][1]
    cum_sum = f32(0)
    ps = []
    for _, logit in cur:
        p = f32(np.exp(f32(logit - max_l)))
        ps.append(p)
        cum_sum = f32(cum_sum + p)
    ps = [f32(p / cum_sum) for p in ps]
    pos_last = 0
    for i in range(len(cur)):
        if ps[i] >= f32(threshold):
            pos_last = i
        else:
            break
    if len(cur) - pos_last >= min_keep and pos_last > 0:
        for token, _ in cur[:pos_last]:
            out[token] = NEG_INF
    return out


@pytest.mark.parametrize("threshold", [0.05, 0.1, 0.2])
def test_equals_llama_cpps_loop_given_the_same_u(threshold: float) -> None:
    """The same tokens removed as llama.cpp's loop given the same ``u``, for every row whose
    probabilities are clear of the threshold by 1e-5 and whose qualifying probabilities are
    distinct (llama.cpp's float32 sequential sum and torch's softmax differ in the last bits;
    ties are ours to define). ``u`` is compared strictly (``u < probability`` fires;
    llama.cpp fires at equality too, measure zero)."""
    rows = 400
    g = torch.Generator().manual_seed(int(threshold * 100))
    x = torch.randn(rows, V, generator=g) * (0.5 + 2 * torch.rand(rows, 1, generator=g))
    x[torch.rand(rows, V, generator=g) < 0.1] = NEG_INF
    u = torch.rand(rows, 1, generator=g)
    prob = torch.full((rows, 1), 0.5)
    got = xtc_mask_(x.clone(), prob, torch.full((rows, 1), np.float32(threshold)), u)
    compared = fired = 0
    for r in range(rows):
        p = x[r].double().softmax(-1)
        qual = p[p >= threshold]
        if ((p - threshold).abs() < 1e-5).any() or len(set(qual.tolist())) < len(qual):
            continue
        want = torch.tensor(llama_cpp_xtc(x[r].tolist(), 0.5, threshold, float(u[r])))
        assert torch.equal(got[r], want), f"row {r}"
        compared += 1
        fired += int(torch.isinf(want).sum() > torch.isinf(x[r]).sum())
    assert compared > rows * 0.9 and fired > 20


def test_ties_at_the_least_qualifying_probability_are_all_kept() -> None:
    x = torch.tensor([[2.0, 2.0, 1.0, -3.0, -3.0], [2.0, 1.0, 1.0, -3.0, -3.0]])
    got = xtc_mask_(x.clone(), torch.ones(2, 1), torch.full((2, 1), 0.1), torch.zeros(2, 1))
    assert torch.equal(got[0, :3], torch.tensor([NEG_INF, NEG_INF, 1.0]))  # 2 removed, 1 kept
    assert torch.equal(got[1], torch.tensor([NEG_INF, 1.0, 1.0, -3.0, -3.0]))  # tie kept
    two = torch.tensor([[1.0, 1.0, -5.0]])  # the only two qualifiers tie: nothing removed
    assert torch.equal(
        xtc_mask_(two.clone(), torch.ones(1, 1), torch.full((1, 1), 0.1), torch.zeros(1, 1)), two
    )


def _xtc(n: int) -> Any:
    return XTCLogitsProcessor(EngineConfig(max_num_seqs=n, vocab_size=V), "cpu", False)


def _removed(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    return torch.isinf(after) & ~torch.isinf(before)


def test_seeded_draws_do_not_depend_on_the_batch() -> None:
    """Request A (seed 7) alone, and in a batch of seeded and unseeded others, moved around by
    swaps: the same steps fire for it (its row's logits are the same each step). A second
    request with the same seed fires on the same steps."""
    steps = 40
    g = torch.Generator().manual_seed(0)
    row = torch.tensor([3.0, 2.9, 2.8, 0.0] + [-2.0] * (V - 4))
    noise = [torch.randn(8, V, generator=g) for _ in range(steps)]
    a = SamplingParams(xtc_probability=0.5, xtc_threshold=0.1, seed=7)

    alone = _xtc(1)
    alone.update_state(upd(1, added=[(0, a, None, [])]))
    fired_alone = []
    for k in range(steps):
        torch.manual_seed(k)
        fired_alone.append(bool(_removed(row, alone.apply(row[None].clone())[0]).any()))

    crowd = _xtc(8)
    others = [
        SamplingParams(xtc_probability=0.5, seed=11),
        SamplingParams(xtc_probability=0.7),
        SamplingParams(),
        SamplingParams(xtc_probability=1.0, seed=3),
        a,  # a second request with the same seed
    ]
    added = [(i, p, None, []) for i, p in enumerate(others)] + [(5, a, None, [])]
    crowd.update_state(upd(6, added=added))
    where_a, where_twin = 5, 4
    fired_crowd, fired_twin = [], []
    for k in range(steps):
        update = None
        if k % 3 == 1:  # a swap moves A around
            other = (where_a + 1 + k) % 6
            update = upd(6, moved=[(where_a, other, _swap())])
            where_twin = where_a if where_twin == other else where_twin
            where_a = other
        crowd.update_state(update)
        x = noise[k][:6].clone()
        x[where_a] = row
        x[where_twin] = row
        torch.manual_seed(1000 + k)  # a different global state: A's draws must not care
        out = crowd.apply(x.clone())
        fired_crowd.append(bool(_removed(row, out[where_a]).any()))
        fired_twin.append(bool(_removed(row, out[where_twin]).any()))
    assert fired_crowd == fired_alone
    assert fired_twin == fired_alone
    assert 5 < sum(fired_alone) < steps - 5


def _swap() -> Any:
    from logitsproc_rs.interface import MoveDirectionality

    return MoveDirectionality.SWAP


def test_seeded_and_unseeded_draws_are_the_stated_generators() -> None:
    """A seeded row's ``u`` is the first draw of ``Generator().manual_seed(xtc_seed(seed))``;
    an unseeded row's is the global generator's ``uniform_`` over the batch."""
    proc = _xtc(2)
    proc.update_state(
        upd(
            2,
            added=[
                (0, SamplingParams(xtc_probability=0.5, seed=5), None, []),
                (1, SamplingParams(xtc_probability=0.5), None, []),
            ],
        )
    )
    x = torch.tensor([[3.0, 2.9, 2.8] + [-2.0] * (V - 3)] * 2)
    for k in range(20):
        torch.manual_seed(k)
        want_u1 = float(torch.empty(2).uniform_()[1])
        if k == 0:
            gen = torch.Generator().manual_seed(xtc_seed(5))
        want_u0 = float(torch.empty(()).uniform_(generator=gen))
        torch.manual_seed(k)
        out = proc.apply(x.clone())
        assert bool(_removed(x[0], out[0]).any()) == (want_u0 < 0.5)
        assert bool(_removed(x[1], out[1]).any()) == (want_u1 < 0.5)


def test_greedy_rows_are_bit_identical_to_xtc_off() -> None:
    """In the ``Sampler``: a greedy request's ``xtc_probability`` is reset to 0 (no draw of its
    own, no mask), and the greedy token is taken before the argmax-invariant phase anyway; its
    token and its processed logits are those of a sampler without XTC."""
    assert SamplingParams(temperature=0.0, xtc_probability=1.0).xtc_probability == 0.0
    n = 6
    cfg = EngineConfig(max_num_seqs=n, vocab_size=V)
    with_xtc = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=[XTCLogitsProcessor])
    without = build_logitsprocs(cfg, "cpu", False)
    params = [
        SamplingParams(temperature=0.0, xtc_probability=1.0, xtc_threshold=0.01)
        if i % 2 == 0
        else SamplingParams(temperature=0.8, xtc_probability=1.0, xtc_threshold=0.01, seed=i)
        for i in range(n)
    ]
    # XTC off for the sampler without it (which refuses a request that switches XTC on).
    off_params = [dataclasses.replace(p, xtc_probability=0.0) for p in params]
    with_xtc.update_state(upd(n, added=[(i, p, None, []) for i, p in enumerate(params)]))
    without.update_state(upd(n, added=[(i, p, None, []) for i, p in enumerate(off_params)]))
    greedy = torch.tensor([i % 2 == 0 for i in range(n)])
    changed = 0
    for k in range(10):
        x = torch.randn(n, V, generator=torch.Generator().manual_seed(k)) * 2
        gens = {i: torch.Generator().manual_seed(i) for i in range(1, n, 2)}
        md = SamplingMetadata.from_params(params, V, "cpu", gens)
        on = Sampler(with_xtc)(x.clone(), md)
        gens = {i: torch.Generator().manual_seed(i) for i in range(1, n, 2)}
        off_md = SamplingMetadata.from_params(off_params, V, "cpu", gens)
        off = Sampler(without)(x.clone(), off_md)
        assert torch.equal(on.sampled_token_ids[greedy], off.sampled_token_ids[greedy])
        assert torch.equal(on.logits[greedy], off.logits[greedy])
        changed += int((on.logits[~greedy] != off.logits[~greedy]).any())
    assert changed == 10  # random rows did get XTC (probability 1)


@pytest.mark.parametrize("probability", [0.1, 0.3, 0.8])
def test_removal_rate_matches_the_probability(probability: float) -> None:
    """Every row has three tokens above the threshold, so a row loses two exactly when its draw
    fires: over 4000 unseeded rows and 2000 seeded rows (100 requests × 20 steps) the fraction
    that fired is within 0.04 of ``xtc_probability`` (5 standard deviations at 4000 rows, 3.5 at
    2000 draws; the run is seeded, so the check is deterministic)."""
    row = torch.tensor([3.0, 2.9, 2.8] + [-2.0] * (V - 3))
    n = 4000
    proc = _xtc(n)
    p = SamplingParams(xtc_probability=probability)
    proc.update_state(upd(n, added=[(i, p, None, []) for i in range(n)]))
    torch.manual_seed(int(probability * 1000))
    out = proc.apply(row.expand(n, V).clone())
    removed = _removed(row.expand(n, V), out).sum(1)
    assert set(removed.tolist()) <= {0, 2}
    assert abs(float((removed == 2).float().mean()) - probability) < 0.04

    m = 100
    seeded = _xtc(m)
    seeded.update_state(
        upd(
            m,
            added=[
                (i, SamplingParams(xtc_probability=probability, seed=1000 + i), None, [])
                for i in range(m)
            ],
        )
    )
    fired = 0
    for _ in range(20):
        fired += int(
            (_removed(row.expand(m, V), seeded.apply(row.expand(m, V).clone())).sum(1) == 2).sum()
        )
    assert abs(fired / (m * 20) - probability) < 0.04


def test_in_the_sampler_after_the_truncations() -> None:
    """Built as an opt-in processor it joins the argmax-invariant phase (after temperature,
    before top-k/top-p), in the order given; the built-ins' order (the bridges, HF) puts it
    after the four truncations, before the kept top-k / top-p (last: vLLM's place for them)."""
    from logitsproc_rs.builtin import OPT_IN_PROCESSORS

    procs = build_logitsprocs(
        CFG,
        "cpu",
        False,
        custom_logitsprocs=[TopNSigmaLogitsProcessor, EtaCutoffLogitsProcessor, XTCLogitsProcessor],
    )
    names = [type(p).__name__ for p in procs.argmax_invariant]
    assert names == [
        "MinPLogitsProcessor",
        "TopNSigmaLogitsProcessor",
        "EtaCutoffLogitsProcessor",
        "XTCLogitsProcessor",
    ]
    assert all(type(p).__name__ != "XTCLogitsProcessor" for p in procs.non_argmax_invariant)
    assert OPT_IN_PROCESSORS[-2:] == [XTCLogitsProcessor, TopKTopPLogitsProcessor]
    assert OPT_IN_PROCESSORS.index(EtaCutoffLogitsProcessor) < len(OPT_IN_PROCESSORS) - 2


def test_off_rows_and_all_off() -> None:
    proc = _xtc(3)
    proc.update_state(
        upd(
            3,
            added=[
                (0, SamplingParams(xtc_probability=1.0, xtc_threshold=0.6), None, []),
                (1, SamplingParams(xtc_probability=0.0), None, []),
                (2, SamplingParams(), None, []),
            ],
        )
    )
    assert proc.pipeline.count("xtc") == 0
    x = torch.tensor([[3.0, 2.9, 2.8] + [-2.0] * (V - 3)] * 3)
    state = torch.get_rng_state()
    assert torch.equal(proc.apply(x.clone()), x)
    assert torch.equal(torch.get_rng_state(), state)  # nothing on: no draw


def test_params_and_bad_input_name_the_request_and_field() -> None:
    assert SamplingParams().xtc_probability == 0.0
    assert SamplingParams().xtc_threshold == 0.1
    assert SamplingParams(xtc_probability=None, xtc_threshold=None).xtc_threshold == 0.1
    for field, bad in (
        ("xtc_probability", float("nan")),
        ("xtc_probability", -0.1),
        ("xtc_probability", 1.5),
        ("xtc_probability", "0.5"),
        ("xtc_threshold", 0.0),
        ("xtc_threshold", -0.5),
        ("xtc_threshold", 1.5),
        ("xtc_threshold", float("nan")),
    ):
        with pytest.raises(RequestError) as ei:
            SamplingParams(**{field: bad})
        assert ei.value.field == field
    proc = _xtc(CAP)
    for field, bad in (
        ("xtc_probability", float("nan")),
        ("xtc_probability", 2.0),
        ("xtc_probability", "x"),
        ("xtc_threshold", 0.0),
        ("xtc_threshold", float("inf")),
    ):
        good = SimpleNamespace(xtc_probability=0.5, xtc_threshold=0.1, seed=1)
        params = SimpleNamespace(xtc_probability=0.5, xtc_threshold=0.1, seed=2)
        setattr(params, field, bad)
        with pytest.raises(ValueError) as e:
            proc.update_state(upd(2, added=[(0, good, None, []), (1, params, None, [])]))
        assert getattr(e.value, "index", None) == 1
        assert getattr(e.value, "field", None) == field
    # Nothing was added: no active row, no generator; a later neutral step applies nothing.
    assert proc.pipeline.count("xtc") == 0
    assert not proc.pipeline.host_section("xtc.serial").any()  # the core holds no seed
    assert proc._gens.by_serial == {}
    proc.update_state(upd(2, added=[(1, SamplingParams(), None, [])]))
    x = torch.randn(2, V)
    assert torch.equal(proc.apply(x.clone()), x)

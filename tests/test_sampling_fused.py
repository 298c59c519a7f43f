"""The fused ``batch_invariant`` tail (``rust/src/sampling/fused.rs``, ``_fused.py``, issue 41)
against the separate processors it stands in for (``Sampler.random_logits`` then ``draw``):

- the same processed logits and tokens, step after step of churn, with temperature, min-p,
  top-n-sigma, typical-p, epsilon, eta, XTC (seeded and unseeded rows, firing and not),
  top-k and top-p rows and greedy rows; min-p and temperature bitwise; the truncations and
  XTC (float64 statistics where torch reduces in float32) differ at most on entries at their
  threshold, and rows whose kept set is the same draw the same token; XTC's draws are the
  separate path's, and its generators (seeded rows' and torch's global one) stand where the
  separate path leaves them;
- a request's token does not depend on its batch through the fused pass either;
- the sampled distribution is the softmax of the kept set after min-p (or top-n-sigma,
  typical-p, epsilon, eta), top-k and top-p (chi-square), and the logits it leaves are the
  separate steps';
- a processor the pass does not run (the kept top-k / top-p here) sends the batch down the
  separate path, with XTC's generators untouched by the plan given up;
- rows built with an entry exactly at a threshold (top-n-sigma, epsilon, typical-p, XTC)
  differ only where ``fused.rs``'s boundary rule allows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from test_spec_distribution import chi2_quantile

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    Sampler,
    SamplingMetadata,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs import _tail as tail
from logitsproc_rs._fused import fused_plan
from logitsproc_rs.builtin import (
    EpsilonCutoffLogitsProcessor,
    EtaCutoffLogitsProcessor,
    TopKTopPLogitsProcessor,
    TopNSigmaLogitsProcessor,
    TypicalPLogitsProcessor,
    XTCLogitsProcessor,
)
from logitsproc_rs.builtin import xtc as xtc_module
from logitsproc_rs.builtin._combined import CombinedView
from logitsproc_rs.builtin.epsilon_cutoff import epsilon_mask_
from logitsproc_rs.builtin.eta_cutoff import eta_mask_
from logitsproc_rs.builtin.min_p import min_p_mask_
from logitsproc_rs.builtin.top_n_sigma import top_n_sigma_mask_
from logitsproc_rs.builtin.typical_p import typical_p_mask_
from logitsproc_rs.builtin.xtc import xtc_mask_
from logitsproc_rs.params import _SAMPLING_EPS
from logitsproc_rs.sampler import apply_top_k_top_p
from logitsproc_rs.state import LogitsProcessors

NEG_INF = float("-inf")
CFG = EngineConfig(max_num_seqs=24, vocab_size=3_000)
#: The opt-in processors the fused pass runs.
OPT_IN = [
    TopNSigmaLogitsProcessor,
    TypicalPLogitsProcessor,
    EpsilonCutoffLogitsProcessor,
    EtaCutoffLogitsProcessor,
    XTCLogitsProcessor,
]


def _params(rng: np.random.Generator) -> SamplingParams:
    kind = int(rng.integers(0, 5))
    return SamplingParams(
        temperature=0.0 if kind == 0 else float(rng.uniform(0.3, 1.5)),
        top_k=int(rng.choice([0, 0, 5, 40, 1_999])),
        top_p=float(rng.choice([1.0, 1.0, 0.95, 0.5])),
        min_p=float(rng.choice([0.0, 0.0, 0.05, 0.2])),
        top_n_sigma=float(rng.choice([0.0, 0.0, 1.0, 2.5])),
        epsilon_cutoff=float(rng.choice([0.0, 0.0, 3e-4, 0.01])),
        eta_cutoff=float(rng.choice([0.0, 0.0, 3e-4, 0.01])),
        typical_p=float(rng.choice([1.0, 1.0, 0.9, 0.5])),
        xtc_probability=float(rng.choice([0.0, 0.0, 0.5, 1.0])),
        xtc_threshold=float(rng.choice([0.1, 0.01, 0.002])),
        seed=int(rng.integers(0, 1_000)) if kind in (3, 4) else None,
    )


@pytest.fixture
def fused_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the batches the ``Sampler`` ran through the fused pass (calling ``fused_plan``
    itself would take XTC's draws of the step)."""
    calls = [0]
    run = Sampler._sample_fused

    def counted(self: Sampler, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return run(self, *args, **kwargs)

    monkeypatch.setattr(Sampler, "_sample_fused", counted)
    return calls


@pytest.fixture
def xtc_draws(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Every ``u`` XTC draws, in order (the XTC view's draws, fused or not)."""
    drawn: list[torch.Tensor] = []
    draw = xtc_module.draw_uniforms

    def recorded(*args: Any, **kwargs: Any) -> torch.Tensor:
        u = draw(*args, **kwargs)
        drawn.append(u.clone())
        return u

    monkeypatch.setattr(xtc_module, "draw_uniforms", recorded)
    return drawn


def _xtc_streams(procs: LogitsProcessors) -> dict[int, torch.Tensor]:
    """The state of each seeded request's XTC generator, by serial."""
    for p in procs.argmax_invariant:
        for v in p.parts if isinstance(p, CombinedView) else [p]:
            if isinstance(v, XTCLogitsProcessor):
                return {k: g.get_state() for k, g in v._gens.by_serial.items()}
    raise AssertionError("no XTC view")


def _assert_same_streams(a: LogitsProcessors, b: LogitsProcessors) -> None:
    sa, sb = _xtc_streams(a), _xtc_streams(b)
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def _separate(sampler: Sampler, logits: torch.Tensor, md: SamplingMetadata):
    """What ``Sampler.sample`` ran before the fused pass: the processors one by one."""
    greedy = logits.argmax(dim=-1)
    x = sampler.random_logits(logits, md)
    tokens = sampler.draw(x, md)
    assert md.temperature is not None
    return torch.where(md.temperature < _SAMPLING_EPS, greedy, tokens), x


def test_fused_equals_the_separate_processors_over_steps(
    fused_steps: list[int], xtc_draws: list[torch.Tensor]
) -> None:
    rng = np.random.default_rng(41)
    procs = {
        name: build_logitsprocs(CFG, "cpu", False, custom_logitsprocs=OPT_IN)
        for name in ("fused", "separate")
    }
    samplers = {n: Sampler(p, sampling="batch_invariant") for n, p in procs.items()}
    params: list[SamplingParams] = []
    rows = 0
    differing_entries = entries = 0
    xtc_fired = xtc_idle = xtc_seeded = xtc_masked_max = 0
    for step in range(40):
        added = []
        if rows < 20:
            n = int(rng.integers(1, 5))
            for j in range(n):
                params.append(_params(rng))
                added.append((rows + j, params[-1], [1, 2], []))
            rows += n
        else:
            r = int(rng.integers(0, rows))
            params[r] = _params(rng)
            added.append((r, params[r], [3], []))
        update = BatchUpdate(rows, [], added, [])
        for p in procs.values():
            p.update_state(update)
        sigma = float(rng.choice([1.0, 3.0, 6.0]))
        logits = torch.from_numpy(rng.normal(0, sigma, (rows, CFG.vocab_size)).astype(np.float32))
        md = SamplingMetadata.from_params(
            params, CFG.vocab_size, "cpu", None, list(range(step, step + rows)), [9] * rows
        )
        if md.all_greedy:
            continue
        # Both paths draw XTC's unseeded u from torch's global generator: each from the same
        # state, and each leaving it at the same place.
        start = torch.get_rng_state()
        before = len(xtc_draws)
        out = samplers["fused"](logits.clone(), md)
        after_fused = torch.get_rng_state()
        torch.set_rng_state(start)
        want_tokens, want = _separate(samplers["separate"], logits.clone(), md)
        assert torch.equal(torch.get_rng_state(), after_fused), step
        _assert_same_streams(procs["fused"], procs["separate"])
        drawn = xtc_draws[before:]
        if drawn:
            assert len(drawn) == 2 and torch.equal(drawn[0], drawn[1]), step
            for r, p in enumerate(params):
                if p.xtc_probability > 0:
                    fired = float(drawn[0][r]) < np.float32(p.xtc_probability)
                    xtc_fired += fired
                    xtc_idle += not fired
                    xtc_seeded += p.seed is not None
                    xtc_masked_max += fired and bool(want[r, logits[r].argmax()] == NEG_INF)
        got = out.logits
        plain = [
            r
            for r, p in enumerate(params)
            if p.top_n_sigma == 0
            and p.epsilon_cutoff == 0
            and p.eta_cutoff == 0
            and p.typical_p == 1
            and p.xtc_probability == 0
        ]
        # Temperature, min-p, top-k, top-p: the separate path's logits, bit for bit.
        assert torch.equal(got[plain], want[plain]), step
        same_kept = ((got > NEG_INF) == (want > NEG_INF)).all(dim=1)
        kept_equal = torch.where(got > NEG_INF, got, 0.0) == torch.where(want > NEG_INF, want, 0.0)
        assert bool(kept_equal.all()), step  # every kept entry keeps its value
        differing_entries += int(((got > NEG_INF) != (want > NEG_INF)).sum())
        entries += got.numel()
        same = same_kept.nonzero().view(-1)
        assert torch.equal(out.sampled_token_ids[same], want_tokens[same]), step
    assert fused_steps[0] >= 30  # the fused pass ran (not the fallback)
    # XTC rows of both kinds, seeded ones among them, and XTC removing the top token.
    assert min(xtc_fired, xtc_idle, xtc_seeded, xtc_masked_max) >= 10, (
        xtc_fired,
        xtc_idle,
        xtc_seeded,
        xtc_masked_max,
    )
    # The truncations' float64 thresholds differ from torch's float32 ones only at the
    # threshold itself: on continuous random logits, (almost) never.
    assert differing_entries <= entries // 100_000, (differing_entries, entries)


def _add_all(procs, params: list[SamplingParams]) -> None:
    added = [(r, p, [1], []) for r, p in enumerate(params)]
    procs.update_state(BatchUpdate(len(params), [], added, []))


def test_fused_token_ignores_the_batch(fused_steps: list[int]) -> None:
    """One request with min-p, the truncations, XTC (seeded), top-k and top-p: alone, at row 2
    of 3 and at row 9 of 17, the same token at each position."""
    rng = np.random.default_rng(5)
    me = SamplingParams(
        temperature=0.9,
        top_k=200,
        top_p=0.95,
        min_p=0.02,
        top_n_sigma=2.0,
        epsilon_cutoff=1e-4,
        eta_cutoff=1e-4,
        typical_p=0.95,
        xtc_probability=0.8,
        xtc_threshold=0.01,
        seed=77,
    )
    for position in range(12):
        row = torch.from_numpy(rng.normal(0, 3, CFG.vocab_size).astype(np.float32))
        tokens = []
        for size, at in ((1, 0), (3, 2), (17, 9)):
            params = [_params(rng) for _ in range(size)]
            params[at] = me
            procs = build_logitsprocs(CFG, "cpu", False, custom_logitsprocs=OPT_IN)
            _add_all(procs, params)
            sampler = Sampler(procs, sampling="batch_invariant")
            logits = torch.from_numpy(rng.normal(0, 3, (size, CFG.vocab_size)).astype(np.float32))
            logits[at] = row
            positions = [int(rng.integers(0, 99)) for _ in range(size)]
            positions[at] = position
            md = SamplingMetadata.from_params(
                params, CFG.vocab_size, "cpu", None, positions, [7] * size
            )
            ran = fused_steps[0]
            tokens.append(int(sampler(logits, md).sampled_token_ids[at]))
            assert fused_steps[0] == ran + 1
        assert len(set(tokens)) == 1, (position, tokens)


def _log_f32(x: float) -> float:
    return float(np.log(np.float32(x)))


#: name: (fused steps for one row, the separate step on [1, V] logits)
STEPS = {
    "min-p": (
        {"log_min_p": [_log_f32(0.1)]},
        lambda x: min_p_mask_(x, torch.tensor([[_log_f32(0.1)]])),
    ),
    "top-n-sigma": ({"top_n_sigma": [1.0]}, lambda x: top_n_sigma_mask_(x, torch.tensor([[1.0]]))),
    "typical-p": ({"typical_p": [0.6]}, lambda x: typical_p_mask_(x, torch.tensor([[0.6]]))),
    "epsilon": ({"epsilon": [0.02]}, lambda x: epsilon_mask_(x, torch.tensor([[0.02]]))),
    "eta": ({"eta": [0.05]}, lambda x: eta_mask_(x, torch.tensor([[0.05]]))),
}


@pytest.mark.parametrize("step", list(STEPS))
def test_fused_distribution_is_the_kept_softmax(step: str) -> None:
    """Chi-square over 6,000 positions: temperature 0.8, the step, top-k 8 and top-p 0.95 of
    a 12-token row through the fused pass; the expected law is the separate steps' kept set."""
    vocab, n = 12, 6_000
    logits = torch.tensor([[2.0, 1.5, 1.4, 0.3, 0.2, 0.1, -0.5, -1.0, -2.0, 1.0, 0.9, -3.0]])
    k, p = torch.tensor([8]), torch.tensor([0.95])
    fused, separate = STEPS[step]
    ref = apply_top_k_top_p(separate(logits / 0.8), k, p, 8)
    probs = ref.softmax(dim=-1)[0]
    batch = logits.expand(n, vocab).contiguous()
    tokens = tail.fused_gumbel_(
        batch,
        [0.8] * n,
        {key: v * n for key, v in fused.items()},
        k.expand(n),
        p.expand(n),
        [42] * n,
        list(range(n)),
        [True] * n,
    )
    assert torch.equal(batch[0], ref[0])  # the fused pass left the separate steps' logits
    counts = torch.bincount(tokens, minlength=vocab).double()
    assert counts[probs == 0].sum() == 0
    assert 2 <= int((probs > 0).sum()) < 8  # the step or top-p cut below top-k
    expected = probs[probs > 0].double() * n
    chi2 = (((counts[probs > 0] - expected) ** 2) / expected).sum().item()
    assert chi2 < chi2_quantile(int((probs > 0).sum()) - 1, 1e-4), (chi2, counts.tolist())


@pytest.mark.parametrize("kept_top_k", [0, 5])
def test_unfused_processor_falls_back(kept_top_k: int) -> None:
    """An active kept top-k / top-p is not in the pass: the batch takes the separate path,
    XTC's draws taken once (by its own apply), and the result is the separate path's either
    way, step after step, with typical-p and XTC rows, seeded and not."""
    procs = {
        n: build_logitsprocs(
            CFG, "cpu", False, custom_logitsprocs=[*OPT_IN, TopKTopPLogitsProcessor]
        )
        for n in ("a", "b")
    }
    params = [
        SamplingParams(temperature=1.0, typical_p=0.9, min_p=0.05, seed=3),
        SamplingParams(temperature=0.8, xtc_probability=0.5, xtc_threshold=0.01, seed=4),
        SamplingParams(temperature=0.8, xtc_probability=1.0, xtc_threshold=0.01),
        SamplingParams(temperature=1.2, typical_p=0.5, xtc_probability=0.7, kept_top_k=kept_top_k),
    ]
    for p in procs.values():
        _add_all(p, params)
    gen = torch.Generator().manual_seed(1)
    for step in range(4):
        logits = torch.randn(4, CFG.vocab_size, generator=gen) * 3
        positions = [step] * 4
        md = SamplingMetadata.from_params(params, CFG.vocab_size, "cpu", None, positions, [5] * 4)
        start = torch.get_rng_state()
        if kept_top_k:  # the plan is given up before XTC draws
            assert fused_plan(procs["a"], logits) is None
            assert torch.equal(torch.get_rng_state(), start)
        out = Sampler(procs["a"], sampling="batch_invariant")(logits.clone(), md)
        after = torch.get_rng_state()
        torch.set_rng_state(start)
        sampler_b = Sampler(procs["b"], sampling="batch_invariant")
        want_tokens, want = _separate(sampler_b, logits.clone(), md)
        assert torch.equal(torch.get_rng_state(), after)
        _assert_same_streams(procs["a"], procs["b"])
        assert torch.equal(out.logits, want), step
        assert torch.equal(out.sampled_token_ids, want_tokens), step


def _fused_mask(x: torch.Tensor, step: str, value: float) -> torch.Tensor:
    """The fused pass's logits for one truncation at ``value`` on every row (no draw)."""
    y = x.clone()
    rows = y.shape[0]
    tail.fused_gumbel_(
        y, None, {step: [value] * rows}, None, None, [0] * rows, [0] * rows, [False] * rows
    )
    return y


@pytest.mark.parametrize("step", ["top_n_sigma", "epsilon"])
def test_truncation_boundary_rule(step: str) -> None:
    """Rows built with an entry exactly at the threshold (in float64): the fused pass and the
    torch processor may decide such entries differently, and only those: every entry they
    decide differently lies within ``BOUNDARY_REL`` (1e-4, relative) of the threshold."""
    rng = np.random.default_rng(17)
    differ = 0
    for _ in range(200):
        x64 = rng.normal(0, 2, 500)
        x = torch.from_numpy(x64.astype(np.float32)).unsqueeze(0)
        xs = x[0].double().numpy()
        j = int(rng.integers(0, 500))
        if step == "top_n_sigma":
            std = xs.std()
            value = float(np.float32((xs.max() - xs[j]) / std)) or 0.5
            want = top_n_sigma_mask_(x.clone(), torch.tensor([[value]]))
            near = np.abs(xs - (xs.max() - value * std)) <= 1e-4 * (abs(xs.max()) + value * std)
        else:
            p = np.exp(xs - xs.max()) / np.exp(xs - xs.max()).sum()
            value = float(np.float32(p[j]))
            want = epsilon_mask_(x.clone(), torch.tensor([[value]]))
            near = np.abs(p - value) <= 1e-4 * value
        got = _fused_mask(x, step, value)
        changed = ((got > NEG_INF) != (want > NEG_INF))[0].numpy()
        assert not (changed & ~near).any(), (step, value, np.nonzero(changed & ~near))
        differ += int(changed.any())
    assert differ < 200  # most rows agree even at the boundary


def _typical_scores(xs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 probabilities, typicality scores and the size of what each score is computed
    from (``|log p| + H``) of one row."""
    log_p = xs - xs.max() - np.log(np.exp(xs - xs.max()).sum())
    p = np.exp(log_p)
    h = -(p * log_p).sum()
    return p, np.abs(-log_p - h), np.abs(log_p) + h


def test_typical_p_boundary_rule() -> None:
    """Rows whose typical_p is exactly the mass at one entry in ascending score order (float64):
    every entry the fused pass and ``typical_p_mask_`` decide differently has its score
    within ``BOUNDARY_REL`` of the threshold score (relative to ``|log p| + H``) or its
    cumulative mass, or the one before it, within ``BOUNDARY_REL`` of ``typical_p``."""
    rng = np.random.default_rng(23)
    differ = 0
    for _ in range(200):
        x = torch.from_numpy(rng.normal(0, 2, 500).astype(np.float32)).unsqueeze(0)
        p, score, size = _typical_scores(x[0].double().numpy())
        order = np.argsort(score, kind="stable")
        cum = np.cumsum(p[order])
        j = int(rng.integers(0, 499))
        value = float(np.float32(cum[j]))
        if value >= 1.0:
            continue
        threshold = score[order][int(np.searchsorted(cum, value))]
        want = typical_p_mask_(x.clone(), torch.tensor([[value]]))
        got = _fused_mask(x, "typical_p", value)
        near_score = np.abs(score - threshold) <= 1e-4 * size
        near_mass = np.zeros(500, dtype=bool)
        before = np.concatenate([[0.0], cum[:-1]])
        near_mass[order] = (np.abs(cum - value) <= 1e-4 * value) | (
            np.abs(before - value) <= 1e-4 * value
        )
        changed = ((got > NEG_INF) != (want > NEG_INF))[0].numpy()
        assert not (changed & ~(near_score | near_mass)).any(), np.nonzero(changed)
        differ += int(changed.any())
    assert differ < 200  # most rows agree even at the boundary


def test_xtc_boundary_rule() -> None:
    """Rows whose xtc_threshold is exactly one entry's probability (float64), XTC firing:
    the fused pass and ``xtc_mask_`` differ only in rows with an entry within
    ``BOUNDARY_REL`` of the threshold, and there only on entries that (nearly) qualify."""
    rng = np.random.default_rng(29)
    differ = 0
    for _ in range(200):
        x = torch.from_numpy(rng.normal(0, 2, 500).astype(np.float32)).unsqueeze(0)
        p, _, _ = _typical_scores(x[0].double().numpy())
        top = np.sort(p)[::-1]
        value = float(np.float32(top[int(rng.integers(1, 6))]))
        one = torch.ones(1, 1)
        want = xtc_mask_(x.clone(), one, torch.tensor([[value]]), torch.zeros(1, 1))
        got = x.clone()
        steps = {"xtc_probability": [1.0], "xtc_threshold": [value], "xtc_u": [0.0]}
        tail.fused_gumbel_(got, None, steps, None, None, [0], [0], [False])
        changed = ((got > NEG_INF) != (want > NEG_INF))[0].numpy()
        near_row = bool((np.abs(p - value) <= 1e-4 * value).any())
        qualifying = p >= value * (1 - 1e-4)
        assert not changed.any() or (near_row and not (changed & ~qualifying).any())
        differ += int(changed.any())
    assert differ < 200  # most rows agree even at the boundary

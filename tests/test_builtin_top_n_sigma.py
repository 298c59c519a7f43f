"""top-n-sigma (``builtin/top_n_sigma.py``, llama.cpp's ``llama_sampler_top_n_sigma_apply``):
against the plain reference under seeded churn on every route, against a literal
transcription of llama.cpp's loop, its edge rows (-inf, +inf, NaN, float64), its place in the
sampler, and its bad input."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import routes_match_reference, upd

from logitsproc_rs import (
    EngineConfig,
    RequestError,
    SamplingParams,
    TopNSigmaLogitsProcessor,
    build_logitsprocs,
)
from logitsproc_rs.reference import RefTopNSigmaLogitsProcessor
from logitsproc_rs.simulate import ChurnSimulator

V = 24
CAP = 6
NEG_INF = float("-inf")
CFG = EngineConfig(max_num_seqs=CAP, vocab_size=V)


def make_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(
        top_n_sigma=rng.choice((0.0, 0.0, -1.0, 0.3, 1.0, 1.5, 2.0, 3.0)), max_tokens=None
    )


def logits_with_holes(seed: int) -> Any:
    g = torch.Generator().manual_seed(seed)

    def make(_step: int, rows: int) -> torch.Tensor:
        x = torch.randn(rows, V, generator=g) * (1 + 4 * torch.rand(rows, 1, generator=g))
        x[torch.rand(rows, V, generator=g) < 0.15] = NEG_INF  # masked earlier (a grammar, bans)
        return x

    return make


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_route_matches_the_reference_under_churn(seed: int) -> None:
    sim = ChurnSimulator(CAP, V, seed, make_params, max_tokens=(2, 40), prompt_len=(0, 4))
    masked = routes_match_reference(
        TopNSigmaLogitsProcessor,
        RefTopNSigmaLogitsProcessor,
        sim,
        CAP,
        V,
        logits_with_holes(seed),
    )
    assert masked > 100  # the churn did mask


def llama_cpp_top_n_sigma(logits: list[float], n: float) -> list[float]:
    """A literal transcription of llama.cpp's ``llama_sampler_top_n_sigma_apply`` (float32
    accumulators, as its ``float`` locals; ``pow`` in double, added to a float)."""
    f32 = np.float32
    out = [f32(x) for x in logits]
    if n <= 0.0 or len(out) <= 1:
        return [float(x) for x in out]
    mx = out[0]
    logits_sum = f32(0)
    valid_count = 0
    for x in out:
        if x != f32(NEG_INF):
            if x > mx:
                mx = x
            logits_sum = f32(logits_sum + x)
            valid_count += 1
    mean = f32(logits_sum / f32(valid_count)) if valid_count > 0 else f32(0)
    acc = f32(0)
    for x in out:
        if x != f32(NEG_INF):
            acc = f32(float(acc) + (float(x) - float(mean)) ** 2)
    std = f32(math.sqrt(float(acc) / valid_count)) if valid_count > 0 else f32(0)
    threshold = f32(mx - f32(f32(n) * std))
    return [NEG_INF if x < threshold else float(x) for x in out]


@pytest.mark.parametrize("n", [0.5, 1.0, 2.0, 3.0])
def test_kept_set_equals_llama_cpps_loop(n: float) -> None:
    """The same tokens kept as llama.cpp's own loop, except a logit within 1e-4 of the
    threshold: llama.cpp sums sequentially in float32, torch in blocks, so the two thresholds
    differ in the last bits (a few ulp of the row's scale)."""
    rows = 32
    proc = TopNSigmaLogitsProcessor(EngineConfig(max_num_seqs=rows, vocab_size=V), "cpu", False)
    proc.update_state(
        upd(rows, added=[(i, SamplingParams(top_n_sigma=n), None, []) for i in range(rows)])
    )
    g = torch.Generator().manual_seed(int(n * 10))
    x = torch.randn(rows, V, generator=g) * 3
    x[torch.rand(rows, V, generator=g) < 0.1] = NEG_INF
    got = proc.apply(x.clone())
    compared = 0
    for r in range(rows):
        want = torch.tensor(llama_cpp_top_n_sigma(x[r].tolist(), n))
        finite = x[r][x[r] > NEG_INF]
        mean = finite.double().mean()
        thr = float(finite.max()) - n * float(((finite.double() - mean) ** 2).mean().sqrt())
        clear = (x[r].double() - thr).abs() > 1e-4
        assert torch.equal(torch.isinf(got[r])[clear], torch.isinf(want)[clear]), f"row {r}"
        assert torch.equal(got[r][~torch.isinf(got[r])], x[r][~torch.isinf(got[r])])
        compared += int(clear.sum())
    assert compared > rows * V * 0.9


def test_temperature_invariant_and_keeps_the_max() -> None:
    proc = TopNSigmaLogitsProcessor(CFG, "cpu", False)
    proc.update_state(
        upd(4, added=[(i, SamplingParams(top_n_sigma=1.0), None, []) for i in range(4)])
    )
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, V, generator=g) * 2
    kept = ~torch.isinf(proc.apply(x.clone()))
    for t in (0.5, 2.0, 4.0):  # powers of two: x / t is exact, so is the kept set
        assert torch.equal(~torch.isinf(proc.apply(x / t)), kept)
    assert kept.gather(1, x.argmax(1, keepdim=True)).all()
    assert (kept.sum(1) < V).all()


def test_edge_rows() -> None:
    """All -inf but one (kept: sigma 0), all -inf (unchanged), a +inf or a NaN in the row
    (unchanged, as llama.cpp's NaN threshold leaves it), float64 logits (same kept set as the
    reference, computed in float64)."""
    proc = TopNSigmaLogitsProcessor(CFG, "cpu", False)
    ref = RefTopNSigmaLogitsProcessor(CFG, torch.device("cpu"), False)
    u = upd(5, added=[(i, SamplingParams(top_n_sigma=1.0), None, []) for i in range(5)])
    proc.update_state(u)
    ref.update_state(u)
    x = torch.randn(5, V, generator=torch.Generator().manual_seed(5))
    x[0] = NEG_INF
    x[0, 7] = 1.5
    x[1] = NEG_INF
    x[2, 3] = float("inf")
    x[3, 4] = float("nan")
    got = proc.apply(x.clone())
    want = ref.apply(x.clone())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    assert torch.equal(got[:4].nan_to_num(), x[:4].nan_to_num())  # rows 0-3 unchanged
    assert torch.isnan(got[3, 4])
    assert torch.isinf(got[4]).any()
    x64 = torch.randn(5, V, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    got64 = proc.apply(x64.clone())
    assert got64.dtype == torch.float64
    assert torch.equal(got64, ref.apply(x64.clone()))
    assert torch.isinf(got64).any()


def test_in_the_sampler_after_temperature_before_top_k() -> None:
    """Built as an opt-in processor it joins the argmax-invariant phase, after MinP."""
    procs = build_logitsprocs(CFG, "cpu", False, custom_logitsprocs=[TopNSigmaLogitsProcessor])
    names = [type(p).__name__ for p in procs.argmax_invariant]
    assert names == ["MinPLogitsProcessor", "TopNSigmaLogitsProcessor"]
    assert all(type(p).__name__ != "TopNSigmaLogitsProcessor" for p in procs.non_argmax_invariant)


def test_params_and_bad_input_name_the_request_and_field() -> None:
    assert SamplingParams().top_n_sigma == 0.0
    assert SamplingParams(top_n_sigma=None).top_n_sigma == 0.0
    assert SamplingParams(top_n_sigma=-2.0).top_n_sigma == 0.0  # <= 0: off
    for bad in (float("nan"), float("inf"), "1", 1e39):
        with pytest.raises(RequestError) as ei:
            SamplingParams(top_n_sigma=bad)
        assert ei.value.field == "top_n_sigma"
    proc = TopNSigmaLogitsProcessor(CFG, "cpu", False)
    for bad in (float("nan"), float("inf"), 1e39, "x"):
        with pytest.raises(ValueError) as e:
            proc.update_state(
                upd(
                    2,
                    added=[
                        (0, SimpleNamespace(top_n_sigma=1.0), None, []),
                        (1, SimpleNamespace(top_n_sigma=bad), None, []),
                    ],
                )
            )
        assert getattr(e.value, "index", None) == 1
        assert getattr(e.value, "field", None) == "top_n_sigma"
    # Nothing was added: a later step with one neutral request has no active row.
    proc.update_state(upd(2, added=[(1, SamplingParams(), None, [])]))
    assert proc.pipeline.count("top_n_sigma") == 0
    x = torch.randn(2, V)
    assert torch.equal(proc.apply(x.clone()), x)

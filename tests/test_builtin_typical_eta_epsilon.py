"""typical-p, epsilon and eta (``builtin/typical_p.py``, ``epsilon_cutoff.py``,
``eta_cutoff.py``; HF's ``TypicalLogitsWarper``, ``EpsilonLogitsWarper``, ``EtaLogitsWarper``
with ``min_tokens_to_keep=1``): against the plain reference under seeded churn on every route,
against HF's own warpers on the same float32 logits (bit for bit), in HF ``generate()``
against HF's own settings, their edge rows and their bad input."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _helpers import routes_match_reference, upd

from logitsproc_rs import (
    EngineConfig,
    EpsilonCutoffLogitsProcessor,
    EtaCutoffLogitsProcessor,
    RequestError,
    SamplingParams,
    TypicalPLogitsProcessor,
    build_logitsprocs,
)
from logitsproc_rs.reference import (
    RefEpsilonCutoffLogitsProcessor,
    RefEtaCutoffLogitsProcessor,
    RefTypicalPLogitsProcessor,
)
from logitsproc_rs.simulate import ChurnSimulator

V = 24
CAP = 6
NEG_INF = float("-inf")
CFG = EngineConfig(max_num_seqs=CAP, vocab_size=V)

# view, reference, field, values drawn under churn (the first is off), HF warper, bad values
CASES = {
    "typical_p": (
        TypicalPLogitsProcessor,
        RefTypicalPLogitsProcessor,
        (1.0, 1.0, 0.2, 0.5, 0.9, 0.95, 0.999),
        "TypicalLogitsWarper",
        (0.0, -0.1, 1.5, float("nan"), float("inf")),
    ),
    "epsilon_cutoff": (
        EpsilonCutoffLogitsProcessor,
        RefEpsilonCutoffLogitsProcessor,
        (0.0, 0.0, 3e-4, 0.01, 0.05, 0.1, 0.5),
        "EpsilonLogitsWarper",
        (1.0, -0.1, 2.0, float("nan"), float("inf")),
    ),
    "eta_cutoff": (
        EtaCutoffLogitsProcessor,
        RefEtaCutoffLogitsProcessor,
        (0.0, 0.0, 3e-4, 2e-3, 0.01, 0.05, 0.3),
        "EtaLogitsWarper",
        (1.0, -0.1, 2.0, float("nan"), float("inf")),
    ),
}
FIELDS = list(CASES)


def hf_warper(field: str, value: float) -> Any:
    lp = pytest.importorskip("transformers.generation.logits_process")
    cls = getattr(lp, CASES[field][3])
    return cls(value) if field == "typical_p" else cls(epsilon=value)


def random_logits(g: torch.Generator, rows: int, holes: float = 0.1) -> torch.Tensor:
    x = torch.randn(rows, V, generator=g) * (0.3 + 4 * torch.rand(rows, 1, generator=g))
    x[torch.rand(rows, V, generator=g) < holes] = NEG_INF
    return x


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("field", FIELDS)
def test_every_route_matches_the_reference_under_churn(field: str, seed: int) -> None:
    view, ref, values, _, _ = CASES[field]

    def make_params(rng: random.Random) -> SamplingParams:
        return SamplingParams(max_tokens=None, **{field: rng.choice(values)})

    sim = ChurnSimulator(CAP, V, seed, make_params, max_tokens=(2, 40), prompt_len=(0, 4))
    g = torch.Generator().manual_seed(seed)
    masked = routes_match_reference(view, ref, sim, CAP, V, lambda _k, rows: random_logits(g, rows))
    assert masked > 100  # the churn did mask


@pytest.mark.parametrize("field", FIELDS)
def test_equal_to_hfs_own_warper(field: str) -> None:
    """Bit for bit HF's warper on the same float32 logits, one value for the whole batch (HF's
    warpers take one), and a batch of mixed values against HF row by row."""
    view, _, values, _, _ = CASES[field]
    rows = 16
    cfg = EngineConfig(max_num_seqs=rows, vocab_size=V)
    g = torch.Generator().manual_seed(11)
    for value in values[2:]:
        proc = view(cfg, "cpu", False)
        proc.update_state(
            upd(rows, added=[(i, SamplingParams(**{field: value}), None, []) for i in range(rows)])
        )
        for _ in range(5):
            x = random_logits(g, rows)
            want = hf_warper(field, value)(None, x.clone())
            got = proc.apply(x.clone())
            assert torch.equal(got, want), f"{field}={value}\n{got}\n{want}"
    proc = view(cfg, "cpu", False)
    per_row = [values[2 + i % (len(values) - 2)] if i % 4 else values[0] for i in range(rows)]
    proc.update_state(
        upd(
            rows, added=[(i, SamplingParams(**{field: v}), None, []) for i, v in enumerate(per_row)]
        )
    )
    x = random_logits(g, rows)
    got = proc.apply(x.clone())
    for i, v in enumerate(per_row):
        want = x[i] if v == values[0] else hf_warper(field, v)(None, x[i : i + 1].clone())[0]
        assert torch.equal(got[i], want), f"row {i}, {field}={v}"


@pytest.mark.parametrize("field", FIELDS)
def test_edge_rows(field: str) -> None:
    """All -inf but one (kept), all -inf, a +inf or a NaN in the row (all unchanged: NaN
    probabilities mask nothing; HF's eta warper raises on those three), float64 logits (equal
    to the reference computed in float64), and the top logit always kept (epsilon, eta)."""
    view, ref_cls, values, _, _ = CASES[field]
    value = values[3]
    proc = view(CFG, "cpu", False)
    ref = ref_cls(CFG, torch.device("cpu"), False)
    u = upd(5, added=[(i, SamplingParams(**{field: value}), None, []) for i in range(5)])
    proc.update_state(u)
    ref.update_state(u)
    x = torch.randn(5, V, generator=torch.Generator().manual_seed(5)) * 3
    x[0] = NEG_INF
    x[0, 7] = 1.5
    x[1] = NEG_INF
    x[2, 3] = float("inf")
    x[3, 4] = float("nan")
    got = proc.apply(x.clone())
    assert torch.equal(got.nan_to_num(), ref.apply(x.clone()).nan_to_num())
    assert torch.equal(got[:4].nan_to_num(), x[:4].nan_to_num())
    assert torch.isnan(got[3, 4])
    if field != "eta_cutoff":  # HF's own gives the same on the rows it accepts
        want = hf_warper(field, value)(None, x.clone())
        assert torch.equal(got.nan_to_num(), want.nan_to_num())
    x64 = torch.randn(5, V, dtype=torch.float64, generator=torch.Generator().manual_seed(6)) * 3
    got64 = proc.apply(x64.clone())
    assert got64.dtype == torch.float64 and torch.isinf(got64).any()
    assert torch.equal(got64, ref.apply(x64.clone()))
    if field != "typical_p":
        assert (got64.amax(-1) == x64.amax(-1)).all()


def test_typical_p_may_drop_the_argmax() -> None:
    """Why typical-p is documented as argmax-changing: p = (0.4, 0.3, 0.3), mass 0.5 keeps the
    two most typical tokens, not the most likely one (HF does the same)."""
    proc = TypicalPLogitsProcessor(EngineConfig(max_num_seqs=1, vocab_size=3), "cpu", False)
    proc.update_state(upd(1, added=[(0, SamplingParams(typical_p=0.5), None, [])]))
    x = torch.tensor([[0.4, 0.3, 0.3]]).log()
    got = proc.apply(x.clone())
    assert torch.isinf(got[0, 0]) and not torch.isinf(got[0, 1:]).any()
    assert torch.equal(got, hf_warper("typical_p", 0.5)(None, x.clone()))


def test_sampler_order() -> None:
    """Opt-in, built when asked for, then run after MinP in the argmax-invariant phase, in
    the order top-n-sigma, typical-p, epsilon, eta."""
    from logitsproc_rs import builtin

    procs = build_logitsprocs(
        CFG,
        "cpu",
        False,
        custom_logitsprocs=builtin.asked_for(
            [SamplingParams(eta_cutoff=0.1), SamplingParams(typical_p=0.5, top_n_sigma=1.0)]
        ),
    )
    assert [type(p).__name__ for p in procs.argmax_invariant] == [
        "MinPLogitsProcessor",
        "TopNSigmaLogitsProcessor",
        "TypicalPLogitsProcessor",
        "EtaCutoffLogitsProcessor",
    ]
    assert builtin.asked_for([SamplingParams()]) == []


@pytest.mark.parametrize("field", FIELDS)
def test_bad_input_names_the_request_and_field(field: str) -> None:
    view, _, values, _, bad_values = CASES[field]
    assert getattr(SamplingParams(), field) == values[0]
    assert getattr(SamplingParams(**{field: None}), field) == values[0]
    for bad in (*bad_values, "0.5"):
        with pytest.raises(RequestError) as ei:
            SamplingParams(**{field: bad})
        assert ei.value.field == field
    proc = view(CFG, "cpu", False)
    for bad in (*bad_values, "x"):
        with pytest.raises(ValueError) as e:
            proc.update_state(
                upd(
                    2,
                    added=[
                        (0, SimpleNamespace(**{field: values[3]}), None, []),
                        (1, SimpleNamespace(**{field: bad}), None, []),
                    ],
                )
            )
        assert getattr(e.value, "index", None) == 1
        assert getattr(e.value, "field", None) == field
    proc.update_state(upd(2, added=[(1, SamplingParams(), None, [])]))
    assert proc.pipeline.count(field) == 0  # slot 0 was never added
    x = torch.randn(2, V)
    assert torch.equal(proc.apply(x.clone()), x)


@pytest.mark.parametrize(
    "setting",
    [
        {"typical_p": 0.5},
        {"epsilon_cutoff": 0.02},
        {"eta_cutoff": 0.9, "temperature": 0.5},
        {"typical_p": 0.7, "epsilon_cutoff": 0.01, "eta_cutoff": 0.005, "temperature": 0.7},
    ],
)
def test_hf_generate_gives_transformers_own_tokens(tiny_llama: Any, setting: dict) -> None:
    """``generate(do_sample=True)`` through ``HFLogitsProcessor`` gives the tokens of HF's own
    warpers with the same settings and seed (HF: temperature, then typical, epsilon, eta; top-k
    off, which our order would otherwise differ from)."""
    from logitsproc_rs.hf import HFLogitsProcessor

    ids = torch.randint(3, 60, (3, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.manual_seed(5)
        theirs = tiny_llama.generate(
            ids, max_new_tokens=30, do_sample=True, top_k=0, top_p=1.0, **setting
        )
        torch.manual_seed(5)
        plain = tiny_llama.generate(
            ids,
            max_new_tokens=30,
            do_sample=True,
            top_k=0,
            temperature=setting.get("temperature", 1.0),
        )
        proc = HFLogitsProcessor([SamplingParams(max_tokens=None, **setting)] * 3)
        torch.manual_seed(5)
        ours = proc.generate(tiny_llama, ids, max_new_tokens=30)
    assert torch.equal(ours, theirs), setting
    assert not torch.equal(plain, theirs)  # the warper changed what was sampled


def test_vllm_bridges_read_them_from_the_namespace() -> None:
    """The V1 and MRV2 bridges read the four from ``extra_args["logitsproc_rs"]`` (vLLM's names
    of the fields, checked by our ``SamplingParams``); a bad one names the request and field."""
    from logitsproc_rs.vllm._fields import NAMESPACE, NAMESPACE_FIELDS, routed_params

    fields = {"top_n_sigma", "typical_p", "epsilon_cutoff", "eta_cutoff"}
    assert fields <= NAMESPACE_FIELDS
    ns = {"top_n_sigma": 1.5, "typical_p": 0.5, "epsilon_cutoff": 0.01, "eta_cutoff": 0.02}
    got = routed_params(0, SimpleNamespace(extra_args={NAMESPACE: ns}), NAMESPACE)
    assert {f: getattr(got, f) for f in fields} == ns
    with pytest.raises(RequestError) as ei:
        routed_params(3, SimpleNamespace(extra_args={NAMESPACE: {"typical_p": 0.0}}), NAMESPACE)
    assert (ei.value.index, ei.value.field) == (3, "typical_p")

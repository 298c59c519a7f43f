"""The kept top-k / top-p (``builtin/top_k_top_p.py``, ours, opt-in): vLLM 0.25.1's top-k then
top-p kept set from ``kept_top_k`` / ``kept_top_p``, as an argmax-invariant processor. Against
the plain reference under seeded churn on every route, against vLLM's own top-k/top-p (our
``Sampler``'s, from ``top_k`` / ``top_p``) through the whole sampler, greedy rows, its place in
the sampler, the fields' ranges and bad input."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _helpers import routes_match_reference, upd

from logitsproc_rs import (
    EngineConfig,
    MinPLogitsProcessor,
    RequestError,
    SamplingParams,
    TopKTopPLogitsProcessor,
    XTCLogitsProcessor,
    build_logitsprocs,
)
from logitsproc_rs.reference import RefTopKTopPLogitsProcessor
from logitsproc_rs.simulate import ChurnSimulator

V = 24
CAP = 6
NEG_INF = float("-inf")
CFG = EngineConfig(max_num_seqs=CAP, vocab_size=V)
KS = (0, 0, -1, 1, 2, 5, 11, V - 1, V, V + 7, 10**9)
PS = (1.0, 1.0, None, 0.05, 0.3, 0.5, 0.8, 0.95, 0.999999)


def make_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(
        kept_top_k=rng.choice(KS),
        kept_top_p=rng.choice(PS),
        temperature=rng.choice((0.0, 0.7, 1.0, 1.0)),
        max_tokens=None,
    )


def logits_with_holes(seed: int) -> Any:
    g = torch.Generator().manual_seed(seed)

    def make(_step: int, rows: int) -> torch.Tensor:
        x = torch.randn(rows, V, generator=g) * (1 + 4 * torch.rand(rows, 1, generator=g))
        x[torch.rand(rows, V, generator=g) < 0.15] = NEG_INF  # masked earlier (a grammar, bans)
        ties = torch.rand(rows, generator=g) < 0.3  # rows with equal logits at a boundary
        x[ties, :6] = x[ties, 6:7]
        return x

    return make


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_route_matches_the_reference_under_churn(seed: int) -> None:
    sim = ChurnSimulator(CAP, V, seed, make_params, max_tokens=(2, 40), prompt_len=(0, 4))
    masked = routes_match_reference(
        TopKTopPLogitsProcessor,
        RefTopKTopPLogitsProcessor,
        sim,
        CAP,
        V,
        logits_with_holes(seed),
    )
    assert masked > 100  # the churn did mask


def test_same_kept_set_and_tokens_as_vllms_own_fields() -> None:
    """The same requests through our ``Sampler`` twice, once with vLLM's ``top_k`` / ``top_p``
    (the sampler's own tail), once with ``kept_top_k`` / ``kept_top_p`` through the processor:
    the same tokens for every seeded and greedy row (the claim the real engine checks in
    ``test_vllm_engine.py``), mixed top-k only, top-p only, both, and neither; and the same
    logits wherever a token could be drawn."""
    from logitsproc_rs import Sampler, SamplingMetadata

    rows = 12
    cfg = EngineConfig(max_num_seqs=rows, vocab_size=V)
    rng = random.Random(5)
    fields = []
    for i in range(rows):
        k, p = rng.choice(((5, 1.0), (0, 0.7), (3, 0.9), (0, 1.0), (V - 2, 0.5), (1, 1.0)))
        fields.append((k, p, 0.0 if i % 4 == 0 else 0.9))

    def run(ours: bool) -> tuple[list[list[int]], list[torch.Tensor]]:
        procs = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=[TopKTopPLogitsProcessor])
        sampler = Sampler(procs)
        params = []
        for k, p, t in fields:
            kw = {"kept_top_k": k, "kept_top_p": p} if ours else {"top_k": k, "top_p": p}
            params.append(SamplingParams(temperature=t, **kw))
        procs.update_state(upd(rows, added=[(i, p, [1, 2], []) for i, p in enumerate(params)]))
        gens = {
            i: torch.Generator().manual_seed(100 + i) for i, p in enumerate(params) if p.temperature
        }
        g = torch.Generator().manual_seed(9)
        out: list[list[int]] = [[] for _ in range(rows)]
        probs = []
        for _ in range(16):
            logits = torch.randn(rows, V, generator=g) * 3
            md = SamplingMetadata.from_params(params, V, generators=gens)
            res = sampler(logits, md)
            probs.append(res.logits.softmax(-1))
            for i, t in enumerate(res.sampled_token_ids.view(-1).tolist()):
                out[i].append(int(t))
            procs.update_state(None)
        return out, probs

    (ours, ours_probs), (own, own_probs) = run(True), run(False)
    assert ours == own
    for a, b in zip(ours_probs, own_probs, strict=True):
        assert torch.equal(a, b)


def test_greedy_rows_untouched() -> None:
    """A greedy request's fields are reset (as vLLM resets its own): a batch of greedy rows is
    left exactly as it was; a sampled row's kept set keeps its argmax."""
    assert SamplingParams(temperature=0.0, kept_top_k=3, kept_top_p=0.5).kept_top_k == 0
    assert SamplingParams(temperature=0.0, kept_top_k=3, kept_top_p=0.5).kept_top_p == 1.0
    proc = TopKTopPLogitsProcessor(CFG, "cpu", False)
    greedy = SamplingParams(temperature=0.0, kept_top_k=2, kept_top_p=0.3)
    proc.update_state(upd(3, added=[(i, greedy, None, []) for i in range(3)]))
    assert proc.pipeline.count("top_k_top_p") == 0
    x = torch.randn(3, V, generator=torch.Generator().manual_seed(1))
    x[1, 0] = -200.0  # an underflowing token: left alone too
    assert torch.equal(proc.apply(x.clone()), x)
    proc.update_state(upd(3, added=[(1, SamplingParams(kept_top_k=1), None, [])]))
    got = proc.apply(x.clone())
    assert torch.equal(got[1].isfinite().nonzero().view(-1), x[1].argmax().view(1))


def test_top_k_ties_and_top_p_edges() -> None:
    """Ties at the k-th value are kept; k at or above the vocabulary keeps all; k = 1 keeps the
    max; a tiny p keeps only the top token; -1 is off."""
    proc = TopKTopPLogitsProcessor(CFG, "cpu", False)
    ref = RefTopKTopPLogitsProcessor(CFG, torch.device("cpu"), False)
    params = [
        SamplingParams(kept_top_k=3),
        SamplingParams(kept_top_k=V),
        SamplingParams(kept_top_k=1),
        SamplingParams(kept_top_p=1e-6),
        SamplingParams(kept_top_k=-1, kept_top_p=0.9),
    ]
    u = upd(len(params), added=[(i, p, None, []) for i, p in enumerate(params)])
    proc.update_state(u)
    ref.update_state(u)
    x = torch.randn(len(params), V, generator=torch.Generator().manual_seed(2))
    x[0, :5] = torch.tensor([9.0, 8.0, 7.0, 7.0, 7.0])  # ties at the 3rd value
    got = proc.apply(x.clone())
    assert torch.equal(got, ref.apply(x.clone()))
    assert int(got[0].isfinite().sum()) == 5  # 9, 8 and the three 7s
    assert bool(got[1].isfinite().all())
    assert int(got[2].isfinite().sum()) == 1 and int(got[3].isfinite().sum()) == 1
    assert 1 <= int(got[4].isfinite().sum()) < V


def test_a_row_at_p_one_loses_its_probability_zero_tokens_as_in_vllms_batch() -> None:
    """vLLM's sort path takes top-p over every row once one row uses it: a row at p = 1 masks
    the tail whose cumulative probability is <= 0, the tokens whose probability underflows to
    0 (no draw picks them either way). The processor passes the whole batch, so the same."""
    proc = TopKTopPLogitsProcessor(CFG, "cpu", False)
    ref = RefTopKTopPLogitsProcessor(CFG, torch.device("cpu"), False)
    u = upd(
        3, added=[(1, SamplingParams(kept_top_p=0.8), None, []), (2, SamplingParams(), None, [])]
    )
    proc.update_state(u)
    ref.update_state(u)
    x = torch.randn(3, V, generator=torch.Generator().manual_seed(4))
    x[0, 3] = x[2, 5] = -150.0  # exp(-150) is 0 in float32
    want = ref.apply(x.clone())
    assert want[0, 3] == NEG_INF and want[2, 5] == NEG_INF
    assert torch.equal(proc.apply(x.clone()), want)


def test_in_the_sampler_last_of_the_argmax_invariant_phase() -> None:
    """Its place in the order (``BUILTINS``, so HF's opt-in and the demo) is last of the
    argmax-invariant ones, where vLLM applies its own top-k / top-p: min-p → (the other opt-in
    truncations, XTC) → top-k → top-p. Built as a custom processor it joins the argmax-invariant
    phase after MinP, in the order it is given (as vLLM orders custom processors)."""
    from logitsproc_rs.builtin import OPT_IN_PROCESSORS, asked_for

    invariant = [c for c in OPT_IN_PROCESSORS if c.ARGMAX_INVARIANT]
    assert invariant[-1] is TopKTopPLogitsProcessor
    assert asked_for([SamplingParams(kept_top_p=0.5, xtc_probability=0.5)]) == [
        XTCLogitsProcessor,
        TopKTopPLogitsProcessor,
    ]
    procs = build_logitsprocs(
        CFG, "cpu", False, custom_logitsprocs=[XTCLogitsProcessor, TopKTopPLogitsProcessor]
    )
    names = [type(p).__name__ for p in procs.argmax_invariant]
    assert names == [
        MinPLogitsProcessor.__name__,
        XTCLogitsProcessor.__name__,
        TopKTopPLogitsProcessor.__name__,
    ]
    assert all(not isinstance(p, TopKTopPLogitsProcessor) for p in procs.non_argmax_invariant)


def test_a_pipeline_without_it_refuses_its_fields() -> None:
    procs = build_logitsprocs(CFG, "cpu", False)
    with pytest.raises(ValueError) as e:
        procs.update_state(upd(1, added=[(0, SamplingParams(kept_top_k=4), None, [])]))
    assert getattr(e.value, "field", None) == "kept_top_k"
    # vLLM's own top_k / top_p are the sampler's: no processor needed.
    procs.update_state(upd(1, added=[(0, SamplingParams(top_k=4, top_p=0.5), None, [])]))


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("kept_top_k", -2),
        ("kept_top_k", 1.5),
        ("kept_top_k", True),
        ("kept_top_k", "3"),
        ("kept_top_k", -(2**70)),
        ("kept_top_p", 0.0),
        ("kept_top_p", -0.1),
        ("kept_top_p", 1.5),
        ("kept_top_p", float("nan")),
        ("kept_top_p", float("inf")),
        ("kept_top_p", "0.5"),
    ],
)
def test_bad_input_names_the_request_and_field(field: str, bad: Any) -> None:
    with pytest.raises(RequestError) as ei:
        SamplingParams(**{field: bad})
    assert ei.value.field == field
    proc = TopKTopPLogitsProcessor(CFG, "cpu", False)
    proc.update_state(upd(1, added=[(0, SamplingParams(kept_top_k=2), None, [])]))
    x = torch.randn(2, V, generator=torch.Generator().manual_seed(3))
    before = proc.apply(x[:1].clone())
    good = SimpleNamespace(kept_top_k=5, kept_top_p=0.5)
    with pytest.raises(ValueError) as e:
        proc.update_state(
            upd(2, added=[(1, good, None, []), (0, SimpleNamespace(**{field: bad}), None, [])])
        )
    assert getattr(e.value, "index", None) == 0
    assert getattr(e.value, "field", None) == field
    # Nothing changed: row 0 still holds k = 2, row 1 nothing.
    assert proc.pipeline.count("top_k_top_p") == 1
    proc.update_state(upd(2, added=[(1, SamplingParams(), None, [])]))
    got = proc.apply(x.clone())
    assert torch.equal(got[:1], before)
    assert int(got[0].isfinite().sum()) == 2


def test_range_messages_are_vllms_ranges() -> None:
    with pytest.raises(RequestError, match=r"kept_top_k must be an int >= -1 \(0 or -1: off\)"):
        SamplingParams(kept_top_k=-3)
    with pytest.raises(RequestError, match=r"kept_top_p must be in \(0, 1\] \(1: off\)"):
        SamplingParams(kept_top_p=0.0)
    assert SamplingParams(kept_top_k=-1).kept_top_k == 0
    assert SamplingParams(kept_top_p=None).kept_top_p == 1.0

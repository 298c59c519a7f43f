"""Logits and sampling metadata the processors cannot take: another device, rows that are not
contiguous, non-float dtypes (with or without work to do), half precision (cast like the
``Sampler`` does), ``SamplingMetadata`` with fewer rows than the logits or generators outside
them. Each raises a ``ValueError`` naming the processor or the field, and changes nothing."""

from __future__ import annotations

import pytest
import torch

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    PenaltiesLogitsProcessor,
    Sampler,
    SamplingMetadata,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.reference import ReferenceSampler, build_reference_logitsprocs

from ._checks import SMALL_CFG as CFG
from ._checks import SMALL_V as V
from ._checks import TRIO as ALL
from ._checks import bias_update

# --- logits the processors cannot take -------------------------------------------------------


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_logits_on_another_device_are_refused(cls) -> None:
    """CPU processors given device logits (here the meta device, which every build has) never
    hand a device pointer to a host kernel."""
    p = cls(CFG, "cpu", False)
    p.update_state(bias_update(1))
    with pytest.raises(ValueError, match=r"logits on meta, but the processors were built for cpu"):
        p.apply(torch.empty(1, V, device="meta"))


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_rows_that_are_not_contiguous_are_refused(cls) -> None:
    p = cls(CFG, "cpu", False)
    p.update_state(bias_update(2))
    x = torch.randn(V, 2).t()
    x0 = x.clone()
    with pytest.raises(ValueError, match="rows must be contiguous"):
        p.apply(x)
    assert torch.equal(x, x0)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64])
def test_non_float_logits_are_refused(dtype) -> None:
    p = PenaltiesLogitsProcessor(CFG, "cpu", False)
    p.update_state(None)
    with pytest.raises(ValueError, match="floating-point"):
        p.apply(torch.zeros(0, V, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_logits_are_cast_like_the_sampler_does(dtype) -> None:
    """float16 / bfloat16 come back as float32 (the Sampler's cast before the processors), with
    the same result as casting first."""
    for route in ("host", "emulated"):
        procs = build_logitsprocs(CFG, "cpu", False, emulate_device=route == "emulated")
        u = BatchUpdate(
            2,
            [],
            [
                (0, SamplingParams(logit_bias={3: 2.5}, repetition_penalty=1.5), [3], [4]),
                (1, SamplingParams(min_p=0.3, min_tokens=2, stop_token_ids=[5]), [1], []),
            ],
            [],
        )
        procs.update_state(u)
        x = torch.randn(2, V).to(dtype)
        want = x.to(torch.float32)
        got = x
        for p in procs.all:
            want = p.apply(want)
            got = p.apply(got)
        assert got.dtype == torch.float32
        assert torch.equal(got, want), route


def _metadata(rows: int, temperature: float = 0.7) -> SamplingMetadata:
    params = [SamplingParams(temperature=temperature, top_p=0.9, top_k=5) for _ in range(rows)]
    return SamplingMetadata.from_params(params, V)


@pytest.mark.parametrize("field", ["temperature", "top_p", "top_k"])
@pytest.mark.parametrize("sampler_kind", ["ours", "reference"])
def test_sampling_metadata_with_fewer_rows_than_the_logits_is_refused(field, sampler_kind):
    """A one-row tensor would broadcast over a three-row batch: every row sampled with row 0's
    temperature, top-p or top-k."""
    if sampler_kind == "ours":
        sampler = Sampler(build_logitsprocs(CFG, "cpu", False))
    else:
        sampler = ReferenceSampler(build_reference_logitsprocs(CFG, "cpu"))
    sampler.logitsprocs.update_state(
        BatchUpdate(3, [], [(i, SamplingParams(), None, []) for i in range(3)], [])
    )
    md = _metadata(3)
    setattr(md, field, getattr(_metadata(1), field))
    with pytest.raises(ValueError, match=rf"SamplingMetadata\.{field}: expected one entry per"):
        sampler(torch.randn(3, V), md)


def test_sampling_metadata_generators_outside_the_rows_are_refused():
    sampler = Sampler(build_logitsprocs(CFG, "cpu", False))
    sampler.logitsprocs.update_state(BatchUpdate(1, [], [(0, SamplingParams(), None, [])], []))
    md = _metadata(1)
    md.generators = {3: torch.Generator().manual_seed(0)}
    with pytest.raises(ValueError, match=r"SamplingMetadata\.generators: rows \[3\]"):
        sampler(torch.randn(1, V), md)


def test_sampling_metadata_that_matches_samples():
    sampler = Sampler(build_logitsprocs(CFG, "cpu", False))
    sampler.logitsprocs.update_state(
        BatchUpdate(2, [], [(i, SamplingParams(), None, []) for i in range(2)], [])
    )
    out = sampler(torch.randn(2, V), _metadata(2))
    assert out.sampled_token_ids.shape == (2,)


def test_non_float_logits_are_refused_with_a_request_active() -> None:
    procs = build_logitsprocs(EngineConfig(max_num_seqs=2, vocab_size=8), "cpu", False)
    procs.update_state(BatchUpdate(1, [], [(0, SamplingParams(logit_bias={1: 1.0}), None, [])], []))
    for dtype in (torch.int64, torch.bool, torch.complex64):
        with pytest.raises(ValueError, match="floating-point"):
            for p in procs.non_argmax_invariant:
                p.apply(torch.zeros(1, 8, dtype=dtype))


def test_every_processor_refuses_non_float_logits_even_with_nothing_to_do() -> None:
    procs = build_logitsprocs(EngineConfig(max_num_seqs=2, vocab_size=8), "cpu", False)
    procs.update_state(BatchUpdate(1, [], [(0, SamplingParams(), None, [])], []))
    for p in procs.all:
        with pytest.raises(ValueError, match="floating-point"):
            p.apply(torch.zeros(1, 8, dtype=torch.int32))

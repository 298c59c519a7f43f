"""Logits the processors and the ``Sampler`` must refuse or handle exactly (issue 18):

- rows that alias each other (an ``expand``ed tensor, ``as_strided`` with a row stride below
  the vocabulary): refused with a ``ValueError`` naming the processor, logits untouched;
- every floating dtype torch has: float32 and float64 exactly as the reference on the same
  dtype, float16 / bfloat16 cast to float32 (as the ``Sampler`` casts), the float8 and float4
  formats refused;
- logits that require grad (and inference tensors outside inference mode): refused with a
  ``ValueError`` by every processor, whether or not it has work this step.

Every built-in is driven through both routes (host kernels, and the device code paths on the
CPU) and against its plain reference."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from logitsproc_rs import (
    BUILTINS,
    BatchUpdate,
    EngineConfig,
    Pipeline,
    Sampler,
    SamplingMetadata,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.builtin import OPT_IN_PROCESSORS
from logitsproc_rs.reference import ReferenceSampler, build_reference_logitsprocs, reference_of
from logitsproc_rs.registry import TABLES

V = 16
CFG = EngineConfig(
    max_num_seqs=4,
    vocab_size=V,
    reasoning_start_token_ids=[14],
    reasoning_end_token_ids=[15],
)
ROUTES = ("host", "emulated")

FLOATS = sorted(
    {d for d in vars(torch).values() if isinstance(d, torch.dtype) and d.is_floating_point},
    key=str,
)
EXACT = (torch.float32, torch.float64)
CAST = (torch.float16, torch.bfloat16)
REFUSED = tuple(d for d in FLOATS if d not in EXACT + CAST)


def _params() -> list[SamplingParams]:
    """Three requests that give every built-in work to do: the ones below, and, for a table
    they leave without work, the registry's first example of each of its switching fields
    (``FieldSpec::examples``) in the first request."""
    requests = [
        SamplingParams(
            logit_bias={3: 2.5, 9: -0.1},
            min_tokens=3,
            stop_token_ids=[5],
            repetition_penalty=1.5,
            frequency_penalty=0.3,
            presence_penalty=0.2,
            no_repeat_ngram_size=2,
            bad_words_token_ids=[[4], [6, 7]],
            top_n_sigma=0.5,
            epsilon_cutoff=0.08,
            dry_multiplier=0.8,
            dry_allowed_length=1,
            kept_top_k=6,
            max_tokens=None,
        ),
        SamplingParams(
            min_p=0.2,
            allowed_token_ids=[1, 2, 3, 5, 8],
            thinking_token_budget=0,
            typical_p=0.3,
            max_tokens=None,
        ),
        SamplingParams(
            min_p=0.05,
            repetition_penalty=0.7,
            eta_cutoff=0.1,
            xtc_probability=1.0,
            xtc_threshold=0.05,
            kept_top_p=0.7,
            max_tokens=None,
        ),
    ]
    given = {
        t.name
        for t in TABLES.values()
        for f in t.fields
        if any(f.is_set(getattr(p, f.attr, None)) for p in requests)
    }
    extra = {
        f.attr: f.examples[0]
        for t in TABLES.values()
        if t.name not in given
        for f in t.fields
        if not f.tunes
    }
    if extra:
        requests[0] = dataclasses.replace(requests[0], **extra)
    return requests


# _params sets fields of every opt-in processor: the sampler tests build them all (a pipeline
# without one refuses its fields).
REF_OPT_IN = [reference_of(c).__name__ for c in OPT_IN_PROCESSORS]


def _every(cfg: Any) -> Any:
    return build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=OPT_IN_PROCESSORS)


def _update() -> BatchUpdate:
    prompts = [[1, 2, 6], [14, 3], [8, 8, 2]]
    outputs: list[list[int]] = [[6, 1], [], [2]]
    return BatchUpdate(3, [], [(i, p, prompts[i], outputs[i]) for i, p in enumerate(_params())], [])


def _ours(cls: Any, route: str) -> Any:
    if route == "host":
        return cls(CFG, "cpu", False)
    pipe = Pipeline(CFG, "cpu", False, tables=cls.TABLES, emulate_device=True)
    return cls(CFG, "cpu", False, pipeline=pipe)


def _stepped(cls: Any, route: str) -> tuple[Any, Any]:
    ours = _ours(cls, route)
    ref = reference_of(cls)(CFG, torch.device("cpu"), False)
    for p in (ours, ref):
        p.update_state(_update())
    return ours, ref


def _logits(dtype: torch.dtype = torch.float32, rows: int = 3, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, V, generator=g, dtype=torch.float64) * 3).to(dtype)


def _name(cls: Any) -> str:
    return str(cls.__name__)


# --- rows that alias each other -------------------------------------------------------------


def _aliased() -> dict[str, torch.Tensor]:
    base = torch.randn(4 * V)
    return {
        "expand": base[:V].unsqueeze(0).expand(3, V),
        "stride0": torch.as_strided(base, (3, V), (0, 1)),
        "half_row": torch.as_strided(base, (3, V), (V // 2, 1)),
        "one_apart": torch.as_strided(base, (3, V), (1, 1)),
    }


@pytest.mark.parametrize("kind", ["expand", "stride0", "half_row", "one_apart"])
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("cls", BUILTINS, ids=_name)
def test_rows_that_alias_each_other_are_refused(cls, route, kind) -> None:
    ours, _ = _stepped(cls, route)
    x = _aliased()[kind]
    storage = x.as_strided((x.untyped_storage().nbytes() // 4,), (1,), 0).clone()
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.apply: logits rows overlap"):
        ours.apply(x)
    after = x.as_strided((x.untyped_storage().nbytes() // 4,), (1,), 0)
    assert torch.equal(storage, after)


@pytest.mark.parametrize("cls", BUILTINS, ids=_name)
def test_rows_that_alias_each_other_are_refused_with_nothing_to_do(cls) -> None:
    p = cls(CFG, "cpu", False)
    p.update_state(BatchUpdate(3, [], [(i, SamplingParams(), None, []) for i in range(3)], []))
    with pytest.raises(ValueError, match="rows overlap"):
        p.apply(torch.zeros(1, V).expand(3, V))


def test_rows_apart_and_single_rows_are_still_taken() -> None:
    """A row stride above the vocabulary (vLLM's slice of a padded vocabulary) and one row
    with any stride are fine: only overlapping rows are refused."""
    for cls in BUILTINS:
        ours, ref = _stepped(cls, "host")
        wide = _logits(torch.float32).repeat(1, 2)[:, :V]
        assert wide.stride(0) == 2 * V
        want = ref.apply(wide.contiguous())
        assert torch.equal(ours.apply(wide), want), cls.__name__
    p = BUILTINS[0](CFG, "cpu", False)
    p.update_state(BatchUpdate(1, [], [(0, SamplingParams(), None, [])], []))
    one = torch.as_strided(torch.randn(V), (1, V), (0, 1))
    p.apply(one)


def test_the_sampler_refuses_aliased_rows() -> None:
    procs = _every(CFG)
    procs.update_state(_update())
    md = SamplingMetadata.from_params(_params(), V)
    with pytest.raises(ValueError, match="rows overlap"):
        Sampler(procs)(torch.zeros(1, V).expand(3, V), md)


# --- every floating dtype -------------------------------------------------------------------


def test_the_dtype_lists_cover_every_floating_dtype_torch_has() -> None:
    assert torch.float8_e4m3fn in REFUSED and torch.float8_e5m2 in REFUSED
    assert set(EXACT + CAST + REFUSED) == set(FLOATS)


@pytest.mark.parametrize("dtype", EXACT, ids=str)
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("cls", BUILTINS, ids=_name)
def test_float32_and_float64_are_exact_against_the_reference(cls, route, dtype) -> None:
    ours, ref = _stepped(cls, route)
    x = _logits(dtype)
    want = ref.apply(x.clone())
    got = ours.apply(x.clone())
    assert got.dtype == dtype
    assert torch.equal(got, want), f"\n{got}\n{want}"
    assert not torch.equal(want, x) or cls.__name__ == "NoRepeatNGramLogitsProcessor"


@pytest.mark.parametrize("dtype", CAST, ids=str)
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("cls", BUILTINS, ids=_name)
def test_half_precision_is_cast_to_float32(cls, route, dtype) -> None:
    ours, ref = _stepped(cls, route)
    x = _logits(dtype)
    got = ours.apply(x.clone())
    assert got.dtype == torch.float32
    assert torch.equal(got, ref.apply(x.to(torch.float32)))


@pytest.mark.parametrize("dtype", REFUSED, ids=str)
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("cls", BUILTINS, ids=_name)
def test_float8_and_float4_logits_are_refused(cls, route, dtype) -> None:
    ours, _ = _stepped(cls, route)
    x = torch.zeros(3, V, dtype=torch.uint8).view(dtype)
    raw = x.view(torch.uint8).clone()
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.apply: logits of dtype {dtype}"):
        ours.apply(x)
    assert torch.equal(x.view(torch.uint8), raw)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_the_sampler_takes_or_refuses_every_floating_dtype(dtype) -> None:
    """The Sampler casts to float32 first (vLLM's order): float16, bfloat16 and float64 sample
    exactly as their float32 cast; float8 / float4 are refused before anything runs."""
    md = SamplingMetadata.from_params(
        [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0), SamplingParams()], V
    )

    def run(x: torch.Tensor, reference: bool = False) -> Any:
        if reference:
            procs = build_reference_logitsprocs(CFG, "cpu", opt_in=REF_OPT_IN)
            procs.update_state(_update())
            return ReferenceSampler(procs)(x, md)
        procs = _every(CFG)
        procs.update_state(_update())
        return Sampler(procs)(x, md)

    if dtype in REFUSED:
        x = torch.zeros(3, V, dtype=torch.uint8).view(dtype)
        with pytest.raises(ValueError, match=rf"Sampler: logits of dtype {dtype}"):
            run(x)
        return
    x = _logits(dtype)
    got = run(x.clone())
    want = run(x.to(torch.float32, copy=True))
    ref = run(x.to(torch.float32, copy=True), reference=True)
    assert torch.equal(got.logits, want.logits)
    assert torch.equal(got.logits, ref.logits)
    assert torch.equal(got.sampled_token_ids[:2], want.sampled_token_ids[:2])


# --- logits that require grad ---------------------------------------------------------------


@pytest.mark.parametrize("work", [True, False], ids=["work", "idle"])
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("cls", BUILTINS, ids=_name)
def test_logits_that_require_grad_are_refused(cls, route, work) -> None:
    if work:
        ours, _ = _stepped(cls, route)
    else:
        ours = _ours(cls, route)
        ours.update_state(
            BatchUpdate(3, [], [(i, SamplingParams(), None, []) for i in range(3)], [])
        )
    for dtype in (torch.float32, torch.float64, torch.float16):
        leaf = torch.zeros(3, V, dtype=dtype, requires_grad=True)
        with pytest.raises(ValueError, match=rf"{cls.__name__}\.apply: logits require grad"):
            ours.apply(leaf)
        assert torch.equal(leaf.detach(), torch.zeros(3, V, dtype=dtype))
        with pytest.raises(ValueError, match="require grad"):
            ours.apply(leaf * 2)


def test_the_sampler_refuses_logits_that_require_grad() -> None:
    procs = _every(CFG)
    procs.update_state(_update())
    md = SamplingMetadata.from_params(_params(), V)
    with pytest.raises(ValueError, match="Sampler: logits require grad"):
        Sampler(procs)(torch.zeros(3, V, requires_grad=True), md)


@pytest.mark.parametrize("cls", BUILTINS, ids=_name)
def test_inference_tensors_outside_inference_mode_are_refused(cls) -> None:
    for route in ROUTES:
        ours, ref = _stepped(cls, route)
        with torch.inference_mode():
            x = _logits()
            # Inside inference mode they are taken as any other logits.
            assert torch.equal(ours.apply(x.clone()), ref.apply(x.clone()))
        with pytest.raises(ValueError, match="inference"):
            ours.apply(x)


def test_detached_logits_work() -> None:
    for cls in BUILTINS:
        ours, ref = _stepped(cls, "host")
        x = _logits().requires_grad_()
        assert torch.equal(ours.apply(x.detach().clone()), ref.apply(x.detach().clone()))


def test_the_spec_decode_applies_check_the_logits_too() -> None:
    """``apply_with_spec_decode`` (MinTokens, bad words) refuses what ``apply`` refuses."""
    from logitsproc_rs import BadWordsLogitsProcessor, MinTokensLogitsProcessor

    bad = {
        "rows overlap": torch.zeros(1, V).expand(3, V),
        "dtype torch.float8_e5m2": torch.zeros(3, V, dtype=torch.float8_e5m2),
        "require grad": torch.zeros(3, V, requires_grad=True),
    }
    cfg = EngineConfig(max_num_seqs=4, vocab_size=V, num_speculative_tokens=1)
    for cls in (MinTokensLogitsProcessor, BadWordsLogitsProcessor):
        p = cls(cfg, "cpu", False)
        p.update_state(_update())
        args: tuple[Any, ...] = ([1, 1, 1],)
        if cls is BadWordsLogitsProcessor:
            args += ([[4], [4], [4]],)
        for what, x in bad.items():
            with pytest.raises(
                ValueError, match=rf"{cls.__name__}\.apply_with_spec_decode: .*{what}"
            ):
                p.apply_with_spec_decode(x, *args)
        x = _logits(torch.float64)
        assert p.apply_with_spec_decode(x.clone(), *args).dtype == torch.float64

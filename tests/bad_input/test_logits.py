"""Misuse is loud (issue 7) and bad logits get a clear ``ValueError`` (issue 9): each case that
used to pass silently (or reach a kernel) now raises, naming the processor or the field, and
changes nothing."""

from __future__ import annotations

import pytest
import torch

from logitsproc_rs import (
    BUILTIN_LOGITS_PROCESSORS,
    BatchUpdate,
    EngineConfig,
    LogitBiasLogitsProcessor,
    LogitsProcessor,
    PenaltiesLogitsProcessor,
    Sampler,
    SamplingMetadata,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.reference import ReferenceSampler, build_reference_logitsprocs

V = 16
CFG = EngineConfig(max_num_seqs=4, vocab_size=V)
ALL = [cls for cls in BUILTIN_LOGITS_PROCESSORS if cls.__name__ != "ThinkingBudgetLogitsProcessor"]


def _bias_update(n: int = 1) -> BatchUpdate:
    return BatchUpdate(
        n, [], [(i, SamplingParams(logit_bias={3: 5.0}), [1], []) for i in range(n)], []
    )


# --- a skipped update_state ------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_logits_for_a_batch_the_processor_was_never_told_of_are_refused(cls) -> None:
    """The engine skipped the update that added the batch's first request: with nothing
    active a processor used to return the logits untouched (the new request's bias or penalty
    silently dropped). The rows are checked against the batch whether or not there is work."""
    p = cls(CFG, "cpu", False)
    p.update_state(None)
    x = torch.randn(1, V)
    x0 = x.clone()
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.apply: .*expected \[0, {V}\]"):
        p.apply(x)
    assert torch.equal(x, x0)


def test_skipped_update_with_a_new_request_is_refused_not_dropped() -> None:
    procs = build_logitsprocs(CFG, "cpu", False)
    procs.update_state(_bias_update(1))
    # Step 2 adds a second request, but the engine forgets update_state.
    bias = next(p for p in procs.all if isinstance(p, LogitBiasLogitsProcessor))
    with pytest.raises(ValueError, match=r"expected \[1, 16\]"):
        bias.apply(torch.zeros(2, V))
    # Told, it applies both.
    procs.update_state(BatchUpdate(2, [], [(1, SamplingParams(logit_bias={3: 5.0}), [1], [])], []))
    y = bias.apply(torch.zeros(2, V))
    assert y[:, 3].tolist() == [5.0, 5.0]


# --- logits the processors cannot take -------------------------------------------------------


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_logits_on_another_device_are_refused(cls) -> None:
    """CPU processors given device logits (here the meta device, which every build has) never
    hand a device pointer to a host kernel."""
    p = cls(CFG, "cpu", False)
    p.update_state(_bias_update(1))
    with pytest.raises(ValueError, match=r"logits on meta, but the processors were built for cpu"):
        p.apply(torch.empty(1, V, device="meta"))


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_rows_that_are_not_contiguous_are_refused(cls) -> None:
    p = cls(CFG, "cpu", False)
    p.update_state(_bias_update(2))
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


# --- SamplingMetadata --------------------------------------------------------------------------


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


# --- configs -----------------------------------------------------------------------------------


def test_a_config_mapping_is_an_engine_config() -> None:
    p = LogitBiasLogitsProcessor({"max_num_seqs": 2, "vocab_size": V}, "cpu", False)
    p.update_state(_bias_update(1))
    assert p.apply(torch.zeros(1, V))[0, 3].item() == 5.0


def test_a_config_mapping_with_an_unknown_field_names_it() -> None:
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['max_seqs'\]"):
        LogitBiasLogitsProcessor({"max_seqs": 2, "vocab_size": V}, "cpu", False)
    with pytest.raises(ValueError, match=r"EngineConfig\.vocab_size must be an int >= 1"):
        LogitBiasLogitsProcessor({"vocab_size": 0}, "cpu", False)


def test_a_config_without_the_fields_names_the_field() -> None:
    with pytest.raises(ValueError, match="config field 'vocab_size'"):
        LogitBiasLogitsProcessor(object(), "cpu", False)


def test_build_logitsprocs_takes_a_config_mapping_and_a_kernel_choice() -> None:
    procs = build_logitsprocs({"max_num_seqs": 2, "vocab_size": V}, "cpu", False, kernels="torch")
    assert procs.pipeline.kernels == "torch"
    procs.update_state(_bias_update(1))
    bias = next(p for p in procs.all if isinstance(p, LogitBiasLogitsProcessor))
    assert bias.apply(torch.zeros(1, V))[0, 3].item() == 5.0
    with pytest.raises(ValueError, match="unknown field"):
        build_logitsprocs({"vocab": V}, "cpu", False)
    with pytest.raises(ValueError, match="kernels"):
        build_logitsprocs(CFG, "cpu", False, kernels="cuda")


# --- a custom processor that raises -----------------------------------------------------------


class _Flaky(LogitsProcessor):
    """Adds 1 to token 0 of every row; raises once in update_state or apply on demand."""

    FAIL: str | None = None

    def __init__(self, vllm_config, device, is_pin_memory) -> None:
        self.rows = 0

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        if _Flaky.FAIL == "update_state":
            raise KeyError("lost a slot")
        if batch_update is not None:
            self.rows = batch_update.batch_size

    def apply(self, logits):
        if _Flaky.FAIL == "apply":
            raise ValueError("bad row")
        logits[:, 0] += 1.0
        return logits


@pytest.mark.parametrize(
    ("where", "exc", "message"),
    [
        ("update_state", RuntimeError, r"_Flaky\.update_state raised KeyError\('lost a slot'\)"),
        ("apply", ValueError, r"_Flaky\.apply: bad row"),
    ],
)
def test_a_raising_custom_processor_is_named_and_the_next_step_works(where, exc, message):
    procs = build_logitsprocs(CFG, "cpu", False, custom_logitsprocs=[_Flaky])
    plain = build_logitsprocs(CFG, "cpu", False)
    sampler, plain_sampler = Sampler(procs), Sampler(plain)
    greedy = [SamplingParams(temperature=0.0, logit_bias={5: 9.0}, min_tokens=2, eos_token_id=3)]
    outputs: list[list[int]] = [[]]
    update = BatchUpdate(1, [], [(0, greedy[0], [1], outputs[0])], [])
    md = SamplingMetadata.from_params(greedy, V)
    g = torch.Generator().manual_seed(0)
    for step in range(4):
        x = torch.randn(1, V, generator=g)
        _Flaky.FAIL = where if step == 1 else None
        try:
            if step == 1 and where == "update_state":
                with pytest.raises(exc, match=message):
                    procs.update_state(update)
                plain.update_state(update)
                continue
            procs.update_state(update)
            plain.update_state(update)
            if step == 1:
                with pytest.raises(exc, match=message):
                    sampler(x.clone(), md)
                continue
        finally:
            _Flaky.FAIL = None
        got = sampler(x.clone(), md).logits
        want = plain_sampler(x.clone(), md).logits
        want[:, 0] += 1.0  # _Flaky's own work, after the built-ins before it in vLLM's order
        assert torch.allclose(got, want), step
        outputs[0].append(7)
        update = None

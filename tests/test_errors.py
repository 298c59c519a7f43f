"""``logitsproc_rs.errors``: one class per kind of error, with ``index``, ``field``, ``processor``
(and ``column``, ``detail``) as attributes, raised alike by the Rust core, the bindings and the
Python side; each still the builtin callers catch (``ValueError``, ``RuntimeError``,
``MemoryError``), with its message unchanged."""

from __future__ import annotations

import copy
import pickle
import re
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from logitsproc_rs import (
    AllocationError,
    BatchUpdate,
    BatchUpdateBuilder,
    BatchUpdateError,
    ColumnLogitsProcessor,
    ConfigError,
    EngineConfig,
    FloatColumn,
    LogitsprocError,
    MoveDirectionality,
    Pipeline,
    ProtocolError,
    RequestError,
    SamplingParams,
    SizeError,
    _core,
    build_logitsprocs,
)
from logitsproc_rs.errors import with_context
from logitsproc_rs.vllm import _guard
from logitsproc_rs.vllm._fields import routed_params

CFG = EngineConfig(max_num_seqs=8, vocab_size=50, max_logit_bias_entries=2)
V = CFG.vocab_size


def P(**fields: Any) -> SimpleNamespace:
    """Duck-typed params (vLLM-like): values our SamplingParams would refuse reach the core."""
    base = {"min_p": 0.0, "logit_bias": None, "min_tokens": 0, "all_stop_token_ids": set()}
    return SimpleNamespace(**{**base, **fields})


def added(*params: Any, first: int = 0) -> BatchUpdate:
    entries = [(first + i, p, None, []) for i, p in enumerate(params)]
    return BatchUpdate(batch_size=first + len(params), removed=[], added=entries, moved=[])


def raised(update: Any, cfg: EngineConfig = CFG) -> BaseException:
    procs = build_logitsprocs(cfg, "cpu", False, sampler_transforms=False)
    with pytest.raises(Exception) as ei:
        procs.update_state(update)
    return ei.value


def test_hierarchy() -> None:
    for cls, builtin in [
        (RequestError, ValueError),
        (BatchUpdateError, ValueError),
        (ConfigError, ValueError),
        (SizeError, ValueError),
        (ProtocolError, RuntimeError),
        (AllocationError, MemoryError),
    ]:
        assert issubclass(cls, LogitsprocError)
        assert issubclass(cls, builtin)
    assert not issubclass(ProtocolError, ValueError)


# --- from the Rust core and its bindings ---------------------------------------------------


def test_bad_min_p_from_the_core() -> None:
    e = raised(added(P(), P(), P(min_p=1.5)))
    assert type(e) is RequestError and isinstance(e, ValueError)
    assert (e.index, e.field, e.processor, e.column) == (2, "min_p", "min_p", None)
    assert str(e) == f"request at index 2: field 'min_p': {e.detail}"
    assert "1.5" in (e.detail or "")


def test_wrong_type_from_the_bindings() -> None:
    e = raised(added(P(min_p="high")))
    assert type(e) is RequestError
    assert (e.index, e.field, e.processor) == (0, "min_p", "min_p")
    assert re.fullmatch(r"request at index 0: field 'min_p': must be a number, got 'high'", str(e))


def test_out_of_vocab_logit_bias() -> None:
    e = raised(added(P(), P(logit_bias={V + 5: 1.0})))
    assert type(e) is RequestError
    assert (e.index, e.field, e.processor) == (1, "logit_bias", "logit_bias")
    assert str(e).startswith("request at index 1: field 'logit_bias': ")


def test_too_many_entries_for_a_cap() -> None:
    e = raised(added(P(logit_bias={1: 1.0, 2: 1.0, 3: 1.0})))
    assert type(e) is RequestError
    assert (e.index, e.field, e.processor) == (0, "logit_bias", "logit_bias")
    assert e.detail == "3 entries exceed the per-request cap of 2"
    cfg = EngineConfig(max_num_seqs=8, vocab_size=50, max_stop_token_ids=2)
    e = raised(added(P(), P(min_tokens=3, all_stop_token_ids={1, 2, 3})), cfg)
    assert (type(e), e.index, e.field, e.processor) == (
        RequestError,
        1,
        "stop_token_ids",
        "min_tokens",
    )


class _Margin(ColumnLogitsProcessor):
    COLUMNS = (FloatColumn("margin", 0.0, lambda sp: (sp.extra_args or {}).get("margin")),)

    def is_argmax_invariant(self) -> bool:
        return True

    def transform(self, logits: torch.Tensor, cols: Any, num_active: int) -> torch.Tensor:
        return logits


@pytest.mark.parametrize(
    ("value", "where"), [("wide", "must be a number"), (1e39, "not a finite float32")]
)
def test_column_error_names_the_column(value: Any, where: str) -> None:
    """A binding error (a wrong type) and a core error (out of float32 range) alike."""
    proc = _Margin(CFG, "cpu", False)
    with pytest.raises(RequestError) as ei:
        proc.update_state(added(P(extra_args={}), P(extra_args={"margin": value})))
    e = ei.value
    assert (e.index, e.field, e.column, e.processor) == (1, "column", "margin", None)
    assert str(e).startswith("request at index 1: field 'column': 'margin': ")
    assert where in str(e)


@pytest.mark.parametrize(
    ("update", "field", "index"),
    [
        (BatchUpdate(batch_size=9, removed=[], added=[], moved=[]), "batch_size", None),
        (BatchUpdate(batch_size=1, removed=[8], added=[], moved=[]), "removed", 8),
        (BatchUpdate(batch_size=1, removed=5, added=[], moved=[]), "removed", None),
        (BatchUpdate(batch_size=2, removed=[], added=[], moved=[(0, 1, "sideways")]), "moved", 0),
        (BatchUpdate(batch_size=1, removed=[], added=[(0, P())], moved=[]), "added", None),
    ],
)
def test_malformed_update(update: BatchUpdate, field: str, index: int | None) -> None:
    e = raised(update)
    assert type(e) is BatchUpdateError and isinstance(e, ValueError)
    assert (e.field, e.index, e.processor) == (field, index, None)
    assert not isinstance(e, RequestError)  # never failed closed as a request (_guard)
    assert _guard.refused_index(e, range(8)) is None


def test_duplicate_add_is_an_update_error() -> None:
    e = raised(BatchUpdate(2, [], [(1, P(), None, []), (1, P(), None, [])], []))
    assert (type(e), e.index, e.field) == (BatchUpdateError, 1, "added")


def test_bad_config() -> None:
    with pytest.raises(ConfigError) as ei:
        EngineConfig(max_num_seqs=0)
    assert ei.value.field == "max_num_seqs"
    assert str(ei.value) == "EngineConfig.max_num_seqs must be an int >= 1, got 0"
    with pytest.raises(ConfigError) as ei:
        EngineConfig(reasoning_start_token_ids=[-1], reasoning_end_token_ids=[2])
    assert ei.value.field == "reasoning_start_token_ids"
    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs="many"),
        model_config=SimpleNamespace(get_vocab_size=lambda: 50),
    )
    with pytest.raises(ConfigError, match="config field 'max_num_seqs'") as ei:
        Pipeline(config, "cpu", False, tables={"min_p"})
    assert isinstance(ei.value, ValueError) and ei.value.field == "max_num_seqs"


def test_size_beyond_the_tables() -> None:
    with pytest.raises(SizeError) as ei:
        _core.Pipeline(2**62, 50, tables=["min_p"])
    assert isinstance(ei.value, ValueError)
    assert ei.value.field == "max_num_seqs"


def test_protocol_misuse() -> None:
    b = BatchUpdateBuilder()
    b.removed_append(1)
    assert b.removed == [1]
    with pytest.raises(ProtocolError, match=r"after self\.removed has been read") as ei:
        b.removed_append(2)
    assert isinstance(ei.value, RuntimeError) and ei.value.index is None

    procs = build_logitsprocs(CFG, "cpu", False, sampler_transforms=False)
    first, second = list(procs.all)[:2]
    first.update_state(added(P(min_p=0.5)))
    with pytest.raises(ProtocolError, match="different batch updates in one step"):
        second.update_state(added(P(min_p=0.2)))


# --- from the Python side ------------------------------------------------------------------


def test_sampling_params_name_the_field() -> None:
    with pytest.raises(RequestError, match=r"^min_p must be in \[0, 1\], got 2$") as ei:
        SamplingParams(min_p=2.0)
    e = ei.value
    assert (e.index, e.field, e.processor) == (None, "min_p", "min_p")
    with pytest.raises(RequestError) as ei:
        SamplingParams(repetition_penalty=0.0)
    assert (ei.value.field, ei.value.processor) == ("repetition_penalty", "penalties")
    with pytest.raises(RequestError) as ei:
        SamplingParams(temperature=-1.0)
    assert (ei.value.field, ei.value.processor) == ("temperature", None)


def test_namespace_errors_name_the_inner_field() -> None:
    request = SimpleNamespace(extra_args={"logitsproc_rs": {"min_p": 3.0}})
    with pytest.raises(RequestError) as ei:
        routed_params(4, request, "logitsproc_rs")
    e = ei.value
    assert (e.index, e.field, e.processor) == (4, "min_p", "min_p")
    assert str(e).startswith(
        "request at index 4: field 'extra_args['logitsproc_rs']['min_p']': min_p must be in"
    )
    assert _guard.refused_index(e, [4, 5]) == 4
    assert _guard.refused_index(e, [5]) is None

    request = SimpleNamespace(extra_args={"logitsproc_rs": {"top_p": 0.5}})
    with pytest.raises(RequestError) as ei:
        routed_params(None, request, "logitsproc_rs")
    assert (ei.value.index, ei.value.processor) == (None, None)
    assert str(ei.value).startswith("request: field 'extra_args['logitsproc_rs']': unknown")


def test_front_end_caps() -> None:
    ours = SamplingParams(max_tokens=None, logit_bias={i: 1.0 for i in range(2000)})
    with pytest.raises(RequestError) as ei:
        _guard.check_caps("request", ours, SimpleNamespace(), {"logit_bias"})
    e = ei.value
    assert (e.index, e.field, e.processor) == (None, "logit_bias", "logit_bias")
    assert str(e) == (
        "request: field 'extra_args['logitsproc_rs']['logit_bias']': 2000 entries exceed the "
        "per-request cap of 1024"
    )


def _refusing(monkeypatch: pytest.MonkeyPatch, make: str, dtype: torch.dtype, error: Exception):
    """torch's ``make`` (``"zeros"``, ``"empty"``) raises ``error`` for a tensor of ``dtype``
    (what an allocator out of memory raises), and works for any other."""
    real = getattr(torch, make)

    def refuse(*args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("dtype") == dtype:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, make, refuse)


_OOM = [
    RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory"),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB"),
]


@pytest.mark.parametrize("error", _OOM, ids=["cpu", "cuda"])
@pytest.mark.parametrize(
    ("make", "dtype", "what", "field", "size"),
    [
        ("zeros", torch.int32, "the penalties' count matrix", "penalties", "[9, 50] torch.int32"),
        ("zeros", torch.uint8, "the arena", "arena", "torch.uint8"),
        ("empty", torch.uint8, "the upload scratch area", "arena", "torch.uint8"),
    ],
    ids=["penalties", "arena", "scratch"],
)
def test_a_refused_allocation_is_an_allocation_error(
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
    make: str,
    dtype: torch.dtype,
    what: str,
    field: str,
    size: str,
) -> None:
    """A tensor a table or processor keeps, refused by torch's allocator (its RuntimeError, on
    a GPU its OutOfMemoryError): an AllocationError (a MemoryError) naming what it was for and
    the size asked for, chained to torch's. The penalties' count matrix let torch's error
    escape."""
    _refusing(monkeypatch, make, dtype, error)
    with pytest.raises(AllocationError) as ei:
        build_logitsprocs(CFG, "cpu", False, emulate_device=True)
    e = ei.value
    assert isinstance(e, MemoryError) and isinstance(e, LogitsprocError)
    assert not isinstance(e, RuntimeError)
    assert e.__cause__ is error and e.field == field
    assert str(e).startswith(f"could not allocate {what} ("), e
    assert size in str(e) and "bytes on cpu): " in str(e) and str(error) in str(e), e
    if field == "penalties":
        assert f"{9 * V * 4} bytes on cpu" in str(e), e


def test_a_refused_first_use_allocation_is_an_allocation_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The allowed ids' bitmask scratch (made at the first apply of the Triton path): an
    AllocationError naming it and its size, as at construction."""
    procs = build_logitsprocs(CFG, "cpu", False)
    (allowed,) = [p for p in procs.all if "allowed" in p.TABLES]
    _refusing(monkeypatch, "zeros", torch.int32, _OOM[1])
    with pytest.raises(AllocationError) as ei:
        allowed._scratch(torch.zeros(3, V))
    assert ei.value.field == "allowed"
    assert str(ei.value).startswith(
        "could not allocate the allowed ids' bitmask scratch ([8, 2] torch.int32, 64 bytes on "
        "cpu): CUDA out of memory"
    ), ei.value


def test_move_direction_from_python() -> None:
    from logitsproc_rs.loader import _vllm_batch_update

    module = SimpleNamespace(BatchUpdate=BatchUpdate, MoveDirectionality=MoveDirectionality)
    update = SimpleNamespace(batch_size=2, removed=[], added=[], moved=[(0, 1, "sideways")])
    with pytest.raises(BatchUpdateError) as ei:
        _vllm_batch_update(module, update)
    assert ei.value.field == "moved"


# --- context ---------------------------------------------------------------------------------


def test_with_context_keeps_class_and_attributes() -> None:
    e = raised(added(P(), P(logit_bias={V + 5: 1.0})))
    assert isinstance(e, RequestError)
    wrapped = e.with_context("MinP (logitsproc_rs.vllm.v1): ")
    assert type(wrapped) is RequestError
    assert str(wrapped) == f"MinP (logitsproc_rs.vllm.v1): {e}"
    assert (wrapped.index, wrapped.field, wrapped.processor, wrapped.detail) == (
        e.index,
        e.field,
        e.processor,
        e.detail,
    )
    assert str(e).startswith("request at index 1")  # the original is unchanged
    # The module-level helper: ours keep their class; any other becomes the fallback.
    assert type(with_context(e, "x: ")) is RequestError
    plain = with_context(KeyError("k"), "x: ")
    assert type(plain) is ValueError and str(plain) == "x: 'k'"
    assert type(with_context(TypeError("t"), "x: ", RuntimeError)) is RuntimeError
    # Copies and pickles keep the attributes (vLLM sends errors between processes).
    for twin in (copy.copy(wrapped), pickle.loads(pickle.dumps(wrapped))):
        assert type(twin) is RequestError and str(twin) == str(wrapped)
        assert (twin.index, twin.field, twin.processor) == (1, "logit_bias", "logit_bias")


def test_custom_processor_error_keeps_attributes() -> None:
    """A custom processor's error, named by ``LogitsProcessors``, is still a ``RequestError``."""
    procs = build_logitsprocs(CFG, "cpu", False, custom_logitsprocs=[_Margin])
    with pytest.raises(RequestError) as ei:
        procs.update_state(added(P(extra_args={"margin": "wide"})))
    assert (ei.value.index, ei.value.column) == (0, "margin")

"""DLPack export of the Rust host buffers (``_core.HostBufferView``).

Torch and numpy views alias the Rust memory (zero-copy), the memory is page-aligned and a whole
number of pages (so CUDA can register it once), every view keeps the memory alive on its own
(also after the ``_core.Pipeline`` that owns the tables is gone), Rust writes show through
existing views, and the capsule protocol is followed (versioned / legacy names, unconsumed
capsules freed, non-CPU devices refused).

The buffers are a pipeline's arena sections (``core.buffer(i)``, the tables' own memory, which
torch reads zero-copy on the CPU) and its staging copies (``core.staging(k)``, what a device
upload copies from).
"""

from __future__ import annotations

import ctypes
import gc
import math
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from _forkserver import run_python

from logitsproc_rs import BatchUpdate, EngineConfig, MinPLogitsProcessor, MoveDirectionality, _core

CAP = 8


def status_of(core: Any, name: str) -> int:
    """A core pipeline's status entry by name."""
    return dict(zip(core.status_names(), core.status(), strict=True))[name]


VOCAB = 50
MAX_BIAS = 4
MAX_STOP = 3
PAGE = 4096
# Count additions per penalties upload chunk: max(4 × capacity, 16384) (rust/src/pipeline.rs).
PENALTY_CHUNK = max(4 * CAP, 16384)

_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype = ctypes.c_char_p
_get_name.argtypes = [ctypes.py_object]


def capsule_name(cap: Any) -> str:
    return _get_name(cap).decode()


def P(min_p: float = 0.0, logit_bias: Any = None, min_tokens: int = 0, stop: Any = ()) -> Any:
    return SimpleNamespace(
        min_p=min_p, logit_bias=logit_bias, min_tokens=min_tokens, all_stop_token_ids=set(stop)
    )


def min_p_pipeline() -> Any:
    return _core.Pipeline(CAP, VOCAB, tables=["min_p"])


def logit_bias_pipeline() -> Any:
    return _core.Pipeline(
        CAP, VOCAB, tables=["logit_bias"], caps=[("max_logit_bias_entries", MAX_BIAS)]
    )


def min_tokens_pipeline() -> Any:
    return _core.Pipeline(
        CAP, VOCAB, tables=["min_tokens"], caps=[("max_stop_token_ids", MAX_STOP)]
    )


def allowed_pipeline() -> Any:
    return _core.Pipeline(CAP, VOCAB, tables=["allowed"], caps=[("max_allowed_token_ids", 3)])


def bad_words_pipeline() -> Any:
    return _core.Pipeline(
        CAP, VOCAB, tables=["bad_words"], caps=[("max_bad_words", 3), ("max_bad_word_len", 4)]
    )


def penalties_pipeline() -> Any:
    return _core.Pipeline(CAP, VOCAB, tables=["penalties"])


def thinking_pipeline() -> Any:
    return _core.Pipeline(CAP, VOCAB, tables=["thinking"], thinking=([5], [7]))


def section_index(core: Any, name: str) -> int:
    for i, (section, *_rest) in enumerate(core.sections()):
        if section == name:
            return i
    raise KeyError(f"no arena section {name!r} in {[s[0] for s in core.sections()]}")


def buffer(core: Any, name: str) -> Any:
    """The ``HostBufferView`` of a table's own buffer, by section name."""
    return core.buffer(section_index(core, name))


def section(name: str) -> Callable[[Any], Any]:
    return lambda core: buffer(core, name)


# (name, pipeline factory, accessor, element count (None: not fixed by the API), dtype name)
VIEWS: list[tuple[str, Callable[[], Any], Callable[[Any], Any], int | None, str]] = [
    ("min_p.log_min_p", min_p_pipeline, section("min_p.log_min_p"), CAP, "float32"),
    ("logit_bias.rows", logit_bias_pipeline, section("logit_bias.rows"), CAP * MAX_BIAS, "int32"),
    ("logit_bias.cols", logit_bias_pipeline, section("logit_bias.cols"), CAP * MAX_BIAS, "int32"),
    (
        "logit_bias.vals",
        logit_bias_pipeline,
        section("logit_bias.vals"),
        CAP * MAX_BIAS,
        "float32",
    ),
    ("min_tokens.rows", min_tokens_pipeline, section("min_tokens.rows"), CAP * MAX_STOP, "int32"),
    ("min_tokens.cols", min_tokens_pipeline, section("min_tokens.cols"), CAP * MAX_STOP, "int32"),
    (
        "min_tokens.vals",
        min_tokens_pipeline,
        section("min_tokens.vals"),
        CAP * MAX_STOP,
        "float32",
    ),
    ("allowed.rows", allowed_pipeline, section("allowed.rows"), None, "int32"),
    ("allowed.cols", allowed_pipeline, section("allowed.cols"), None, "int32"),
    ("allowed.vals", allowed_pipeline, section("allowed.vals"), None, "float32"),
    (
        "allowed.restricted_rows",
        allowed_pipeline,
        section("allowed.restricted_rows"),
        None,
        "int64",
    ),
    ("bad_words.rows", bad_words_pipeline, section("bad_words.rows"), None, "int32"),
    ("bad_words.cols", bad_words_pipeline, section("bad_words.cols"), None, "int32"),
    ("bad_words.vals", bad_words_pipeline, section("bad_words.vals"), None, "float32"),
    ("thinking.rows", thinking_pipeline, section("thinking.rows"), None, "int32"),
    ("thinking.cols", thinking_pipeline, section("thinking.cols"), None, "int32"),
    ("thinking.vals", thinking_pipeline, section("thinking.vals"), None, "float32"),
    ("penalties.repetition", penalties_pipeline, section("penalties.repetition"), None, "float32"),
    ("penalties.frequency", penalties_pipeline, section("penalties.frequency"), None, "float32"),
    ("penalties.presence", penalties_pipeline, section("penalties.presence"), None, "float32"),
    ("penalties.copy_dst", penalties_pipeline, section("penalties.copy_dst"), None, "int64"),
    ("penalties.copy_src", penalties_pipeline, section("penalties.copy_src"), None, "int64"),
    (
        "penalties.ops_rows",
        penalties_pipeline,
        section("penalties.ops_rows"),
        PENALTY_CHUNK,
        "int32",
    ),
    (
        "penalties.ops_cols",
        penalties_pipeline,
        section("penalties.ops_cols"),
        PENALTY_CHUNK,
        "int32",
    ),
    (
        "penalties.ops_vals",
        penalties_pipeline,
        section("penalties.ops_vals"),
        PENALTY_CHUNK,
        "int32",
    ),
    # The staging copies of the arena (uint8, the whole arena each).
    ("staging.0", penalties_pipeline, lambda core: core.staging(0), None, "uint8"),
    ("staging.1", logit_bias_pipeline, lambda core: core.staging(1), None, "uint8"),
]
IDS = [v[0] for v in VIEWS]
TORCH_DTYPES = {
    "float32": torch.float32,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
}
ITEMSIZE = {"float32": 4, "int32": 4, "int64": 8, "uint8": 1}


@pytest.fixture(params=VIEWS, ids=IDS)
def view_case(request: pytest.FixtureRequest) -> tuple[Any, Any, int, str]:
    name, make, access, n, dtype = request.param
    core = make()
    view = access(core)
    if n is None:
        n = len(view)
        assert n >= 1
    if name.startswith("staging."):
        assert n == core.arena_bytes  # a staging copy holds the whole arena
    else:
        _, _, nbytes, sdtype, elements = core.sections()[section_index(core, name)]
        assert (elements, sdtype, nbytes) == (n, dtype, n * ITEMSIZE[dtype])
    return core, view, n, dtype


def test_page_size_constant() -> None:
    assert _core.PAGE_SIZE == PAGE


def test_view_attributes(view_case: tuple[Any, Any, int, str]) -> None:
    _, view, n, dtype = view_case
    assert isinstance(view, _core.HostBufferView)
    assert len(view) == n
    assert view.dtype == dtype
    assert view.__dlpack_device__() == (1, 0)  # kDLCPU
    assert view.data_ptr % PAGE == 0
    assert view.nbytes % PAGE == 0
    assert view.nbytes >= n * ITEMSIZE[dtype]
    assert view.nbytes - n * ITEMSIZE[dtype] < PAGE  # whole pages, no more


def test_torch_zero_copy(view_case: tuple[Any, Any, int, str]) -> None:
    _, view, n, dtype = view_case
    t = torch.from_dlpack(view)
    assert t.device.type == "cpu"
    assert t.dtype == TORCH_DTYPES[dtype]
    assert t.shape == (n,) and t.is_contiguous()
    assert t.data_ptr() == view.data_ptr
    assert t.data_ptr() % PAGE == 0
    # Another view of the same buffer aliases the same memory (the buffer never moves).
    assert torch.from_dlpack(view).data_ptr() == view.data_ptr


def test_numpy_zero_copy(view_case: tuple[Any, Any, int, str]) -> None:
    _, view, n, dtype = view_case
    a = np.from_dlpack(view)
    assert a.dtype == np.dtype(dtype)
    assert a.shape == (n,)
    assert a.ctypes.data == view.data_ptr
    assert not a.flags.owndata
    b = np.from_dlpack(view, copy=False)
    assert b.ctypes.data == view.data_ptr
    # numpy and torch see one memory: a write through torch shows in numpy.
    t = torch.from_dlpack(view)
    t[n - 1] = 7
    assert a[n - 1] == 7


def test_accessors_return_the_same_buffer_each_time() -> None:
    s = logit_bias_pipeline()
    rows, cols, vals = (section_index(s, f"logit_bias.{k}") for k in ("rows", "cols", "vals"))
    assert s.buffer(rows).data_ptr == s.buffer(rows).data_ptr
    assert len({s.buffer(rows).data_ptr, s.buffer(cols).data_ptr, s.buffer(vals).data_ptr}) == 3
    assert s.staging(0).data_ptr == s.staging(0).data_ptr
    assert s.staging(0).data_ptr != s.staging(1).data_ptr
    m = min_p_pipeline()
    i = section_index(m, "min_p.log_min_p")
    assert m.buffer(i).data_ptr == m.buffer(i).data_ptr
    # Every section of a pipeline is its own buffer.
    p = _core.Pipeline(
        CAP,
        VOCAB,
        tables=["min_p", "logit_bias", "min_tokens"],
        caps=[("max_logit_bias_entries", MAX_BIAS), ("max_stop_token_ids", MAX_STOP)],
    )
    ptrs = [p.buffer(k).data_ptr for k in range(len(p.sections()))]
    assert len(set(ptrs)) == len(ptrs)


def test_processor_views_alias_the_core_buffers() -> None:
    """On the CPU a processor's pipeline reads the tables' own buffers (no copy)."""
    proc = MinPLogitsProcessor(EngineConfig(max_num_seqs=CAP, vocab_size=VOCAB), "cpu", False)
    pipe = proc.pipeline
    assert pipe.arena.zero_copy
    core = pipe.core
    t = pipe.section("min_p.log_min_p")
    assert t.data_ptr() == buffer(core, "min_p.log_min_p").data_ptr
    proc.update_state(BatchUpdate(2, [], [(1, P(min_p=0.25), None, [])], []))
    assert t[1].item() == torch.tensor(0.25).log().item()
    assert torch.isneginf(t[0])


def test_initial_contents() -> None:
    assert torch.isneginf(torch.from_dlpack(buffer(min_p_pipeline(), "min_p.log_min_p"))).all()
    for s, table, status in (
        (logit_bias_pipeline(), "logit_bias", "logit_bias"),
        (min_tokens_pipeline(), "min_tokens", "min_tokens"),
    ):
        assert dict(s.active())[table] == 0
        assert status_of(s, status) == 0  # no triples
        assert not torch.from_dlpack(buffer(s, f"{table}.rows")).any()


# One buffer per table kind and dtype (each gc.collect() costs ~0.1 s with torch loaded).
_KEEPALIVE_NAMES = (
    "min_p.log_min_p",
    "logit_bias.vals",
    "min_tokens.rows",
    "allowed.restricted_rows",
    "penalties.ops_vals",
    "staging.0",
)
KEEPALIVE = [v for v in VIEWS if v[0] in _KEEPALIVE_NAMES]


@pytest.mark.parametrize("consumer", ["torch", "numpy"])
@pytest.mark.parametrize("case", KEEPALIVE, ids=[v[0] for v in KEEPALIVE])
def test_view_keeps_memory_alive(case: tuple, consumer: str) -> None:
    name, make, access, _, _ = case
    core = make()
    view = access(core)
    if name == "min_p.log_min_p":
        core.step(BatchUpdate(2, [], [(1, P(min_p=0.25), None, [])], []))
        assert status_of(core, "min_p") == 1
    t = torch.from_dlpack(view) if consumer == "torch" else np.from_dlpack(view)
    before = t.copy() if consumer == "numpy" else t.clone()
    if name == "min_p.log_min_p":
        assert before[1] == np.float32(np.log(np.float32(0.25)))
    ptr = view.data_ptr
    del core, view
    gc.collect()
    # Allocate and touch memory so a freed page would likely be reused.
    junk = [bytearray(PAGE * 4) for _ in range(64)]
    del junk
    assert (t == before).all() if consumer == "torch" else np.array_equal(t, before)
    t[0] = 3  # still writable memory we own
    assert t[0] == 3
    assert (t.data_ptr() if consumer == "torch" else t.ctypes.data) == ptr


def test_processor_section_view_outlives_its_pipeline() -> None:
    """A view taken from a processor's pipeline stays valid after processor, ``Pipeline`` and
    ``_core.Pipeline`` are all gone."""
    proc = MinPLogitsProcessor(EngineConfig(max_num_seqs=CAP, vocab_size=VOCAB), "cpu", False)
    proc.update_state(BatchUpdate(3, [], [(2, P(min_p=0.5), None, [])], []))
    t = proc.pipeline.section("min_p.log_min_p")
    ptr = t.data_ptr()
    before = t.clone()
    assert before[2].item() == torch.tensor(0.5).log().item()
    del proc
    gc.collect()
    junk = [bytearray(PAGE * 4) for _ in range(64)]
    del junk
    assert torch.equal(t, before) and t.data_ptr() == ptr
    t[0] = 3
    assert t[0] == 3


def test_rust_writes_visible_through_existing_min_p_view() -> None:
    s = min_p_pipeline()
    t = torch.from_dlpack(buffer(s, "min_p.log_min_p"))
    a = np.from_dlpack(buffer(s, "min_p.log_min_p"))
    s.step(BatchUpdate(3, [], [(0, P(0.5), None, []), (2, P(1.0), None, [])], []))
    assert t[0].item() == torch.tensor(0.5).log().item()
    assert t[2].item() == 0.0
    assert math.isinf(t[1].item()) and t[1].item() < 0
    assert a[0] == np.float32(np.log(np.float32(0.5)))
    # Moves and removes too.
    s.step(BatchUpdate(2, [2], [], [(0, 1, MoveDirectionality.SWAP)]))
    assert torch.isneginf(t[0]) and t[1].item() == torch.tensor(0.5).log().item()
    assert torch.isneginf(t[2])


def _triples(rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, n: int, valid: int):
    """The first ``valid`` of the ``n`` (padded) triples, sorted, and the padding after them."""
    assert valid <= n <= len(rows)
    got = list(zip(rows[:n].tolist(), cols[:n].tolist(), vals[:n].tolist(), strict=True))
    return sorted(got[:valid]), got[valid:]


def test_rust_writes_visible_through_existing_logit_bias_views() -> None:
    s = logit_bias_pipeline()
    rows, cols, vals = (
        torch.from_dlpack(buffer(s, f"logit_bias.{k}")) for k in ("rows", "cols", "vals")
    )
    s.step(
        BatchUpdate(
            3,
            [],
            [
                (2, P(logit_bias={5: 1.5, 7: -2.0}), None, []),
                (0, P(logit_bias={1: 0.25}), None, []),
            ],
            [],
        )
    )
    assert dict(s.active())["logit_bias"] == 2
    n = status_of(s, "logit_bias")  # padded length
    got, pad = _triples(rows, cols, vals, n, 3)
    assert got == [(0, 1, 0.25), (2, 5, 1.5), (2, 7, -2.0)]
    # Padding: the first triple again with −0.0 (a no-op for the additive apply).
    assert all(p[:2] == (rows[0].item(), cols[0].item()) for p in pad)
    assert all(p[2] == 0.0 and math.copysign(1.0, p[2]) == -1.0 for p in pad)
    s.step(BatchUpdate(2, [], [], [(2, 1, MoveDirectionality.UNIDIRECTIONAL)]))
    n = status_of(s, "logit_bias")
    got, pad = _triples(rows, cols, vals, n, 3)
    assert got == [(0, 1, 0.25), (1, 5, 1.5), (1, 7, -2.0)]
    assert all(p[:2] == (rows[0].item(), cols[0].item()) for p in pad)
    assert all(p[2] == 0.0 and math.copysign(1.0, p[2]) == -1.0 for p in pad)


def test_rust_writes_visible_through_existing_min_tokens_views() -> None:
    s = min_tokens_pipeline()
    rows, cols, vals = (
        torch.from_dlpack(buffer(s, f"min_tokens.{k}")) for k in ("rows", "cols", "vals")
    )
    out: list[int] = []
    s.step(BatchUpdate(2, [], [(1, P(min_tokens=2, stop=[3, 9]), None, out)], []))
    assert dict(s.active())["min_tokens"] == 1
    n = status_of(s, "min_tokens")  # padded length
    assert n >= 2
    got, pad = _triples(rows, cols, vals, n, 2)
    assert [r for r, _, _ in got] == [1, 1]
    assert sorted(c for _, c, _ in got) == [3, 9]
    assert all(p == (rows[0].item(), cols[0].item(), vals[0].item()) for p in pad)
    assert torch.isneginf(vals[:n]).all()
    out.extend([1, 2])
    s.step(None)  # the output reached min_tokens: the triples go
    assert status_of(s, "min_tokens") == 0 and dict(s.active())["min_tokens"] == 0


def test_legacy_capsule_by_default_versioned_on_request() -> None:
    view = buffer(min_p_pipeline(), "min_p.log_min_p")
    assert capsule_name(view.__dlpack__()) == "dltensor"
    assert capsule_name(view.__dlpack__(max_version=(0, 8))) == "dltensor"
    assert capsule_name(view.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert capsule_name(view.__dlpack__(max_version=(1, 3))) == "dltensor_versioned"
    assert capsule_name(view.__dlpack__(max_version=(2, 0))) == "dltensor_versioned"
    assert capsule_name(view.__dlpack__(dl_device=(1, 0), copy=False)) == "dltensor"
    assert capsule_name(view.__dlpack__(stream=None)) == "dltensor"


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_capsule_consumed_after_owner_deleted(max_version: tuple[int, int] | None) -> None:
    s = min_p_pipeline()
    s.step(BatchUpdate(1, [], [(0, P(0.5), None, [])], []))
    cap = buffer(s, "min_p.log_min_p").__dlpack__(max_version=max_version)
    del s
    gc.collect()
    t = torch.from_dlpack(cap)
    assert capsule_name(cap).startswith("used_")
    assert t.shape == (CAP,) and t[0].item() == torch.tensor(0.5).log().item()
    del cap
    gc.collect()
    assert t[0].item() == torch.tensor(0.5).log().item()


def test_unconsumed_capsules_are_freed() -> None:
    s = logit_bias_pipeline()
    view = buffer(s, "logit_bias.vals")
    t = torch.from_dlpack(view)
    for i in range(200):
        cap = view.__dlpack__(max_version=(1, 0) if i % 2 else None)
        del cap
    gc.collect()
    del s, view
    gc.collect()
    assert t.shape == (CAP * MAX_BIAS,)
    t += 1  # the buffer is still ours


@pytest.mark.parametrize("device", [(2, 0), (3, 0), (13, 0), (2, 1)])
def test_non_cpu_dl_device_is_buffer_error(device: tuple[int, int]) -> None:
    for view in (buffer(min_p_pipeline(), "min_p.log_min_p"), min_p_pipeline().staging(0)):
        with pytest.raises(BufferError):
            view.__dlpack__(dl_device=device)
        with pytest.raises(BufferError):
            view.__dlpack__(max_version=(1, 0), dl_device=device)


def test_copy_true_is_buffer_error() -> None:
    view = buffer(min_p_pipeline(), "min_p.log_min_p")
    with pytest.raises(BufferError):
        view.__dlpack__(copy=True)


def test_view_not_constructible_and_frozen() -> None:
    with pytest.raises(TypeError):
        _core.HostBufferView()  # type: ignore[call-arg]
    view = buffer(min_p_pipeline(), "min_p.log_min_p")
    with pytest.raises(AttributeError):
        view.data_ptr = 0  # type: ignore[misc]


def test_no_crash_on_interpreter_shutdown(tmp_path: Path) -> None:
    """Live tensors, unconsumed capsules and dropped pipelines at exit: a clean exit code."""
    script = textwrap.dedent(
        """
        import gc, torch, numpy as np
        from logitsproc_rs import _core
        keep = []
        for i in range(20):
            s = _core.Pipeline(8, 50, tables=["logit_bias"], caps=[("max_logit_bias_entries", 4)])
            ix = {name: k for k, (name, *_rest) in enumerate(s.sections())}
            keep.append(torch.from_dlpack(s.buffer(ix["logit_bias.rows"])))
            keep.append(np.from_dlpack(s.buffer(ix["logit_bias.vals"])))
            # never consumed
            keep.append(s.buffer(ix["logit_bias.cols"]).__dlpack__(max_version=(1, 0)))
            keep.append(s.staging(0).__dlpack__())
            m = _core.Pipeline(8, 50, tables=["min_p"])
            keep.append(torch.from_dlpack(m.buffer(0).__dlpack__()))
            del s, m
        gc.collect()
        print("ok", len(keep))
        """
    )
    # A child of the fork server: it ends as any interpreter does (atexit, then finalization).
    r = run_python(script, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok 100"

"""DLPack export of the Rust host buffers (``_core.HostBufferView``).

Torch and numpy views alias the Rust memory (zero-copy), the memory is page-aligned and a whole
number of pages (so CUDA can register it once), every view keeps the memory alive on its own,
Rust writes show through existing views, and the capsule protocol is followed (versioned /
legacy names, unconsumed capsules freed, non-CPU devices refused).
"""

from __future__ import annotations

import ctypes
import gc
import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from logitsproc_rs import BatchUpdate, MoveDirectionality, _core

CAP = 8
VOCAB = 50
MAX_BIAS = 4
MAX_STOP = 3
PAGE = 4096

_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype = ctypes.c_char_p
_get_name.argtypes = [ctypes.py_object]


def capsule_name(cap: Any) -> str:
    return _get_name(cap).decode()


def P(min_p: float = 0.0, logit_bias: Any = None, min_tokens: int = 0, stop: Any = ()) -> Any:
    return SimpleNamespace(
        min_p=min_p, logit_bias=logit_bias, min_tokens=min_tokens, all_stop_token_ids=set(stop)
    )


def min_p_state() -> Any:
    return _core.MinPState(CAP)


def logit_bias_state() -> Any:
    return _core.LogitBiasState(CAP, VOCAB, MAX_BIAS)


def min_tokens_state() -> Any:
    return _core.MinTokensState(CAP, VOCAB, MAX_STOP)


def allowed_state() -> Any:
    return _core.AllowedTokenIdsState(CAP, VOCAB, 3)


def bad_words_state() -> Any:
    return _core.BadWordsState(CAP, VOCAB, 3, 4)


def penalties_state() -> Any:
    return _core.PenaltiesState(CAP, VOCAB, 100)


# (name, state factory, accessor, element count (None: not fixed by the API), dtype name)
VIEWS: list[tuple[str, Callable[[], Any], Callable[[Any], Any], int | None, str]] = [
    ("min_p.log_min_p", min_p_state, lambda s: s.log_min_p(), CAP, "float32"),
    ("logit_bias.rows", logit_bias_state, lambda s: s.rows(), CAP * MAX_BIAS, "int32"),
    ("logit_bias.cols", logit_bias_state, lambda s: s.cols(), CAP * MAX_BIAS, "int32"),
    ("logit_bias.vals", logit_bias_state, lambda s: s.vals(), CAP * MAX_BIAS, "float32"),
    ("min_tokens.rows", min_tokens_state, lambda s: s.rows(), CAP * MAX_STOP, "int32"),
    ("min_tokens.cols", min_tokens_state, lambda s: s.cols(), CAP * MAX_STOP, "int32"),
    ("min_tokens.vals", min_tokens_state, lambda s: s.vals(), CAP * MAX_STOP, "float32"),
    ("allowed.rows", allowed_state, lambda s: s.rows(), None, "int32"),
    ("allowed.cols", allowed_state, lambda s: s.cols(), None, "int32"),
    ("allowed.restricted_rows", allowed_state, lambda s: s.restricted_rows(), None, "int64"),
    ("bad_words.rows", bad_words_state, lambda s: s.rows(), None, "int32"),
    ("bad_words.cols", bad_words_state, lambda s: s.cols(), None, "int32"),
    ("bad_words.vals", bad_words_state, lambda s: s.vals(), None, "float32"),
    ("penalties.repetition", penalties_state, lambda s: s.repetition(), None, "float32"),
    ("penalties.frequency", penalties_state, lambda s: s.frequency(), None, "float32"),
    ("penalties.presence", penalties_state, lambda s: s.presence(), None, "float32"),
    ("penalties.copy_dst", penalties_state, lambda s: s.copy_dst(), None, "int64"),
    ("penalties.copy_src", penalties_state, lambda s: s.copy_src(), None, "int64"),
    ("penalties.ops_rows", penalties_state, lambda s: s.ops_rows(), 100, "int32"),
    ("penalties.ops_cols", penalties_state, lambda s: s.ops_cols(), 100, "int32"),
    ("penalties.ops_vals", penalties_state, lambda s: s.ops_vals(), 100, "int32"),
]
IDS = [v[0] for v in VIEWS]
TORCH_DTYPES = {"float32": torch.float32, "int32": torch.int32, "int64": torch.int64}
ITEMSIZE = {"float32": 4, "int32": 4, "int64": 8}


@pytest.fixture(params=VIEWS, ids=IDS)
def view_case(request: pytest.FixtureRequest) -> tuple[Any, Any, int, str]:
    _, make, access, n, dtype = request.param
    state = make()
    view = access(state)
    if n is None:
        n = len(view)
        assert n >= 1
    return state, view, n, dtype


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
    s = logit_bias_state()
    assert s.rows().data_ptr == s.rows().data_ptr
    assert len({s.rows().data_ptr, s.cols().data_ptr, s.vals().data_ptr}) == 3
    m = min_p_state()
    assert m.log_min_p().data_ptr == m.log_min_p().data_ptr


def test_initial_contents() -> None:
    assert torch.isneginf(torch.from_dlpack(min_p_state().log_min_p())).all()
    for s in (logit_bias_state(), min_tokens_state()):
        assert s.len == 0
        assert not torch.from_dlpack(s.rows()).any()


# One buffer per state kind and dtype (each gc.collect() costs ~0.1 s with torch loaded).
_KEEPALIVE_NAMES = (
    "min_p.log_min_p",
    "logit_bias.vals",
    "min_tokens.rows",
    "allowed.restricted_rows",
    "penalties.ops_vals",
)
KEEPALIVE = [v for v in VIEWS if v[0] in _KEEPALIVE_NAMES]


@pytest.mark.parametrize("consumer", ["torch", "numpy"])
@pytest.mark.parametrize("case", KEEPALIVE, ids=[v[0] for v in KEEPALIVE])
def test_view_keeps_memory_alive(case: tuple, consumer: str) -> None:
    _, make, access, _, _ = case
    state = make()
    view = access(state)
    if isinstance(state, _core.MinPState):
        state.update(BatchUpdate(2, [], [(1, P(min_p=0.25), None, [])], []))
    t = torch.from_dlpack(view) if consumer == "torch" else np.from_dlpack(view)
    before = t.copy() if consumer == "numpy" else t.clone()
    ptr = view.data_ptr
    del state, view
    gc.collect()
    # Allocate and touch memory so a freed page would likely be reused.
    junk = [bytearray(PAGE * 4) for _ in range(64)]
    del junk
    assert (t == before).all() if consumer == "torch" else np.array_equal(t, before)
    t[0] = 3  # still writable memory we own
    assert t[0] == 3
    assert (t.data_ptr() if consumer == "torch" else t.ctypes.data) == ptr


def test_rust_writes_visible_through_existing_min_p_view() -> None:
    s = min_p_state()
    t = torch.from_dlpack(s.log_min_p())
    a = np.from_dlpack(s.log_min_p())
    s.update(BatchUpdate(3, [], [(0, P(0.5), None, []), (2, P(1.0), None, [])], []))
    assert t[0].item() == torch.tensor(0.5).log().item()
    assert t[2].item() == 0.0
    assert math.isinf(t[1].item()) and t[1].item() < 0
    assert a[0] == np.float32(np.log(np.float32(0.5)))
    # Moves and removes too.
    s.update(BatchUpdate(2, [2], [], [(0, 1, MoveDirectionality.SWAP)]))
    assert torch.isneginf(t[0]) and t[1].item() == torch.tensor(0.5).log().item()
    assert torch.isneginf(t[2])


def test_rust_writes_visible_through_existing_logit_bias_views() -> None:
    s = logit_bias_state()
    rows, cols, vals = (torch.from_dlpack(v) for v in (s.rows(), s.cols(), s.vals()))
    s.update(
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
    n = s.len
    assert n == 3
    got = sorted(zip(rows[:n].tolist(), cols[:n].tolist(), vals[:n].tolist(), strict=True))
    assert got == [(0, 1, 0.25), (2, 5, 1.5), (2, 7, -2.0)]
    s.update(BatchUpdate(2, [], [], [(2, 1, MoveDirectionality.UNIDIRECTIONAL)]))
    n = s.len
    got = sorted(zip(rows[:n].tolist(), cols[:n].tolist(), vals[:n].tolist(), strict=True))
    assert got == [(0, 1, 0.25), (1, 5, 1.5), (1, 7, -2.0)]


def test_rust_writes_visible_through_existing_min_tokens_views() -> None:
    s = min_tokens_state()
    rows, cols, vals = (torch.from_dlpack(v) for v in (s.rows(), s.cols(), s.vals()))
    out: list[int] = []
    s.update(BatchUpdate(2, [], [(1, P(min_tokens=2, stop=[3, 9]), None, out)], []))
    n = s.len
    assert n == 2
    assert rows[:n].tolist() == [1, 1]
    assert sorted(cols[:n].tolist()) == [3, 9]
    assert torch.isneginf(vals[:n]).all()
    out.extend([1, 2])
    assert s.update(None) is True
    assert s.len == 0 and s.active == 0


def test_legacy_capsule_by_default_versioned_on_request() -> None:
    view = min_p_state().log_min_p()
    assert capsule_name(view.__dlpack__()) == "dltensor"
    assert capsule_name(view.__dlpack__(max_version=(0, 8))) == "dltensor"
    assert capsule_name(view.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert capsule_name(view.__dlpack__(max_version=(1, 3))) == "dltensor_versioned"
    assert capsule_name(view.__dlpack__(max_version=(2, 0))) == "dltensor_versioned"
    assert capsule_name(view.__dlpack__(dl_device=(1, 0), copy=False)) == "dltensor"
    assert capsule_name(view.__dlpack__(stream=None)) == "dltensor"


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_capsule_consumed_after_owner_deleted(max_version: tuple[int, int] | None) -> None:
    s = min_p_state()
    s.update(BatchUpdate(1, [], [(0, P(0.5), None, [])], []))
    cap = s.log_min_p().__dlpack__(max_version=max_version)
    del s
    gc.collect()
    t = torch.from_dlpack(cap)
    assert capsule_name(cap).startswith("used_")
    assert t.shape == (CAP,) and t[0].item() == torch.tensor(0.5).log().item()
    del cap
    gc.collect()
    assert t[0].item() == torch.tensor(0.5).log().item()


def test_unconsumed_capsules_are_freed() -> None:
    s = logit_bias_state()
    view = s.vals()
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
    view = min_p_state().log_min_p()
    with pytest.raises(BufferError):
        view.__dlpack__(dl_device=device)
    with pytest.raises(BufferError):
        view.__dlpack__(max_version=(1, 0), dl_device=device)


def test_copy_true_is_buffer_error() -> None:
    view = min_p_state().log_min_p()
    with pytest.raises(BufferError):
        view.__dlpack__(copy=True)


def test_view_not_constructible_and_frozen() -> None:
    with pytest.raises(TypeError):
        _core.HostBufferView()  # type: ignore[call-arg]
    view = min_p_state().log_min_p()
    with pytest.raises(AttributeError):
        view.data_ptr = 0  # type: ignore[misc]


def test_no_crash_on_interpreter_shutdown(tmp_path: Path) -> None:
    """Live tensors, unconsumed capsules and dropped states at exit: a clean exit code."""
    script = textwrap.dedent(
        """
        import gc, torch, numpy as np
        from logitsproc_rs import _core
        keep = []
        for i in range(20):
            s = _core.LogitBiasState(8, 50, 4)
            keep.append(torch.from_dlpack(s.rows()))
            keep.append(np.from_dlpack(s.vals()))
            keep.append(s.cols().__dlpack__(max_version=(1, 0)))  # never consumed
            keep.append(s.cols().__dlpack__())
            m = _core.MinPState(8)
            keep.append(torch.from_dlpack(m.log_min_p().__dlpack__()))
            del s, m
        gc.collect()
        print("ok", len(keep))
        """
    )
    src = Path(__file__).resolve().parents[1] / "python"
    env = {**os.environ, "PYTHONPATH": str(src)}
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok 100"

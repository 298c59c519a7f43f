"""Triton's interpreter (``TRITON_INTERPRET=1``) without two of its costs, for the tests that
run vLLM's Triton kernels in it on the CPU (MRV2 in a real engine, ``triton_standin.py``; vLLM's
own MRV2 processors, ``tests/vllm_drivers/v2_mrv2_own.py``). Import it before a kernel runs.
Nothing of vLLM is changed, and the kernels compute what they computed (the same tokens).
"""

from __future__ import annotations

# The repeated patching.
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

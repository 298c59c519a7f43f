"""Triton kernels for the bandwidth-bound applies, and the choice between them and torch ops.

One kernel per transform, each a single pass over the logits it touches (MinP: a max pass and a
masking pass over the rows that have a min_p), bit-identical to the torch-op path, which stays
as the fallback (CPU, no Triton, non-float32 logits) and as a second reference:

* MinP: row max, then ``logit < max + ln(min_p)`` → −inf (the torch path's logit-space rule);
* penalties: repetition / frequency / presence fused, reading the count matrix in place (no
  ``[B, V]`` temporaries, no gather through a row map); neutral rows are not touched;
* sparse triples: MinTokens / bad words / thinking (put) and LogitBias (add), one launch each;
* allowed ids and the grammar bitmask: store-only passes (allowed ids: its (row, token) pairs
  are turned into a bitmask in a scratch first).

Which path runs: ``LOGITSPROC_KERNELS`` = ``auto`` (default: Triton for CUDA logits when
``triton`` imports), ``triton`` (always; on CPU tensors only under ``TRITON_INTERPRET=1``, set
before triton is imported) or ``torch``. A pipeline's ``kernels`` attribute, when set,
overrides the variable for its processors; ``set_default_backend`` overrides it process-wide.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import torch

from ..errors import ConfigError, LoadError

KERNELS_ENV = "LOGITSPROC_KERNELS"
BACKENDS = ("auto", "triton", "torch")

_default: str | None = None
_ops: ModuleType | None = None
_import_error: BaseException | None = None


def _check(name: Any, where: str) -> str:
    value = str(name).strip().lower()
    if value not in BACKENDS:
        raise ConfigError(f"{where}: expected one of {BACKENDS}, got {name!r}")
    return value


def validate_backend(name: Any) -> str:
    """``name`` as a backend (``"auto"``, ``"triton"``, ``"torch"``), or a ``ValueError``."""
    return _check(name, "kernels")


def default_backend() -> str:
    """The process-wide choice: ``set_default_backend``'s, else ``LOGITSPROC_KERNELS``."""
    global _default
    if _default is None:
        _default = _check(os.environ.get(KERNELS_ENV) or "auto", KERNELS_ENV)
    return _default


def set_default_backend(name: str | None) -> None:
    """``"auto"``, ``"triton"`` or ``"torch"`` for every pipeline without its own choice;
    ``None`` reads ``LOGITSPROC_KERNELS`` again."""
    global _default
    _default = None if name is None else _check(name, "set_default_backend")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false")


def ops() -> ModuleType | None:
    """The kernels module, or None where triton does not import (tried once)."""
    global _ops, _import_error
    if _ops is None and _import_error is None:
        try:
            from . import _triton  # imports triton: optional and heavy, so on first use

            _ops = _triton
        except Exception as e:  # ImportError, or a broken install failing at import
            _import_error = e
    return _ops


def triton_ops() -> ModuleType:
    """The kernels module, where ``use_triton`` said yes (it does only once triton imported)."""
    mod = ops()
    if mod is None:
        raise LoadError(f"triton does not import: {_import_error}")
    return mod


def use_triton(logits: torch.Tensor, choice: str | None = None, any_float: bool = False) -> bool:
    """Whether this apply runs the Triton kernel: float32 logits (any float dtype with
    ``any_float``, for store-only kernels) with unit column stride, and the backend allows it.

    A forced ``triton`` that cannot run (no triton; CPU tensors outside the interpreter) is a
    ``RuntimeError``, never a silent fallback, so a test that forces it tests the kernels.
    """
    choice = default_backend() if choice is None else validate_backend(choice)
    if choice == "torch":
        return False
    if choice == "auto" and logits.device.type != "cuda":
        return False
    if logits.dim() != 2 or logits.stride(1) != 1 or logits.requires_grad:
        return False
    if not (logits.is_floating_point() if any_float else logits.dtype == torch.float32):
        return False
    if ops() is None:
        if choice == "auto":
            return False
        raise LoadError(f"{KERNELS_ENV}=triton, but triton does not import: {_import_error}")
    if choice == "triton" and logits.device.type == "cpu" and not interpreting():
        raise LoadError(
            f"{KERNELS_ENV}=triton on CPU tensors needs TRITON_INTERPRET=1 (set before triton "
            "is imported)"
        )
    return True


def pipeline_choice(pipe: Any) -> str | None:
    """A pipeline's own choice (its ``kernels`` attribute), if it has one."""
    return getattr(pipe, "kernels", None)

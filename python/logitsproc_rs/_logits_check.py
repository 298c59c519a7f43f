"""What every processor's ``apply`` (and the ``Sampler``) refuses, whether or not it has work
this step."""

from __future__ import annotations

import math
from typing import Any

import torch

from .errors import InputError

#: Logits dtypes transformed in place, exactly as the reference does on the same dtype.
EXACT_DTYPES = (torch.float32, torch.float64)
#: Half precision: cast to float32 first (what vLLM's sampler does before its processors).
CAST_DTYPES = (torch.float16, torch.bfloat16)


def rows_overlap(rows: int, width: int, s0: int, s1: int) -> bool:
    """Whether two elements of a ``[rows, width]`` view with strides ``(s0, s1)`` share an
    address: ``a * s0 == b * s1`` for some ``|a| < rows``, ``|b| < width``, not both 0 (the
    smallest such pair is ``(s1 / g, s0 / g)``, ``g = gcd(s0, s1)``). Exact, no data read."""
    if rows == 0 or width == 0:
        return False
    if rows == 1 or width == 1:
        return (rows > 1 and s0 == 0) or (width > 1 and s1 == 0)
    if s0 == 0 or s1 == 0:
        return True
    g = math.gcd(s0, s1)
    return s1 // g < rows and s0 // g < width


def check_tensor(name: str, logits: Any) -> None:
    """What the processors and the ``Sampler`` refuse of any logits tensor, a ``ValueError``
    starting with ``name``: not a tensor, not a supported floating dtype (float8 / float4
    formats have too little range, and e4m3fn no −inf, for a mask or a penalty), a tensor
    that requires grad (the transforms write in place; pass ``logits.detach()``), an
    inference tensor outside inference mode (torch forbids writing it there), or 2-D rows
    that overlap one another (an ``expand``ed tensor, a row stride below the row length: one
    write would land in several rows)."""
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        kind = getattr(logits, "dtype", type(logits).__name__)
        raise InputError(f"{name}: logits must be a floating-point tensor, got {kind}")
    dtype = logits.dtype
    if dtype not in EXACT_DTYPES and dtype not in CAST_DTYPES:
        raise InputError(
            f"{name}: logits of dtype {dtype} are not supported (float32, float64, float16 "
            "or bfloat16; cast them first, e.g. logits.float())"
        )
    if logits.requires_grad:
        raise InputError(
            f"{name}: logits require grad; the transforms work in place, without autograd: "
            "pass logits.detach()"
        )
    if logits.is_inference() and not torch.is_inference_mode_enabled():
        raise InputError(
            f"{name}: logits are an inference tensor, written outside inference mode (torch "
            "refuses that): apply inside torch.inference_mode(), or pass logits.clone()"
        )
    if logits.dim() == 2 and rows_overlap(*logits.shape, *logits.stride()):
        raise InputError(
            f"{name}: logits rows overlap (shape {list(logits.shape)}, stride "
            f"{list(logits.stride())}: an expanded or strided view); pass "
            "logits.contiguous()"
        )


def checked_logits(
    name: str,
    logits: Any,
    rows: int,
    vocab_size: int,
    device: torch.device,
    what: str,
    method: str = "apply",
) -> torch.Tensor:
    """``logits`` if they are a ``[rows, vocab_size]`` tensor on ``device`` that
    ``check_tensor`` takes, whose rows are contiguous, else a ``ValueError`` naming the
    processor ``name``. float16 and bfloat16 are cast to float32 (as the ``Sampler`` casts
    before the processors); the cast is returned, so use ``apply``'s return value. ``what``
    names what ``rows`` is ("the batch", "the row map"), ``method`` the method refusing."""
    where = f"{name}.{method}"
    check_tensor(where, logits)
    if logits.dim() != 2 or logits.shape[0] != rows or logits.shape[1] != vocab_size:
        raise InputError(
            f"{where}: logits of shape {list(logits.shape)} do not match {what}: "
            f"expected [{rows}, {vocab_size}] (batch_size from the last step, "
            "vocab_size from the config)"
        )
    if logits.device != device and not (device.type == "cpu" and logits.device.type == "cpu"):
        raise InputError(
            f"{where}: logits on {logits.device}, but the processors were built for {device}"
        )
    if rows and logits.stride(1) != 1:
        # Rows may be apart (vLLM slices a padded vocabulary: row stride > vocab_size), but
        # each row must be contiguous: kernels and host code walk a row as one array.
        raise InputError(
            f"{where}: logits rows must be contiguous (stride {list(logits.stride())}); "
            "pass logits.contiguous()"
        )
    if logits.dtype in CAST_DTYPES:
        logits = logits.to(torch.float32)
    return logits


def check_sampler_logits(logits: Any) -> None:
    """The ``Sampler``'s logits: what ``check_tensor`` takes, 2-D (``[rows, vocab]``); a
    ``ValueError`` naming the ``Sampler`` before anything runs (the grammar bitmask is applied
    in place in the logits' own dtype, before the float32 cast)."""
    check_tensor("Sampler", logits)
    if logits.dim() != 2:
        raise InputError(f"Sampler: logits must be 2-D [rows, vocab], got {list(logits.shape)}")

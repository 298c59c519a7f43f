"""What every processor's ``apply`` refuses, whether or not it has work this step."""

from __future__ import annotations

from typing import Any

import torch


def checked_logits(
    name: str, logits: Any, rows: int, vocab_size: int, device: torch.device, what: str
) -> torch.Tensor:
    """``logits`` if they are a floating-point ``[rows, vocab_size]`` tensor on ``device``
    whose rows are contiguous and do not overlap, else a ``ValueError`` naming the processor
    ``name``. float16 and bfloat16 are cast to float32 (as the ``Sampler`` casts before the
    processors); the cast is returned, so use ``apply``'s return value. ``what`` names what
    ``rows`` is ("the batch", "the row map")."""
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        kind = getattr(logits, "dtype", type(logits).__name__)
        raise ValueError(f"{name}.apply: logits must be a floating-point tensor, got {kind}")
    if logits.dim() != 2 or logits.shape[0] != rows or logits.shape[1] != vocab_size:
        raise ValueError(
            f"{name}.apply: logits of shape {list(logits.shape)} do not match {what}: "
            f"expected [{rows}, {vocab_size}] (batch_size from the last step, "
            "vocab_size from the config)"
        )
    if logits.device != device and not (device.type == "cpu" and logits.device.type == "cpu"):
        raise ValueError(
            f"{name}.apply: logits on {logits.device}, but the processors were built for {device}"
        )
    if rows and logits.stride(1) != 1:
        # Rows may be apart (vLLM slices a padded vocabulary: row stride > vocab_size), but
        # each row must be contiguous: kernels and host code walk a row as one array.
        raise ValueError(
            f"{name}.apply: logits rows must be contiguous (stride {list(logits.stride())}); "
            "pass logits.contiguous()"
        )
    if rows > 1 and logits.stride(0) < vocab_size:
        # Rows that share memory (an ``expand``ed row, a strided view): a write to one row
        # would land in another (a bias added twice, a mask leaking into the next row).
        raise ValueError(
            f"{name}.apply: logits rows overlap in memory (stride {list(logits.stride())}, "
            f"rows of {vocab_size}); pass logits.contiguous()"
        )
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.to(torch.float32)
    return logits

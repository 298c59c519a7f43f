"""Pieces shared by the built-in processors' ``apply``."""

from __future__ import annotations

import torch


def host_kernel_ok(logits: torch.Tensor) -> bool:
    """Whether Rust may process ``logits`` in place on the host: float32 on the CPU, rows of
    contiguous elements that do not overlap (the ``unsafe_apply_*_cpu`` contract). Checked on
    the tensor itself (device, dtype, strides of its storage view)."""
    return (
        type(logits) is torch.Tensor
        and logits.device.type == "cpu"
        and logits.dtype == torch.float32
        and logits.dim() == 2
        and logits.stride(1) == 1
        and logits.stride(0) >= logits.shape[1]
        and not logits.requires_grad
        and logits.storage_offset() * 4
        + (logits.shape[0] - 1) * logits.stride(0) * 4
        + logits.shape[1] * 4
        <= logits.untyped_storage().nbytes()
    )


def put_sparse_(
    logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor
) -> torch.Tensor:
    """In place: ``logits[rows[k], cols[k]] = vals[k]`` (duplicates write the same value)."""
    return logits.index_put_((rows, cols), vals)


def add_sparse_(
    logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor
) -> torch.Tensor:
    """In place: ``logits[rows[k], cols[k]] += vals[k]``.

    Pairs are unique except the padding, whose value is −0.0 (``x + −0.0 == x`` exactly).
    """
    return logits.index_put_((rows, cols), vals, accumulate=True)

"""Checks shared by the built-in processors' ``apply``."""

from __future__ import annotations

import torch


def check_logits(name: str, logits: torch.Tensor, rows: int, vocab_size: int | None) -> None:
    """Raise ``ValueError`` unless ``logits`` is ``[rows, vocab_size]`` (host-side, no sync)."""
    if (
        logits.dim() != 2
        or logits.shape[0] != rows
        or (vocab_size is not None and logits.shape[1] != vocab_size)
    ):
        want = f"[{rows}, {vocab_size if vocab_size is not None else 'V'}]"
        raise ValueError(
            f"{name}.apply: logits of shape {list(logits.shape)} do not match the batch: "
            f"expected {want} (batch_size from the last BatchUpdate, vocab_size from the config)"
        )


def host_kernel_ok(logits: torch.Tensor) -> bool:
    """Whether Rust may process ``logits`` in place on the host: float32 on the CPU, rows of
    contiguous elements that do not overlap (the ``unsafe_apply_cpu`` contract)."""
    return (
        logits.device.type == "cpu"
        and logits.dtype == torch.float32
        and logits.dim() == 2
        and logits.stride(1) == 1
        and logits.stride(0) >= logits.shape[1]
        and not logits.requires_grad
    )

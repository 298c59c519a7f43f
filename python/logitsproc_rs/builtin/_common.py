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

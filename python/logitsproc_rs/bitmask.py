"""Structured-output (grammar) bitmask in xgrammar's layout, applied in place with no sync.

``bitmask`` is int32 ``[rows, words]``: bit ``j`` (LSB first) of word ``w`` is token
``32 * w + j``; a set bit allows the token, a clear bit sets its logit to −inf. A row of all
ones (−1) masks nothing. Only columns below ``min(V, 32 * words)`` are touched.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from . import kernels

_BIT_SHIFTS: dict[torch.device, torch.Tensor] = {}


def _shifts(device: torch.device) -> torch.Tensor:
    t = _BIT_SHIFTS.get(device)
    if t is None:
        t = _BIT_SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
    return t


def apply_token_bitmask_(
    logits: torch.Tensor,
    bitmask: torch.Tensor | np.ndarray,
    indices: Sequence[int] | np.ndarray | torch.Tensor | None = None,
) -> torch.Tensor:
    """Mask ``logits`` (``[B, V]``, any float dtype) in place with an xgrammar bitmask.

    ``indices`` (optional) lists the logits rows the bitmask rows apply to, in order; without
    it the bitmask has one row per logits row. Raises ``ValueError`` for a bitmask of the wrong
    dtype or shape, or host-side indices out of range. Never synchronises with the device.
    """
    if isinstance(bitmask, np.ndarray):
        if bitmask.dtype != np.int32:
            raise ValueError(f"bitmask must be int32, got numpy {bitmask.dtype}")
        bitmask = torch.from_numpy(bitmask)
    if not isinstance(bitmask, torch.Tensor):
        raise ValueError(f"bitmask must be a numpy array or a tensor, got {type(bitmask).__name__}")
    if bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32, got {bitmask.dtype}")
    if bitmask.dim() != 2 or bitmask.shape[1] == 0:
        raise ValueError(
            f"bitmask must be [rows, words] with words >= 1, got {list(bitmask.shape)}"
        )
    if logits.dim() != 2:
        raise ValueError(f"logits must be [batch, vocab], got {list(logits.shape)}")
    n_rows, vocab = logits.shape
    if indices is None:
        if bitmask.shape[0] != n_rows:
            raise ValueError(
                f"bitmask has {bitmask.shape[0]} rows but logits have {n_rows} (pass indices)"
            )
        idx = None
    else:
        if isinstance(indices, torch.Tensor):
            if indices.dim() != 1 or indices.dtype not in (torch.int32, torch.int64):
                raise ValueError("indices must be a 1-D int32/int64 tensor")
            idx = indices.to(logits.device, dtype=torch.int64, non_blocking=True)
        else:
            host = np.asarray(indices, dtype=np.int64).reshape(-1)
            if host.size and (host.min() < 0 or host.max() >= n_rows):
                raise ValueError(f"indices must be in [0, {n_rows}), got {host.tolist()}")
            idx = torch.from_numpy(host).to(logits.device, non_blocking=True)
        if bitmask.shape[0] != idx.shape[0]:
            raise ValueError(
                f"bitmask has {bitmask.shape[0]} rows but {idx.shape[0]} indices were given"
            )
    if bitmask.shape[0] == 0:
        return logits  # nothing to mask (and an empty reshape below would be ambiguous)
    width = min(vocab, 32 * bitmask.shape[1])
    words = bitmask.to(logits.device, non_blocking=True)
    if kernels.use_triton(logits, any_float=True):
        # Store-only: −inf where a bit is clear, no logit read (out-of-range device indices
        # write nothing, where the torch path raises).
        return kernels.ops().token_bitmask_(logits, words.contiguous(), idx, width)
    bits = (words.unsqueeze(-1) >> _shifts(logits.device)) & 1
    blocked = (bits == 0).view(words.shape[0], -1)[:, :width]
    if idx is None:
        logits[:, :width].masked_fill_(blocked, float("-inf"))
    else:
        sub = logits[idx, :width].masked_fill_(blocked, float("-inf"))
        logits[idx, :width] = sub
    return logits

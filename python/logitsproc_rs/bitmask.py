"""Structured-output (grammar) bitmask in xgrammar's layout, applied in place with no sync.

``bitmask`` is int32 ``[rows, words]``: bit ``j`` (LSB first) of word ``w`` is token
``32 * w + j``; a set bit allows the token, a clear bit sets its logit to −inf. A row of all
ones (−1) masks nothing. Only columns below ``min(V, 32 * words)`` are touched.

``kernel`` chooses who applies it: ``"builtin"`` (ours: a store-only Triton kernel on CUDA, torch
ops elsewhere) or ``"xgrammar"`` (xgrammar's ``apply_token_bitmask_inplace``, what vLLM's runner
calls, where xgrammar is installed). Both give the same logits (``tests/test_bitmask_backends.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .errors import InputError
from .kernels import triton_ops, use_triton

_BIT_SHIFTS: dict[torch.device, torch.Tensor] = {}
GRAMMAR_KERNELS = ("builtin", "xgrammar")


def _shifts(device: torch.device) -> torch.Tensor:
    t = _BIT_SHIFTS.get(device)
    if t is None:
        t = _BIT_SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
    return t


def apply_token_bitmask_(
    logits: torch.Tensor,
    bitmask: torch.Tensor | np.ndarray,
    indices: Sequence[int] | np.ndarray | torch.Tensor | None = None,
    kernel: str = "builtin",
) -> torch.Tensor:
    """Mask ``logits`` (``[B, V]``, any float dtype) in place with an xgrammar bitmask.

    ``indices`` (optional) lists the logits rows the bitmask rows apply to, in order; without
    it the bitmask has one row per logits row. Raises ``ValueError`` for a bitmask of the wrong
    dtype or shape, or host-side indices out of range. Never synchronises with the device.
    """
    if kernel not in GRAMMAR_KERNELS:
        raise InputError(f"kernel must be one of {GRAMMAR_KERNELS}, got {kernel!r}")
    if isinstance(bitmask, np.ndarray):
        if bitmask.dtype != np.int32:
            raise InputError(f"bitmask must be int32, got numpy {bitmask.dtype}")
        bitmask = torch.from_numpy(bitmask)
    if not isinstance(bitmask, torch.Tensor):
        raise InputError(f"bitmask must be a numpy array or a tensor, got {type(bitmask).__name__}")
    if bitmask.dtype != torch.int32:
        raise InputError(f"bitmask must be int32, got {bitmask.dtype}")
    if bitmask.dim() != 2 or bitmask.shape[1] == 0:
        raise InputError(
            f"bitmask must be [rows, words] with words >= 1, got {list(bitmask.shape)}"
        )
    if logits.dim() != 2:
        raise InputError(f"logits must be [batch, vocab], got {list(logits.shape)}")
    n_rows, vocab = logits.shape
    if indices is None:
        if bitmask.shape[0] != n_rows:
            raise InputError(
                f"bitmask has {bitmask.shape[0]} rows but logits have {n_rows} (pass indices)"
            )
        idx = None
    else:
        if isinstance(indices, torch.Tensor):
            if indices.dim() != 1 or indices.dtype not in (torch.int32, torch.int64):
                raise InputError("indices must be a 1-D int32/int64 tensor")
            idx = indices.to(logits.device, dtype=torch.int64, non_blocking=True)
        else:
            host = np.asarray(indices, dtype=np.int64).reshape(-1)
            if host.size and (host.min() < 0 or host.max() >= n_rows):
                raise InputError(f"indices must be in [0, {n_rows}), got {host.tolist()}")
            idx = torch.from_numpy(host).to(logits.device, non_blocking=True)
        if bitmask.shape[0] != idx.shape[0]:
            raise InputError(
                f"bitmask has {bitmask.shape[0]} rows but {idx.shape[0]} indices were given"
            )
    if bitmask.shape[0] == 0:
        return logits  # nothing to mask (and an empty reshape below would be ambiguous)
    width = min(vocab, 32 * bitmask.shape[1])
    words = bitmask.to(logits.device, non_blocking=True)
    if kernel == "xgrammar":
        return _xgrammar_apply(logits, words.contiguous(), idx, width)
    if use_triton(logits, any_float=True):
        # Store-only: −inf where a bit is clear, no logit read (out-of-range device indices
        # write nothing, where the torch path raises).
        return triton_ops().token_bitmask_(logits, words.contiguous(), idx, width)
    bits = (words.unsqueeze(-1) >> _shifts(logits.device)) & 1
    blocked = (bits == 0).view(words.shape[0], -1)[:, :width]
    if idx is None:
        logits[:, :width].masked_fill_(blocked, float("-inf"))
    else:
        sub = logits[idx, :width].masked_fill_(blocked, float("-inf"))
        logits[idx, :width] = sub
    return logits


def _xgrammar_apply(
    logits: torch.Tensor, words: torch.Tensor, idx: torch.Tensor | None, width: int
) -> torch.Tensor:
    """xgrammar's kernel. Its ``indices`` select logits rows and read the bitmask row of the
    same number (vLLM's runner scatters its rows first), where ours pair bitmask row ``k`` with
    ``indices[k]``: scatter into an all-ones ``[B, words]`` mask first (one device op)."""
    try:
        import xgrammar
    except ImportError as e:
        raise InputError("kernel='xgrammar' needs xgrammar installed (pip install xgrammar)") from e
    if idx is not None:
        # xgrammar takes host row numbers; ours live on the device after the checks above, so
        # it applies to every row (an all-ones row masks nothing): no device-to-host read.
        full = torch.full(
            (logits.shape[0], words.shape[1]), -1, dtype=torch.int32, device=logits.device
        )
        full.index_copy_(0, idx, words)
        words = full
    target = logits if logits.dtype == torch.float32 else logits.to(torch.float32)
    xgrammar.apply_token_bitmask_inplace(target, words, vocab_size=width)
    if target is not logits:
        logits.copy_(target)  # vLLM's runner converts non-float32 logits the same way
    return logits

"""The sampling tail without a sort: top-k / top-p kept sets and the draw (issue 27).

Work in progress: ``mask_top_k_top_p_`` is the entry point other modules call; its CPU body
moves to Rust (``_core``) in the next commits.
"""

from __future__ import annotations

import torch


def mask_top_k_top_p_(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """In place: ``-inf`` outside each row's kept set, vLLM 0.25.1's (``top_k``: int64 ``[B]``,
    ``vocab_size`` or more for a row without top-k; ``top_p``: float32 ``[B]``, 1 for a row
    without top-p). Returns ``logits``."""
    from .sampler import apply_top_k_top_p

    max_top_k = int(top_k.max()) if top_k is not None else None
    return apply_top_k_top_p(logits, top_k, top_p, max_top_k)

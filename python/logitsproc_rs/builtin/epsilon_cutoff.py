"""Epsilon sampling (HF ``EpsilonLogitsWarper``, ``min_tokens_to_keep=1``): mask the tokens
whose probability is below ``epsilon_cutoff``, never the row's top logit. 0: off.

A row holding +inf or NaN (NaN probabilities) or of all -inf is left alone, as HF leaves it.
"""

from __future__ import annotations

import torch

from ._truncation import TruncationView, keep_top_


def epsilon_mask_(logits: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """In place: HF's ``EpsilonLogitsWarper(eps)`` per row (``eps``: ``[rows, 1]``, 0 for rows
    without it: ``p < 0`` removes nothing)."""
    return keep_top_(logits, logits.softmax(dim=-1) < eps)


class EpsilonCutoffLogitsProcessor(TruncationView):
    """Argmax-invariant (the top logit is kept). Reads ``params.epsilon_cutoff`` (0: off)."""

    TABLES = ("epsilon_cutoff",)
    REFERENCE = "logitsproc_rs.reference:RefEpsilonCutoffLogitsProcessor"
    mask_ = staticmethod(epsilon_mask_)

"""Eta sampling (HF ``EtaLogitsWarper``, ``min_tokens_to_keep=1``): mask the tokens whose
probability is below ``min(eta, sqrt(eta) * exp(-entropy))``, never the row's top logit; the
entropy is ``torch.distributions.Categorical``'s, op for op. 0: off.

A row holding +inf or NaN, or of all -inf, is left alone (its entropy is NaN); HF's own warper
raises on such a row (``Categorical`` rejects NaN logits).
"""

from __future__ import annotations

import torch

from ._truncation import TruncationView, keep_top_


def eta_mask_(logits: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """In place: HF's ``EtaLogitsWarper(eps)`` per row (``eps``: ``[rows, 1]``, 0 for rows
    without it: eta is then 0 and removes nothing)."""
    probabilities = logits.softmax(dim=-1)
    # Categorical(logits=logits).entropy(), without its argument check (no host sync).
    norm = logits - logits.logsumexp(dim=-1, keepdim=True)
    p_log_p = torch.clamp(norm, min=torch.finfo(norm.dtype).min) * norm.softmax(dim=-1)
    entropy = -p_log_p.sum(-1)
    eta = torch.min(eps, torch.sqrt(eps) * torch.exp(-entropy)[..., None])
    return keep_top_(logits, probabilities < eta)


class EtaCutoffLogitsProcessor(TruncationView):
    """Argmax-invariant (the top logit is kept). Reads ``params.eta_cutoff`` (0: off)."""

    TABLES = ("eta_cutoff",)
    REFERENCE = "logitsproc_rs.reference:RefEtaCutoffLogitsProcessor"
    mask_ = staticmethod(eta_mask_)

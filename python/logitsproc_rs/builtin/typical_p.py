"""typical-p (HF ``TypicalLogitsWarper``, ``min_tokens_to_keep=1``): sort the tokens by how far
their surprisal ``-log p`` is from the row's entropy and keep the closest ones until their mass
reaches ``typical_p`` (HF's arithmetic, op for op, in the logits' dtype). ``typical_p == 1``:
off.

Not strictly argmax-invariant: it may drop the most likely token (a row's single most typical
token is what is always kept). It runs in the argmax-invariant phase all the same, on purpose:
HF applies its warpers only when sampling, and that phase is what only sampled rows see (a
greedy row keeps its argmax); see docs/semantics.md.
"""

from __future__ import annotations

import torch

from ._truncation import NEG_INF, TruncationView


def typical_p_mask_(logits: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """In place: HF's ``TypicalLogitsWarper(mass)`` on the rows with ``mass < 1`` (``mass``:
    ``[rows, 1]``, 1 for rows without typical-p)."""
    normalized = torch.nn.functional.log_softmax(logits, dim=-1)
    p = torch.exp(normalized)
    ent = -(normalized * p).nansum(-1, keepdim=True)
    shifted = torch.abs((-normalized) - ent)
    sorted_scores, sorted_indices = torch.sort(shifted, descending=False)
    sorted_logits = logits.gather(-1, sorted_indices)
    cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    last_ind = (cumulative_probs < mass).sum(dim=-1)
    last_ind.clamp_(max=sorted_scores.shape[-1] - 1)
    sorted_remove = sorted_scores > sorted_scores.gather(-1, last_ind.view(-1, 1))
    sorted_remove[..., :1] = False
    remove = sorted_remove.scatter(-1, sorted_indices, sorted_remove)
    remove &= mass < 1.0
    return logits.masked_fill_(remove, NEG_INF)


class TypicalPLogitsProcessor(TruncationView):
    """Reads ``params.typical_p`` (1: off). See the module for why it is in the
    argmax-invariant phase."""

    TABLES = ("typical_p",)
    REFERENCE = "logitsproc_rs.reference:RefTypicalPLogitsProcessor"
    mask_ = staticmethod(typical_p_mask_)

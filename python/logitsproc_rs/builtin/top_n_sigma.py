"""top-n-sigma (llama.cpp ``llama_sampler_top_n_sigma_apply``, arXiv 2411.07641): mask every
logit below ``max - n * sigma``, with the max, mean and population standard deviation taken
over the row's logits that are not -inf. ``top_n_sigma <= 0``: off.

A row holding +inf or NaN is left alone (llama.cpp's sums are then inf/NaN and its threshold
NaN, which masks nothing); a row of all -inf is left alone; a row with one finite logit keeps
it (sigma 0). The kept set does not depend on the temperature; the max is always kept.
"""

from __future__ import annotations

import torch

from ._truncation import NEG_INF, TruncationView


def top_n_sigma_mask_(logits: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """In place: ``-inf`` where ``logits < max - n * std`` on rows with ``n > 0`` (``n``:
    ``[rows, 1]``, 0 for rows without top-n-sigma)."""
    out = logits == NEG_INF
    count = (~out).sum(dim=-1, keepdim=True)  # 0 for a row of all -inf: mean NaN, masks nothing
    mean = logits.masked_fill(out, 0.0).sum(dim=-1, keepdim=True) / count
    dev = (logits - mean).masked_fill_(out, 0.0)
    std = dev.square_().sum(dim=-1, keepdim=True).div_(count).sqrt_()
    threshold = logits.amax(dim=-1, keepdim=True) - n * std
    drop = (logits < threshold) & (n > 0)
    return logits.masked_fill_(drop, NEG_INF)


class TopNSigmaLogitsProcessor(TruncationView):
    """Argmax-invariant (the max is never below ``max - n * sigma``). Reads
    ``params.top_n_sigma`` (<= 0: off)."""

    TABLES = ("top_n_sigma",)
    REFERENCE = "logitsproc_rs.reference:RefTopNSigmaLogitsProcessor"
    mask_ = staticmethod(top_n_sigma_mask_)

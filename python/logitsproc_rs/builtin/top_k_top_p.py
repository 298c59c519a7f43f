"""The kept top-k / top-p (ours, opt-in): vLLM 0.25.1's own top-k then top-p kept set, from
``kept_top_k`` (an int; 0 or -1 off) and ``kept_top_p`` (in (0, 1]; 1 off), applied as an
argmax-invariant processor, last of them, where vLLM's sampler applies its own top-k / top-p.

In a vLLM engine a request that gives them in our namespace (``extra_args["logitsproc_rs"] =
{"kept_top_k": 50, "kept_top_p": 0.9}``) instead of vLLM's ``top_k`` / ``top_p`` gets the same
kept set from us, vLLM's sampler sees no top-k / top-p and skips its own (its sort), and its
exponential race over the masked row draws the same token (``docs/semantics.md``). The fields
are not ``top_k`` / ``top_p``: those are our ``SamplingParams``' own sampler fields, which
``Sampler`` applies itself.

The kept set is ``logitsproc_rs.sampler.mask_top_k_top_p_``'s, over the whole batch as vLLM's
sampler takes it: every row gets ``top_k = vocab_size`` and ``top_p = 1`` where its request sets
neither; so, as in vLLM once some row of the batch uses top-p, a row with ``top_p = 1`` loses
the tokens whose probability is exactly 0 (which no draw picks). No work at all when no row
sets either (a host-side count, no sync).
"""

from __future__ import annotations

import torch

from .._tail import mask_top_k_top_p_
from ..views import PipelineView, Stage

TABLE = "top_k_top_p"


class TopKTopPLogitsProcessor(PipelineView):
    """Argmax-invariant (top-k and top-p always keep the max). Reads ``params.kept_top_k`` and
    ``params.kept_top_p``; reset for a greedy request, as vLLM resets its own."""

    TABLES = (TABLE,)
    ARGMAX_INVARIANT = True
    STAGE = Stage.OPT_IN
    REFERENCE = "logitsproc_rs.reference:RefTopKTopPLogitsProcessor"

    def _apply(self, logits: torch.Tensor, rowspace: bool) -> torch.Tensor:
        pipe = self._pipe
        if not pipe.count(TABLE):
            return logits
        rows, vocab = logits.shape
        k = pipe.dense(TABLE + ".top_k", rows, rowspace).view(-1)  # float32, 0: off
        p = pipe.dense(TABLE + ".top_p", rows, rowspace).view(-1)  # float32, 1: off
        top_k = torch.where(k >= 1, k.clamp(max=vocab), vocab).to(torch.int64)
        top_p = p.to(torch.float32, copy=True)
        if logits.device.type == "cpu":
            # As vLLM's batch: no top-p tensor unless a row uses it (then p = 1 rows lose their
            # zero-probability tokens), no top-k tensor unless a row uses it. Host tensors: no
            # sync. On a device this would sync, so there both are always passed.
            return mask_top_k_top_p_(
                logits,
                top_k if bool((top_k < vocab).any()) else None,
                top_p if bool((top_p < 1).any()) else None,
            )
        return mask_top_k_top_p_(logits, top_k, top_p)

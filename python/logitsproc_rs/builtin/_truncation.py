"""What the four truncation views share (top-n-sigma, typical-p, epsilon, eta): each reads one
float32 per row from its table on the generic float-parameter table
(``rust/src/tables/float_params.rs``), skips all work when no row sets it (a host-side count,
no sync), and masks the logits with torch ops on their device, batched over every row (rows
whose request does not set it are masked out of the result, never looked at one by one)."""

from __future__ import annotations

import torch

from ..views import PipelineView, Stage

NEG_INF = float("-inf")


class TruncationView(PipelineView):
    """Base of the four: opt-in (not vLLM's), applied in the argmax-invariant phase (after
    temperature, before top-k/top-p). ``TABLES`` names the table, whose buffer is
    ``"<table>.value"`` and whose status count is ``"<table>"``."""

    ARGMAX_INVARIANT = True
    STAGE = Stage.OPT_IN

    def _apply(self, logits: torch.Tensor, rowspace: bool) -> torch.Tensor:
        pipe = self._pipe
        table = self.TABLES[0]
        if not pipe.count(table):
            return logits
        value = pipe.dense(table + ".value", logits.shape[0], rowspace)
        return self.mask_(logits, value)

    @staticmethod
    def mask_(logits: torch.Tensor, value: torch.Tensor, /) -> torch.Tensor:
        """In place: -inf where the rows' values (``[rows, 1]``, neutral where unset) drop."""
        raise NotImplementedError


def keep_top_(logits: torch.Tensor, remove: torch.Tensor) -> torch.Tensor:
    """HF's ``min_tokens_to_keep=1`` for epsilon and eta: never remove a logit equal to the
    row's maximum (``scores < topk(scores, 1)``), then mask."""
    remove &= logits < logits.amax(dim=-1, keepdim=True)
    return logits.masked_fill_(remove, NEG_INF)

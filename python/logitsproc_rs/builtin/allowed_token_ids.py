"""Allowed token ids: every token outside a request's set becomes −inf."""

from __future__ import annotations

import torch

from .._alloc import allocated
from ..kernels import pipeline_choice, triton_ops, use_triton
from ..views import PipelineView, Stage
from ._common import host_sparse_


def keep_only_(
    logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, restricted: torch.Tensor
) -> torch.Tensor:
    """In place: in each ``restricted`` row, every logit except those at ``(rows, cols)``
    becomes −inf (save the allowed values, fill the rows, write the values back)."""
    kept = logits[rows, cols]
    logits.index_fill_(0, restricted, float("-inf"))
    return logits.index_put_((rows, cols), kept)


class AllowedTokenIdsLogitsProcessor(PipelineView):
    """Not argmax-invariant. Unlike vLLM 0.25.1, a SWAP exchanges the two rows' sets and a
    condense move leaves no stale set behind (the state moves with its request)."""

    TABLES = ("allowed",)
    ARGMAX_INVARIANT = False
    STAGE = Stage.SAMPLER_BEFORE
    REFERENCE = "logitsproc_rs.reference:RefAllowedTokenIdsLogitsProcessor"
    _bits: torch.Tensor | None = None  # Triton path: zeroed [rows, ceil(V / 32)] int32 scratch

    def _apply(self, logits: torch.Tensor, rowspace: bool) -> torch.Tensor:
        pipe = self._pipe
        pre = "rows." if rowspace else ""
        n, r = pipe.count(pre + "allowed"), pipe.count(pre + "allowed_rows")
        if not n or host_sparse_(pipe, "allowed", logits, rowspace):
            return logits
        rows, cols, _ = pipe.triples("allowed", n, rowspace)
        name = "rows.allowed.restricted_rows" if rowspace else "allowed.restricted_rows"
        restricted = pipe.dense(name, r, False).view(-1)
        if use_triton(logits, pipeline_choice(pipe)):
            # The pairs become a bitmask (allowed = set bit), applied as the grammar's is:
            # store-only, no gather or scatter of logits.
            return triton_ops().keep_only_(logits, rows, cols, restricted, self._scratch(logits))
        return keep_only_(logits, rows, cols, restricted)

    def _scratch(self, logits: torch.Tensor) -> torch.Tensor:
        """One bit per logit of a row (V / 8 bytes a row), allocated zeroed on first use; the
        kernel leaves it zeroed again."""
        rows, vocab = logits.shape
        bits = self._bits
        if bits is None or bits.shape[0] < rows or bits.device != logits.device:
            n = max(rows, self._pipe.capacity)
            shape = (n, (vocab + 31) // 32)
            what = "the allowed ids' bitmask scratch"
            bits = allocated(shape, torch.int32, logits.device, what, "allowed")
            self._bits = bits
        return bits

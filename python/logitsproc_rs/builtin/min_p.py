"""MinP: drop tokens whose probability is below ``min_p`` times the row's top probability."""

from __future__ import annotations

import torch

from ..errors import SlotIndexError
from ..kernels import pipeline_choice, triton_ops, use_triton
from ..views import PipelineView, Stage
from ._common import host_kernel_ok


def min_p_mask_(logits: torch.Tensor, log_min_p: torch.Tensor) -> torch.Tensor:
    """In place: ``logits[i, j] = -inf`` where ``logits[i, j] < max_j logits[i] + log_min_p[i]``.

    The logit-space form of vLLM's ``p < min_p * p_max``: no softmax. ``log_min_p`` is
    ``[rows, 1]`` with −inf for rows without min_p (threshold −inf masks nothing).
    """
    row_max = logits.amax(dim=-1, keepdim=True)
    # A row holding +inf is left alone, as vLLM's softmax form (NaN probabilities) leaves it.
    threshold = row_max.add(log_min_p).masked_fill_(row_max == float("inf"), float("-inf"))
    return logits.masked_fill_(logits < threshold, float("-inf"))


class MinPLogitsProcessor(PipelineView):
    """Argmax-invariant: runs only for batches with randomly sampled rows."""

    TABLES = ("min_p",)
    ARGMAX_INVARIANT = True
    STAGE = Stage.BUILTIN
    REFERENCE = "logitsproc_rs.reference:RefMinPLogitsProcessor"

    def _apply(self, logits: torch.Tensor, rowspace: bool) -> torch.Tensor:
        pipe = self._pipe
        if not pipe.count("min_p"):
            return logits
        rows = logits.shape[0]  # matched to the batch by check_logits
        if pipe.host_kernels and host_kernel_ok(logits):
            # Rust masks the rows that have a min_p in place (two passes, no temporaries).
            pipe.core.unsafe_apply_cpu(
                "min_p", logits.data_ptr(), rows, logits.shape[1], logits.stride(0), rowspace
            )
            return logits
        if use_triton(logits, pipeline_choice(pipe)):
            # One kernel: the row max, then the mask; rows without a min_p are not read.
            row_map = pipe.row_map(rows) if rowspace else None
            return triton_ops().min_p_(logits, pipe.section("min_p.log_min_p"), row_map)
        return min_p_mask_(logits, pipe.dense("min_p.log_min_p", rows, rowspace))

    def get_min_p_by_index(self, index: int) -> float:
        """The stored (float32) min_p of a slot, as vLLM's helper. An index that is no slot
        of the table (a bool, a non-int, out of range however large) is a ``SlotIndexError``
        naming it."""
        capacity = self._pipe.capacity
        if isinstance(index, bool) or not isinstance(index, int):
            raise SlotIndexError(f"index must be an int, got {index!r}", field="index")
        value = self._pipe.core.min_p(index) if 0 <= index < capacity else None
        if value is None:
            shown = index if index.bit_length() <= 256 else f"(an int of {index.bit_length()} bits)"
            raise SlotIndexError(
                f"index {shown} is outside [0, {capacity})", index=None, field="index"
            )
        return float(value)

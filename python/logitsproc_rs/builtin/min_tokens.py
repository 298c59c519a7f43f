"""MinTokens: mask stop tokens (stop_token_ids ∪ EOS) until ``min_tokens`` were generated."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._logits_check import checked_logits
from ..kernels import pipeline_choice
from ..pipeline import Pipeline
from ..views import Stage
from ._common import TripleView, put_sparse_


class MinTokensLogitsProcessor(TripleView):
    """Not argmax-invariant. Its state follows each request's output, so a step without a
    batch change still re-checks lengths."""

    TABLES = ("min_tokens",)
    ARGMAX_INVARIANT = False
    STAGE = Stage.BUILTIN
    REFERENCE = "logitsproc_rs.reference:RefMinTokensLogitsProcessor"
    WITH_SPEC_DECODE = True

    def apply_with_spec_decode(
        self, logits: torch.Tensor, num_draft_tokens: Sequence[int]
    ) -> torch.Tensor:
        """Speculative decoding (vLLM's rejection-sampler path): request ``r`` owns
        ``num_draft_tokens[r]`` consecutive rows; stop tokens are masked on the first
        ``min_tokens - len(output)`` of them."""
        pipe = self._pipe
        rows, n = pipe.core.spec_min_tokens(list(num_draft_tokens))
        return _spec_apply(pipe, "MinTokensLogitsProcessor", "spec.min_tokens", logits, rows, n)


def _spec_apply(
    pipe: Pipeline, name: str, table: str, logits: torch.Tensor, rows: int, n: int
) -> torch.Tensor:
    logits = checked_logits(
        name,
        logits,
        rows,
        pipe.vocab_size,
        pipe.device,
        "the draft layout",
        "apply_with_spec_decode",
    )
    pipe.arena.upload_in_apply()
    if not n:
        return logits
    return put_sparse_(logits, *pipe.triples(table, n), pipeline_choice(pipe))

"""LogitBias: add per-request ``{token: bias}`` to the logits."""

from __future__ import annotations

import torch

from ..kernels import pipeline_choice
from ..views import PipelineView, Stage
from ._common import add_sparse_, host_sparse_


class LogitBiasLogitsProcessor(PipelineView):
    """Not argmax-invariant: a bias can change the top token."""

    TABLES = ("logit_bias",)
    ARGMAX_INVARIANT = False
    STAGE = Stage.BUILTIN
    REFERENCE = "logitsproc_rs.reference:RefLogitBiasLogitsProcessor"

    def _apply(self, logits: torch.Tensor, rowspace: bool) -> torch.Tensor:
        pipe = self._pipe
        n = pipe.count("rows.logit_bias" if rowspace else "logit_bias")
        if not n or host_sparse_(pipe, "logit_bias", logits, rowspace):
            return logits
        return add_sparse_(logits, *pipe.triples("logit_bias", n, rowspace), pipeline_choice(pipe))

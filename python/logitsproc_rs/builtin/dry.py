"""DRY ("don't repeat yourself", llama.cpp's ``llama_sampler_dry_apply``): penalise the tokens
that would extend a repetition of the sequence's own suffix, ``multiplier * base^(len -
allowed_length)`` for a repetition of ``len`` tokens, prompt included.

Not one of vLLM's: built only when asked for (pass the class as a processor, or through the
vLLM bridges). The matching lives in Rust and takes each step's new tokens only (see
``rust/src/tables/dry.rs``); the penalties come as sparse ``(row, token, -penalty)`` triples
added to the logits.
"""

from __future__ import annotations

import torch

from ..kernels import pipeline_choice
from ..views import PipelineView, Stage
from ._common import add_sparse_, host_sparse_


class DryLogitsProcessor(PipelineView):
    """Not argmax-invariant: a penalty can change the top token. Reads ``params.dry_multiplier``
    (0: off), ``dry_base``, ``dry_allowed_length``, ``dry_penalty_last_n`` and
    ``dry_sequence_breakers``."""

    TABLES = ("dry",)
    ARGMAX_INVARIANT = False
    STAGE = Stage.OPT_IN
    REFERENCE = "logitsproc_rs.reference:RefDryLogitsProcessor"

    def _apply(self, logits: torch.Tensor, rowspace: bool) -> torch.Tensor:
        pipe = self._pipe
        n = pipe.count("rows.dry" if rowspace else "dry")
        if not n or host_sparse_(pipe, "dry", logits, rowspace):
            return logits
        return add_sparse_(logits, *pipe.triples("dry", n, rowspace), pipeline_choice(pipe))

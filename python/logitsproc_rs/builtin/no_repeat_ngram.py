"""No-repeat-ngram (HF transformers' ``no_repeat_ngram_size``): never repeat an n-gram of the
request's sequence, prompt included.

Not one of vLLM's: built only when asked for (pass the class as a processor, or through the
vLLM bridges). The n-gram map lives in Rust and takes each step's new tokens only; the map
covers the last ``max_no_repeat_ngram_window`` tokens (see ``rust/src/tables/no_repeat_ngram.rs``).
"""

from __future__ import annotations

import torch

from ..kernels import pipeline_choice
from ..views import PipelineView, Stage
from ._common import host_sparse_, put_sparse_


class NoRepeatNGramLogitsProcessor(PipelineView):
    """Not argmax-invariant: it bans tokens. Reads ``params.no_repeat_ngram_size`` (0: off)."""

    TABLES = ("no_repeat_ngram",)
    ARGMAX_INVARIANT = False
    STAGE = Stage.OPT_IN
    REFERENCE = "logitsproc_rs.reference:RefNoRepeatNGramLogitsProcessor"

    def _apply(self, logits: torch.Tensor, rowspace: bool) -> torch.Tensor:
        pipe = self._pipe
        n = pipe.count("rows.no_repeat_ngram" if rowspace else "no_repeat_ngram")
        if not n or host_sparse_(pipe, "no_repeat_ngram", logits, rowspace):
            return logits
        triples = pipe.triples("no_repeat_ngram", n, rowspace)
        return put_sparse_(logits, *triples, pipeline_choice(pipe))

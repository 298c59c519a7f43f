"""No-repeat-ngram (HF transformers' ``no_repeat_ngram_size``): never repeat an n-gram of the
request's sequence, prompt included.

Not one of vLLM's: built only when asked for (pass the class as a processor, or through the
vLLM bridges). The n-gram map lives in Rust and takes each step's new tokens only; the map
covers the last ``max_no_repeat_ngram_window`` tokens (see ``rust/src/tables/no_repeat_ngram.rs``).
"""

from __future__ import annotations

from ..views import Stage
from ._common import TripleView


class NoRepeatNGramLogitsProcessor(TripleView):
    """Not argmax-invariant: it bans tokens. Reads ``params.no_repeat_ngram_size`` (0: off)."""

    TABLES = ("no_repeat_ngram",)
    ARGMAX_INVARIANT = False
    STAGE = Stage.OPT_IN
    REFERENCE = "logitsproc_rs.reference:RefNoRepeatNGramLogitsProcessor"

"""DRY ("don't repeat yourself", llama.cpp's ``llama_sampler_dry_apply``): penalise the tokens
that would extend a repetition of the sequence's own suffix, ``multiplier * base^(len -
allowed_length)`` for a repetition of ``len`` tokens, prompt included.

Not one of vLLM's: built only when asked for (pass the class as a processor, or through the
vLLM bridges). The matching lives in Rust and takes each step's new tokens only (see
``rust/src/tables/dry.rs``); the penalties come as sparse ``(row, token, -penalty)`` triples
added to the logits.
"""

from __future__ import annotations

from ..views import Stage
from ._common import TripleView


class DryLogitsProcessor(TripleView):
    """Not argmax-invariant: a penalty can change the top token. Reads ``params.dry_multiplier``
    (0: off), ``dry_base``, ``dry_allowed_length``, ``dry_penalty_last_n`` and
    ``dry_sequence_breakers``."""

    TABLES = ("dry",)
    ARGMAX_INVARIANT = False
    STAGE = Stage.OPT_IN
    REFERENCE = "logitsproc_rs.reference:RefDryLogitsProcessor"

"""Thinking budget: once a request has spent its reasoning budget, force the end marker.

vLLM 0.25.1's ``ThinkingBudgetStateHolder`` semantics (rust/src/tables/thinking.rs has the
rules): the start/end markers may be several tokens long; a request whose thinking tokens reach
``thinking_token_budget`` gets the end sequence forced one token per step, by setting that one
logit to 1e9 (nothing else is masked, and it overrides an earlier −inf); a new start marker after
a forced end is closed at once; a prompt that already opened a thinking section counts its
tokens. Unlike 0.25.1, a SWAP with one empty side moves the state instead of duplicating it.
"""

from __future__ import annotations

from typing import Any

from ..views import Stage
from ._common import TripleView


class ThinkingBudgetLogitsProcessor(TripleView):
    """Not argmax-invariant; runs last among the non-invariant processors (after penalties).

    Needs ``reasoning_start_token_ids`` / ``reasoning_end_token_ids`` in the config (vLLM's
    ``reasoning_config``); ``build_logitsprocs`` adds it only then.
    """

    TABLES = ("thinking",)
    ARGMAX_INVARIANT = False
    STAGE = Stage.REASONING
    REFERENCE = "logitsproc_rs.reference_thinking:RefThinkingBudgetLogitsProcessor"

    @classmethod
    def lacks(cls, vllm_config: Any) -> str | None:
        # With a reasoning config its ids are read (or a clear error); build_logitsprocs and
        # the combined processors leave it out without one.
        if getattr(vllm_config, "reasoning_config", None) is not None:
            return None
        return (
            "a reasoning config (start vLLM with --reasoning-parser or --reasoning-config; "
            "EngineConfig.reasoning_start_token_ids / reasoning_end_token_ids)"
        )

"""Thinking budget: once a request has spent its reasoning budget, force the end marker.

vLLM 0.25.1's ``ThinkingBudgetStateHolder`` semantics (see rust/src/thinking.rs for the rules):
the start/end markers may be several tokens long; a request whose thinking tokens reach
``thinking_token_budget`` gets the end sequence forced one token per step, by setting that one
logit to 1e9 (nothing else is masked, and it overrides an earlier −inf); a new start marker after
a forced end is closed at once; a prompt that already opened a thinking section counts its
tokens. Unlike 0.25.1, a SWAP with one empty side moves the state instead of duplicating it.
"""

from __future__ import annotations

import torch

from .. import _core
from .._transfer import TripleViews
from ..interface import BatchUpdate, LogitsProcessor
from ..params import config_max_num_seqs, config_vocab_size
from ._common import check_logits
from .min_tokens import put_sparse_


class ThinkingBudgetLogitsProcessor(LogitsProcessor):
    """Not argmax-invariant; runs last among the non-invariant processors (after penalties).

    Needs ``reasoning_start_token_ids`` / ``reasoning_end_token_ids`` in the config (vLLM's
    ``reasoning_config``); ``build_logitsprocs`` adds it only then.
    """

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        reasoning = getattr(vllm_config, "reasoning_config", None)
        if reasoning is None:
            raise ValueError(
                "ThinkingBudgetLogitsProcessor needs a reasoning config "
                "(EngineConfig.reasoning_start_token_ids / reasoning_end_token_ids)"
            )
        self._vocab_size = config_vocab_size(vllm_config)
        self._state = s = _core.ThinkingState(
            config_max_num_seqs(vllm_config),
            self._vocab_size,
            list(reasoning.reasoning_start_token_ids),
            list(reasoning.reasoning_end_token_ids),
        )
        self._triples = TripleViews([s.rows(), s.cols(), s.vals()], device, is_pin_memory)
        self._rows = 0

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None and not self._state.active:
            return
        self._triples.mirror.before_host_write()
        n = self._state.update(batch_update)
        if batch_update is not None:
            self._rows = batch_update.batch_size
        self._triples.refresh(n)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self._state.saw_placeholders:
            # Async scheduling: an output ended in a -1 placeholder at update_state; the engine
            # fills those in before sampling (vLLM reads the outputs only now), so look again.
            self._triples.mirror.before_host_write()
            self._triples.refresh(self._state.restep())
        triples = self._triples.current
        if triples is None:
            return logits
        check_logits("ThinkingBudgetLogitsProcessor", logits, self._rows, self._vocab_size)
        return put_sparse_(logits, *triples)

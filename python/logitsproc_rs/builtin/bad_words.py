"""Bad words: ban a word's last token once the output ends with the rest of the word."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import _core
from .._transfer import TripleViews
from ..interface import BatchUpdate, LogitsProcessor
from ..params import config_cap, config_max_num_seqs, config_spec_tokens, config_vocab_size
from ._common import DraftRowMask, check_logits
from .min_tokens import put_sparse_

DEFAULT_MAX_BAD_WORDS = 128
DEFAULT_MAX_BAD_WORD_LEN = 64


class BadWordsLogitsProcessor(LogitsProcessor):
    """Not argmax-invariant. Reads ``params.bad_words_token_ids`` (vLLM's tokenized bad words).

    Matching runs in Rust over the tails of the live output lists, once per step.
    """

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self._vocab_size = config_vocab_size(vllm_config)
        self._state = _core.BadWordsState(
            config_max_num_seqs(vllm_config),
            self._vocab_size,
            config_cap(vllm_config, "max_bad_words", DEFAULT_MAX_BAD_WORDS),
            config_cap(vllm_config, "max_bad_word_len", DEFAULT_MAX_BAD_WORD_LEN),
            config_spec_tokens(vllm_config),
        )
        s = self._state
        self._triples = TripleViews([s.rows(), s.cols(), s.vals()], device, is_pin_memory)
        self._spec = DraftRowMask(
            "BadWordsLogitsProcessor", self._state, self._vocab_size, device, is_pin_memory
        )
        self._rows = 0

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None and not self._state.active:
            return
        self._triples.mirror.before_host_write()
        if self._state.update(batch_update):
            self._triples.refresh(self._state.padded_len)
        if batch_update is not None:
            self._rows = batch_update.batch_size

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self._state.saw_placeholders:
            # Async scheduling: an output ended in a -1 placeholder at update_state; the engine
            # fills those in before sampling (vLLM reads the outputs only now), so look again.
            self._triples.mirror.before_host_write()
            if self._state.update(None):
                self._triples.refresh(self._state.padded_len)
        triples = self._triples.current
        if triples is None:
            return logits
        check_logits("BadWordsLogitsProcessor", logits, self._rows, self._vocab_size)
        return put_sparse_(logits, *triples)

    def apply_with_spec_decode(
        self,
        logits: torch.Tensor,
        num_draft_tokens: Sequence[int],
        spec_token_ids: Sequence[Sequence[int]],
    ) -> torch.Tensor:
        """Speculative decoding (vLLM ``apply_bad_words_with_drafts``): request ``r`` owns
        ``num_draft_tokens[r]`` rows; row ``j`` is matched against the output followed by
        ``spec_token_ids[r][:j]``."""
        if not self._state.active:
            return logits
        return self._spec.apply(logits, list(num_draft_tokens), [list(t) for t in spec_token_ids])

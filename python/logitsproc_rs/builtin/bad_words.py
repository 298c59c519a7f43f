"""Bad words: ban a word's last token once the output ends with the rest of the word."""

from __future__ import annotations

import torch

from .. import _core
from .._transfer import TripleViews
from ..interface import BatchUpdate, LogitsProcessor
from ..params import config_cap, config_max_num_seqs, config_vocab_size
from ._common import check_logits
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
        )
        self._triples = TripleViews(self._state, device, is_pin_memory)
        self._rows = 0

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None and not self._state.active:
            return
        self._triples.mirror.before_host_write()
        if self._state.update(batch_update):
            self._triples.refresh()
        if batch_update is not None:
            self._rows = batch_update.batch_size

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        triples = self._triples.current
        if triples is None:
            return logits
        check_logits("BadWordsLogitsProcessor", logits, self._rows, self._vocab_size)
        return put_sparse_(logits, *triples)

"""MinTokens: mask stop tokens (stop_token_ids ∪ EOS) until ``min_tokens`` were generated."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import _core
from .._transfer import TripleViews
from ..interface import BatchUpdate, LogitsProcessor
from ..params import config_cap, config_max_num_seqs, config_spec_tokens, config_vocab_size
from ._common import DraftRowMask, check_logits

DEFAULT_MAX_STOP_TOKEN_IDS = 128


def put_sparse_(
    logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor
) -> torch.Tensor:
    """In place: ``logits[rows[k], cols[k]] = vals[k]`` (duplicates write the same value)."""
    return logits.index_put_((rows, cols), vals)


class MinTokensLogitsProcessor(LogitsProcessor):
    """Not argmax-invariant. Its state follows each request's live output list, so
    ``update_state(None)`` still re-checks lengths every step."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self._vocab_size = config_vocab_size(vllm_config)
        cap = config_cap(vllm_config, "max_stop_token_ids", DEFAULT_MAX_STOP_TOKEN_IDS)
        self._state = _core.MinTokensState(
            config_max_num_seqs(vllm_config), self._vocab_size, cap, config_spec_tokens(vllm_config)
        )
        s = self._state
        self._triples = TripleViews([s.rows(), s.cols(), s.vals()], device, is_pin_memory)
        self._spec = DraftRowMask(
            "MinTokensLogitsProcessor", self._state, self._vocab_size, device, is_pin_memory
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
        triples = self._triples.current
        if triples is None:
            return logits
        check_logits("MinTokensLogitsProcessor", logits, self._rows, self._vocab_size)
        return put_sparse_(logits, *triples)

    def apply_with_spec_decode(
        self, logits: torch.Tensor, num_draft_tokens: Sequence[int]
    ) -> torch.Tensor:
        """Speculative decoding (vLLM's rejection-sampler path): request ``r`` owns
        ``num_draft_tokens[r]`` consecutive rows; stop tokens are masked on the first
        ``min_tokens - len(output)`` of them."""
        if not self._state.active:
            return logits
        return self._spec.apply(logits, list(num_draft_tokens))

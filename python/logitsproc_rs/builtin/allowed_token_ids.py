"""Allowed token ids: every token outside a request's set becomes −inf."""

from __future__ import annotations

import torch

from .. import _core
from .._transfer import DeviceMirror
from ..interface import BatchUpdate, LogitsProcessor
from ..params import config_cap, config_max_num_seqs, config_vocab_size
from ._common import check_logits

DEFAULT_MAX_ALLOWED_TOKEN_IDS = 4096


def keep_only_(
    logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, restricted: torch.Tensor
) -> torch.Tensor:
    """In place: in each ``restricted`` row, every logit except those at ``(rows, cols)``
    becomes −inf (save the allowed values, fill the rows, write the values back)."""
    kept = logits[rows, cols]
    logits.index_fill_(0, restricted, float("-inf"))
    return logits.index_put_((rows, cols), kept)


class AllowedTokenIdsLogitsProcessor(LogitsProcessor):
    """Not argmax-invariant. Unlike vLLM 0.25.1, a SWAP exchanges the two rows' sets and a
    condense move leaves no stale set behind (the state moves with its request)."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self._vocab_size = config_vocab_size(vllm_config)
        self._state = s = _core.AllowedTokenIdsState(
            config_max_num_seqs(vllm_config),
            self._vocab_size,
            config_cap(vllm_config, "max_allowed_token_ids", DEFAULT_MAX_ALLOWED_TOKEN_IDS),
        )
        self._mirror = DeviceMirror(
            [s.rows(), s.cols(), s.restricted_rows()], device, is_pin_memory
        )
        self._rows = 0
        self._views: tuple[torch.Tensor, ...] | None = None
        self._cache: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        self._mirror.before_host_write()
        if self._state.update(batch_update):
            n, r = self._state.padded_len, self._state.padded_rows
            if n == 0:
                self._views = None
            else:
                self._mirror.upload(max(n, r))
                views = self._cache.get((n, r))
                if views is None:
                    rows, cols, restricted = self._mirror.dev
                    views = self._cache[(n, r)] = (rows[:n], cols[:n], restricted[:r])
                self._views = views
        self._rows = batch_update.batch_size

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self._views is None:
            return logits
        check_logits("AllowedTokenIdsLogitsProcessor", logits, self._rows, self._vocab_size)
        return keep_only_(logits, *self._views)

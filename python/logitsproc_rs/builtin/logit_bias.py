"""LogitBias: add per-request ``{token: bias}`` to the logits."""

from __future__ import annotations

import torch

from .. import _core
from .._transfer import DeviceMirror
from ..interface import BatchUpdate, LogitsProcessor
from ..params import config_cap, config_max_num_seqs, config_vocab_size
from ._common import check_logits

DEFAULT_MAX_LOGIT_BIAS_ENTRIES = 1024


def add_sparse_(
    logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor
) -> torch.Tensor:
    """In place: ``logits[rows[k], cols[k]] += vals[k]`` ((row, col) pairs are unique)."""
    return logits.index_put_((rows, cols), vals, accumulate=True)


class LogitBiasLogitsProcessor(LogitsProcessor):
    """Not argmax-invariant: a bias can change the top token."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self._vocab_size = config_vocab_size(vllm_config)
        cap = config_cap(vllm_config, "max_logit_bias_entries", DEFAULT_MAX_LOGIT_BIAS_ENTRIES)
        self._state = _core.LogitBiasState(config_max_num_seqs(vllm_config), self._vocab_size, cap)
        s = self._state
        self._mirror = DeviceMirror([s.rows(), s.cols(), s.vals()], device, is_pin_memory)
        self._rows = 0
        self._n = 0
        self._slices: tuple[torch.Tensor, ...] = ()

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        self._mirror.before_host_write()
        rebuilt = self._state.update(batch_update)
        self._rows = batch_update.batch_size
        if rebuilt:
            self._n = n = self._state.len
            self._mirror.upload(n)
            self._slices = tuple(t[:n] for t in self._mirror.dev)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._n:
            return logits
        check_logits("LogitBiasLogitsProcessor", logits, self._rows, self._vocab_size)
        rows, cols, vals = self._slices
        return add_sparse_(logits, rows, cols, vals)

"""LogitBias: add per-request ``{token: bias}`` to the logits."""

from __future__ import annotations

import torch

from .. import _core
from .._transfer import TripleViews
from ..interface import BatchUpdate, LogitsProcessor
from ..params import config_cap, config_max_num_seqs, config_vocab_size
from ._common import check_logits

DEFAULT_MAX_LOGIT_BIAS_ENTRIES = 1024


def add_sparse_(
    logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor
) -> torch.Tensor:
    """In place: ``logits[rows[k], cols[k]] += vals[k]``.

    Pairs are unique except the padding, whose value is −0.0 (``x + −0.0 == x`` exactly).
    """
    return logits.index_put_((rows, cols), vals, accumulate=True)


class LogitBiasLogitsProcessor(LogitsProcessor):
    """Not argmax-invariant: a bias can change the top token."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self._vocab_size = config_vocab_size(vllm_config)
        cap = config_cap(vllm_config, "max_logit_bias_entries", DEFAULT_MAX_LOGIT_BIAS_ENTRIES)
        self._state = _core.LogitBiasState(config_max_num_seqs(vllm_config), self._vocab_size, cap)
        s = self._state
        self._triples = TripleViews([s.rows(), s.cols(), s.vals()], device, is_pin_memory)
        self._rows = 0

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        self._triples.mirror.before_host_write()
        if self._state.update(batch_update):
            self._triples.refresh(self._state.padded_len)
        self._rows = batch_update.batch_size

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        triples = self._triples.current
        if triples is None:
            return logits
        check_logits("LogitBiasLogitsProcessor", logits, self._rows, self._vocab_size)
        return add_sparse_(logits, *triples)

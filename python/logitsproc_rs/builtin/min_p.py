"""MinP: drop tokens whose probability is below ``min_p`` times the row's top probability."""

from __future__ import annotations

import torch

from .. import _core
from .._transfer import DeviceMirror
from ..interface import BatchUpdate, LogitsProcessor
from ..params import config_max_num_seqs, config_vocab_size
from ._common import check_logits, host_kernel_ok


def min_p_mask_(logits: torch.Tensor, log_min_p: torch.Tensor) -> torch.Tensor:
    """In place: ``logits[i, j] = -inf`` where ``logits[i, j] < max_j logits[i] + log_min_p[i]``.

    The logit-space form of vLLM's ``p < min_p * p_max``: no softmax. ``log_min_p`` is
    ``[rows, 1]`` with −inf for rows without min_p (threshold −inf masks nothing).
    """
    threshold = logits.amax(dim=-1, keepdim=True).add_(log_min_p)
    return logits.masked_fill_(logits < threshold, float("-inf"))


class MinPLogitsProcessor(LogitsProcessor):
    """Argmax-invariant: runs only for batches with randomly sampled rows."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self._state = _core.MinPState(config_max_num_seqs(vllm_config))
        self._vocab_size = config_vocab_size(vllm_config)
        self._mirror = DeviceMirror([self._state.log_min_p()], device, is_pin_memory)
        # On the CPU, Rust masks the rows that have a min_p in place (two passes over each such
        # row, no temporaries); elsewhere, or for other dtypes/layouts, torch does.
        self._host_kernel = self._mirror.on_cpu
        self._count = 0
        self._rows = 0
        # [rows, 1] views of the device buffer, one per batch size seen (views never move).
        self._column = self._mirror.dev[0].unsqueeze(1)
        self._views: dict[int, torch.Tensor] = {}
        self._log_min_p = self._column[:0]

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        self._mirror.before_host_write()
        needs_copy = self._state.update(batch_update)
        self._count = self._state.count
        rows = self._state.batch_size
        if needs_copy:
            self._mirror.upload(rows)
        if rows != self._rows:
            self._rows = rows
            view = self._views.get(rows)
            if view is None:
                view = self._views[rows] = self._column[:rows]
            self._log_min_p = view

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._count:
            return logits
        check_logits("MinPLogitsProcessor", logits, self._rows, self._vocab_size)
        if self._host_kernel and host_kernel_ok(logits):
            rows, vocab = logits.shape
            self._state.unsafe_apply_cpu(logits.data_ptr(), rows, vocab, logits.stride(0))
            return logits
        return min_p_mask_(logits, self._log_min_p)

    def get_min_p_by_index(self, index: int) -> float:
        """The stored (float32) min_p of a slot, as vLLM's helper."""
        value = self._state.get(index)
        if value is None:
            raise IndexError(f"index {index} is outside [0, {self._state.capacity})")
        return float(value)

"""Repetition, frequency and presence penalties with incremental counts.

Each step Rust reads only the newly generated tokens of each request, so a step costs the same
at 16 or 4,096 generated tokens. On the CPU, Rust then applies the penalties in place, touching
only the tokens each request has seen (its counts live in the Rust state). On a GPU the device
holds one int32 matrix ``cells[capacity + 1, V]``: the output count of each (slot, token), plus
``PROMPT_FLAG`` for prompt tokens; row ``capacity`` stays zero. Rust hands back row copies
(moved requests take their counts along, new ones copy the zero row) and ``(row, token,
delta)`` additions, applied with two small kernels, and the apply is a few dense torch ops.
"""

from __future__ import annotations

import torch

from .. import _core
from .._transfer import DeviceMirror
from ..interface import BatchUpdate, LogitsProcessor
from ..params import config_max_num_seqs, config_vocab_size
from ._common import check_logits, host_kernel_ok


def apply_penalties_(
    logits: torch.Tensor,
    cells: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    prompt_flag: int,
) -> torch.Tensor:
    """In place, vLLM's order: repetition on prompt ∪ output (divide positive logits, multiply
    the rest), then ``frequency × count``, then ``presence × [count > 0]`` (output only).

    ``cells`` is ``[rows, V]`` int32 (count | prompt_flag); the penalties are ``[rows, 1]``.
    Rows with neutral values (1, 0, 0) come out bit-identical.
    """
    counts = cells & (prompt_flag - 1)
    in_output = counts > 0
    penalized = torch.where(logits > 0, logits / repetition, logits * repetition)
    torch.where(cells != 0, penalized, logits, out=logits)
    logits.sub_(frequency * counts)
    logits.sub_(presence * in_output)
    return logits


class PenaltiesLogitsProcessor(LogitsProcessor):
    """Not argmax-invariant. Runs after the other non-invariant processors (vLLM's order)."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        cap = config_max_num_seqs(vllm_config)
        self._vocab_size = config_vocab_size(vllm_config)
        self.device = torch.device(device)
        self._state = s = _core.PenaltiesState(cap, self._vocab_size, max(4 * cap, 16384))
        self._prompt_flag = s.prompt_flag
        self._values = DeviceMirror(
            [s.repetition(), s.frequency(), s.presence()], device, is_pin_memory
        )
        self._copies = DeviceMirror([s.copy_dst(), s.copy_src()], device, is_pin_memory)
        self._ops = DeviceMirror([s.ops_rows(), s.ops_cols(), s.ops_vals()], device, is_pin_memory)
        self._columns = [t.unsqueeze(1) for t in self._values.dev]
        self._cells: torch.Tensor | None = None  # allocated when the first request needs it
        # CPU: Rust applies in place from its own counts; the device matrix is not kept.
        self._host_kernel = self._values.on_cpu
        self._rows = 0
        self._row_views: tuple[torch.Tensor, ...] = ()
        self._op_views: dict[int, tuple[torch.Tensor, ...]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        state = self._state
        if batch_update is None and not state.active:
            return
        for m in (self._values, self._copies, self._ops):
            m.before_host_write()
        state.update(batch_update)
        if batch_update is not None and batch_update.batch_size != self._rows:
            self._rows = batch_update.batch_size
            self._row_views = ()
        if state.active and not self._host_kernel:
            self._sync_device()

    def _sync_device(self) -> None:
        """Bring the device matrix and penalty values in step with the Rust state."""
        state = self._state
        if self._cells is None:
            cap = state.zero_row
            self._cells = torch.zeros(
                (cap + 1, self._vocab_size), dtype=torch.int32, device=self.device
            )
        if state.take_values_changed():
            self._values.upload(state.zero_row)  # the whole (small) table: rows never go stale
        n = state.n_copies
        if n:
            self._copies.upload(n)
            dst, src = (t[:n] for t in self._copies.dev)
            self._cells[dst] = self._cells[src]  # the right side is gathered (copied) first
        while True:
            self._ops.before_host_write()
            m = state.next_chunk()
            if not m:
                break
            self._ops.upload(m)
            views = self._op_views.get(m)
            if views is None:
                views = self._op_views[m] = tuple(t[:m] for t in self._ops.dev)
            rows, cols, vals = views
            self._cells.index_put_((rows, cols), vals, accumulate=True)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        state = self._state
        if not state.active:
            return logits
        check_logits("PenaltiesLogitsProcessor", logits, self._rows, self._vocab_size)
        if state.saw_placeholders:
            # Async scheduling: tokens that were -1 at update_state may be real by now (vLLM
            # fills them in between); count them before applying, as vLLM would see them.
            for m in (self._copies, self._ops):
                m.before_host_write()
            state.update(None)
            if not self._host_kernel:
                self._sync_device()
        if self._host_kernel:
            if host_kernel_ok(logits):
                rows, vocab = logits.shape
                state.unsafe_apply_cpu(logits.data_ptr(), rows, vocab, logits.stride(0))
                return logits
            work = logits.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
            state.unsafe_apply_cpu(work.data_ptr(), *work.shape, work.stride(0))
            return logits.copy_(work)
        if not self._row_views:
            r = self._rows
            assert self._cells is not None
            self._row_views = (self._cells[:r], *(c[:r] for c in self._columns))
        cells, rep, freq, pres = self._row_views
        return apply_penalties_(logits, cells, rep, freq, pres, self._prompt_flag)

"""Repetition, frequency and presence penalties with incremental counts.

Each step Rust reads only the newly generated tokens of each request, so a step costs the same
at 16 or 4,096 generated tokens. On the CPU, Rust then applies the penalties in place, touching
only the tokens each request has seen (its counts live in the Rust state). On a device the
pipeline holds one int32 matrix ``cells[capacity + 1, V]``: the output count of each (slot,
token), plus ``PROMPT_FLAG`` for prompt tokens; row ``capacity`` stays zero (``PenaltyCounts``,
this processor's device state). Rust hands back row copies (moved requests take their counts
along, new ones copy the zero row) and ``(row, token, delta)`` additions, applied after each
upload; the apply is one fused Triton pass over the logits and the count rows (``kernels``),
or a few dense torch ops.
"""

from __future__ import annotations

import torch

from .._alloc import allocated
from ..errors import InputError
from ..kernels import pipeline_choice, triton_ops, use_triton
from ..pipeline import Pipeline
from ..views import PipelineView, Stage
from ._common import host_kernel_ok


def apply_penalties_(
    logits: torch.Tensor,
    cells: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    prompt_flag: int,
    divide: bool | None = None,
) -> torch.Tensor:
    """In place, vLLM's order: repetition on prompt ∪ output (divide positive logits, multiply
    the rest; on the CPU the positive ones are multiplied by the reciprocal, as vLLM), then
    ``frequency × count``, then ``presence × [count > 0]`` (output only).

    ``cells`` is ``[rows, V]`` int32 (count | prompt_flag); the penalties are ``[rows, 1]``.
    Rows with neutral values (1, +0.0, +0.0) come out bit-identical. ``divide`` picks the form
    of the positive case (default: divide on CUDA).
    """
    counts = cells & (prompt_flag - 1)
    in_output = counts > 0
    # vLLM divides on CUDA (its kernel) and multiplies by the float32 reciprocal elsewhere (its
    # torch fallback); the two differ by up to 1 ulp, so each device gets vLLM's own form.
    if divide is None:
        divide = logits.device.type == "cuda"
    up = logits / repetition if divide else logits * (1.0 / repetition)
    penalized = torch.where(logits > 0, up, logits * repetition)
    torch.where(cells != 0, penalized, logits, out=logits)
    logits.sub_(frequency * counts)
    logits.sub_(presence * in_output)
    return logits


# The core's sections this processor reads (rust/src/tables/penalties.rs names them).
_PENALTIES = ("penalties.repetition", "penalties.frequency", "penalties.presence")
_OPS = ("penalties.ops_rows", "penalties.ops_cols", "penalties.ops_vals")


class PenaltyCounts:
    """The device count matrix ``cells[capacity + 1, V]`` (int32) of a device pipeline, kept
    in step with the core: the row copies and the first chunk of count additions go up with
    the step's upload, then are applied (more chunks, rarely, with more uploads)."""

    def __init__(self, pipe: Pipeline) -> None:
        self._pipe = pipe
        # Allocated up front (an engine sizes its KV cache after the processors exist).
        self.cells = allocated(
            (pipe.capacity + 1, pipe.vocab_size),
            torch.int32,
            pipe.device,
            "the penalties' count matrix",
            "penalties",
        )
        self._copies = 0
        self._chunk = 0

    def before_upload(self) -> None:
        core = self._pipe.core
        self._copies = core.take_penalty_copies()
        self._chunk = core.next_penalty_chunk()

    def after_upload(self) -> None:
        pipe, cells = self._pipe, self.cells
        n, m = self._copies, self._chunk
        if n:
            dst = pipe.section("penalties.copy_dst")[:n]
            src = pipe.section("penalties.copy_src")[:n]
            cells[dst] = cells[src]  # the right side is gathered (copied) first
        while m:
            rows, cols, vals = (pipe.section(name)[:m] for name in _OPS)
            cells.index_put_((rows, cols), vals, accumulate=True)
            m = pipe.core.next_penalty_chunk()
            if m:
                pipe.arena.upload_in_apply()


class PenaltiesLogitsProcessor(PipelineView):
    """Not argmax-invariant. Runs after the other non-invariant processors (vLLM's order)."""

    TABLES = ("penalties",)
    ARGMAX_INVARIANT = False
    STAGE = Stage.SAMPLER_AFTER
    REFERENCE = "logitsproc_rs.reference:RefPenaltiesLogitsProcessor"

    def attach(self, pipeline: Pipeline) -> None:
        if not pipeline.host_kernels and "penalties" not in pipeline.device_state:
            pipeline.attach_device_state("penalties", PenaltyCounts(pipeline))

    def _apply(self, logits: torch.Tensor, rowspace: bool) -> torch.Tensor:
        pipe = self._pipe
        if not pipe.count("penalties"):
            return logits
        rows = logits.shape[0]  # matched to the batch by check_logits
        core = pipe.core
        if pipe.host_kernels:
            f64 = logits.dtype == torch.float64
            if host_kernel_ok(logits, allow_float64=True):
                core.unsafe_apply_cpu(
                    "penalties",
                    logits.data_ptr(),
                    rows,
                    logits.shape[1],
                    logits.stride(0),
                    rowspace,
                    f64,
                )
                return logits
            # Other layouts (or half precision): a contiguous copy in float64 when the logits
            # are float64, else float32 (what vLLM's sampler computes in), written back.
            # A fresh plain tensor made from the data itself: its pointer, shape and strides
            # are its own, whatever a tensor subclass reports.
            work = logits.as_subclass(torch.Tensor).to(
                torch.float64 if f64 else torch.float32,
                memory_format=torch.contiguous_format,
                copy=True,
            )
            if work.dim() != 2 or tuple(work.shape) != (rows, pipe.vocab_size):
                raise InputError(
                    f"PenaltiesLogitsProcessor.apply: logits hold {list(work.shape)}, "
                    f"expected [{rows}, {pipe.vocab_size}]"
                )
            core.unsafe_apply_cpu(
                "penalties", work.data_ptr(), rows, work.shape[1], work.stride(0), rowspace, f64
            )
            return logits.copy_(work)
        counts = pipe.device_state["penalties"]
        assert isinstance(counts, PenaltyCounts)
        drafted = pipe.count("rows.penalties") if rowspace else 0
        if drafted:
            # Draft rows: the cells that differ from their slot's, and those tokens' logits
            # before the committed form runs over the rows (penalized again below).
            d_rows, d_cols, d_cells = pipe.triples("penalties", drafted, rowspace=True)
            d_rows, d_cols = d_rows.long(), d_cols.long()
            originals = logits[d_rows, d_cols]
        logits = self._apply_committed(logits, rows, rowspace, counts.cells)
        if drafted:
            slots = pipe.row_map(rows).index_select(0, d_rows)
            rep, freq, pres = (pipe.section(name).index_select(0, slots) for name in _PENALTIES)
            fixed = apply_penalties_(
                originals.unsqueeze(1),
                d_cells.unsqueeze(1),
                rep.unsqueeze(1),
                freq.unsqueeze(1),
                pres.unsqueeze(1),
                core.prompt_flag,
            )
            logits.index_put_((d_rows, d_cols), fixed.squeeze(1).to(logits.dtype))
        return logits

    def _apply_committed(
        self, logits: torch.Tensor, rows: int, rowspace: bool, cells: torch.Tensor
    ) -> torch.Tensor:
        """Every row with its slot's committed counts (the device count matrix)."""
        pipe = self._pipe
        if use_triton(logits, pipeline_choice(pipe)):
            # One fused pass: reads the count rows in place (through the row map in row
            # space), no [rows, V] temporaries, neutral rows untouched.
            return triton_ops().penalties_(
                logits,
                cells,
                *(pipe.section(name) for name in _PENALTIES),
                pipe.core.prompt_flag,
                pipe.row_map(rows) if rowspace else None,
                divide=logits.device.type == "cuda",
            )
        cells = cells.index_select(0, pipe.row_map(rows)) if rowspace else cells[:rows]
        rep, freq, pres = (pipe.dense(name, rows, rowspace) for name in _PENALTIES)
        return apply_penalties_(logits, cells, rep, freq, pres, pipe.core.prompt_flag)

"""Pieces shared by the built-in processors' ``apply``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ..kernels import pipeline_choice, triton_ops, use_triton
from ..views import PipelineView

if TYPE_CHECKING:
    from ..pipeline import Pipeline


def host_kernel_ok(logits: torch.Tensor, allow_float64: bool = False) -> bool:
    """Whether Rust may process ``logits`` in place on the host: float32 (or float64 where the
    kernel has that form) on the CPU, rows of contiguous elements that do not overlap, inside
    the tensor's storage (the ``unsafe_apply_cpu`` contract). Checked on the tensor itself,
    not on a subclass's word."""
    if type(logits) is not torch.Tensor or logits.device.type != "cpu":
        return False
    if logits.dtype == torch.float32:
        size = 4
    elif logits.dtype == torch.float64 and allow_float64:
        size = 8
    else:
        return False
    end = int(logits.storage_offset()) + (logits.shape[0] - 1) * logits.stride(0) + logits.shape[1]
    return (
        logits.dim() == 2
        and logits.stride(1) == 1
        and logits.stride(0) >= logits.shape[1]
        and not logits.requires_grad
        and end * size <= logits.untyped_storage().nbytes()
    )


def host_sparse_(pipe: Pipeline, table: str, logits: torch.Tensor, rowspace: bool) -> bool:
    """Rust applies a V1 table's triples in place on host float32 logits (one pass, no
    torch op); ``False`` where it cannot, and the caller takes the torch path."""
    if rowspace or not pipe.host_kernels or not host_kernel_ok(logits):
        return False
    pipe.core.unsafe_apply_cpu(
        table, logits.data_ptr(), logits.shape[0], logits.shape[1], logits.stride(0)
    )
    return True


def put_sparse_(
    logits: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    vals: torch.Tensor,
    choice: str | None = None,
) -> torch.Tensor:
    """In place: ``logits[rows[k], cols[k]] = vals[k]`` (duplicates write the same value).
    ``choice``: the kernels backend (see ``logitsproc_rs.kernels``)."""
    if use_triton(logits, choice):
        return triton_ops().sparse_(logits, rows, cols, vals, add=False)
    return logits.index_put_((rows, cols), _as_dtype_of(logits, vals))


def add_sparse_(
    logits: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    vals: torch.Tensor,
    choice: str | None = None,
) -> torch.Tensor:
    """In place: ``logits[rows[k], cols[k]] += vals[k]``.

    Pairs are unique except the padding, whose value is −0.0 (``x + −0.0 == x`` exactly).
    """
    if use_triton(logits, choice):
        return triton_ops().sparse_(logits, rows, cols, vals, add=True)
    return logits.index_put_((rows, cols), _as_dtype_of(logits, vals), accumulate=True)


def _as_dtype_of(logits: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
    """The table's float32 values in the logits' dtype (float64 logits: exact, as vLLM's
    ``logits[idx] += float32`` promotes); ``index_put_`` wants the dtypes equal."""
    return vals if vals.dtype == logits.dtype else vals.to(logits.dtype)


class TripleView(PipelineView):
    """A built-in whose one table exports sparse triples (bad words, DRY, logit bias,
    MinTokens, the n-gram ban, the thinking budget): its apply is the table's triples, put
    into the logits or added to them as the core's table says (``triples_add``), by Rust on
    host float32 logits, else by torch or Triton. A subclass is a declaration: ``TABLES``,
    ``STAGE``, ``REFERENCE``, its fields' docs."""

    def _apply(self, logits: torch.Tensor, rowspace: bool) -> torch.Tensor:
        pipe = self._pipe
        (table,) = self.TABLES
        n = pipe.count(f"rows.{table}" if rowspace else table)
        if not n or host_sparse_(pipe, table, logits, rowspace):
            return logits
        return self._write(logits, *pipe.triples(table, n, rowspace), pipeline_choice(pipe))

    @functools.cached_property
    def _write(self) -> Callable[..., torch.Tensor]:
        """``add_sparse_`` or ``put_sparse_``, as the core's table says (asked once)."""
        (table,) = self.TABLES
        return add_sparse_ if self._pipe.core.triples_add(table) else put_sparse_

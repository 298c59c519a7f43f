"""Custom processors without bookkeeping: declare per-request columns, write ``transform``.

A processor author lists the per-request values the processor needs and how each is read from
a request's ``SamplingParams`` (including ``extra_args``). The Rust core keeps them per slot
(added, removed, condensed, swapped, or overwritten in a stable slot), tracks what changed and
uploads it with the rest of the pipeline, once per step. ``transform`` receives device tensors
whose rows line up with the logits, and a host-side count of the requests that set a value (so
it can skip all work without a device sync)::

    class Scale(ColumnLogitsProcessor):
        COLUMNS = (FloatColumn("scale", default=1.0,
                               read=lambda sp: (sp.extra_args or {}).get("scale")),)

        def is_argmax_invariant(self) -> bool:
            return True

        def transform(self, logits, cols, num_active):
            return logits if not num_active else logits.mul_(cols["scale"])

A reader returns ``None`` for "not set" (the default). A value of the wrong type or out of range
is a ``ValueError`` naming the request and the column, and the whole step is rejected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .views import PipelineView

Reader = Callable[[Any], Any]


@dataclass(frozen=True, eq=False)
class Column:
    """A declared per-request column. Use the typed constructors below."""

    name: str
    kind: str
    width: int
    default: float
    read: Reader

    def declaration(self) -> tuple[str, str, int, float, Reader]:
        return (self.name, self.kind, self.width, float(self.default), self.read)


def FloatColumn(name: str, default: float, read: Reader) -> Column:
    """One float32 per request; ``transform`` sees ``[rows, 1]``."""
    return Column(name, "float", 1, default, read)


def IntColumn(name: str, default: int, read: Reader) -> Column:
    """One int64 per request; ``transform`` sees ``[rows, 1]``."""
    return Column(name, "int", 1, default, read)


def ArrayColumn(name: str, width: int, default: float, read: Reader) -> Column:
    """``width`` float32s per request (a sequence of that length); ``[rows, width]``."""
    return Column(name, "array", width, default, read)


def TokensColumn(name: str, max_len: int, read: Reader) -> Column:
    """Up to ``max_len`` token ids per request; ``transform`` sees ``cols[name]`` as
    ``[rows, max_len]`` int32 padded with −1 and ``cols[name + "_len"]`` as ``[rows, 1]``."""
    return Column(name, "tokens", max_len, 0, read)


class ColumnLogitsProcessor(PipelineView):
    """Base of a custom processor built on declared columns (see the module docstring).

    Subclasses set ``COLUMNS`` and implement ``is_argmax_invariant`` and ``transform``. Like
    every ``LogitsProcessor`` it is built as ``cls(vllm_config, device, is_pin_memory)``;
    ``build_logitsprocs`` puts its columns in the shared pipeline.
    """

    COLUMNS: tuple[Column, ...] = ()

    def transform(
        self, logits: torch.Tensor, cols: dict[str, torch.Tensor], num_active: int
    ) -> torch.Tensor:
        raise NotImplementedError

    def attach(self, pipeline: Any) -> None:
        # Per column, once: its status entry and its sections' occurrences in the arena.
        self._column_parts = [
            (c, f"column.{k}", _occurrence(pipeline, k), _occurrence(pipeline, k, "tokens"))
            for c, k in zip(self.COLUMNS, self._column_index, strict=True)
        ]

    def _apply(self, logits: torch.Tensor, rowspace: bool) -> torch.Tensor:
        pipe = self._pipe
        rows = logits.shape[0]  # matched to the batch by check_logits
        cols: dict[str, torch.Tensor] = {}
        active = 0
        for c, status, occ, tokens_occ in self._column_parts:
            active = max(active, pipe.count(status))
            cols[c.name] = pipe.dense("column.values", rows, rowspace, c.width, occ)
            if c.kind == "tokens":
                cols[c.name + "_len"] = pipe.dense("column.lengths", rows, rowspace, 1, tokens_occ)
        return self.transform(logits, cols, active)


def _occurrence(pipe: Any, k: int, kind: str | None = None) -> int:
    """Which ``column.values`` (or, for ``kind='tokens'``, ``column.lengths``) section belongs
    to the pipeline's k-th column."""
    if kind is None:
        return k
    return sum(1 for c in pipe.columns[:k] if c.kind == "tokens")


__all__ = [
    "ArrayColumn",
    "Column",
    "ColumnLogitsProcessor",
    "FloatColumn",
    "IntColumn",
    "TokensColumn",
]

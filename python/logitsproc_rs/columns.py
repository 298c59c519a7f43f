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

Under speculative decoding every row of a request, draft rows included, gets its columns. A
processor that also reads the drafts says ``READS_DRAFTS = True``: ``cols`` then holds
``"draft_pos"`` (``[rows, 1]`` int64, the row's draft position: how many drafts precede it, 0
off drafts) and ``"drafts"`` (``[rows, w]`` int64, those drafts, oldest first, −1 padded; ``w``
the pipeline's most draft positions).
"""

from __future__ import annotations

import math
import operator
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .errors import ConfigError, processor_raised
from .views import PipelineView

Reader = Callable[[Any], Any]


KINDS = ("float", "int", "array", "tokens")
#: Most values an array column or a token list holds (lengths are int32 on the device).
MAX_WIDTH = 2**31 - 1
INT64 = (-(2**63), 2**63 - 1)


def _bad(name: str, detail: str) -> ConfigError:
    return ConfigError(f"column '{name}': {detail}", field="columns", detail=detail, column=name)


def _bool_like(v: Any) -> bool:
    """A bool in disguise: Python's, numpy's ``bool_``, a bool tensor or array."""
    return isinstance(v, bool) or str(getattr(v, "dtype", "")) in ("bool", "torch.bool")


def _width(name: str, kind: str, width: Any) -> int:
    what = "max_len" if kind == "tokens" else "width"
    if _bool_like(width) or isinstance(width, (str, bytes)):
        raise _bad(name, f"{what} must be an int, got {width!r}")
    try:
        w = operator.index(width)
    except TypeError:
        raise _bad(name, f"{what} must be an int, got {width!r}") from None
    if kind in ("float", "int"):
        if w != 1:
            raise _bad(name, f"a {kind} column has width 1, got {w}")
    elif not 1 <= w <= MAX_WIDTH:
        raise _bad(name, f"{what} must be in [1, {MAX_WIDTH}], got {w}")
    return w


def _default(name: str, kind: str, default: Any) -> float | int:
    if kind == "tokens":
        return 0
    if kind == "int":
        if _bool_like(default) or isinstance(default, (str, bytes, float)):
            raise _bad(name, f"an int column needs an int default, got {default!r}")
        try:
            d = operator.index(default)
        except TypeError:
            raise _bad(name, f"an int column needs an int default, got {default!r}") from None
        if not INT64[0] <= d <= INT64[1]:
            raise _bad(name, f"the default {d} does not fit in int64")
        return d
    if _bool_like(default) or isinstance(default, (str, bytes)):
        raise _bad(name, f"the default must be a float, got {default!r}")
    try:
        f = float(default)
    except (TypeError, ValueError, OverflowError):
        raise _bad(name, f"the default must be a float, got {default!r}") from None
    # float32 on the device: a default that is not a finite float32 would read back as inf/nan.
    # As float32 (what the device holds): a finite value may round to inf there.
    if not math.isfinite(struct.unpack("f", struct.pack("f", f))[0]):
        raise _bad(name, f"the default {default!r} is not a finite float32")
    return f


@dataclass(frozen=True, eq=False)
class Column:
    """A declared per-request column. Use the typed constructors below.

    Checked when declared: a non-empty str name, a known kind, an int width (1 for ``float``
    and ``int``, in ``[1, 2**31 - 1]`` for ``array`` and ``tokens``; not a bool), a default
    the column holds exactly (an int within int64 for ``int``; a finite float32 otherwise; not
    a bool) and a callable reader. Anything else is a ``ConfigError`` (a ``ValueError``) naming
    the column (``.column``).
    """

    name: str
    kind: str
    width: int
    default: float
    read: Reader

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name:
            raise ConfigError(f"column name must be a non-empty str, got {name!r}", field="columns")
        if self.kind not in KINDS:
            raise _bad(name, f"unknown kind {self.kind!r} (one of {KINDS})")
        object.__setattr__(self, "width", _width(name, self.kind, self.width))
        object.__setattr__(self, "default", _default(name, self.kind, self.default))
        if not callable(self.read):
            raise _bad(name, f"read must be a callable params -> value, got {self.read!r}")

    def declaration(self) -> tuple[str, str, int, float | int, Reader]:
        return (self.name, self.kind, self.width, self.default, self.read)


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
    #: ``transform`` also gets each row's draft position and the drafts before it (module docs).
    READS_DRAFTS: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _check_columns(cls.__name__, cls.COLUMNS, bool(cls.READS_DRAFTS))

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
        if self.READS_DRAFTS:
            cols["draft_pos"], cols["drafts"] = _draft_columns(pipe, rows, rowspace, logits.device)
        # A transform that raises names this processor, as the Sampler does for any custom
        # processor: a ValueError stays one, any other Exception becomes a RuntimeError, both
        # chained to the original; an interrupt (KeyboardInterrupt...) propagates as itself.
        try:
            return self.transform(logits, cols, active)
        except Exception as e:
            raise processor_raised(f"{type(self).__name__}.apply", e) from e


def _draft_columns(
    pipe: Any, rows: int, rowspace: bool, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's draft position and the drafts before it: the row space's, or none (a V1
    batch, or a pipeline without a row space)."""
    if rowspace:
        pos = pipe.section("rows.draft_pos")
        drafts = pipe.section("rows.drafts")
        width = drafts.numel() // pos.numel()  # the row space's rows, each `width` drafts
        return pos[:rows].view(rows, 1), drafts.view(-1, width)[:rows]
    return (
        torch.zeros((rows, 1), dtype=torch.int64, device=device),
        torch.full((rows, 1), -1, dtype=torch.int64, device=device),
    )


def _check_columns(owner: str, columns: Any, reads_drafts: bool = False) -> None:
    """``COLUMNS``: a tuple of ``Column``s whose names (and, for a tokens column ``x``, its
    ``x_len`` tensor; with ``READS_DRAFTS``, ``draft_pos`` and ``drafts``) do not clash in the
    ``cols`` dict ``transform`` gets."""
    if not isinstance(columns, tuple) or not all(isinstance(c, Column) for c in columns):
        raise ConfigError(
            f"{owner}.COLUMNS must be a tuple of Column (FloatColumn(...), ...), got {columns!r}",
            field="columns",
        )
    seen: set[str] = {"draft_pos", "drafts"} if reads_drafts else set()
    for c in columns:
        keys = [c.name] + ([c.name + "_len"] if c.kind == "tokens" else [])
        for key in keys:
            if key in seen:
                raise _bad(c.name, f"{owner}.COLUMNS has two columns named {key!r}")
            seen.add(key)


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

"""Values no request field may hold, for every field of the core's registry by its kind
(``logitsproc_rs.registry``): a field added to the core inherits them in every machine and
test that draws from here (``test_params``, ``test_property``, ``test_property_slots``).

- numbers that are no numbers here: bools (Python's, numpy's, a 0-d bool tensor or array),
  ints too large for a float or for the core's int range (``INT_FIELD_RANGE``);
- 0-d tensors of every dtype where the kind is a list or a dict, and bool-typed ones anywhere;
- endless iterables (an ``itertools.repeat``) and iterables whose ``__iter__`` raises, for the
  list kinds (the outer list and an inner one).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch

from logitsproc_rs.registry import INT_FIELD_RANGE, TABLES, Field

# Every dtype a 0-d tensor can have here (the quantized and bit ones cannot be built so).
TORCH_DTYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
)


class RaisingIter:
    """An iterable whose ``__iter__`` raises (a buggy or hostile list)."""

    def __iter__(self) -> Any:
        raise RuntimeError("boom")

    def __repr__(self) -> str:
        return "RaisingIter()"


class Endless:
    """An endless iterable (fresh each time it is iterated), with a short repr."""

    def __init__(self, item: Any) -> None:
        self.item = item

    def __iter__(self) -> Any:
        return itertools.repeat(self.item)

    def __repr__(self) -> str:
        return f"Endless({self.item!r})"


BOOLS: tuple[Any, ...] = (True, False, np.True_, np.array(True), torch.tensor(True))
HUGE: tuple[Any, ...] = (10**400, -(10**400))
BEYOND_INT = (INT_FIELD_RANGE[1] + 1, INT_FIELD_RANGE[0] - 1, 2**70)
ZERO_D = tuple(torch.tensor(1, dtype=d) for d in TORCH_DTYPES)


def junk(kind: str) -> list[Any]:
    """Values no field of ``kind`` may hold."""
    if kind == "float":
        return [*BOOLS, *HUGE, torch.tensor(1j), torch.tensor(1 + 0j), np.complex128(1), 1j]
    if kind in ("int", "opt_int"):
        return [*BOOLS, *HUGE, *BEYOND_INT, torch.tensor(1.0)]
    if kind == "bool":
        return [1, 0, np.int64(1), 10**400, torch.tensor(1)]
    if kind == "ids":
        return [*ZERO_D, *BOOLS, 10**400, Endless(1), RaisingIter(), [True], [10**400]]
    if kind == "id_lists":
        return [
            *ZERO_D,
            10**400,
            Endless([1]),
            [Endless(1)],
            RaisingIter(),
            [RaisingIter()],
            [torch.tensor(1)],
            [[True]],
            [[10**400]],
        ]
    if kind == "bias":
        return [*ZERO_D, Endless((1, 1.0)), {1: True}, {1: torch.tensor(True)}, {1: 10**400}]
    raise AssertionError(f"no junk for field kind {kind!r}: add it here")


def registry_fields(tables: Any = None) -> list[Field]:
    """Every field of the registry (of ``tables`` only, when given), once."""
    seen: dict[str, Field] = {}
    for t in TABLES.values():
        if tables is None or t.name in tables:
            for f in t.fields:
                seen.setdefault(f.name, f)
    return list(seen.values())


def registry_junk(tables: Any = None) -> list[tuple[Field, Any]]:
    """``(field, value)`` for every field of the registry (of ``tables``) and every value of
    its kind that no request may hold."""
    return [(f, v) for f in registry_fields(tables) for v in junk(f.kind)]


def short(v: Any) -> str:
    """A test id for a value (an int of 400 digits has none worth reading)."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 2**80:
        return f"int{'-' if v < 0 else ''}{v.bit_length()}bits"
    if isinstance(v, torch.Tensor):
        return f"tensor0d-{v.dtype}".replace("torch.", "")
    return repr(v)[:24]


def bad_layouts(drafts: list[list[int]]) -> list[tuple[Any, Any, Any]]:
    """Draft layouts (``spec_token_ids``, ``row_to_request``, ``positions``) that are not those
    of a batch whose requests have ``drafts`` (one entry each, in batch order): each must be
    refused naming its field, with nothing changed (``LogitsProcessors.apply_drafts``)."""
    batch = len(drafts)
    rows = [r for r, d in enumerate(drafts) for _ in range(len(d) + 1)]
    pos = [j for d in drafts for j in range(len(d) + 1)]
    out: list[tuple[Any, Any, Any]] = [
        ([*drafts, []], None, None),  # one entry too many
        (Endless([]), None, None),
        (RaisingIter(), None, None),
        (None, None, None),
        (batch, None, None),
        ({tuple(d) for d in drafts}, None, None),  # no order
        (dict(enumerate(drafts)), None, None),
        (drafts, [*rows[:-1], batch], pos),  # a row of a request past the batch
        (drafts, [*rows[:-1], -1], pos),
        (drafts, rows, None),  # a row map without positions
    ]
    if batch:
        out.append((drafts[:-1], None, None))  # one entry short
    return out

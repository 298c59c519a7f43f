"""The built-in tables, as the Rust core's registry lists them (``_core.registry()``).

Every Python place that needs a built-in table's name, its per-request caps and their
defaults, the request fields it reads (with the ``SamplingParams`` attribute each is read
from, and its neutral value) or whether it reads output histories takes it from here, so a
table is declared once: in its Rust file and the core's registry. The processors built on the
tables, and their order in the sampler, are listed in ``builtin``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._core import INT_FIELD_RANGE as _INT_FIELD_RANGE
from ._core import registry as core_registry
from .errors import LogitsprocError


@dataclass(frozen=True)
class Field:
    """One request field a table reads."""

    #: The name the core gives it (errors name it).
    name: str
    #: The ``SamplingParams`` attribute it is read from.
    attr: str
    #: ``float``, ``int``, ``opt_int``, ``ids``, ``id_lists`` or ``bias``.
    kind: str
    #: Its value when unset (``None`` for the optional and list kinds).
    neutral: Any
    #: Whether it only tunes its processor (set alone it changes nothing); the other fields
    #: switch the processor on, and a pipeline without it refuses them.
    tunes: bool
    #: The per-request caps bounding it (engine-config names): a list's length (for lists of
    #: lists, then each list's), or an int's value.
    caps: tuple[str, ...]
    #: What an error calls one entry of a list field ("word").
    item: str
    #: The values at or below it are off, read as the neutral value (``kept_top_k``'s -1,
    #: ``top_n_sigma <= 0``), which ``SamplingParams`` then holds; ``None`` for most fields.
    off_at_most: float | int | None = None
    #: Values a request may give it (the first not neutral: for a switching field, one that
    #: switches its processor on), declared next to its range; the tests' lists come from here.
    examples: tuple[Any, ...] = ()
    #: Values a request may not give it (each refused, naming the field).
    bad: tuple[Any, ...] = ()

    def is_set(self, value: Any) -> bool:
        """Whether ``value`` (as a request holds it) sets this field."""
        if self.kind in ("float", "int"):
            return value is not None and value != self.neutral
        if self.kind == "opt_int":
            return value is not None
        return bool(value)


@dataclass(frozen=True)
class Table:
    """One built-in table of the core."""

    name: str
    #: Per-request caps (engine-config names) and their defaults.
    caps: dict[str, int]
    #: The request fields it reads, in reading order.
    fields: tuple[Field, ...]
    #: Whether its requests' output histories are read every step.
    history: bool


TABLES: dict[str, Table] = {
    name: Table(
        name,
        dict(caps),
        tuple(
            Field(n, a, k, v, tunes, tuple(c), item, off, tuple(ex), tuple(bad))
            for n, a, k, v, tunes, c, item, (off, ex, bad) in fields
        ),
        history,
    )
    for name, caps, fields, history in core_registry()
}

#: Every per-request cap's default, by engine-config name.
CAP_DEFAULTS: dict[str, int] = {c: d for t in TABLES.values() for c, d in t.caps.items()}

#: The table that reads each field, by the field's name and by its attribute.
FIELD_TABLE: dict[str, str] = {
    key: t.name for t in TABLES.values() for f in t.fields for key in (f.name, f.attr)
}

# Each error of ours names the table that reads its field (``LogitsprocError.processor``).
LogitsprocError.FIELD_TABLE = FIELD_TABLE

#: Every field's neutral value, by the field's name.
NEUTRAL: dict[str, Any] = {f.name: f.neutral for t in TABLES.values() for f in t.fields}

#: Where a number field is off, by attribute: ``(at most, neutral value)``
#: (``{"kept_top_k": (0, 0), ...}``); ``SamplingParams`` holds such a value as the neutral one.
OFF_AT_MOST: dict[str, tuple[Any, Any]] = {
    f.attr: (f.off_at_most, f.neutral)
    for t in TABLES.values()
    for f in t.fields
    if f.off_at_most is not None
}

#: The range of an int request field's value (``int`` and ``opt_int`` kinds), both ends
#: included: what the core reads them as.
INT_FIELD_RANGE: tuple[int, int] = tuple(_INT_FIELD_RANGE)  # type: ignore[assignment]

#: The tables whose requests' output histories are read every step.
HISTORY_TABLES: frozenset[str] = frozenset(t.name for t in TABLES.values() if t.history)


def caps_of(tables: Any, config: Any, read: Any) -> dict[str, int]:
    """The caps the named ``tables`` are sized by, each read from ``config`` as
    ``read(config, name, default)``, in the registry's order."""
    return {
        cap: read(config, cap, default)
        for t in TABLES.values()
        if t.name in tables
        for cap, default in t.caps.items()
    }

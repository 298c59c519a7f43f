"""The built-in tables, as the Rust core's registry lists them (``_core.builtins()``).

Every Python place that needs a built-in table's name, its per-request caps and their
defaults, or the request fields it reads (with the ``SamplingParams`` attribute each is read
from) takes it from here, so a table is declared once, in its Rust file and the core's
registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import _core


@dataclass(frozen=True)
class Table:
    """One built-in table of the core."""

    name: str
    #: Per-request caps (engine-config names) and their defaults.
    caps: dict[str, int]
    #: The request fields it reads: ``(name, SamplingParams attribute)``, in reading order.
    fields: tuple[tuple[str, str], ...]


TABLES: dict[str, Table] = {
    name: Table(name, dict(caps), tuple(fields)) for name, caps, fields in _core.builtins()
}

#: Every per-request cap's default, by engine-config name.
CAP_DEFAULTS: dict[str, int] = {c: d for t in TABLES.values() for c, d in t.caps.items()}

#: The table that reads each field, by the field's name and by its attribute.
FIELD_TABLE: dict[str, str] = {
    key: t.name for t in TABLES.values() for name, attr in t.fields for key in (name, attr)
}


def caps_of(tables: Any, config: Any, read: Any) -> dict[str, int]:
    """The caps the named ``tables`` are sized by, each read from ``config`` as
    ``read(config, name, default)``, in the registry's order."""
    return {
        cap: read(config, cap, default)
        for t in TABLES.values()
        if t.name in tables
        for cap, default in t.caps.items()
    }

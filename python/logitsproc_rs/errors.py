"""The exceptions logitsproc_rs raises about input and use it refuses, one class per kind.

Each is also the builtin a caller already catches, so ``except ValueError`` keeps working:

- ``RequestError`` (``ValueError``): one request's parameter is refused.
- ``BatchUpdateError`` (``ValueError``): a batch update is malformed (its size, an index or a
  direction in its lists), not one request's parameters.
- ``ConfigError`` (``ValueError``): a bad engine-wide setting.
- ``SizeError`` (``ValueError``): a size beyond what the fixed tables support (a setting, or
  a step's row count).
- ``ProtocolError`` (``RuntimeError``): a call that does not fit the step protocol.
- ``AllocationError`` (``MemoryError``): a buffer the allocator refused.

What a caller needs is an attribute, never something to parse out of the message:
``index`` (the request's batch index or slot; ``None`` when the error names no request, as at
vLLM's front end), ``field`` (the ``SamplingParams`` field, the update's list or the setting),
``processor`` (the built-in processor that reads ``field``, by its table name, e.g.
``"penalties"``; ``None`` for any other field), ``column`` (a custom column's name) and
``detail`` (for an error about a request: the message after ``field '...': ``).

The Rust core raises these (``_core``, built in ``rust/src/python/errors.rs``) and so does the
Python side; their messages are part of the interface and stay as they are. A layer that adds
where an error happened uses ``with_context``, which keeps the class and the attributes.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import ClassVar, TypeVar

__all__ = [
    "AllocationError",
    "BatchUpdateError",
    "ConfigError",
    "LogitsprocError",
    "ProtocolError",
    "RequestError",
    "SizeError",
    "with_context",
]

E = TypeVar("E", bound="LogitsprocError")


class LogitsprocError(Exception):
    """The base of every error in this module (each also derives from a builtin)."""

    #: The one field -> table map, the core's registry's: ``registry`` sets it when it reads
    #: the registry (this module imports nothing of ours, so the extension, which raises these
    #: classes, never waits on it).
    FIELD_TABLE: ClassVar[Mapping[str, str]] = {}

    def __init__(
        self,
        message: str,
        *,
        index: int | None = None,
        field: str | None = None,
        detail: str | None = None,
        column: str | None = None,
    ) -> None:
        super().__init__(message)
        self.index = index
        self.field = field
        self.detail = detail
        self.column = column

    @classmethod
    def at(
        cls: type[E],
        field: str,
        detail: str,
        *,
        where: str = "",
        label: str | None = None,
        index: int | None = None,
        column: str | None = None,
    ) -> E:
        """The one way a message names a field, the core's form: ``<where>field '<label>':
        <detail>`` (``where``: ``"request at index 3: "``, ``"batch update: "``, ``"config "``
        or nothing; ``label``: the field as the message names it, default ``field``)."""
        return cls(
            f"{where}field '{label or field}': {detail}",
            index=index,
            field=field,
            detail=detail,
            column=column,
        )

    @property
    def processor(self) -> str | None:
        """The built-in processor (table) that reads ``field``, else ``None``."""
        if self.field is None:
            return None
        return self.FIELD_TABLE.get(self.field)

    def with_context(self: E, prefix: str) -> E:
        """This error with ``prefix`` before its message: the same class and attributes (raise
        it ``from`` this one)."""
        new = copy.copy(self)
        new.args = (f"{prefix}{self}",)
        return new


class RequestError(LogitsprocError, ValueError):
    """One request's parameter is refused (``index``, ``field``, ``processor``, ``detail``)."""

    @classmethod
    def located(
        cls,
        index: int | None,
        field: str,
        detail: str,
        *,
        label: str | None = None,
        where: str | None = None,
        column: str | None = None,
    ) -> RequestError:
        """The error with the core's message, ``request at index 3: field 'min_p': <detail>``
        (``request: ...`` without an index). ``label``: the field as the message names it
        (default ``field``); ``where``: the request as the message names it."""
        if where is None:
            where = "request" if index is None else f"request at index {index}"
        return cls.at(field, detail, where=f"{where}: ", label=label, index=index, column=column)


class BatchUpdateError(LogitsprocError, ValueError):
    """A malformed batch update (``field``: its list; ``index`` when an entry names one)."""


class InputError(LogitsprocError, ValueError):
    """A call's argument is refused: logits of the wrong shape, dtype, device or layout, a
    grammar bitmask, sampling metadata, an HF call's parameters (``field`` when it names one)."""


class LoadError(LogitsprocError, RuntimeError):
    """A logits-processor plugin or named class failed to import or load."""


class SlotIndexError(LogitsprocError, IndexError, ValueError):
    """A slot index outside the table: an ``IndexError`` as in vLLM, and a ``ValueError`` like
    every other bad input (one of ours: ``field`` is ``"index"``)."""


class ProcessorError(LogitsprocError, RuntimeError):
    """A custom processor raised something other than a ``ValueError`` (chained to it)."""


class ConfigError(LogitsprocError, ValueError):
    """A bad engine-wide setting (``field``)."""


class SizeError(LogitsprocError, ValueError):
    """A size beyond what the fixed tables support (``field``)."""


class ProtocolError(LogitsprocError, RuntimeError):
    """A call that does not fit the step protocol."""


class AllocationError(LogitsprocError, MemoryError):
    """The allocator refused a buffer (``field``: what it was for)."""

    @classmethod
    def refused(
        cls,
        what: str,
        shape: tuple[int, ...],
        dtype: object,
        nbytes: int,
        device: object,
        error: BaseException,
        *,
        field: str,
    ) -> AllocationError:
        """torch refused ``what`` (``error``: what it raised), a ``shape`` tensor of ``dtype``:
        ``could not allocate the arena ([4096] torch.uint8, 4096 bytes on cuda:0): ...``."""
        size = f"[{', '.join(map(str, shape))}] {dtype}, {nbytes} bytes on {device}"
        return cls(f"could not allocate {what} ({size}): {error}", field=field)


def with_context(
    error: BaseException, prefix: str, other: type[Exception] = ValueError
) -> Exception:
    """``error`` with ``prefix`` before its message, to raise ``from`` it: one of ours keeps
    its class and attributes; any other exception becomes an ``other`` (a ``ValueError``)."""
    if isinstance(error, LogitsprocError):
        return error.with_context(prefix)
    return other(f"{prefix}{error}")


def processor_raised(where: str, error: Exception) -> Exception:
    """The one wrapper for a custom processor that raised (``where``: ``"Class.method"``, and
    where it runs): a ``ValueError`` keeps its class with ``where: `` before its message, any
    other ``Exception`` is a ``ProcessorError`` naming ``where`` and the original; raise the
    result ``from`` the original."""
    if isinstance(error, ValueError):
        return with_context(error, f"{where}: ")
    return ProcessorError(f"{where} raised {error!r}")

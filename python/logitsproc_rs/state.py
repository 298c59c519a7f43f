"""Batch bookkeeping: ``BatchUpdateBuilder`` and the ``LogitsProcessors`` container (vLLM 0.25.1
``state.py``). The same rules are implemented in Rust (``rust/src/batch.rs``) for the core."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from .interface import AddedRequest, BatchUpdate, LogitsProcessor, MovedRequest


class BatchUpdateBuilder:
    """Collects one step's changes.

    All removals are registered first; once ``removed``, ``peek_removed`` or ``pop_removed``
    has been read, ``removed_append`` raises ``RuntimeError``. ``removed`` reads sorted
    descending, and ``pop_removed`` hands out the lowest freed slot first.
    """

    def __init__(
        self,
        removed: list[int] | None = None,
        added: list[AddedRequest] | None = None,
        moved: list[MovedRequest] | None = None,
    ) -> None:
        self._removed: list[int] = removed or []
        self.added: list[AddedRequest] = added or []
        self.moved: list[MovedRequest] = moved or []
        self._is_removed_sorted = False
        # Tracks changes in the pooling case, where `added` is not populated.
        self.batch_changed = False

    def _ensure_removed_sorted(self) -> None:
        if not self._is_removed_sorted:
            self._removed.sort(reverse=True)
            self._is_removed_sorted = True

    @property
    def removed(self) -> list[int]:
        """The removed slots, descending (the internal list itself, as vLLM)."""
        self._ensure_removed_sorted()
        return self._removed

    def removed_append(self, index: int) -> None:
        if self._is_removed_sorted:
            raise RuntimeError(
                "Cannot register new removed request after self.removed has been read."
            )
        self._removed.append(index)
        self.batch_changed = True

    def has_removed(self) -> bool:
        return bool(self._removed)

    def peek_removed(self) -> int | None:
        """The lowest removed slot, without taking it."""
        if self.has_removed():
            self._ensure_removed_sorted()
            return self._removed[-1]
        return None

    def pop_removed(self) -> int | None:
        """Takes the lowest removed slot."""
        if self.has_removed():
            self._ensure_removed_sorted()
            return self._removed.pop()
        return None

    def reset(self) -> bool:
        """Clears everything; returns whether the batch had changed (pooling path)."""
        self._is_removed_sorted = False
        self._removed.clear()
        self.added.clear()
        self.moved.clear()
        changed, self.batch_changed = self.batch_changed, False
        return changed

    def get_and_reset(self, batch_size: int) -> BatchUpdate | None:
        """The step's ``BatchUpdate``, or ``None`` when nothing was added, removed or moved."""
        self._is_removed_sorted = False
        self.batch_changed = False
        if not any((self._removed, self.moved, self.added)):
            return None
        update = BatchUpdate(
            batch_size=batch_size, removed=self._removed, moved=self.moved, added=self.added
        )
        self._removed = []
        self.moved = []
        self.added = []
        return update


class LogitsProcessors:
    """Processors split by argmax invariance, each group in construction order."""

    def __init__(self, logitsprocs: Iterable[LogitsProcessor] | None = None) -> None:
        self.argmax_invariant: list[LogitsProcessor] = []
        self.non_argmax_invariant: list[LogitsProcessor] = []
        if logitsprocs:
            for p in logitsprocs:
                (
                    self.argmax_invariant if p.is_argmax_invariant() else self.non_argmax_invariant
                ).append(p)

    @property
    def all(self) -> Iterator[LogitsProcessor]:
        """Argmax-invariant ones first, then the rest (vLLM's ``update_state`` order)."""
        return itertools.chain(self.argmax_invariant, self.non_argmax_invariant)

"""Batch bookkeeping: ``BatchUpdateBuilder`` and the ``LogitsProcessors`` container (vLLM 0.25.1
``state.py``). The same rules are implemented in Rust (``rust/src/batch.rs``) for the core."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .errors import ProtocolError, RequestError, processor_raised
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
            raise ProtocolError(
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
    """Processors split by argmax invariance, each group in construction order.

    ``update_state(update)`` is the fast path: one call into each pipeline for the whole step
    (the built-ins of ``build_logitsprocs`` share one), plus ``update_state`` of any processor
    that is not a pipeline view. Calling each processor's ``update_state`` in turn, as vLLM's
    loop does, gives the same logits.
    """

    def __init__(
        self, logitsprocs: Iterable[LogitsProcessor] | None = None, pipeline: Any = None
    ) -> None:
        self.argmax_invariant: list[LogitsProcessor] = []
        self.non_argmax_invariant: list[LogitsProcessor] = []
        if logitsprocs:
            for p in logitsprocs:
                (
                    self.argmax_invariant if p.is_argmax_invariant() else self.non_argmax_invariant
                ).append(p)
        self.pipeline = pipeline
        pipes: dict[int, Any] = {}
        self._others: list[LogitsProcessor] = []
        for p in self.all:
            pipe = getattr(p, "_pipe", None)
            if pipe is not None and hasattr(pipe, "step"):
                pipes.setdefault(id(pipe), pipe)
            else:
                self._others.append(p)
        if pipeline is not None:
            pipes.setdefault(id(pipeline), pipeline)
        self._pipelines = list(pipes.values())
        self._other_ids = {id(p) for p in self._others}

    @property
    def all(self) -> Iterator[LogitsProcessor]:
        """Argmax-invariant ones first, then the rest (vLLM's ``update_state`` order)."""
        return itertools.chain(self.argmax_invariant, self.non_argmax_invariant)

    def update_state(
        self,
        batch_update: BatchUpdate | None,
        sampled_token_ids: Any = None,
    ) -> None:
        """One step for every processor: one core call per pipeline, then the other
        processors' own ``update_state``. With several pipelines, all of them check the
        update before any applies it: a refusal leaves every pipeline as it was.
        ``sampled_token_ids`` (token-feed pipelines only): the token each row sampled last
        step, −1 for none, on the host."""
        pipes = self._pipelines
        if len(pipes) == 1 or not all(hasattr(p, "prepare_step") for p in pipes):
            for pipe in pipes:
                pipe.step(batch_update, sampled_token_ids)
        else:
            # Several pipelines take the step all or none: each reads and checks it first,
            # a refusal drops what the others checked, then every one applies it.
            prepared: list[Any] = []
            try:
                for pipe in pipes:
                    pipe.prepare_step(batch_update, sampled_token_ids)
                    prepared.append(pipe)
            except BaseException:
                for pipe in prepared:
                    pipe.abort_step()
                raise
            for pipe in pipes:
                pipe.commit_step()
        for p in self._others:
            _named(p, "update_state", p.update_state, batch_update)

    def apply_each(self, procs: Iterable[LogitsProcessor], logits: Any) -> Any:
        """``logits = p.apply(logits)`` for each processor in turn (the ``Sampler``'s loop).
        A custom processor that raises is named in the error (our own name themselves)."""
        others = self._other_ids
        for p in procs:
            logits = _named(p, "apply", p.apply, logits) if id(p) in others else p.apply(logits)
        return logits

    def apply_drafts(
        self,
        procs: Iterable[LogitsProcessor],
        logits: Any,
        spec_token_ids: Sequence[Sequence[int]],
        row_to_request: Sequence[int] | None = None,
        positions: Sequence[int] | None = None,
    ) -> Any:
        """Speculative decoding, after this step's ``update_state``: each processor in turn
        on draft rows (``drafts`` module). Request ``r`` (batch row ``r``) has drafts
        ``spec_token_ids[r]``; logits row ``i`` belongs to request ``row_to_request[i]`` at
        draft position ``positions[i]`` and gets its transforms over the request's output
        followed by its first ``positions[i]`` drafts. By default each request owns ``k + 1``
        consecutive rows at positions ``0 .. k``. A layout that is not the batch's (one entry
        of ``spec_token_ids`` per request of this step's batch, rows of its requests) or that
        the core refuses is a ``ValueError`` and changes nothing."""
        from ._drafts import apply_by_position, draft_layout

        batch_size = None
        if self._pipelines:
            pipe = self._pipelines[0]
            if not pipe.protocol.epoch:
                detail = "apply_drafts before any update_state: no batch to lay the drafts over"
                raise RequestError.at("spec_token_ids", detail)
            batch_size = pipe.count("batch_size")
        rows, pos, drafts = draft_layout(spec_token_ids, row_to_request, positions, batch_size)
        for pipe in self._pipelines:
            pipe.map_drafts(rows, pos, drafts)
        others = self._other_ids
        for p in procs:
            if id(p) in others:
                logits = _named(p, "apply", apply_by_position, p, logits, rows, pos)
            else:
                logits = p.apply_rows(logits)  # type: ignore[attr-defined]
        return logits

    @property
    def bytes_uploaded_last_step(self) -> int:
        """Bytes the pipelines' last uploads carried (zero on a step that changed nothing)."""
        return sum(p.bytes_uploaded_last_step for p in self._pipelines)


def _named(p: Any, what: str, fn: Any, *args: Any) -> Any:
    """Call a custom processor's method; an exception it raises names it (a ``ValueError``
    stays one, anything else becomes a ``RuntimeError``), chained to the original."""
    try:
        return fn(*args)
    except Exception as e:
        raise processor_raised(f"{type(p).__name__}.{what}", e) from e

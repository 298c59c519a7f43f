"""vLLM's loop over one pipeline's processors: which ``update_state`` call runs the step.

vLLM calls every processor's ``update_state`` in turn each step. The processors of one
``Pipeline`` share its tables, so exactly one of those calls must run the step: the first call
of a step is the one from a processor that already took part in the current step (or any call
after a one-call step, ``LogitsProcessors.update_state``); the others join it and must pass the
same, unchanged update object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._core import update_fingerprint
from .errors import ProtocolError


class Signature:
    """What ``update_signature`` gives: compares equal to another by the fingerprint alone;
    holds the objects it names."""

    __slots__ = ("fingerprint", "held")

    def __init__(self, fingerprint: int, held: tuple[Any, ...]) -> None:
        self.fingerprint = fingerprint
        self.held = held

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Signature) and other.fingerprint == self.fingerprint

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]


def update_signature(update: Any) -> Signature | None:
    """Fingerprint of what a step reads of an update's structure (the core's
    ``update_fingerprint``: batch size, removed indices, moves, each added entry's index and
    the identity of its params / prompt / output objects, the length of a list prompt or
    output), holding those objects so that no new object can take one's identity while the
    step's processors compare it. Catches an update changed between the processors of one
    step, also in place with the same sizes; a params object whose fields are changed in
    place is not seen. A malformed update is the ``ValueError`` its reading raises."""
    if update is None:
        return None
    return Signature(*update_fingerprint(update))


class StepProtocol:
    """Which processor's call runs each step, for one pipeline."""

    def __init__(self) -> None:
        self.epoch = 0
        # A step every processor took part in at once (a one-call step).
        self._all_done = 0
        # The step each processor last took part in.
        self._taken: dict[Any, int] = {}
        self._signature: Signature | None = None
        self._update: Any = None

    def register(self, view: Any) -> None:
        """A processor joins; its first call runs a step."""
        self._taken[view] = self.epoch

    def starts_step(self, view: Any) -> bool:
        """Whether ``view``'s next ``update_state`` runs a new step (it took part in the
        current one, or the current one was a one-call step) rather than joining it."""
        return self._taken.get(view) == self.epoch or self._all_done == self.epoch

    def stepped_all(self) -> None:
        """A step every processor took part in (one call for all, or stable slots)."""
        self.epoch += 1
        self._all_done = self.epoch

    def update(self, view: Any, batch_update: Any, run: Callable[[Any], None]) -> None:
        """``view.update_state(batch_update)``: runs the step with ``run(batch_update)`` when
        this call starts one, else joins the current step (the same, unchanged update)."""
        if self.starts_step(view):
            # Read before the step runs: what the joining processors must find again.
            signature = update_signature(batch_update)
            run(batch_update)
            self.epoch += 1
            self._taken[view] = self.epoch
            self._signature = signature
            self._update = batch_update
            return
        if batch_update is not self._update or self._changed(batch_update):
            raise ProtocolError(
                f"{type(view).__name__}.update_state: the processors of one pipeline were given "
                "different batch updates in one step (or the update was changed between them). "
                "Call update_state on every processor with the same update each step, or call "
                "LogitsProcessors.update_state(update) once."
            )
        self._taken[view] = self.epoch

    def _changed(self, batch_update: Any) -> bool:
        """Whether the update differs from what the step read."""
        return update_signature(batch_update) != self._signature

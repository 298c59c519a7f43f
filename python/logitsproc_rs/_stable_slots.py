"""The stable-slot front-end (vLLM's Model Runner V2): requests stay in their slot, and each
step gives a row → slot map under which a slot may own several logits rows.

``add_request(slot, params)`` and ``remove_request(slot)`` are checked when called and take
effect at the next step; ``step_slots(row_to_slot)`` runs the step (tokens sampled last step by
slot, the slot changes, the per-step work, this step's row map, one upload); processors then
``apply_rows`` with rows lined up through the map. ``apply`` does all of it in one call.

Speculative decoding (MRV2's layout): a request owns a run of consecutive rows, and with
``local_pos`` (each row's position in its run, ``ctx.expanded_local_pos``) and ``input_ids``
(the token fed at each row: at position ``j >= 1`` the draft ``d_{j-1}``) the row at position
``j`` gets its slot's transforms over the committed history followed by ``d_0 .. d_{j-1}``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ._host_ints import host_ints
from ._logits_check import checked_logits
from .errors import ProtocolError, RequestError


class StableSlots:
    """The stable-slot methods of a ``Pipeline`` (a mixin: the pipeline owns the state)."""

    # Set by the pipeline.
    stable_slots: bool
    core: Any
    arena: Any
    protocol: Any
    _views: list[Any]
    _row_map: Any
    vocab_size: int
    device: torch.device

    def _after_step(self) -> None:
        raise NotImplementedError

    def add_request(
        self,
        slot: int,
        params: Any,
        prompt_tok_ids: Sequence[int] | None = None,
        output_tok_ids: list[int] | None = None,
    ) -> None:
        """The request in ``slot`` from the next step on (replaces whatever the slot held).
        Checked now: bad parameters raise ``ValueError`` and change nothing."""
        self._need_stable("add_request")
        self.core.add_request(slot, params, prompt_tok_ids, output_tok_ids)

    def remove_request(self, slot: int) -> None:
        """``slot`` is free from the next step on."""
        self._need_stable("remove_request")
        self.core.remove_request(slot)

    def step_slots(
        self,
        row_to_slot: Any,
        sampled_token_ids: Any = None,
        slots: Any = None,
        *,
        local_pos: Any = None,
        input_ids: Any = None,
    ) -> None:
        """Stable slots, once per step before applying: the tokens sampled last step (by
        slot), the slot changes since the last step, the per-step work, then this step's row
        map (logits row ``r`` belongs to slot ``row_to_slot[r]``) with its draft layout
        (``local_pos`` and ``input_ids``, both or neither: module docs), and one upload.
        Everything is checked first: a refused call changes nothing (pending changes stay
        pending)."""
        self._need_stable("step_slots")
        inputs = self._slot_inputs(row_to_slot, sampled_token_ids, slots)
        self._step_slots(*inputs, *self._draft_inputs(local_pos, input_ids))

    def _draft_inputs(self, local_pos: Any, input_ids: Any) -> tuple[Any, Any]:
        """The draft layout in the core's form (both or neither)."""
        if (local_pos is None) != (input_ids is None):
            detail = "local_pos and input_ids go together (a draft layout has both)"
            raise RequestError.at("input_ids", detail)
        if local_pos is None:
            return None, None
        limit = self.core.max_rows + 1
        return (
            _materialized(host_ints(local_pos, "local_pos"), "local_pos", limit),
            _materialized(host_ints(input_ids, "input_ids"), "input_ids", limit),
        )

    def _slot_inputs(
        self, row_to_slot: Any, sampled_token_ids: Any, slots: Any
    ) -> tuple[Any, Any, Any]:
        """The row map, the feed and its slots in the core's form (refused if malformed)."""
        if (sampled_token_ids is None) != (slots is None):
            detail = "sampled_token_ids and slots go together (the slot each token is for)"
            raise RequestError.at("slots", detail)
        row_map = _materialized(
            host_ints(row_to_slot, "row_to_slot"), "row_to_slot", self.core.max_rows + 1
        )
        tokens = None if sampled_token_ids is None else host_ints(sampled_token_ids)
        feed_slots = None if slots is None else host_ints(slots, "slots")
        return row_map, tokens, feed_slots

    def _step_slots(
        self,
        row_map: Any,
        tokens: Any,
        feed_slots: Any,
        local_pos: Any = None,
        input_ids: Any = None,
    ) -> None:
        self.arena.begin_step()
        self.core.step_slots(row_map, tokens, feed_slots, local_pos, input_ids)
        self._row_map = row_map  # only once the core took it (re-mapped after a re-step)
        self._after_step()
        self.protocol.stepped_all()

    def apply(
        self,
        logits: torch.Tensor,
        row_to_slot: Any,
        processors: Iterable[Any] | None = None,
        sampled_token_ids: Any = None,
        slots: Any = None,
        *,
        local_pos: Any = None,
        input_ids: Any = None,
    ) -> torch.Tensor:
        """Stable slots, the whole step: ``step_slots`` then every processor on this pipeline
        (or the given ones, in order) with rows lined up through the map (and its draft
        layout). The logits are checked against the new row map first: refused logits change
        nothing."""
        self._need_stable("apply")
        procs = list(processors) if processors is not None else self._views
        row_map, tokens, feed_slots = self._slot_inputs(row_to_slot, sampled_token_ids, slots)
        drafts = self._draft_inputs(local_pos, input_ids)
        rows = len(row_map) // 8 if isinstance(row_map, bytes) else len(row_map)
        name = type(procs[0]).__name__ if procs else type(self).__name__
        checked_logits(name, logits, rows, self.vocab_size, self.device, "the row map")
        self._step_slots(row_map, tokens, feed_slots, *drafts)
        for p in procs:
            logits = p.apply_rows(logits)
        return logits

    def host_row_map(self) -> list[int]:
        """The last accepted row map (row → slot) as host ints (empty before the first)."""
        m = self._row_map
        if m is None:
            return []
        if isinstance(m, bytes):
            return memoryview(m).cast("q").tolist()
        return [int(s) for s in m]

    def _need_stable(self, what: str) -> None:
        if not self.stable_slots:
            raise ProtocolError(f"{what}: this pipeline was built without stable_slots=True")


def _materialized(obj: Any, field: str, limit: int) -> Any:
    """A row map the core reads twice (the step, and the re-map after a re-step) and whose
    length is known before the step: bytes, or a list copied from any other iterable. The
    copy reads at most ``limit`` entries (one more than a step may have: the core refuses
    it); an error
    raised while iterating becomes a ``RequestError`` (interrupts propagate)."""
    if isinstance(obj, bytes):
        return obj
    try:
        it = iter(obj)
    except Exception as e:
        detail = f"expected a sequence of ints, got a {type(obj).__name__}"
        raise RequestError.at(field, detail) from e
    try:
        return list(itertools.islice(it, limit))
    except Exception as e:
        detail = f"iterating it raised {e!r}"
        raise RequestError.at(field, detail) from e

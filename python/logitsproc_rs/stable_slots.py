"""The stable-slot front-end (vLLM's Model Runner V2): requests stay in their slot, and each
step gives a row → slot map under which a slot may own several logits rows.

``add_request(slot, params)`` and ``remove_request(slot)`` are checked when called and take
effect at the next step; ``step_slots(row_to_slot)`` runs the step (tokens sampled last step by
slot, the slot changes, the per-step work, this step's row map, one upload); processors then
``apply_rows`` with rows lined up through the map. ``apply`` does all of it in one call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from .host_ints import host_ints


class StableSlots:
    """The stable-slot methods of a ``Pipeline`` (a mixin: the pipeline owns the state)."""

    # Set by the pipeline.
    stable_slots: bool
    core: Any
    arena: Any
    protocol: Any
    _views: list[Any]
    _row_map: Any

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
        self, row_to_slot: Any, sampled_token_ids: Any = None, slots: Any = None
    ) -> None:
        """Stable slots, once per step before applying: the tokens sampled last step (by
        slot), the slot changes since the last step, the per-step work, then this step's row
        map (logits row ``r`` belongs to slot ``row_to_slot[r]``), and one upload."""
        self._need_stable("step_slots")
        self._row_map = host_ints(row_to_slot)
        self.arena.begin_step()
        self.core.step_slots(
            self._row_map,
            None if sampled_token_ids is None else host_ints(sampled_token_ids),
            None if slots is None else host_ints(slots),
        )
        self._after_step()
        self.protocol.stepped_all()

    def apply(
        self,
        logits: torch.Tensor,
        row_to_slot: Any,
        processors: Iterable[Any] | None = None,
        sampled_token_ids: Any = None,
        slots: Any = None,
    ) -> torch.Tensor:
        """Stable slots, the whole step: ``step_slots`` then every processor on this pipeline
        (or the given ones, in order) with rows lined up through the map."""
        self.step_slots(row_to_slot, sampled_token_ids, slots)
        for p in processors if processors is not None else self._views:
            logits = p.apply_rows(logits)
        return logits

    def _need_stable(self, what: str) -> None:
        if not self.stable_slots:
            raise RuntimeError(f"{what}: this pipeline was built without stable_slots=True")

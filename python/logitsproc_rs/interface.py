"""The vLLM 0.25.1 logits-processor interface: ``LogitsProcessor``, ``BatchUpdate``, moves,
and the two helpers vLLM's custom processors are written with: ``process_dict_updates`` and
``AdapterLogitsProcessor`` (a per-request function as a batch processor).

A processor written against vLLM's ``vllm.v1.sample.logits_processor`` runs here with only its
import line changed, and our processors accept vLLM's own ``BatchUpdate`` objects (duck-typed:
a move's direction is read by its name, so vLLM's ``MoveDirectionality`` works too).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import RequestError

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


class MoveDirectionality(Enum):
    """How a moved request travels: ``UNIDIRECTIONAL`` is i1 → i2, ``SWAP`` is i1 ↔ i2."""

    UNIDIRECTIONAL = 1
    SWAP = 2


RemovedRequest = int
# (index, params, prompt_tok_ids | None, output_tok_ids); output_tok_ids is the request's
# live output list, which the engine appends to every step.
AddedRequest = tuple[int, Any, list[int] | None, list[int]]
MovedRequest = tuple[int, int, MoveDirectionality]


@dataclass(frozen=True)
class BatchUpdate:
    """One step's batch change. ``batch_size`` is the row count after the change.

    Process in the order added, removed, moved (as vLLM's built-ins do); an index never
    appears in both ``added`` and ``removed`` of one update. Once handed to the processors an
    update is treated as immutable (as vLLM's are): the Rust side reads its structure once per
    object and shares it between processors, so mutating its lists afterwards is not seen.
    """

    batch_size: int
    removed: Sequence[RemovedRequest]
    added: Sequence[AddedRequest]
    moved: Sequence[MovedRequest]


class LogitsProcessor(ABC):
    """A batch-level logits processor, as in vLLM 0.25.1.

    ``update_state`` is called once per step (with ``None`` when the batch did not change),
    before ``apply``. ``apply`` may modify the logits in place and returns them.
    """

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Raise ``ValueError`` if ``sampling_params`` are invalid for this processor.

        An optional hook: the default accepts everything, as in vLLM."""
        return None

    @abstractmethod
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        raise NotImplementedError

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True if this processor can never change the argmax of a row (only then may the
        sampler skip it for greedy rows)."""
        raise NotImplementedError

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        raise NotImplementedError


# A per-request logits processor (vLLM's ``vllm.logits_process.LogitsProcessor``): called with
# the request's output ids (or its prompt ids and output ids) and its row of logits.
RequestLogitsProcessor = Callable[..., "torch.Tensor"]


def direction_name(direction: Any) -> str | None:
    """A move's direction as ``"SWAP"`` or ``"UNIDIRECTIONAL"``: any enum member of that name
    (ours, vLLM's), or its value 2 / 1; ``None`` for anything else. The rule every Python
    reader of moves uses (the core's is ``direction`` in ``rust/src/python/update.rs``)."""
    name = getattr(direction, "name", None)
    if name is None and isinstance(direction, int) and not isinstance(direction, bool):
        name = {1: "UNIDIRECTIONAL", 2: "SWAP"}.get(direction)
    return name if name in ("SWAP", "UNIDIRECTIONAL") else None


def is_swap(direction: Any) -> bool:
    """Whether a move's direction is SWAP (``direction_name``); anything else moves one way,
    as vLLM's ``direct == MoveDirectionality.SWAP``."""
    return direction_name(direction) == "SWAP"


def process_dict_updates(
    req_entries: dict[int, T],
    batch_update: BatchUpdate | None,
    new_state: Callable[[Any, list[int] | None, list[int]], T | None],
) -> bool:
    """vLLM 0.25.1's helper for sparse per-request state in a dict keyed by batch index.

    Added requests get ``new_state(params, prompt_tok_ids, output_tok_ids)`` (``None``: no
    entry), then removals, then moves (a → b; a SWAP also moves b → a). Returns whether the
    dict changed. vLLM's quirks are kept: removals and moves are skipped while the dict is
    empty, and a removed entry that is falsy does not count as a change.
    """
    if not batch_update:
        return False
    updated = False
    for index, params, prompt_tok_ids, output_tok_ids in batch_update.added:
        if (state := new_state(params, prompt_tok_ids, output_tok_ids)) is not None:
            req_entries[index] = state
            updated = True
        elif req_entries.pop(index, None) is not None:
            updated = True
    if req_entries:
        for index in batch_update.removed:
            if req_entries.pop(index, None):
                updated = True
        for a_index, b_index, direct in batch_update.moved:
            a_entry = req_entries.pop(a_index, None)
            b_entry = req_entries.pop(b_index, None)
            if a_entry is not None:
                req_entries[b_index] = a_entry
                updated = True
            if b_entry is not None:
                updated = True
                if is_swap(direct):
                    req_entries[a_index] = b_entry
    return updated


class AdapterLogitsProcessor(LogitsProcessor):
    """A per-request logits processor as a batch processor (vLLM 0.25.1's adapter).

    Subclasses implement ``is_argmax_invariant`` and ``new_req_logits_processor(params)``,
    which returns a callable for the request (or ``None`` to leave its row alone). A callable
    taking three arguments gets ``(prompt_ids, output_ids, logits_row)``, otherwise
    ``(output_ids, logits_row)``; the output list is the live one, so it always sees the
    tokens generated so far. A subclass that overrides ``__init__`` must call
    ``super().__init__(vllm_config, device, is_pin_memory)``.
    """

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.req_info: dict[int, partial[torch.Tensor]] = {}

    @abstractmethod
    def new_req_logits_processor(self, params: Any) -> RequestLogitsProcessor | None:
        raise NotImplementedError

    def _new_state(
        self, params: Any, prompt_ids: list[int] | None, output_ids: list[int]
    ) -> partial[torch.Tensor] | None:
        if req_lp := self.new_req_logits_processor(params):
            if len(inspect.signature(req_lp).parameters) == 3:
                if prompt_ids is None:
                    raise RequestError(
                        "Prompt token ids are required for this "
                        "logits processor but were not provided."
                    )
                args = [prompt_ids, output_ids]
            else:
                args = [output_ids]
            return partial(req_lp, *args)
        return None

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.req_info, batch_update, self._new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for req_idx, req_lp in self.req_info.items():
            req_logits = logits[req_idx]
            new_logits = req_lp(req_logits)
            if new_logits is not req_logits:
                logits[req_idx] = new_logits  # the callable returned a new row: copy it in
        return logits

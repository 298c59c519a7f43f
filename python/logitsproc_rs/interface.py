"""The vLLM 0.25.1 logits-processor interface: ``LogitsProcessor``, ``BatchUpdate``, moves.

A processor written against vLLM's ``vllm.v1.sample.logits_processor.interface`` runs here
unchanged, and our processors accept vLLM's own ``BatchUpdate`` objects (duck-typed).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


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

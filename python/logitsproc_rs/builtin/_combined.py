"""Several built-ins as one processor: one ``update_state`` and one ``apply`` a step for all.

An engine that calls every processor each step (vLLM's loop) pays a call per processor even
when none has work; a combined processor pays one. Its parts are the built-ins themselves, on
the same pipeline, applied in the order ``combined`` is given, so the logits are the parts'
own, one after another. The parts of one combined processor share a phase: all can
change the argmax, or none can (vLLM applies the second kind after temperature, to sampled
rows only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from ..errors import ConfigError
from ..views import PipelineView


class CombinedView(PipelineView):
    """Base of combined processors (``combined``): ``PARTS`` applied in order."""

    PARTS: ClassVar[tuple[type[PipelineView], ...]] = ()

    @classmethod
    def parts_for(cls, vllm_config: Any) -> list[type[PipelineView]]:
        """The parts an engine with this config runs (the thinking budget only with a
        reasoning config)."""
        return [p for p in cls.PARTS if p.lacks(vllm_config) is None]

    @classmethod
    def tables_for(cls, vllm_config: Any) -> tuple[str, ...]:
        return tuple(t for p in cls.parts_for(vllm_config) for t in p.TABLES)

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool, **kw: Any) -> None:
        super().__init__(vllm_config, device, is_pin_memory, **kw)
        # The parts read the same pipeline; they are not processors of it on their own (its
        # step protocol and its processor list know the combined one only).
        self.parts = [
            p(vllm_config, device, is_pin_memory, pipeline=self._pipe, registered=False)
            for p in self.parts_for(vllm_config)
        ]

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        for p in cls.PARTS:
            p.validate_params(sampling_params)

    def _apply(self, logits: torch.Tensor, rowspace: bool) -> torch.Tensor:
        for p in self.parts:
            logits = p._apply(logits, rowspace)
        return logits


def combined(name: str, parts: Sequence[type[PipelineView]], doc: str) -> type[CombinedView]:
    """A processor class ``name`` applying ``parts`` in order, with the union of their
    tables; they must agree on ``ARGMAX_INVARIANT``."""
    phases = {p.ARGMAX_INVARIANT for p in parts}
    if len(phases) != 1 or None in phases:
        raise ConfigError(f"{name}: its parts must all be argmax-invariant, or none of them")
    tables = tuple(t for p in parts for t in p.TABLES)
    cls = type(
        name,
        (CombinedView,),
        {
            "PARTS": tuple(parts),
            "TABLES": tables,
            "ARGMAX_INVARIANT": phases.pop(),
            "__doc__": doc,
            "__module__": __name__.rsplit(".", 1)[0],
            "__qualname__": name,
        },
    )
    return cls

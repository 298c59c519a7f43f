"""The base of every processor whose state lives in a ``Pipeline``: a thin view that reads its
own tables' device views in ``apply``."""

from __future__ import annotations

from enum import Enum
from typing import Any

import torch

from .errors import ConfigError
from .interface import BatchUpdate, LogitsProcessor
from .pipeline import Pipeline


class Stage(Enum):
    """Where vLLM 0.25.1 applies a built-in (``builtin`` lists them in sampler order)."""

    #: Hard-coded in vLLM's sampler, before the logits processors (allowed ids, bad words).
    SAMPLER_BEFORE = "sampler_before"
    #: One of vLLM's ``BUILTIN_LOGITS_PROCESSORS`` (MinTokens, LogitBias, MinP).
    BUILTIN = "builtin"
    #: Hard-coded in vLLM's sampler, after the custom processors (penalties).
    SAMPLER_AFTER = "sampler_after"
    #: After those, only with a reasoning config (the thinking budget).
    REASONING = "reasoning"
    #: Not one of vLLM's: built only when asked for, as a processor like any other.
    OPT_IN = "opt_in"


class PipelineView(LogitsProcessor):
    """Base of processors whose state lives in a ``Pipeline``.

    ``TABLES`` names the core tables the processor needs. Built the vLLM way
    (``cls(vllm_config, device, is_pin_memory)``) a processor gets a pipeline of its own;
    ``build_logitsprocs`` builds one pipeline for all of them and passes ``pipeline=``.
    ``registered=False``: a part of another processor (``builtin._combined``), which alone
    takes part in the pipeline's steps.

    A built-in also says where vLLM applies it (``STAGE``), where its plain reference
    implementation is (``REFERENCE``, ``"module:Class"``) and whether vLLM builds it under
    speculative decoding (``WITH_SPEC_DECODE``, for the ``BUILTIN`` stage).
    """

    TABLES: tuple[str, ...] = ()
    COLUMNS: tuple[Any, ...] = ()
    #: Whether it can never change a row's argmax (``is_argmax_invariant``); a custom
    #: processor may override the method instead.
    ARGMAX_INVARIANT: bool | None = None
    STAGE: Stage | None = None
    REFERENCE: str = ""
    WITH_SPEC_DECODE: bool = False

    @classmethod
    def lacks(cls, vllm_config: Any) -> str | None:
        """What an engine with this config lacks to run it (``None``: nothing): a processor
        that needs part of the config (the thinking budget: a reasoning config) says what, and
        a combined processor (``builtin._combined``) leaves it out there."""
        return None

    @classmethod
    def tables_for(cls, vllm_config: Any) -> tuple[str, ...]:
        """The tables it needs under this config (``TABLES`` but for a combined processor)."""
        return cls.TABLES

    def __init__(
        self,
        vllm_config: Any,
        device: torch.device | str,
        is_pin_memory: bool,
        *,
        pipeline: Pipeline | None = None,
        registered: bool = True,
    ) -> None:
        if pipeline is None:
            pipeline = Pipeline(
                vllm_config,
                device,
                is_pin_memory,
                tables=self.tables_for(vllm_config),
                columns=self.COLUMNS,
            )
        self._pipe = pipeline
        self._column_index = self._find_columns()
        if registered:  # (a part of a combined processor is not: the combined one is)
            pipeline.register(self)
        self.attach(pipeline)

    def attach(self, pipeline: Pipeline) -> None:
        """Called once the processor is registered with its pipeline: where a processor
        sets up device-side state of its own (``Pipeline.attach_device_state``)."""

    def _find_columns(self) -> list[int]:
        """Positions of this processor's declared columns in its pipeline (by identity)."""
        out = []
        for c in self.COLUMNS:
            for k, d in enumerate(self._pipe.columns):
                if d is c and k not in out:
                    out.append(k)
                    break
            else:
                raise ConfigError(
                    f"{type(self).__name__}: column {c.name!r} is not in the pipeline"
                )
        return out

    def is_argmax_invariant(self) -> bool:
        if self.ARGMAX_INVARIANT is None:
            raise NotImplementedError(f"{type(self).__name__} must say is_argmax_invariant")
        return self.ARGMAX_INVARIANT

    @property
    def pipeline(self) -> Pipeline:
        return self._pipe

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        self._pipe.update_from_view(self, batch_update)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        logits = self._pipe.check_logits(self, logits, False)
        self._pipe.before_apply()
        return self._apply(logits, False)

    def apply_rows(self, logits: torch.Tensor) -> torch.Tensor:
        """Stable slots: apply with rows lined up through the pipeline's last row map."""
        logits = self._pipe.check_logits(self, logits, True)
        self._pipe.before_apply()
        return self._apply(logits, True)

    def _apply(self, logits: torch.Tensor, rowspace: bool) -> torch.Tensor:
        raise NotImplementedError

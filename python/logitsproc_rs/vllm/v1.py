"""Our processors inside vLLM V1 (0.25.1): ``--logits-processors logitsproc_rs.vllm.v1:<Class>``.

Each class here is a subclass of vLLM's own ``LogitsProcessor`` and consumes vLLM's own
``BatchUpdate`` (its ``MoveDirectionality``) and ``SamplingParams``. ``bridge(cls)`` makes the
same kind of class from any processor built on our columns (``ColumnLogitsProcessor``).

**One pipeline.** vLLM builds each listed class as ``cls(vllm_config, device, is_pin_memory)``
and then calls every processor's ``update_state`` in turn. The bridges built with one config
on one device (until the first step) share one ``Pipeline``: one Rust core, one update per step
(the first ``update_state`` of a step runs it, the others join it), one upload. Building joins
the group by rebuilding its pipeline with the union of the members' tables and columns, which
is cheap before the first step; a class listed twice, or a build after the group has stepped,
starts a new group.

**Nothing applied twice.** vLLM 0.25.1 always builds its own MinTokens, LogitBias and MinP, and
its sampler always applies allowed ids, bad words, penalties and the thinking budget from the
request's own fields. So our built-ins read their fields, by vLLM's names, from the request's
``extra_args["logitsproc_rs"]`` (checked by our ``SamplingParams``): a request that sets
``min_p`` there gets ours, one that sets the ordinary ``min_p`` gets vLLM's, and neither both.
``bridge(cls, namespace=None)`` reads the ordinary fields instead (for an engine that does not
apply them itself). Column processors read whatever their readers read (usually
``extra_args``), which vLLM never applies.

Importing this module imports vLLM.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from vllm.v1.sample.logits_processor import LogitsProcessor as VllmLogitsProcessor

from .. import builtin
from ..interface import BatchUpdate
from ..pipeline import Pipeline, PipelineView, _update_signature
from ._fields import FIELD_TABLE, NAMESPACE, Routed, routed_params

# Groups still being built, by (config, device, namespace): vLLM builds each class on its own,
# so this is where the members of one build_logitsprocs find each other. A group leaves it at
# its first step (and holds its config meanwhile, so the id is not reused).
_OPEN: dict[tuple[int, str, str | None], _Group] = {}


class _Group:
    """The bridges built with one config on one device (and one namespace): one pipeline."""

    def __init__(self, key: tuple[int, str, str | None], config: Any, device: Any, pin: bool):
        self.key = key
        self.config, self.device, self.pin = config, device, pin  # holds the config: id stays
        self.members: list[_Bridge] = []
        self.pipeline: Pipeline | None = None
        self.started = False
        self.routes = False
        self._source: Any = None
        self._source_sig: Any = None
        self._converted: Any = None

    @classmethod
    def join(cls, member: _Bridge, config: Any, device: Any, pin: bool) -> _Group:
        device = torch.device(device)
        key = (id(config), str(device), type(member).NAMESPACE)
        group = _OPEN.get(key)
        if group is None or group.started or any(type(m) is type(member) for m in group.members):
            group = _OPEN[key] = _Group(key, config, device, pin)
        group.members.append(member)
        group.pipeline = None  # (re)built at first use, with every member built by then
        return group

    def ensure(self) -> None:
        """Build the pipeline once all members exist: vLLM builds every class, then asks
        them anything (is_argmax_invariant, update_state), so there is one build, not one per
        member (a penalties matrix on a GPU is hundreds of MB)."""
        if self.pipeline is None:
            self._build()

    def _build(self) -> None:
        views = [type(m).VIEW for m in self.members]
        self.pipeline = Pipeline(
            self.config,
            self.device,
            self.pin,
            tables={t for v in views for t in v.TABLES},
            columns=[c for v in views for c in v.COLUMNS],
        )
        for m in self.members:
            m._built_view = type(m).VIEW(self.config, self.device, self.pin, pipeline=self.pipeline)
        namespace = type(self.members[0]).NAMESPACE
        self.routes = bool(namespace and self.pipeline.tables)

    def start(self) -> None:
        if not self.started:
            self.started = True  # members built from now on start a new group
            if _OPEN.get(self.key) is self:
                del _OPEN[self.key]

    def convert(self, update: Any) -> Any:
        """The update our pipeline reads: in namespace mode each added request's parameters
        are routed; one converted object per update, shared by every member of the step."""
        self.start()
        self.ensure()
        if not self.routes or update is None:
            return update
        sig = _update_signature(update)
        if update is self._source and sig == self._source_sig:
            return self._converted
        namespace = type(self.members[0]).NAMESPACE
        assert namespace is not None
        added = [
            (i, Routed(sp, routed_params(i, sp, namespace)), prompt, out)
            for i, sp, prompt, out in update.added
        ]
        self._converted = BatchUpdate(
            batch_size=update.batch_size, removed=update.removed, added=added, moved=update.moved
        )
        self._source, self._source_sig = update, sig
        return self._converted

    def owner(self, error: ValueError) -> str | None:
        """The member whose field or column a core error names."""
        m = re.search(r"field '(extra_args\[[^\]]*\]\['(\w+)'\]|\w+)'(?:: '([^']+)')?", str(error))
        if m is None:
            return None
        field = m.group(2) or m.group(1)  # a namespace error names the field inside it
        column = m.group(3)
        for member in self.members:
            view = type(member).VIEW
            if field == "column" and any(c.name == column for c in view.COLUMNS):
                return type(member).__name__
            if FIELD_TABLE.get(field) in view.TABLES:
                return type(member).__name__
        return None


class _Bridge(VllmLogitsProcessor):
    """A view of ours on the group's pipeline, speaking vLLM's interface."""

    VIEW: type[PipelineView]
    NAMESPACE: str | None = NAMESPACE
    # Our loader hands vLLM-derived processors vLLM's types; this one reads either.
    ACCEPTS_ANY_BATCH_UPDATE = True

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """vLLM's front-end check: the namespace's fields, then the processor's own."""
        if cls.NAMESPACE and cls.VIEW.TABLES:
            routed_params(None, sampling_params, cls.NAMESPACE)
        cls.VIEW.validate_params(sampling_params)

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self._built_view: PipelineView
        self._group = _Group.join(self, vllm_config, device, is_pin_memory)

    @property
    def _view(self) -> PipelineView:
        self._group.ensure()
        return self._built_view

    @property
    def pipeline(self) -> Pipeline:
        return self._view.pipeline

    def is_argmax_invariant(self) -> bool:
        return self._view.is_argmax_invariant()

    def update_state(self, batch_update: Any) -> None:
        group = self._group
        try:
            self._view.update_state(group.convert(batch_update))
        except ValueError as e:
            # The first member of a step runs it for all: name the one whose field failed.
            owner = group.owner(e) or type(self).__name__
            raise ValueError(
                f"{owner} (logitsproc_rs.vllm.v1, step run by {type(self).__name__}."
                f"update_state; no table changed): {e}"
            ) from e

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        self._group.start()
        try:
            return self._view.apply(logits)
        except ValueError as e:
            raise ValueError(f"{type(self).__name__}.apply (logitsproc_rs.vllm.v1): {e}") from e
        except Exception as e:
            raise RuntimeError(
                f"{type(self).__name__}.apply (logitsproc_rs.vllm.v1): {type(e).__name__}: {e}"
            ) from e


def bridge(
    cls: type[PipelineView], namespace: str | None = NAMESPACE, name: str | None = None
) -> type[VllmLogitsProcessor]:
    """``cls`` (a ``ColumnLogitsProcessor`` subclass, or one of our built-ins) as a subclass of
    vLLM's ``LogitsProcessor``. Bind the result to a module-level name to load it by FQCN:
    ``LogitMargin = bridge(LogitMarginLogitsProcessor)`` → ``mymodule:LogitMargin``.

    ``namespace``: where built-in tables read their fields (see the module docstring); ``None``
    reads the request's ordinary fields. Column readers always get the request itself."""
    if not (isinstance(cls, type) and issubclass(cls, PipelineView)):
        raise ValueError(
            f"bridge: {cls!r} is not a ColumnLogitsProcessor subclass or a built-in processor"
        )
    name = name or cls.__name__
    return type(
        name,
        (_Bridge,),
        {
            "VIEW": cls,
            "NAMESPACE": namespace,
            "__module__": cls.__module__,
            "__qualname__": name,
            "__doc__": f"{cls.__name__} as a vLLM V1 logits processor (logitsproc_rs).",
        },
    )


def _ours(cls: type[PipelineView], name: str) -> type[VllmLogitsProcessor]:
    bridged = bridge(cls, name=name)
    bridged.__module__ = __name__
    return bridged


MinP = _ours(builtin.MinPLogitsProcessor, "MinP")
LogitBias = _ours(builtin.LogitBiasLogitsProcessor, "LogitBias")
MinTokens = _ours(builtin.MinTokensLogitsProcessor, "MinTokens")
Penalties = _ours(builtin.PenaltiesLogitsProcessor, "Penalties")
BadWords = _ours(builtin.BadWordsLogitsProcessor, "BadWords")
AllowedTokenIds = _ours(builtin.AllowedTokenIdsLogitsProcessor, "AllowedTokenIds")
ThinkingBudget = _ours(builtin.ThinkingBudgetLogitsProcessor, "ThinkingBudget")

__all__ = [
    "NAMESPACE",
    "AllowedTokenIds",
    "BadWords",
    "LogitBias",
    "MinP",
    "MinTokens",
    "Penalties",
    "ThinkingBudget",
    "bridge",
    "routed_params",
]

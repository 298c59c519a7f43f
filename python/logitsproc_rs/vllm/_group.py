"""What the two vLLM bridges share: a group of bridged processors on one ``Pipeline``, the
bridged class itself, and how it pickles. Shared by ``v1`` and ``v2``; imports no vLLM.

**A group** (``Group``) is the bridged processors that vLLM builds for one engine (``v1``: one
config on one device and one namespace) or one runner (``v2``: one ``req_states``). Each
member joins the group still forming under its key (``Group.joined``; the forming groups of a
bridge are its group class's ``FORMING``), and the group builds one ``Pipeline`` for all of
them at its first use (``ensure``), with the union of their tables and their columns, and
binds each member's ``VIEW`` to it. Its members read one namespace; it routes a request's
parameters (``route``: the namespace's fields over the request, ``_fields``), names the member
whose table or column an error is about (``owner``) and fails a refused request closed
(``fail_closed``, ``forced``: ``_guard``). When a group stops taking members (``close``) and
how it steps are each bridge's own.

**A bridged class** (``Bridge``, built by ``make_bridge``) is a view of ours (``VIEW``) that
reads its fields from ``NAMESPACE``, checks a request at vLLM's front end
(``validate_params``) and exposes the group's ``pipeline``. Its metaclass (``BridgeType``)
pickles it by reference when it is importable by name, else as a call to its bridge's
``bridge`` (``LLM(logits_processors=[bridge(MyColumns)])`` sends the class to the engine's
processes).
"""

from __future__ import annotations

import copyreg
import importlib
import sys
from abc import ABCMeta
from collections.abc import Callable, MutableMapping
from typing import Any, ClassVar, TypeVar

from ..builtin import BUILTINS
from ..errors import ConfigError, RequestError
from ..pipeline import Pipeline
from ..registry import TABLES
from ..views import PipelineView
from ._fields import _NEUTRAL, NAMESPACE, Routed, read_namespace, routed_params
from ._guard import (
    ForcedRows,
    check_caps,
    forced_tokens,
    front_end_classes,
    log_refused,
    model_eos,
)

G = TypeVar("G", bound="Group")


class Group:
    """Bridged processors built for one engine or runner, and their one pipeline."""

    #: The groups still taking members, by key: each bridge's group class has its own.
    FORMING: ClassVar[MutableMapping[Any, Any]]

    def __init__(self, key: Any, config: Any) -> None:
        self.key = key
        self.config = config
        self.members: list[Bridge] = []
        self.namespace: str | None = None
        self.pipeline: Pipeline | None = None
        # Whether our tables read the namespace (there is one, and the pipeline has tables).
        self.routes = False
        self.eos = model_eos(config)
        self.forced = ForcedRows()  # failed-closed requests: row or slot -> tokens

    # --- members ------------------------------------------------------------------------------

    @classmethod
    def joined(cls: type[G], key: Any, member: Bridge, new: Callable[[], G]) -> G:
        """The group forming under ``key`` with ``member`` in it: the one there if it takes
        ``member`` (``accepts``), else ``new()``, which then forms under ``key``."""
        group = cls.FORMING.get(key)
        if group is None or not group.accepts(member):
            group = cls.FORMING[key] = new()
        group.join(member)
        return group

    def accepts(self, member: Bridge) -> bool:
        """Whether ``member`` joins this group rather than starting one of its own."""
        return True

    def join(self, member: Bridge) -> None:
        if self.members and self.namespace != member.NAMESPACE:
            raise ConfigError(
                f"{type(member).__name__}: the processors of one runner must read one namespace "
                f"({self.namespace!r}, not {member.NAMESPACE!r})"
            )
        self.namespace = member.NAMESPACE
        self.members.append(member)
        self.pipeline = None  # (re)built at first use, with every member built by then

    def close(self) -> None:
        """No member joins this group from now on (later ones start a group of their own)."""
        forming = type(self).FORMING
        if forming.get(self.key) is self:
            del forming[self.key]

    # --- the pipeline -------------------------------------------------------------------------

    def ensure(self) -> Pipeline:
        """The pipeline, built once all members exist: vLLM builds every processor, then asks
        them anything, so there is one build, not one per member (a penalties matrix on a GPU
        is hundreds of MB)."""
        pipe = self.pipeline
        if pipe is None:
            pipe = self._build()
        return pipe

    def _build(self) -> Pipeline:
        """Builds the pipeline (``build_pipeline``, with the bridge's config and options)."""
        raise NotImplementedError

    def tables(self) -> set[str]:
        """The tables of every member under the engine's config (a combined member leaves out
        a part the config cannot run: the thinking budget without a reasoning config)."""
        return {t for m in self.members for t in m.VIEW.tables_for(self.config)}

    def build_pipeline(self, config: Any, device: Any, pin: bool, **options: Any) -> Pipeline:
        """One pipeline with every member's tables and columns (``options``: the pipeline's
        front-end), and each member's view on it."""
        views = [type(m).VIEW for m in self.members]
        pipe = Pipeline(
            config,
            device,
            pin,
            tables=self.tables(),
            columns=[c for v in views for c in v.COLUMNS],
            refuse=self.refused(),
            **options,
        )
        for m in self.members:
            m._view = type(m).VIEW(config, device, pin, pipeline=pipe)
        self.pipeline = pipe
        self.routes = bool(self.namespace)
        return pipe

    def refused(self) -> dict[str, str] | None:
        """What the pipeline refuses rather than drops: in namespace mode every built-in table
        no member has (a namespaced field is ours alone: vLLM never reads it), each with the
        bridged class to load; without a namespace the pipeline's default (our opt-in
        processors' tables: vLLM applies its own fields itself)."""
        if not self.namespace:
            return None
        bridge = self.members[0].BRIDGE if self.members else "logitsproc_rs.vllm.v1"
        have = self.tables()
        # Tables a member carries but left out under this config: loading more cannot help.
        left_out = {t for m in self.members for t in m.VIEW.TABLES} - have

        def how(c: type[PipelineView]) -> str:
            lacks = c.lacks(self.config)
            if lacks is not None and set(c.TABLES) & left_out:
                return f"{c.__name__} needs {lacks}"
            return load_hint(bridge, c)

        return {t: how(c) for c in BUILTINS for t in c.TABLES if t not in have}

    # --- requests -----------------------------------------------------------------------------

    def route(self, index: int | None, params: Any) -> Any:
        """What our tables read of a request (``index``: its batch index or slot): the
        namespace's fields over the request when the group routes, else the request."""
        if not self.routes:
            return params
        assert self.namespace is not None
        return Routed(params, routed_params(index, params, self.namespace))

    def owner(self, error: ValueError) -> str | None:
        """The member whose table or column an error names (its ``processor`` or ``column``)."""
        processor = getattr(error, "processor", None)
        column = getattr(error, "column", None)
        for m in self.members:
            view = type(m).VIEW
            if processor is not None and processor in view.TABLES:
                return type(m).__name__
            if column is not None and any(c.name == column for c in view.COLUMNS):
                return type(m).__name__
        return None

    def fail_closed(self, what: str, params: Any, error: Exception) -> list[int]:
        """The tokens a refused request (``what``, for the log) may still emit: its stop
        tokens, else the model's EOS (``_guard``); the refusal is logged at ERROR."""
        assert self.pipeline is not None
        tokens = forced_tokens(params, self.pipeline.vocab_size, self.eos)
        log_refused(what, error, tokens)
        return tokens


class BridgeType(ABCMeta):
    """The metaclass of bridged classes: pickled by reference when importable by name, else
    as a call to their bridge's ``bridge``."""


def _reduce_bridge(cls: BridgeType) -> Any:
    name: str = cls.__qualname__
    module = sys.modules.get(cls.__module__)
    if module is not None and getattr(module, name, None) is cls:
        return name  # importable: by reference, as any class
    assert issubclass(cls, Bridge)
    return (rebridge, (cls.BRIDGE, cls.VIEW, cls.__name__, cls.__module__, cls.NAMESPACE))


def rebridge(
    bridge_module: str, view: type[PipelineView], name: str, module: str, namespace: str | None
) -> type:
    """A bridged class again, in another process: ``<bridge_module>.bridge(view, ...)``."""
    bridge = importlib.import_module(bridge_module).bridge
    cls: type = bridge(view, name=name, module=module, namespace=namespace)
    return cls


copyreg.pickle(BridgeType, _reduce_bridge)


class Bridge:
    """A view of ours (``VIEW``) on its group's pipeline. Mixed into each bridge's class (with
    vLLM's ``LogitsProcessor`` of that runner and ``BridgeType``)."""

    #: The module of the bridge that made the class (``logitsproc_rs.vllm.v1`` or ``v2``).
    BRIDGE: ClassVar[str]
    VIEW: type[PipelineView]
    NAMESPACE: str | None = NAMESPACE

    _group: Group
    _view: PipelineView | None = None  # its VIEW on the group's pipeline, once built

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """vLLM's front-end check: the namespace's fields and their caps, that the engine
        loaded a processor for each field set (``check_loaded``), then the processor's own.
        Token ids against the vocabulary are checked in the worker (vLLM gives this check no
        vocabulary), which fails such a request closed."""
        if cls.NAMESPACE:
            ours, label = read_namespace(None, sampling_params, cls.NAMESPACE)
            if cls.VIEW.TABLES:
                check_caps("request", ours, sampling_params, cls.VIEW.TABLES, label)
            if ours is not _NEUTRAL:
                cls.check_loaded(ours, label, sys._getframe(1))
        cls.VIEW.validate_params(sampling_params)

    @classmethod
    def check_loaded(cls, ours: Any, label: Callable[[str], str], caller: Any) -> None:
        """Refuses a field of ours that switches on a processor the engine did not load
        (``RequestError`` naming the field and the class to load), as the worker's pipeline
        would refuse it (``Group.refused``), but at the front end, where vLLM can still tell
        the client (HTTP 400). The loaded classes come from vLLM's validator
        (``_guard.front_end_classes``, ``caller``: its frame); the first of ours in them
        checks, once per request. Where they cannot be read the worker refuses the request,
        failing it closed."""
        loaded = front_end_classes(caller)
        if loaded is None:
            return
        ours_loaded = [
            c
            for c in loaded
            if isinstance(c, type) and issubclass(c, Bridge) and c.NAMESPACE == cls.NAMESPACE
        ]
        if not ours_loaded or ours_loaded[0] is not cls:
            return
        have = {t for c in ours_loaded for t in c.VIEW.TABLES}
        for c in BUILTINS:
            for t in c.TABLES:
                if t in have:
                    continue
                for f in TABLES[t].fields:
                    if not f.tunes and f.is_set(getattr(ours, f.attr)):
                        raise RequestError.located(
                            None,
                            f.attr,
                            "it is set, but the engine did not load its processor: "
                            + load_hint(cls.BRIDGE, c),
                            label=label(f.attr),
                        )

    @property
    def view(self) -> PipelineView:
        """Its ``VIEW`` on the group's pipeline (built at first use)."""
        self._group.ensure()
        assert self._view is not None
        return self._view

    @property
    def pipeline(self) -> Pipeline:
        return self._group.ensure()


def load_hint(bridge: str, c: type[PipelineView]) -> str:
    """How to get built-in ``c`` into a vLLM engine (``bridge``: its bridge's module)."""
    return f"add '{bridge}:{c.__name__}' to vLLM's logits_processors"


def make_bridge(
    base: type[Bridge],
    cls: type[PipelineView],
    name: str | None,
    module: str | None,
    namespace: str | None,
    doc: Callable[[type[PipelineView]], str | None],
) -> Any:
    """A subclass of ``base`` (a bridge's class) for ``cls``: ``VIEW`` is ``cls``, named
    ``name`` in ``module`` (default: ``cls``'s), documented by ``doc(cls)``."""
    if not (isinstance(cls, type) and issubclass(cls, PipelineView)):
        raise ConfigError(
            f"bridge: {cls!r} is not a processor built on a Pipeline (a PipelineView: a "
            "ColumnLogitsProcessor subclass or a built-in processor)"
        )
    name = name or cls.__name__
    return BridgeType(
        name,
        (base,),
        {
            "VIEW": cls,
            "NAMESPACE": namespace,
            "__module__": module or cls.__module__,
            "__qualname__": name,
            "__doc__": doc(cls),
        },
    )

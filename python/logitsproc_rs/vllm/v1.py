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

**No request stops the engine** (``_guard``). ``validate_params`` refuses at vLLM's front end
every bad field that needs no vocabulary (types, ranges, unknown names, caps) and runs a
column processor's own check. A request the worker must still refuse (a token id outside the
vocabulary, a column reader raising) is failed closed: its row is −inf but its stop tokens, so
it ends at its next token, and an ERROR on the ``logitsproc_rs`` logger names it and the
field; the step goes on for everyone else. Other step errors (not about one request) raise.

**Idle costs nothing.** While no table or column has work and no row is forced, a step
without a batch update does nothing, and only the first ``apply`` of a step checks the logits.

Importing this module imports vLLM.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from vllm.v1.sample.logits_processor import LogitsProcessor as VllmLogitsProcessor

from .._step_protocol import update_signature
from ..builtin import BUILTINS, COMBINED
from ..errors import processor_raised, with_context
from ..interface import BatchUpdate, process_dict_updates
from ..pipeline import Pipeline
from ..views import PipelineView, Stage
from ._fields import NAMESPACE, routed_params
from ._group import Bridge, BridgeType, Group, make_bridge
from ._guard import Refused, refused_index


class _Group(Group):
    """The bridges built with one config on one device (and one namespace): one pipeline.

    Besides the pipeline it follows, by batch index, the rows of failed-closed requests
    (``_guard``) and of structured-output requests under our min_tokens (whose stop tokens
    come back when masking them would leave the grammar nothing, as vLLM >= 0.32 does)."""

    # By (config, device, namespace): vLLM builds each class on its own, so this is where the
    # members of one build_logitsprocs find each other. A group leaves it at its first step
    # (and holds its config meanwhile, so the id is not reused).
    FORMING: ClassVar[dict[tuple[int, str, str | None], _Group]] = {}

    def __init__(self, key: tuple[int, str, str | None], config: Any, device: Any, pin: bool):
        super().__init__(key, config)
        self.config, self.device, self.pin = config, device, pin  # holds the config: id stays
        self.started = False
        # row -> (min_tokens, output list, stop ids) of structured-output rows under min_tokens
        self.structured: dict[int, tuple[int, Any, list[int]]] = {}
        # Idle: no table or column has work and no row is forced. Then a step without a
        # batch update does nothing and only the first apply of a step checks the logits.
        self.idle = False
        # The logits the first idle apply of this step checked (weakly held).
        self.checked: Callable[[], Any] = _nothing
        self.shape: tuple[int, int] = (0, 0)

    @classmethod
    def of(cls, member: _Bridge, config: Any, device: Any, pin: bool) -> _Group:
        """The group ``member`` joins: a class listed twice, or a build after the group has
        stepped, starts a new group."""
        device = torch.device(device)
        key = (id(config), str(device), type(member).NAMESPACE)
        return cls.joined(key, member, lambda: cls(key, config, device, pin))

    def accepts(self, member: Bridge) -> bool:
        return not self.started and not any(type(m) is type(member) for m in self.members)

    def _build(self) -> Pipeline:
        return self.build_pipeline(self.config, self.device, self.pin)

    def start(self) -> None:
        if not self.started:
            self.started = True  # members built from now on start a new group
            self.close()

    # --- update_state -----------------------------------------------------------------------

    def update(self, member: _Bridge, update: Any) -> None:
        """One member's ``update_state``. The first of a step (by the pipeline's step
        protocol, never by the update's identity: vLLM's updates are short-lived objects whose
        ids recur) converts the update and runs the step for all; a request the core refuses
        (only what the front end could not check gets here) is failed closed and the step is
        run again without it. The others join with the same converted update."""
        self.start()
        pipe = self.ensure()
        view = member._view
        assert view is not None
        first = pipe.starts_step(view)
        refused: dict[int, Exception] = {}
        if not first:
            # The pipeline checks that this is the step's update; a different one is a
            # protocol error there, so it gets the raw update.
            same = update is self._update and update_signature(update) == self._signature
            view.update_state(self._converted if same else update)
            return
        while True:
            try:
                # Routing checks the namespace: its errors name the request too.
                converted = self.convert(update, refused)
                view.update_state(converted)
                break
            except ValueError as e:
                index = None
                if update is not None:
                    index = refused_index(e, [i for i, *_ in update.added])
                if index is None or index in refused:
                    owner = self.owner(e) or type(member).__name__
                    raise with_context(
                        e,
                        f"{owner} (logitsproc_rs.vllm.v1, step run by {type(member).__name__}."
                        f"update_state; no table changed): ",
                    ) from e
                refused[index] = e
        # Held (not an id) until the next step: the joining members compare identity.
        self._update, self._signature, self._converted = (
            update,
            update_signature(update),
            converted,
        )
        if update is not None:
            self.follow(update, converted, refused)
        self.idle = pipe.idle and not self.forced
        self.checked = _nothing
        self.shape = (
            pipe.count("batch_size"),
            pipe.vocab_size,
        )  # what an idle step's logits must be

    _update: Any = None
    _signature: Any = None
    _converted: Any = None

    def convert(self, update: Any, refused: dict[int, Exception]) -> Any:
        """The update our pipeline reads: in namespace mode each added request's parameters
        are routed, and a refused request is neutral."""
        if update is None or not (self.routes or refused):
            return update
        added = []
        for i, sp, prompt, out in update.added:
            params = Refused(sp) if i in refused else self.route(i, sp)
            added.append((i, params, prompt, out))
        return BatchUpdate(
            batch_size=update.batch_size, removed=update.removed, added=added, moved=update.moved
        )

    def follow(self, update: Any, converted_update: Any, refused: dict[int, Exception]) -> None:
        """The forced and structured rows through this step's update (vLLM's dict rules)."""
        assert self.pipeline is not None
        converted = {i: p for i, p, _, _ in converted_update.added}

        def forced(params: Any, _prompt: Any, _out: Any) -> Any:
            return params if isinstance(params, list) else None

        def structured(params: Any, _prompt: Any, out: Any) -> Any:
            return params if isinstance(params, tuple) else None

        forced_added, structured_added = [], []
        for i, sp, prompt, out in update.added:
            tokens = None
            if i in refused:
                tokens = self.fail_closed(f"request at index {i}", sp, refused[i])
            forced_added.append((i, tokens, prompt, out))
            ours = converted.get(i, sp)
            entry = None
            min_tokens = getattr(ours, "min_tokens", 0) or 0
            if (
                tokens is None
                and min_tokens
                and getattr(sp, "structured_outputs", None) is not None
                and "min_tokens" in self.pipeline.tables
            ):
                entry = (min_tokens, out, sorted(getattr(ours, "all_stop_token_ids", ()) or ()))
            structured_added.append((i, entry, prompt, out))
        if process_dict_updates(
            self.forced.rows,
            BatchUpdate(update.batch_size, update.removed, forced_added, update.moved),
            forced,
        ):
            self.forced.changed()
        process_dict_updates(
            self.structured,
            BatchUpdate(update.batch_size, update.removed, structured_added, update.moved),
            structured,
        )

    # --- apply ------------------------------------------------------------------------------

    def apply(self, member: _Bridge, logits: torch.Tensor) -> torch.Tensor:
        self.start()
        view = member.view
        if self.structured and "min_tokens" in view.TABLES:
            return self._apply_keeping_grammar(view, logits)
        logits = view.apply(logits)
        if self.forced:
            logits = self.forced.apply_(logits)
        return logits

    def _apply_keeping_grammar(self, view: PipelineView, logits: torch.Tensor) -> torch.Tensor:
        """MinTokens on structured-output rows (vLLM >= 0.32): a row that masking its stop
        tokens leaves all −inf (the grammar allowed only those) gets their finite logits
        back, so the grammar can end. vLLM 0.25.1 left the row −inf (an engine error)."""
        live = [(r, e) for r, e in sorted(self.structured.items()) if len(e[1]) < e[0]]
        if not live:
            return view.apply(logits)
        rows = [r for r, (_, _, stops) in live for _ in stops]
        toks = [t for _, (_, _, stops) in live for t in stops]
        dev = logits.device
        rows_t = torch.tensor(rows, dtype=torch.int64, device=dev)
        toks_t = torch.tensor(toks, dtype=torch.int64, device=dev)
        saved = logits[rows_t, toks_t]  # a copy: survives the masking
        logits = view.apply(logits)
        dead = torch.isneginf(logits[rows_t]).all(dim=-1) & torch.isfinite(saved)
        # torch.where, not a boolean index: no device-to-host sync in apply.
        logits[rows_t, toks_t] = torch.where(dead, saved, logits[rows_t, toks_t])
        if self.forced:
            logits = self.forced.apply_(logits)
        return logits


def _nothing() -> None:
    return None


class _Bridge(Bridge, VllmLogitsProcessor, metaclass=BridgeType):
    """A view of ours on the group's pipeline, speaking vLLM V1's interface."""

    BRIDGE = __name__
    # Our loader hands vLLM-derived processors vLLM's types; this one reads either.
    ACCEPTS_ANY_BATCH_UPDATE = True

    _group: _Group

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self._group = _Group.of(self, vllm_config, device, is_pin_memory)

    def is_argmax_invariant(self) -> bool:
        return self.view.is_argmax_invariant()

    def update_state(self, batch_update: Any) -> None:
        group = self._group
        if batch_update is None and group.idle:
            return  # nothing to advance, nothing changed
        group.update(self, batch_update)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        group = self._group
        if group.idle:
            # An idle step reads no logit: the first member checks the shape only (its rows
            # are the batch), in as few operations as possible, since after the model's
            # forward pass every Python operation here runs from cold caches (µs each).
            if group.checked() is logits:
                return logits
            if logits.shape == group.shape:
                group.checked = weakref.ref(logits)
                return logits
            pipe = group.pipeline
            assert pipe is not None
            try:
                logits = pipe.check_logits(self, logits, False)
            except ValueError as e:
                raise with_context(
                    e, f"{type(self).__name__}.apply (logitsproc_rs.vllm.v1): "
                ) from e
            group.checked = weakref.ref(logits)
            return logits
        try:
            return group.apply(self, logits)
        except Exception as e:
            raise processor_raised(f"{type(self).__name__}.apply (logitsproc_rs.vllm.v1)", e) from e


def bridge(
    cls: type[PipelineView],
    *,
    name: str | None = None,
    module: str | None = None,
    namespace: str | None = NAMESPACE,
) -> type[VllmLogitsProcessor]:
    """``cls`` (a ``ColumnLogitsProcessor`` subclass, or one of our built-ins) as a subclass of
    vLLM's ``LogitsProcessor``. Pass the class itself (``LLM(logits_processors=[bridge(C)])``:
    it pickles as this call), or bind it to a module-level name and load it by FQCN:
    ``LogitMargin = bridge(LogitMarginLogitsProcessor, name="LogitMargin",
    module=__name__)`` → ``"mymodule:LogitMargin"``.

    ``namespace``: where built-in tables read their fields (see the module docstring); ``None``
    reads the request's ordinary fields. Column readers always get the request itself.
    ``name`` and ``module``: the class's own (default: ``cls``'s)."""
    return make_bridge(
        _Bridge,
        cls,
        name,
        module,
        namespace,
        lambda view: f"{view.__name__} as a vLLM V1 logits processor (logitsproc_rs).",
    )


# Every built-in, under its own class name (``logitsproc_rs.vllm.v1:MinPLogitsProcessor``); ALL
# holds vLLM's (not ours beyond vLLM's, which are opt-in), in the built-ins' order.
_BRIDGED = {view: bridge(view, module=__name__) for view in BUILTINS}
globals().update({cls.__name__: cls for cls in _BRIDGED.values()})
ALL: tuple[type[VllmLogitsProcessor], ...] = tuple(
    c for view, c in _BRIDGED.items() if view.STAGE is not Stage.OPT_IN
)
# Every field of ours in two classes (``EveryFieldLogitsProcessor``, argmax-changing, the
# thinking budget with a reasoning config; ``EveryFieldSamplingLogitsProcessor``,
# argmax-invariant): the recommended way to load ours, two calls a step instead of one per
# processor.
_COMBINED = {view: bridge(view, module=__name__) for view in COMBINED}
globals().update({cls.__name__: cls for cls in _COMBINED.values()})
EVERY_FIELD: tuple[type[VllmLogitsProcessor], ...] = tuple(_COMBINED.values())

__all__ = [
    "ALL",
    "EVERY_FIELD",
    "NAMESPACE",
    "bridge",
    "routed_params",
    *(cls.__name__ for cls in _BRIDGED.values()),
    *(cls.__name__ for cls in _COMBINED.values()),
]

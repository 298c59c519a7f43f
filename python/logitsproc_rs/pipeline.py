"""One Rust core per processor set: the ``Pipeline``.

A ``Pipeline`` owns the tables of every processor built on it (the built-ins and the columns
that custom processors declare) and one arena of host buffers. One ``step`` reads the update
once, validates everything for every table, applies everything and uploads what changed once;
a rejected step leaves every table as it was.

Processors are thin views on it (``views.PipelineView``): ``apply`` reads its own tables'
device views. Their ``update_state`` keeps vLLM's interface (``step_protocol``: in vLLM's loop
the first call of a step runs the whole step and the others join it). The fast path is one
call for everything: ``LogitsProcessors.update_state(update)`` (or ``Pipeline.step``).

Two front-ends drive the same core: **V1** batch updates (rows = slots, condense moves and
swaps), here, and **stable slots** (``stable_slots.StableSlots``: ``add_request(slot,
params)``, ``remove_request(slot)``, ``apply(logits, row_to_slot)`` with a row → slot map).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import torch

from ._arena import DeviceArena
from ._core import Pipeline as CorePipeline
from ._host_ints import host_ints
from ._logits_check import checked_logits
from ._stable_slots import StableSlots
from ._step_protocol import StepProtocol
from .errors import ConfigError, ProtocolError, RequestError
from .interface import BatchUpdate
from .kernels import validate_backend
from .params import (
    EngineConfig,
    _token_ids,
    as_engine_config,
    config_cap,
    config_max_num_seqs,
    config_size,
    config_spec_tokens,
    config_vocab_size,
)
from .registry import TABLES, caps_of

# A token-feed step with nothing to read (``Pipeline._step_tokens``).
_IDLE: Any = object()


class DeviceState(Protocol):
    """Device-side state a processor keeps besides the arena, synced around each upload: it
    may stage into the upload first (``before_upload``) and apply what arrived after."""

    def before_upload(self) -> None: ...

    def after_upload(self) -> None: ...


class Pipeline(StableSlots):
    """The Rust core of a processor set, its device arena, and the step protocol.

    ``tables`` names the built-in tables to build (``registry.TABLES``); ``columns`` are the
    declared columns of custom processors, in order. ``token_feed=True`` makes the pipeline own each
    request's output history and take the sampled token ids per step instead of re-reading
    the engine's lists. ``stable_slots=True`` adds the row-space buffers of the stable-slot
    front-end; ``max_rows`` bounds the rows of one stable-slot step (default
    ``max_num_seqs × (1 + num_speculative_tokens)``). ``kernels`` chooses the device applies:
    ``"triton"``, ``"torch"`` or ``"auto"`` (Triton for float32 CUDA logits where it imports);
    ``None`` follows ``LOGITSPROC_KERNELS``.

    ``refuse`` maps tables it does not build to how to get their processor: a request that
    sets a field switching one of them on is refused (a ``RequestError`` naming the field,
    saying how), never run without it. Given where the whole processor set is known:
    ``build_logitsprocs`` (our opt-in processors it did not build: ``loader.unbuilt_opt_in``) and
    the vLLM bridges; a processor built alone (vLLM's way) refuses nothing, as another
    processor of the engine may apply the field.
    """

    def __init__(
        self,
        vllm_config: Any,
        device: torch.device | str,
        is_pin_memory: bool,
        *,
        tables: Iterable[str] = (),
        columns: Sequence[Any] = (),
        token_feed: bool = False,
        stable_slots: bool = False,
        emulate_device: bool = False,
        max_rows: int | None = None,
        kernels: str | None = None,
        refuse: Mapping[str, str] | None = None,
    ) -> None:
        vllm_config = as_engine_config(vllm_config)
        self.device = resolve_device(device)
        tables = set(tables)
        unknown = tables - TABLES.keys()
        if unknown:
            raise ConfigError(f"unknown tables {sorted(unknown)}")
        self.vocab_size = _config_int(config_vocab_size, vllm_config, "vocab_size")
        self.capacity = _config_int(config_max_num_seqs, vllm_config, "max_num_seqs")
        self.spec_tokens = _config_int(config_spec_tokens, vllm_config, "num_speculative_tokens", 0)
        self.token_feed = token_feed
        self.stable_slots = stable_slots
        max_rows = _max_rows(max_rows)
        thinking = None
        if "thinking" in tables:
            thinking = _reasoning_ids(vllm_config)
        self.columns = list(columns)

        def cap(config: Any, name: str, default: int) -> int:
            return _config_int(lambda c: config_cap(c, name, default), config, name)

        self.core = CorePipeline(
            self.capacity,
            self.vocab_size,
            tables=sorted(tables),
            caps=sorted(caps_of(tables, vllm_config, cap).items()),
            thinking=thinking,
            spec_tokens=self.spec_tokens,
            columns=[c.declaration() for c in self.columns],
            stable_slots=stable_slots,
            token_feed=token_feed,
            max_rows=max_rows,
            host_kernels=self.device.type == "cpu" and not emulate_device,
            refuse=sorted((refuse or {}).items()),
        )
        self.tables = frozenset(tables)
        self.arena = DeviceArena(self.core, self.device, is_pin_memory, emulate_device)
        # On the CPU (without device emulation) MinP and penalties run in Rust on the logits.
        self.host_kernels = self.arena.zero_copy
        # Device-side applies: "auto" / "triton" / "torch"; None follows LOGITSPROC_KERNELS.
        self.kernels = None if kernels is None else validate_backend(kernels)
        self._by_name: dict[str, list[int]] = {}
        for i, (name, *_rest) in enumerate(self.arena.sections):
            self._by_name.setdefault(name, []).append(i)
        # The step's status: values in ``status`` (refreshed in place), named by the core.
        self.status: list[int] = self.core.status()
        self._status_index = {n: i for i, n in enumerate(self.core.status_names())}
        self._placeholders = self._status_index["placeholders"]
        # The two sizes come first (the core's order); every entry after them is work.
        assert self.core.status_names()[:2] == ["batch_size", "rows"]
        self.idle = True  # nothing applied, no per-step state (refreshed with the status)
        self._views: list[Any] = []
        # Which processor's update_state runs each step (vLLM's loop).
        self.protocol = StepProtocol()
        self._pending_restep = False
        # A step checked by prepare_step, waiting for commit_step / abort_step.
        self._prepared: str | None = None
        self._cache: dict[tuple[Any, ...], Any] = {}
        self._resteped = False
        self._row_map: Any = None
        # Device-side state some processors keep besides the arena (the penalties' count
        # matrix), by table: synced around each upload.
        self.device_state: dict[str, DeviceState] = {}
        # Host-side objects the views of a table share (XTC's generators), by table: no slot
        # bookkeeping (which slot holds what is the core's).
        self._shared: dict[str, Any] = {}
        self._host: dict[str, Any] = {}
        # CPU, zero-copy: the step is one core call (no upload, no device state).
        self._fast_cpu = self.arena.zero_copy

    # --- the step -------------------------------------------------------------------------

    def register(self, view: Any) -> None:
        """A processor that reads this pipeline; it joins the step protocol."""
        self._views.append(view)
        self.protocol.register(view)

    def attach_device_state(self, table: str, state: DeviceState) -> None:
        """Device-side state of ``table`` kept by its processor (at most one per table),
        synced with every upload from now on; synced once now."""
        if table in self.device_state:
            return
        self.device_state[table] = state
        self._fast_cpu = False
        state.before_upload()
        self.arena.upload_step()
        state.after_upload()
        self.arena.mark_step_done()

    def shared_state(self, table: str, make: Callable[[], Any]) -> Any:
        """The host-side object the views of ``table`` share on this pipeline (made by
        ``make`` on first use). It is told nothing of slot changes: what a slot holds is the
        core's (``host_section``)."""
        state = self._shared.get(table)
        if state is None:
            state = self._shared[table] = make()
        return state

    def host_section(self, name: str) -> Any:
        """The core's own host buffer behind arena section ``name``, as a zero-copy numpy
        array: what the table holds after the last accepted step (XTC's seeded requests),
        for host-side reads that must not wait on the device."""
        v = self._host.get(name)
        if v is None:
            found = self._by_name.get(name)
            if not found:
                raise KeyError(f"no arena section {name!r}; have {sorted(self._by_name)}")
            v = self._host[name] = torch.from_dlpack(self.core.buffer(found[0])).numpy()
        return v

    def step(
        self,
        batch_update: BatchUpdate | None,
        sampled_token_ids: Any = None,
        slots: Any = None,
    ) -> None:
        """One whole step for every table: feed, update, per-step work, one upload."""
        tokens = self._step_tokens(batch_update, sampled_token_ids)
        if tokens is _IDLE:
            # Token feed, no update, no tokens: nothing can have changed.
            self.protocol.stepped_all()
            self.core.discard()
            return
        self._core_step(batch_update, tokens, None if slots is None else host_ints(slots, "slots"))
        self.protocol.stepped_all()  # every view has taken part in this step

    def _step_tokens(self, batch_update: Any, sampled_token_ids: Any) -> Any:
        """The step's token feed as host ints (``None``: none), or ``_IDLE`` for a token-feed
        step that can change nothing; a ``ValueError`` for tokens this pipeline cannot take."""
        if sampled_token_ids is not None:
            if not self.token_feed:
                detail = (
                    "given to a pipeline that reads the engine's output lists (the list feed); "
                    "build it with token_feed=True"
                )
                raise RequestError.at("sampled_token_ids", detail)
            return host_ints(sampled_token_ids, "sampled_token_ids")
        if batch_update is None and self.token_feed and not self._pending_restep:
            return _IDLE
        return None

    # --- one step over several pipelines (LogitsProcessors.update_state) -----------------

    def prepare_step(self, batch_update: BatchUpdate | None, sampled_token_ids: Any = None) -> None:
        """The first half of ``step``: reads and checks everything (a ``ValueError`` as
        ``step`` raises it), changes nothing any table holds. Then ``commit_step`` applies it
        or ``abort_step`` drops it: several pipelines take one step all or none."""
        if self._prepared is not None:
            raise ProtocolError("a prepared step is pending: commit or abort it first")
        tokens = self._step_tokens(batch_update, sampled_token_ids)
        if tokens is _IDLE:
            self._prepared = "idle"
            return
        self.core.prepare(batch_update, tokens)
        self._prepared = "core"

    def commit_step(self) -> None:
        """Applies the step ``prepare_step`` checked (as ``step`` would have)."""
        kind, self._prepared = self._prepared, None
        if kind is None:
            raise ProtocolError("no prepared step to commit")
        if kind == "idle":
            self.core.discard()
        elif self._fast_cpu:
            self.core.commit(self.status, True)
            self._after_fast_step()
        else:
            self.arena.begin_step()
            self.core.commit()
            self._after_step()
        self.protocol.stepped_all()

    def abort_step(self) -> None:
        """Drops the step ``prepare_step`` checked: every table as before it."""
        kind, self._prepared = self._prepared, None
        if kind == "core":
            self.core.abort()

    def _core_step(self, batch_update: Any, tokens: Any = None, slots: Any = None) -> None:
        if self._fast_cpu:
            # CPU, zero-copy: one call does the step, forgets what changed (counting it) and
            # refreshes the status.
            self.core.step(batch_update, tokens, slots, self.status, True)
            self._after_fast_step()
            return
        self.arena.begin_step()
        self.core.step(batch_update, tokens, slots)
        self._after_step()

    def _after_fast_step(self) -> None:
        self._resteped = False
        self._pending_restep = bool(self.status[self._placeholders])
        self._refresh_idle()

    def _after_step(self) -> None:
        self._resteped = False
        self._upload(self.arena.upload_step)
        self.arena.mark_step_done()
        self.core.status_into(self.status)
        self._pending_restep = bool(self.status[self._placeholders])
        self._refresh_idle()

    def _refresh_idle(self) -> None:
        s = self.status
        self.idle = not any(s[2:])

    def count(self, name: str) -> int:
        """The step's status entry ``name`` (see the core's ``status_names``): a table's
        padded triple count (``"logit_bias"``, ``"rows.logit_bias"`` on the stable slots'
        rows, ...), its active count (``"min_p"``, ``"penalties"``, ``"column.<k>"``), or
        ``"batch_size"``, ``"rows"``, ``"placeholders"``, ``"stepping"``; 0 for a table this
        pipeline does not hold."""
        i = self._status_index.get(name)
        return 0 if i is None else self.status[i]

    def starts_step(self, view: Any) -> bool:
        """Whether ``view``'s next ``update_state`` runs a new step (see ``StepProtocol``)."""
        return self.protocol.starts_step(view)

    def update_from_view(self, view: Any, batch_update: BatchUpdate | None) -> None:
        """vLLM's loop: ``view.update_state(batch_update)`` runs the step or joins it."""
        self.protocol.update(view, batch_update, self._core_step)

    def check_logits(self, view: Any, logits: Any, rowspace: bool) -> torch.Tensor:
        """The logits every processor accepts (see ``logits_check.checked_logits``)."""
        rows = self.count("rows" if rowspace else "batch_size")
        what = "the row map" if rowspace else "the batch"
        return checked_logits(type(view).__name__, logits, rows, self.vocab_size, self.device, what)

    def before_apply(self) -> None:
        """Before a processor's ``apply``: the device must see the step's work, and async
        placeholders filled in since the step are read (an extra upload from a free staging
        copy, no waiting)."""
        self.arena.order_current_stream()
        if not self.status[self._placeholders] or self._resteped:
            return
        self.core.restep()
        # Once per step (the engine fills placeholders before sampling), counted only once the
        # re-read succeeded: a refused one changed nothing, so the next apply is refused alike.
        self._resteped = True
        if self.stable_slots and self._row_map is not None:
            self.core.remap_rows()  # the row map again, with its drafts
        self._upload(self.arena.upload_in_apply)
        self.core.status_into(self.status)
        self._pending_restep = bool(self.status[self._placeholders])
        self._refresh_idle()

    def map_drafts(
        self, row_to_slot: list[int], positions: list[int], drafts: list[list[int]]
    ) -> None:
        """Speculative decoding on the V1 front-end (after the step): logits row ``i`` is
        slot ``row_to_slot[i]``'s at draft position ``positions[i]``; slot ``s`` has drafts
        ``drafts[s]``. Maps the rows (the history-reading tables replay the drafts) and
        uploads what changed; processors then ``apply_rows``. A refused layout changes
        nothing."""
        if not self.spec_tokens and not self.stable_slots:
            raise ProtocolError(
                "apply_drafts: this pipeline was built without speculative decoding "
                "(EngineConfig.num_speculative_tokens)"
            )
        self.before_apply()  # outputs ending in async placeholders are read again first
        drafted = [s for s, d in enumerate(drafts) if d]
        offsets = [0]
        tokens: list[int] = []
        for s in drafted:
            tokens += drafts[s]
            offsets.append(len(tokens))
        self.core.map_draft_rows(row_to_slot, positions, drafted, offsets, tokens)
        self._row_map = row_to_slot
        self._upload(self.arena.upload_in_apply)
        self.core.status_into(self.status)
        self._refresh_idle()

    def _upload(self, upload: Callable[[], Any]) -> None:
        """One upload of what the step wrote, with the device states synced around it."""
        states = self.device_state.values()
        for state in states:
            state.before_upload()
        upload()
        for state in states:
            state.after_upload()

    # --- device views ---------------------------------------------------------------------

    def section(self, name: str, occurrence: int = 0) -> torch.Tensor:
        """The device (or zero-copy host) view of an arena section, by the name the core gives
        it (``core.sections()``)."""
        found = self._by_name.get(name)
        if found is None or occurrence >= len(found):
            raise KeyError(
                f"no arena section {name!r} (#{occurrence}); have {sorted(self._by_name)}"
            )
        return self.arena.views[found[occurrence]]

    def triples(
        self, table: str, n: int, rowspace: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The first ``n`` (padded) triples of a sparse table, cached per length."""
        key = (table, rowspace, n)
        views = self._cache.get(key)
        if views is None:
            prefix = "rows." + table if rowspace else table
            rows, cols, vals = (self.section(prefix + part) for part in (".rows", ".cols", ".vals"))
            views = self._cache[key] = (rows[:n], cols[:n], vals[:n])
        return views

    def dense(
        self, name: str, rows: int, rowspace: bool, width: int = 1, occurrence: int = 0
    ) -> torch.Tensor:
        """Per-slot values lined up with the logits' rows: the prefix (V1) or gathered through
        the row map (stable slots). Shape ``[rows, width]``."""
        base = self.section(name, occurrence)
        if width != 1 or base.dim() == 1:
            base = base.view(-1, width)
        if not rowspace:
            key = (name, occurrence, rows)
            v = self._cache.get(key)
            if v is None:
                v = self._cache[key] = base[:rows]
            return v
        return base.index_select(0, self.row_map(rows))

    def row_map(self, rows: int) -> torch.Tensor:
        key = ("row_map", rows)
        v = self._cache.get(key)
        if v is None:
            v = self._cache[key] = self.section("rows.row_to_slot")[:rows]
        return v

    @property
    def graph_key(self) -> tuple[int, ...]:
        """What a captured ``apply`` depends on besides the (fixed-address) device tables: the
        batch size and every table's active count. A CUDA graph of the processors' ``apply``
        captured under one key replays correctly on any later step with the same key (values
        and counts may change in place: penalties counts, biases, masks); recapture when it
        changes."""
        return tuple(self.status)

    @property
    def bytes_uploaded_last_step(self) -> int:
        """Bytes the last upload carried (on the CPU: what a device upload would carry)."""
        return self.core.last_upload_bytes


def _reasoning_ids(config: Any) -> tuple[list[int], list[int]]:
    """The thinking budget's start and end markers, or a ValueError naming where they are set:
    our ``EngineConfig``'s fields, or vLLM's ``reasoning_config`` (whose token ids stay unset
    until its strings or its parser give them)."""
    reasoning = getattr(config, "reasoning_config", None)
    starts = getattr(reasoning, "reasoning_start_token_ids", None)
    ends = getattr(reasoning, "reasoning_end_token_ids", None)
    if starts is not None and ends is not None:
        # Token-id lists (no str, bool or float; bounded: an endless iterable ends in an
        # error); the core checks them against the vocabulary.
        return (
            _token_ids("reasoning_start_token_ids", starts, ConfigError),
            _token_ids("reasoning_end_token_ids", ends, ConfigError),
        )
    if isinstance(config, EngineConfig):
        where = "set EngineConfig.reasoning_start_token_ids and reasoning_end_token_ids"
    elif reasoning is None:
        where = (
            "the engine has no reasoning_config: start vLLM with one (--reasoning-parser, or "
            "--reasoning-config with reasoning_start_str and reasoning_end_str)"
        )
    else:
        where = (
            "vLLM's reasoning_config has no reasoning token ids (its reasoning_start_str / "
            "reasoning_end_str, or its reasoning_parser, must give both)"
        )
    raise ConfigError(f"ThinkingBudgetLogitsProcessor needs reasoning marker token ids: {where}")


def _config_int(read: Any, config: Any, field: str, least: int = 1) -> int:
    """A size from an engine config: an int >= ``least`` (``config_size``: no bool, float or
    str), or a ``ConfigError`` naming the field. An interrupt raised while reading it
    (``KeyboardInterrupt``: not an ``Exception``) propagates."""
    try:
        value = read(config)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError.at(field, f"could not be read ({e})", where="config ") from e
    return config_size(value, field, least)


def resolve_device(device: Any) -> torch.device:
    """The device the tables live on (CUDA's current one for a bare ``"cuda"``). One torch
    cannot name, or a CUDA device this machine does not have, is a ``ConfigError`` naming
    ``device`` (torch's own error was a ``RuntimeError``)."""
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ConfigError(
            f"device: {device!r} is not a device torch knows ({e})", field="device"
        ) from e
    if d.type != "cuda":
        return d
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not count:
        raise ConfigError(
            f"device: {d} asked for, but CUDA is not available on this machine "
            "(torch.cuda.is_available() is False)",
            field="device",
        )
    if d.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if not 0 <= d.index < count:
        raise ConfigError(f"device: {d} asked for, but this machine has {count}", field="device")
    return d


def _max_rows(max_rows: Any) -> int | None:
    """The stable-slot step's row bound: ``None`` (the default) or an int >= 1."""
    return None if max_rows is None else config_size(max_rows, "max_rows")

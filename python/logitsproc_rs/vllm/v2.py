"""Our processors for vLLM's Model Runner V2 (vLLM >= 0.32), on the stable-slot front-end.

vLLM 0.32.0's MRV2 interface and loader are the same files as 0.33.0's, which the tests run.

MRV2's interface (``vllm.v1.worker.gpu.sample.logits_processor``): each processor is built as
``cls(vllm_config, req_states)``; ``add_request(req_idx, sp)`` fills slot ``req_idx`` (slots
are recycled through a free list and a processor is never told that a request finished: the
next ``add_request`` on the slot overwrites it); ``apply_staged_writes()`` runs once per step
after the runner flushed its own request state; ``apply(logits, ctx)`` runs once per step on
rows that ``ctx.expanded_idx_mapping`` maps to slots (a slot owns several rows under
speculative decoding). Committed tokens live only in ``req_states``: ``all_token_ids[slot]``
holds the prompt (``prompt_len``), then the output, up to ``total_len``.

How that maps onto one ``Pipeline`` (``stable_slots=True, token_feed=True``):

* Every processor of this module built on the same ``req_states`` joins one group, and the
  group builds one pipeline (one core, one upload per step) for all of them at its first use,
  with the tables of every member.
* ``add_request``: the first member called for a slot checks the request for every table at
  once (``ValueError`` naming the processor, the request and the field; the slot is then left
  empty) and the others join that add. Each returns whether it acts on the request.
* ``apply_staged_writes`` (every step, before the forward pass): the requests added since
  the last step are installed with their prompt and output so far, read back from
  ``req_states`` (one gathered copy, on steps with arrivals only); then the copy of what the
  last batch's requests may have committed before this step starts (``total_len`` and a
  window of ``all_token_ids``: one gather, non-blocking into pinned memory on a GPU).
* ``apply``: the first member called with a step's ``ctx`` runs the step: the tokens each
  request committed since we last looked (``all_token_ids[known:total_len]``, from that copy,
  or read then for a request it lacks) go in through the token feed, then the row map (on
  the host already unless draft rows make it ``ctx.expanded_idx_mapping``, which is then
  copied with ``ctx.expanded_local_pos`` and ``ctx.input_ids``, the draft layout, in one
  copy); each member then applies its transform through the map, a draft row at position
  ``j`` over its request's committed tokens followed by the drafts before it.

MRV2 applies its own logit bias, allowed ids, min-tokens, penalties, bad words, thinking
budget and min_p from the ordinary ``SamplingParams`` fields, so, as in ``v1``, our built-ins
read theirs (vLLM's names) from ``extra_args["logitsproc_rs"]``: a request gets ours or
vLLM's, never both (``bridge(cls, namespace=None)`` reads the ordinary fields). Custom
processors run after vLLM's penalties and bad words and before temperature, min_p and
top-k/top-p; so our MinP selects on ``logits / temperature`` (what vLLM's own min_p sees).

A request refused at ``add_request`` (only what the front end could not check: token ids
against the vocabulary) is failed closed (``_guard``): raising there would stop the engine.

Importing this module imports vLLM's MRV2 interface module (which is itself import-light).
"""

from __future__ import annotations

import itertools
import math
import numbers
import weakref
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, ClassVar, cast

import numpy as np
import torch
from vllm.v1.worker.gpu.sample.logits_processor.interface import (
    LogitsProcessor as _V2LogitsProcessor,
)

from .._core import int_item
from ..builtin import BUILTINS, COMBINED
from ..builtin import MinPLogitsProcessor as _MinP  # v2 defines its bridge of the same name
from ..builtin._combined import CombinedView, combined
from ..columns import ColumnLogitsProcessor
from ..errors import BatchUpdateError, processor_raised
from ..params import _show, config_size, config_spec_tokens
from ..pipeline import Pipeline
from ..registry import HISTORY_TABLES, TABLES
from ..views import PipelineView, Stage
from ._fields import NAMESPACE
from ._group import Bridge, BridgeType, Group, make_bridge
from ._guard import Refused, forced_tokens, log_refused


class _SlotConfig:
    """The engine config as the pipeline reads it, sized by the runner's slots."""

    def __init__(self, vllm_config: Any, req_states: Any) -> None:
        self._config = vllm_config
        slots = config_size(req_states.max_num_reqs, "max_num_reqs")
        self.scheduler_config = SimpleNamespace(max_num_seqs=slots)
        vocab = config_size(req_states.vocab_size, "vocab_size")
        self.model_config = SimpleNamespace(get_vocab_size=lambda: vocab)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


class _Group(Group):
    """The processors of one runner and their shared pipeline (built at first use)."""

    # The group that processors being built for a runner join, keyed (weakly) by the runner's
    # token buffer (``req_states.all_token_ids``); a group leaves it when it builds its
    # pipeline and then lives as long as its members.
    FORMING: ClassVar[weakref.WeakKeyDictionary[Any, _Group]] = weakref.WeakKeyDictionary()

    def __init__(self, vllm_config: Any, req_states: Any) -> None:
        super().__init__(req_states.all_token_ids, vllm_config)
        self.config = vllm_config
        self.req_states = req_states
        slots = config_size(req_states.max_num_reqs, "max_num_reqs")
        self.reads_history = False
        # Requests added since the last apply_staged_writes: slot -> (the engine's params, what
        # our tables read, joined members, whether each member acts on it).
        self.pending: dict[int, tuple[Any, Any, set[int], dict[int, bool]]] = {}
        # Slots whose request has a fed history, and how many of its tokens we have fed
        # (prompt included: the same count as the runner's total_len).
        self.known = np.full(slots, -1, dtype=np.int64)
        # Slots whose request some member acts on (or that are failed closed): a step whose
        # batch has none of them does nothing (``idle_for``), and only these slots' histories
        # are read. ``num_active`` counts them.
        self.active = np.zeros(slots, dtype=bool)
        self.num_active = 0
        self.fresh: set[int] = set()  # installed this step, from a total_len read just now
        # Tokens one step can commit for a request: the sampled one plus accepted drafts.
        self.window = 1 + max(0, config_spec_tokens(vllm_config) if vllm_config else 0)
        self.last_slots: list[int] = []  # the last batch: who may have committed tokens
        self.snapshot: Any = None  # what prefetch read: (row of each slot, starts, host, event)
        self.ctx: Any = None  # the last ctx stepped
        self.idle_ctx: Any = None  # the last ctx found idle (``idle_for``)
        # Each slot's temperature: MRV2 applies it after the custom processors, so MinP
        # reads it to select what vLLM's own min_p selects (after temperature).
        self.temperature = np.ones(slots, dtype=np.float32)
        dev = torch.device(req_states.device)
        # Its device copy (on the CPU the same memory), written at add_request: MinP gathers
        # it through the row map on the device, without a sync.
        self.temperature_dev = (
            torch.from_numpy(self.temperature)
            if dev.type == "cpu"
            else torch.ones(self.temperature.shape, dtype=torch.float32, device=dev)
        )
        self.row_slots: Any = None  # this step's slot of each logits row, on the host
        self.batch_slots: Any = None  # this step's slot of each request (ctx.idx_mapping_np)

    def _build(self) -> Pipeline:
        rs = self.req_states
        device = torch.device(rs.device)
        pipe = self.build_pipeline(
            _SlotConfig(self.config, rs),
            device,
            device.type == "cuda",
            token_feed=True,
            stable_slots=True,
        )
        for m in self.members:
            for view in (m._view, *getattr(m._view, "parts", ())):
                if isinstance(view, (_TemperedMinP, _SampledRowsOnly)):
                    view.group = self
        self.reads_history = bool(self.tables() & HISTORY_TABLES)  # only their tokens are fed
        self.close()  # later processors start a group of their own
        return pipe

    # --- add_request ----------------------------------------------------------------------

    def add(self, member: _Bridge, req_idx: Any, params: Any) -> bool:
        """Whether ``member`` acts on the request (on a failed-closed one every member does).
        Everything is read and checked before anything changes: a slot that is not one
        raises (``slot_of``), and an interrupt raised by the request's own attributes leaves
        the slot's previous state whole."""
        pipe = self.ensure()
        slot = self.slot_of(member, req_idx)
        pending = self.pending.get(slot)
        if pending is not None and pending[0] is params and id(member) not in pending[2]:
            pending[2].add(id(member))  # joins the add another member made for this slot
            return pending[3].get(id(member), False)
        temperature = _temperature(params)
        tokens = None
        try:
            # Checked now for every table; installed with its tokens by apply_staged_writes.
            routed = self.route(slot, params)
            pipe.add_request(slot, routed, None, [])
        except ValueError as e:
            # Raising would stop MRV2's engine: the request is failed closed (_guard).
            routed = Refused(params)
            tokens = forced_tokens(params, pipe.vocab_size, self.eos)
            pipe.add_request(slot, routed, None, [])  # neutral: replaces the previous occupant
            owner = self.owner(e) or type(member).__name__
            log_refused(f"{owner}.add_request(req_idx={slot})", e, tokens)
        refused = isinstance(routed, Refused)
        # Which members act on it: each one's add_request answers from this (MRV2 skips a
        # batch's apply when none acts on any of its requests).
        acts = {id(m): refused or cast(_Bridge, m).acts_on(routed) for m in self.members}
        active = any(acts.values())
        # Nothing below reads the request or can fail: the slot changes as a whole.
        self.pending[slot] = (params, routed, {id(member)}, acts)
        self.known[slot] = -1
        self.num_active += int(active) - int(self.active[slot])
        self.active[slot] = active
        if tokens is not None:
            self.forced.rows[slot] = tokens
            self.forced.changed()
        elif self.forced.rows.pop(slot, None) is not None:
            self.forced.changed()
        self.temperature[slot] = temperature
        if self.temperature_dev.device.type != "cpu":
            self.temperature_dev[slot] = float(temperature)
        return acts[id(member)]

    def slot_of(self, member: _Bridge, req_idx: Any) -> int:
        """``req_idx`` as a slot: an int (numpy's too) in ``[0, max_num_reqs)``. A bool, a
        float, a str, a negative or one beyond is a ``BatchUpdateError`` naming the processor
        (``True`` would index numpy as a mask, ``-1`` the last slot)."""
        n = self.known.shape[0]
        slot = int_item(req_idx)
        if slot is None or not 0 <= slot < n:
            raise BatchUpdateError(
                f"{type(member).__name__}.add_request(req_idx={_show(req_idx)}) "
                f"(logitsproc_rs.vllm.v2): req_idx must be a slot, an int in [0, {n}) "
                "(max_num_reqs); nothing changed",
                index=slot,
                field="req_idx",
            )
        return slot

    def step_slots_of(self, member: _Bridge, ctx: Any) -> np.ndarray:
        """``ctx.idx_mapping_np`` (the slot of each request of the step) checked: a 1-d
        sequence of at most ``max_num_reqs`` ints (no bool, no float) in ``[0,
        max_num_reqs)``; else a ``BatchUpdateError`` naming the processor and the position."""
        n = self.known.shape[0]
        raw = ctx.idx_mapping_np

        def refuse(why: str, index: int | None = None) -> BatchUpdateError:
            return BatchUpdateError(
                f"{type(member).__name__}.apply (logitsproc_rs.vllm.v2): ctx.idx_mapping_np"
                f"{'' if index is None else f'[{index}]'}: {why}; nothing changed",
                index=index,
                field="idx_mapping",
            )

        if isinstance(raw, np.ndarray):
            if raw.ndim != 1 or raw.dtype.kind not in "iu":
                raise refuse(f"expected a 1-d int array of slots, got {raw.dtype} {raw.shape}")
            slots = raw.astype(np.int64)
        elif isinstance(raw, (str, bytes)) or not hasattr(raw, "__iter__"):
            raise refuse(f"expected a 1-d int array of slots, got {_show(raw)}")
        else:
            items = list(itertools.islice(raw, n + 1))
            ints = [int_item(v) for v in items]
            for k, v in enumerate(ints):
                if v is None:
                    raise refuse(f"expected a slot (an int), got {_show(items[k])}", k)
            slots = np.asarray(ints, dtype=np.int64)
        if slots.shape[0] > n:
            raise refuse(f"more than max_num_reqs={n} requests")
        bad = np.flatnonzero((slots < 0) | (slots >= n))
        if bad.size:
            k = int(bad[0])
            raise refuse(f"slot {int(slots[k])} is not in [0, {n}) (max_num_reqs)", k)
        return slots

    def idle_for(self, ctx: Any) -> bool:
        """Whether no request of ``ctx``'s batch is one a member acts on: then the step does
        nothing (no core call, no gather, no copy) and every member returns the logits as
        they are. Read on the host from ``ctx.idx_mapping_np``; a map that is not a 1-d int
        array of slots is not idle (the step refuses it, naming it)."""
        raw = ctx.idx_mapping_np
        if type(raw) is not np.ndarray or raw.ndim != 1 or raw.dtype.kind not in "iu":
            return False
        if raw.size and (raw.min() < 0 or raw.max() >= self.active.shape[0]):
            return False  # not slots: the step refuses them
        if self.num_active and self.active[raw].any():
            return False
        self.idle_ctx = ctx
        self.last_slots = []  # none of them may commit tokens we read
        return True

    # --- apply_staged_writes --------------------------------------------------------------

    def staged_writes(self, member: _Bridge) -> None:
        """Once per step: every member gets the call, in load order, every step (also when
        no apply follows); the first does the work."""
        if member is not self.members[0] or not (self.pending or self.last_slots or self.fresh):
            return
        # A new step: a slot installed at an earlier one is no longer fresh, even when no
        # apply came in between (MRV2 skips it when no request of the batch needs one), so
        # what it committed since is fed.
        self.fresh.clear()
        self.install_pending()
        self.prefetch()

    def install_pending(self) -> None:
        """The requests added since the last step, with their prompt and output so far: the
        runner has flushed them to ``all_token_ids`` by now. One gathered read (a wait, on
        steps with arrivals only). The core replaces a slot's pending change with a later
        one, so re-adding what add_request checked is safe."""
        if not self.pending:
            return
        pipe = self.ensure()
        # Only requests a member acts on need their tokens: for the others (and when no
        # table reads tokens) the adds made in add_request stand.
        active = [s for s in self.pending if self.active[s]] if self.reads_history else []
        params = [self.pending[s][1] for s in active]
        self.pending.clear()
        if not active:
            return
        slots = np.asarray(active, dtype=np.int64)
        rs = self.req_states
        prompt_len = np.asarray(rs.prompt_len.np)[slots].astype(np.int64)
        # MRV2 commits a request's first sampled token after its first step, so total_len
        # is the prefill length now; the window reads a little more, to be sure (what lies
        # beyond it, if anything, comes through the feed at the next step).
        width = int(np.asarray(rs.prefill_len.np)[slots].max()) + self.window
        host = self.gather(slots, np.zeros_like(slots), width).numpy()
        for k, slot in enumerate(slots.tolist()):
            p, n = int(prompt_len[k]), min(int(host[k, 0]), width)
            row = host[k, 1 : 1 + n].tolist()
            pipe.add_request(slot, params[k], row[:p], row[p:])
            self.known[slot] = n
            if n == int(host[k, 0]):
                self.fresh.add(slot)

    def prefetch(self) -> None:
        """Starts reading what the requests of the last batch may commit before this step's
        apply: ``total_len`` and ``all_token_ids[known : known + 1 + draft tokens]``. On a
        GPU the copy is non-blocking into pinned memory and ordered before the forward pass,
        so ``apply`` finds it done instead of waiting for the forward pass to finish."""
        slots = np.asarray([s for s in self.last_slots if self.known[s] >= 0], dtype=np.int64)
        self.snapshot = None
        if not slots.size:
            return
        starts = self.known[slots].copy()
        host = self.gather(slots, starts, self.window, pinned=True)
        event = None
        if host.device.type == "cpu" and self.req_states.all_token_ids.gpu.is_cuda:
            event = torch.cuda.Event()
            event.record()
        row_of = np.full(self.known.shape, -1, dtype=np.int64)
        row_of[slots] = np.arange(slots.size)
        self.snapshot = (row_of, starts, host, event)

    def gather(
        self, slots: np.ndarray, starts: np.ndarray, width: int, pinned: bool = False
    ) -> torch.Tensor:
        """``[total_len, all_token_ids[start : start + width]]`` of each slot, on the host: one
        gather on the device and one copy (non-blocking into pinned memory when ``pinned``)."""
        rs = self.req_states
        tokens = rs.all_token_ids.gpu
        dev = tokens.device
        idx = torch.from_numpy(slots).to(dev)
        cols = torch.from_numpy(starts).to(dev)[:, None] + torch.arange(width, device=dev)
        window = tokens[idx[:, None], cols.clamp_(max=tokens.shape[1] - 1)]
        both = torch.cat([rs.total_len.gpu[idx][:, None].to(window.dtype), window], 1)
        if dev.type != "cuda":
            return both.to(torch.int64)
        host = torch.empty(both.shape, dtype=both.dtype, pin_memory=pinned)
        return host.copy_(both, non_blocking=pinned)

    # --- apply ----------------------------------------------------------------------------

    def step(self, member: _Bridge, logits: torch.Tensor, ctx: Any) -> None:
        """Once per step (the first member called with this ``ctx``): feed the committed
        tokens, then the row map. A ``ctx`` whose slots are not slots is refused first."""
        pipe = self.ensure()
        slots_np = self.step_slots_of(member, ctx)
        self.install_pending()  # normally done already, by apply_staged_writes
        drafts: dict[str, Any] = {}
        if logits.shape[0] == slots_np.shape[0]:
            row_to_slot: Any = slots_np  # one row per request, in batch order: no copy needed
        else:
            # Draft rows: the layout is on the device. One copy brings the row map, each
            # row's draft position and the token fed at it (the drafts) to the host.
            row_to_slot, drafts["local_pos"], drafts["input_ids"] = _host_layout(ctx)
        self.row_slots = row_to_slot
        tokens, feed_slots, known = self.committed(slots_np)
        most = pipe.core.max_rows
        if tokens is not None and len(tokens) > most:
            # More tokens than one feed holds (applies skipped for a while: MRV2's sampler
            # skips them when no request of the batch needs processing): all but the last
            # feed's worth go in first, in order, read by this step as one feed.
            cut = len(tokens) - most
            for k in range(0, cut, most):
                end = min(k + most, cut)
                pipe.core.feed_slots(tokens[k:end], feed_slots[k:end])
                np.add.at(self.known, feed_slots[k:end], 1)  # fed, whatever the step does
            tokens, feed_slots = tokens[cut:], feed_slots[cut:]
        pipe.step_slots(row_to_slot, tokens, feed_slots, **drafts)
        if known is not None:
            self.known[known[0]] = known[1]  # only once the step was accepted
        self.ctx = ctx
        self.batch_slots = slots_np
        self.last_slots = slots_np.tolist()
        self.fresh.clear()
        self.snapshot = None

    def host_row_slots(self) -> Any:
        """This step's slot of each logits row, as a host list."""
        return self.row_slots.tolist() if isinstance(self.row_slots, np.ndarray) else self.row_slots

    def tempered(self) -> bool:
        """Whether a request of this step has a temperature neither 0 nor 1 (MRV2 divides
        those after the custom processors). Read from the batch's slots, on the host."""
        t = self.temperature[self.batch_slots]
        return not bool(np.all((t == 0.0) | (t == 1.0)))

    def all_at_one(self) -> bool:
        """Whether every request of this step samples at temperature 1 (no greedy row, none
        that MRV2 divides). Read from the batch's slots, on the host."""
        return bool(np.all(self.temperature[self.batch_slots] == 1.0))

    def committed(self, slots: np.ndarray) -> tuple[Any, Any, Any]:
        """Tokens the batch's requests committed since we last looked,
        ``all_token_ids[slot, known:total_len]`` in slot order (and the slot of each), from
        the prefetched copy, or read now for what it lacks (a request whose apply was
        skipped, or more tokens than its window); and the requests' new ``known``."""
        slots = slots[(self.known[slots] >= 0) & ~np.isin(slots, list(self.fresh))]
        if not slots.size:
            return None, None, None
        known = self.known[slots]
        need = np.full(slots.shape, -1, dtype=np.int64)
        window = np.zeros((slots.size, self.window), dtype=np.int64)
        if self.snapshot is not None:
            row_of, starts, host, event = self.snapshot
            if event is not None:
                event.synchronize()  # recorded before the forward pass: already done
            k = row_of[slots]
            hit = k >= 0
            hit[hit] = starts[k[hit]] == known[hit]
            snap = host.numpy()[k[hit]]
            n = snap[:, 0] - known[hit]
            good = n <= self.window
            idx = np.flatnonzero(hit)[good]
            need[idx], window[idx] = n[good], snap[good, 1:]
        missing = np.flatnonzero(need < 0)
        if missing.size:
            width = self.window
            while True:
                host = self.gather(slots[missing], known[missing], width).numpy()
                n = host[:, 0] - known[missing]
                if int(n.max()) <= width:
                    break
                width = int(n.max())
            if width > window.shape[1]:
                window = np.pad(window, ((0, 0), (0, width - window.shape[1])))
            need[missing], window[missing, :width] = n, host[:, 1:]
        need = np.maximum(need, 0)
        take = np.arange(window.shape[1]) < need[:, None]
        if not take.any():
            return None, None, None
        return window[take], np.repeat(slots, need), (slots, known + need)


class _Bridge(Bridge, _V2LogitsProcessor, metaclass=BridgeType):
    """One of our processors (``VIEW``) as an MRV2 ``LogitsProcessor``. Token ids against the
    vocabulary are checked at ``add_request``, which fails such a request closed."""

    BRIDGE = __name__

    _group: _Group

    def __init__(self, vllm_config: Any, req_states: Any) -> None:
        self._group = _Group.joined(
            req_states.all_token_ids, self, lambda: _Group(vllm_config, req_states)
        )

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        return self._group.add(self, req_idx, sampling_params)

    def acts_on(self, sp: Any) -> bool:
        """Whether this processor may change a request's logits (what ``add_request``
        returns; MRV2 skips ``apply`` for batches where no processor acts): a built-in when
        the request sets one of its tables' fields, a column processor when a reader gives a
        value (the core holds the column's default otherwise). ``sp`` has passed the core's
        checks, so the readers ran once already; one that raises now counts as acting."""
        view = self.VIEW
        if not view.TABLES and not view.COLUMNS:
            return True  # nothing declared to tell by
        for t in view.TABLES:
            for f in TABLES[t].fields:
                if f.is_set(getattr(sp, f.name, None)) or (
                    f.attr != f.name and f.is_set(getattr(sp, f.attr, None))
                ):
                    return True
        for column in view.COLUMNS:
            try:
                if column.read(sp) is not None:
                    return True
            except Exception:
                return True
        return False

    def apply_staged_writes(self) -> None:
        self._group.staged_writes(self)

    def apply(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
        group = self._group
        if ctx is not group.ctx:
            if ctx is group.idle_ctx or group.idle_for(ctx):
                return logits  # no request of this batch is ours: nothing to do
            group.step(self, logits, ctx)
        view = self._view
        assert view is not None
        try:
            logits = view.apply_rows(logits)
        except Exception as e:
            if isinstance(view, ColumnLogitsProcessor):
                # A custom transform's failure, named (the pipeline is unaffected).
                raise processor_raised(f"{type(self).__name__}.apply", e) from e
            raise
        if group.forced:
            logits = group.forced.apply_(logits, group.host_row_slots())
        return logits


def _host_layout(ctx: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A draft step's layout on the host: ``ctx.expanded_idx_mapping``,
    ``ctx.expanded_local_pos`` and ``ctx.input_ids`` (one row each), in one copy (the one
    wait a draft step has: the core reads the drafts on the host). Tensors that are not 1-D
    integer rows of the same length are refused, naming the field."""
    fields = ("expanded_idx_mapping", "expanded_local_pos", "input_ids")
    parts = [getattr(ctx, f) for f in fields]
    for f, t in zip(fields, parts, strict=True):
        ok = isinstance(t, torch.Tensor) and t.dim() == 1 and not t.dtype.is_floating_point
        if not ok or t.dtype == torch.bool or t.shape != parts[0].shape:
            raise BatchUpdateError(
                f"apply (logitsproc_rs.vllm.v2): ctx.{f} must be a 1-d int tensor with one "
                f"entry per logits row, got {_show(t)}; nothing changed",
                field=f,
            )
    host = torch.stack([t.to(torch.int64) for t in parts]).cpu().numpy()
    return host[0], host[1], host[2]


def _temperature(params: Any) -> float:
    """The request's temperature as MRV2 stores it (float32; greedy is 0); 1 for anything that
    is not a finite real number (a bool included: MRV2's front end refuses those)."""
    t = getattr(params, "temperature", 1.0)
    if isinstance(t, bool) or not isinstance(t, numbers.Real):
        return 1.0
    try:
        f = float(t)
    except (OverflowError, ValueError):
        return 1.0
    return f if math.isfinite(f) else 1.0


def bridge(
    cls: type[PipelineView],
    *,
    name: str | None = None,
    module: str | None = None,
    namespace: str | None = NAMESPACE,
) -> type[_Bridge]:
    """An MRV2 processor class for one of ours: a built-in or a ``ColumnLogitsProcessor``
    subclass. Load it as any MRV2 processor (a class in ``logits_processors``, or a
    ``"module:Name"`` where the module defines ``Name = bridge(MyColumns)``). ``namespace``:
    where built-in tables read their fields (module docstring); ``None``: the ordinary ones.
    The processors of one runner must agree on it."""
    if cls in COMBINED:
        # Its parts as this bridge runs each of them (below), in one processor.
        assert issubclass(cls, CombinedView)
        parts = [_as_run_here(p) for p in cls.PARTS]
        cls, name = combined(cls.__name__, parts, cls.__doc__ or ""), name or cls.__name__
    elif cls in BUILTINS:
        cls, name = _as_run_here(cls), name or cls.__name__
    bridged: type[_Bridge] = make_bridge(
        _Bridge, cls, name, module, namespace, lambda view: view.__doc__
    )
    return bridged


def _as_run_here(view: type[PipelineView]) -> type[PipelineView]:
    """A built-in as MRV2 runs it through this bridge (``bridge``): MRV2 runs custom
    processors before temperature, on every row; V1 applies the argmax-invariant ones after
    temperature, to sampled rows only. So MinP selects on tempered logits, the other
    argmax-invariant ones mask sampled rows only (``_SampledRowsOnly``), the rest run as
    they are."""
    if view is _MinP:
        return _TemperedMinP
    return _sampled_rows_only(view) if view.ARGMAX_INVARIANT else view


class _TemperedMinP(_MinP):
    """MinP as MRV2's own selects: MRV2 runs custom processors before temperature and its
    min_p after, so the rows whose temperature is neither 0 nor 1 are compared on
    ``logits / temperature`` (the same float32 division as MRV2's temperature kernel)
    against ``max + log(min_p)``, and the raw logits are masked (temperature comes later)."""

    group: _Group | None = None

    def _apply(self, logits: torch.Tensor, rowspace: bool) -> torch.Tensor:
        pipe = self._pipe
        group = self.group
        if not pipe.count("min_p") or group is None or not rowspace or not group.tempered():
            return super()._apply(logits, rowspace)
        rows = logits.shape[0]
        t = group.temperature_dev.index_select(0, pipe.row_map(rows)).unsqueeze(1)
        scaled = torch.where((t == 0.0) | (t == 1.0), logits, logits / t)
        log_min_p = pipe.dense("min_p.log_min_p", rows, rowspace)
        threshold = scaled.amax(dim=-1, keepdim=True).add_(log_min_p)
        return logits.masked_fill_(scaled < threshold, float("-inf"))


class _SampledRowsOnly(PipelineView):
    """A built-in argmax-invariant processor (the truncations, XTC) as V1 applies it: vLLM V1
    takes a greedy row's token before its argmax-invariant phase and applies that phase after
    temperature, so such a processor never sees a greedy row and sees the others divided by
    their temperature. MRV2 runs custom processors on every row before temperature; so here
    the processor masks a copy of the logits, divided by each row's temperature where it is
    neither 0 nor 1, and the raw logits take its -inf mask on every row but the greedy ones.
    (Every built-in of this phase only masks: it sets entries to -inf and nothing else.)"""

    group: _Group | None = None

    def _apply(self, logits: torch.Tensor, rowspace: bool) -> torch.Tensor:
        group = self.group
        if group is None or not rowspace or group.all_at_one():
            return super()._apply(logits, rowspace)
        t = group.temperature_dev.index_select(0, self._pipe.row_map(logits.shape[0]))
        t = t.unsqueeze(1)
        scaled = torch.where((t == 0.0) | (t == 1.0), logits, logits / t)
        masked = super()._apply(scaled, rowspace)
        return logits.masked_fill_(torch.isneginf(masked) & (t != 0.0), float("-inf"))


def _sampled_rows_only(view: type[PipelineView]) -> type[PipelineView]:
    """``view`` with ``_SampledRowsOnly`` ahead of it, a class of this module by its own name
    (so a bridge of it pickles as any)."""
    name = f"_SampledRowsOnly{view.__name__}"
    cls = globals().get(name)
    if cls is None:
        cls = type(
            name, (_SampledRowsOnly, view), {"__doc__": view.__doc__, "__module__": __name__}
        )
        globals()[name] = cls
    return cls


# Every built-in, under its own class name (``logitsproc_rs.vllm.v2:MinPLogitsProcessor``).
_BRIDGED = {view: bridge(view, module=__name__) for view in BUILTINS}
globals().update({cls.__name__: cls for cls in _BRIDGED.values()})
# Every field of ours in two classes (as in ``v1``).
_COMBINED = {view: bridge(view, module=__name__) for view in COMBINED}
globals().update({cls.__name__: cls for cls in _COMBINED.values()})
EVERY_FIELD: Sequence[type[_Bridge]] = tuple(_COMBINED.values())

# vLLM 0.25.1's processors and sampler transforms (not ours beyond vLLM's, which are opt-in), as
# MRV2 runs custom processors: the argmax-changing ones in the built-ins' order, then the
# argmax-invariant ones (MinP), for ``logits_processors`` (the thinking budget needs a
# reasoning config).
ALL: Sequence[type[_Bridge]] = sorted(
    (c for view, c in _BRIDGED.items() if view.STAGE is not Stage.OPT_IN),
    key=lambda c: bool(c.VIEW.ARGMAX_INVARIANT),  # a stable sort
)

__all__ = [
    "ALL",
    "EVERY_FIELD",
    "bridge",
    *(cls.__name__ for cls in _BRIDGED.values()),
    *(cls.__name__ for cls in _COMBINED.values()),
]

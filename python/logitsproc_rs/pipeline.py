"""One Rust core per processor set: the ``Pipeline`` and the processors that are views on it.

A ``Pipeline`` owns the tables of every processor built on it (the built-ins and the columns
that custom processors declare) and one arena of host buffers. One ``step`` reads the update
once, validates everything for every table, applies everything and uploads what changed once;
a rejected step leaves every table as it was.

Processors are thin views: ``apply`` reads its own tables' device views. Their
``update_state`` keeps vLLM's interface: when the processors of one pipeline are each called
in turn (vLLM's loop), the first call of a step runs the whole step and the others join it
(they must pass the same update object, unchanged). The fast path is one call for everything:
``LogitsProcessors.update_state(update)`` (or ``Pipeline.step``).

Two front-ends drive the same core: **V1** batch updates (rows = slots, condense moves and
swaps), and **stable slots** (``add_request(slot, params)``, ``remove_request(slot)``, and
``apply(logits, row_to_slot)`` with a row → slot map, where a slot may own several rows).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from . import _core
from . import kernels as _kernels
from ._arena import DeviceArena
from .errors import ConfigError, ProtocolError
from .interface import BatchUpdate, LogitsProcessor
from .params import (
    DEFAULT_MAX_ALLOWED_TOKEN_IDS,
    DEFAULT_MAX_BAD_WORD_LEN,
    DEFAULT_MAX_BAD_WORDS,
    DEFAULT_MAX_LOGIT_BIAS_ENTRIES,
    DEFAULT_MAX_STOP_TOKEN_IDS,
    EngineConfig,
    as_engine_config,
    config_cap,
    config_max_num_seqs,
    config_spec_tokens,
    config_vocab_size,
)

# Indices into ``Pipeline.status`` (the core's ``Status``).
BATCH_SIZE, MIN_P_COUNT, LOGIT_BIAS, MIN_TOKENS, BAD_WORDS, ALLOWED, ALLOWED_ROWS = range(7)
THINKING, PENALTIES, PLACEHOLDERS, ROWS = 7, 8, 9, 10
ROW_OFFSET = 9  # row-space entries: status[ROW_OFFSET + k] mirrors status[k] for tables 2..7
STEPPING = 17  # some table holds state a step must advance even without a batch change
COLUMNS = 18


def _update_signature(update: Any) -> tuple[int, ...] | None:
    """Cheap fingerprint of an update object (identity, sizes): catches an update mutated
    between the processors of one step."""
    if update is None:
        return None
    try:
        return (
            id(update),
            int(update.batch_size),
            len(update.removed),
            len(update.added),
            len(update.moved),
        )
    except Exception:
        return (id(update),)


class Pipeline:
    """The Rust core of a processor set, its device arena, and the step protocol.

    ``tables`` names the built-in tables to build (``min_p``, ``logit_bias``, ``min_tokens``,
    ``penalties``, ``bad_words``, ``allowed``, ``thinking``); ``columns`` are the declared
    columns of custom processors, in order. ``token_feed=True`` makes the pipeline own each
    request's output history and take the sampled token ids per step instead of re-reading
    the engine's lists. ``stable_slots=True`` adds the row-space buffers of the stable-slot
    front-end; ``max_rows`` bounds the rows of one stable-slot step (default
    ``max_num_seqs × (1 + num_speculative_tokens)``). ``kernels`` chooses the device applies:
    ``"triton"``, ``"torch"`` or ``"auto"`` (Triton for float32 CUDA logits where it imports);
    ``None`` follows ``LOGITSPROC_KERNELS``.
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
    ) -> None:
        vllm_config = as_engine_config(vllm_config)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        tables = set(tables)
        unknown = tables - {
            "min_p",
            "logit_bias",
            "min_tokens",
            "penalties",
            "bad_words",
            "allowed",
            "thinking",
        }
        if unknown:
            raise ValueError(f"unknown tables {sorted(unknown)}")
        self.vocab_size = _config_int(config_vocab_size, vllm_config, "vocab_size")
        self.capacity = _config_int(config_max_num_seqs, vllm_config, "max_num_seqs")
        self.spec_tokens = _config_int(config_spec_tokens, vllm_config, "num_speculative_tokens", 0)
        self.token_feed = token_feed
        self.stable_slots = stable_slots
        thinking = None
        if "thinking" in tables:
            thinking = _reasoning_ids(vllm_config)
        self.columns = list(columns)

        def cap(config: Any, name: str, default: int) -> int:
            return _config_int(lambda c: config_cap(c, name, default), config, name)

        self.core = _core.Pipeline(
            self.capacity,
            self.vocab_size,
            min_p="min_p" in tables,
            logit_bias=cap(vllm_config, "max_logit_bias_entries", DEFAULT_MAX_LOGIT_BIAS_ENTRIES)
            if "logit_bias" in tables
            else None,
            min_tokens=cap(vllm_config, "max_stop_token_ids", DEFAULT_MAX_STOP_TOKEN_IDS)
            if "min_tokens" in tables
            else None,
            penalties="penalties" in tables,
            bad_words=(
                cap(vllm_config, "max_bad_words", DEFAULT_MAX_BAD_WORDS),
                cap(vllm_config, "max_bad_word_len", DEFAULT_MAX_BAD_WORD_LEN),
            )
            if "bad_words" in tables
            else None,
            allowed=cap(vllm_config, "max_allowed_token_ids", DEFAULT_MAX_ALLOWED_TOKEN_IDS)
            if "allowed" in tables
            else None,
            thinking=thinking,
            spec_tokens=self.spec_tokens,
            columns=[c.declaration() for c in self.columns],
            stable_slots=stable_slots,
            token_feed=token_feed,
            max_rows=max_rows,
            host_kernels=self.device.type == "cpu" and not emulate_device,
        )
        self.tables = frozenset(tables)
        self.arena = DeviceArena(self.core, self.device, is_pin_memory, emulate_device)
        # On the CPU (without device emulation) MinP and penalties run in Rust on the logits.
        self.host_kernels = self.arena.zero_copy
        # Device-side applies: "auto" / "triton" / "torch"; None follows LOGITSPROC_KERNELS.
        self.kernels = None if kernels is None else _kernels.validate_backend(kernels)
        self._by_name: dict[str, list[int]] = {}
        for i, (name, *_rest) in enumerate(self.arena.sections):
            self._by_name.setdefault(name, []).append(i)
        self.status: list[int] = self.core.status()
        self.idle = True  # nothing applied, no per-step state (refreshed with the status)
        self._views: list[Any] = []
        # Step protocol: a view has taken part in the current step when its `_pipe_epoch` (or
        # `_all_done`, after a one-call step) equals `_epoch`.
        self._epoch = 0
        self._all_done = 0
        self._pending_restep = False
        self._step_sig: tuple[int, ...] | None = None
        self._step_update: Any = None
        self._cache: dict[tuple[Any, ...], Any] = {}
        self._resteped = False
        self._row_map: Any = None
        self.cells: torch.Tensor | None = None
        self._fast_cpu = False
        if "penalties" in tables and not self.host_kernels:
            # Allocated up front (an engine sizes its KV cache after the processors exist).
            self.cells = torch.zeros(
                (self.capacity + 1, self.vocab_size), dtype=torch.int32, device=self.device
            )
            self._sync_penalties()
        self._fast_cpu = self.arena.zero_copy and self.cells is None

    # --- the step -------------------------------------------------------------------------

    def register(self, view: Any) -> None:
        """A processor that reads this pipeline; it joins the step protocol."""
        self._views.append(view)
        view._pipe_epoch = self._epoch  # counts as having taken part: its first call steps

    def step(
        self,
        batch_update: BatchUpdate | None,
        sampled_token_ids: Any = None,
        slots: Any = None,
    ) -> None:
        """One whole step for every table: feed, update, per-step work, one upload."""
        if sampled_token_ids is not None:
            if not self.token_feed:
                raise ValueError(
                    "sampled_token_ids given to a pipeline that reads the engine's output "
                    "lists; build it with token_feed=True"
                )
            sampled_token_ids = _host_ints(sampled_token_ids)
        elif batch_update is None and self.token_feed and not self._pending_restep:
            # Token feed, no update, no tokens: nothing can have changed.
            self._epoch += 1
            self._all_done = self._epoch
            self.core.discard()
            return
        self._core_step(
            batch_update, sampled_token_ids, None if slots is None else _host_ints(slots)
        )
        self._epoch += 1
        self._all_done = self._epoch  # every view has taken part in this step

    def _core_step(self, batch_update: Any, tokens: Any = None, slots: Any = None) -> None:
        if self._fast_cpu:
            # CPU, zero-copy: one call does the step, forgets what changed (counting it) and
            # refreshes the status.
            self.core.step(batch_update, tokens, slots, self.status, True)
            self._resteped = False
            self._pending_restep = bool(self.status[PLACEHOLDERS])
            self._refresh_idle()
            return
        self.arena.begin_step()
        self.core.step(batch_update, tokens, slots)
        self._after_step()

    def _after_step(self) -> None:
        self._resteped = False
        if self.cells is not None:
            self._sync_penalties(first_upload=True)
        else:
            self.arena.upload_step()
        self.arena.mark_step_done()
        self.core.status_into(self.status)
        self._pending_restep = bool(self.status[PLACEHOLDERS])
        self._refresh_idle()

    def _refresh_idle(self) -> None:
        s = self.status
        # Counts of the tables' work (1..9 with placeholders; 11.. row space, the stepping
        # flag and the columns); 0 and 10 are sizes.
        self.idle = not (any(s[1:10]) or any(s[11:]))

    def starts_step(self, view: Any) -> bool:
        """Whether ``view``'s next ``update_state`` runs a new step (it took part in the
        current one, or the current one was a one-call step) rather than joining it."""
        return view._pipe_epoch == self._epoch or self._all_done == self._epoch

    def update_from_view(self, view: Any, batch_update: BatchUpdate | None) -> None:
        """vLLM's loop: each processor's ``update_state`` in turn. The first call of a step
        (from a processor that already took part in the current one) runs the step; the
        others join it and must pass the same, unchanged update."""
        epoch = self._epoch
        if self.starts_step(view):
            self._core_step(batch_update)
            self._epoch = epoch = epoch + 1
            view._pipe_epoch = epoch
            self._step_sig = _update_signature(batch_update)
            self._step_update = batch_update
            return
        if (
            batch_update is not self._step_update
            or _update_signature(batch_update) != self._step_sig
        ):
            raise ProtocolError(
                f"{type(view).__name__}.update_state: the processors of one pipeline were given "
                "different batch updates in one step (or the update was changed between them). "
                "Call update_state on every processor with the same update each step, or call "
                "LogitsProcessors.update_state(update) once."
            )
        view._pipe_epoch = epoch

    def check_logits(self, view: Any, logits: Any, rowspace: bool) -> torch.Tensor:
        """Every processor refuses the same inputs, whether or not it has work this step:
        a floating-point ``[rows, vocab_size]`` tensor on the processors' device whose rows
        are contiguous. float16 and bfloat16 are cast to float32 (as the ``Sampler`` casts
        before the processors); the cast is returned, so use ``apply``'s return value."""
        name = type(view).__name__
        if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
            what = getattr(logits, "dtype", type(logits).__name__)
            raise ValueError(f"{name}.apply: logits must be a floating-point tensor, got {what}")
        rows = self.status[ROWS] if rowspace else self.status[BATCH_SIZE]
        if logits.dim() != 2 or logits.shape[0] != rows or logits.shape[1] != self.vocab_size:
            what = "the row map" if rowspace else "the batch"
            raise ValueError(
                f"{name}.apply: logits of shape {list(logits.shape)} do not match {what}: "
                f"expected [{rows}, {self.vocab_size}] (batch_size from the last step, "
                "vocab_size from the config)"
            )
        if logits.device != self.device and not (
            self.device.type == "cpu" and logits.device.type == "cpu"
        ):
            raise ValueError(
                f"{name}.apply: logits on {logits.device}, but the processors were built for "
                f"{self.device}"
            )
        if rows and logits.stride(1) != 1:
            # Rows may be apart (vLLM slices a padded vocabulary: row stride > vocab_size), but
            # each row must be contiguous: kernels and host code walk a row as one array.
            raise ValueError(
                f"{name}.apply: logits rows must be contiguous (stride {list(logits.stride())}); "
                "pass logits.contiguous()"
            )
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.to(torch.float32)
        return logits

    def before_apply(self) -> None:
        """Before a processor's ``apply``: the device must see the step's work, and async
        placeholders filled in since the step are read (an extra upload from a free staging
        copy, no waiting)."""
        self.arena.order_current_stream()
        if not self.status[PLACEHOLDERS] or self._resteped:
            return
        self._resteped = True  # once per step: the engine fills placeholders before sampling
        self.core.restep()
        if self.stable_slots and self._row_map is not None:
            self.core.map_rows(self._row_map)
        if self.cells is not None:
            self._sync_penalties(first_upload=False)
        else:
            self.arena.upload_in_apply()
        self.core.status_into(self.status)
        self._pending_restep = bool(self.status[PLACEHOLDERS])
        self._refresh_idle()

    def _sync_penalties(self, first_upload: bool = True) -> None:
        """Device path: upload with the penalties' first chunk of count ops, then apply the
        row copies and the count additions to the device matrix (more chunks, rarely)."""
        core, cells = self.core, self.cells
        assert cells is not None
        n_copies = core.take_penalty_copies()
        m = core.next_penalty_chunk()
        if first_upload:
            self.arena.upload_step()
        else:
            self.arena.upload_in_apply()
        if n_copies:
            dst, src = (
                self.section("penalties.copy_dst")[:n_copies],
                self.section("penalties.copy_src")[:n_copies],
            )
            cells[dst] = cells[src]  # the right side is gathered (copied) first
        while m:
            rows, cols, vals = (
                self.section(f"penalties.ops_{k}")[:m] for k in ("rows", "cols", "vals")
            )
            cells.index_put_((rows, cols), vals, accumulate=True)
            m = core.next_penalty_chunk()
            if m:
                self.arena.upload_in_apply()

    # --- stable slots ---------------------------------------------------------------------

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
        self._row_map = _host_ints(row_to_slot)
        self.arena.begin_step()
        self.core.step_slots(
            self._row_map,
            None if sampled_token_ids is None else _host_ints(sampled_token_ids),
            None if slots is None else _host_ints(slots),
        )
        self._after_step()
        self._epoch += 1
        self._all_done = self._epoch

    def _need_stable(self, what: str) -> None:
        if not self.stable_slots:
            raise RuntimeError(f"{what}: this pipeline was built without stable_slots=True")

    # --- device views ---------------------------------------------------------------------

    def section(self, name: str, occurrence: int = 0) -> torch.Tensor:
        """The device (or zero-copy host) view of an arena section."""
        return self.arena.views[self._by_name[name][occurrence]]

    def triples(self, table: str, n: int, rowspace: bool = False) -> tuple[torch.Tensor, ...]:
        """The first ``n`` (padded) triples of a sparse table, cached per length."""
        prefix = f"rows.{table}" if rowspace else table
        key = (prefix, n)
        views = self._cache.get(key)
        if views is None:
            views = self._cache[key] = tuple(
                self.section(f"{prefix}.{k}")[:n] for k in ("rows", "cols", "vals")
            )
        return views

    def dense(self, name: str, rows: int, rowspace: bool, width: int = 1, occurrence: int = 0):
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

    # --- stable slots: apply --------------------------------------------------------------

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


def _reasoning_ids(config: Any) -> tuple[list[int], list[int]]:
    """The thinking budget's start and end markers, or a ValueError naming where they are set:
    our ``EngineConfig``'s fields, or vLLM's ``reasoning_config`` (whose token ids stay unset
    until its strings or its parser give them)."""
    reasoning = getattr(config, "reasoning_config", None)
    starts = getattr(reasoning, "reasoning_start_token_ids", None)
    ends = getattr(reasoning, "reasoning_end_token_ids", None)
    if starts is not None and ends is not None:
        return list(starts), list(ends)
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
    raise ValueError(f"ThinkingBudgetLogitsProcessor needs reasoning marker token ids: {where}")


def _config_int(read: Any, config: Any, field: str, least: int = 1) -> int:
    """A size from an engine config: an int >= ``least``, or a ValueError naming the field."""
    try:
        value = read(config)
    except Exception as e:
        raise ConfigError(f"config field '{field}': could not be read ({e})", field=field) from e
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(
            f"config field '{field}': must be an int >= {least}, got {value!r}", field=field
        )
    return value


def _host_ints(obj: Any) -> Any:
    """A host-side int sequence for the core: tensors and arrays as native int64 bytes (one
    copy), other sequences as they are. A device tensor is copied to the host first, which
    waits for it: pass the sampler's output already on the host."""
    if isinstance(obj, torch.Tensor):
        if obj.dtype == torch.int64 and obj.device.type == "cpu" and not obj.requires_grad:
            return obj.numpy().tobytes()  # the common case: one copy, no torch op
        if obj.dtype.is_floating_point or obj.dtype.is_complex or obj.dtype == torch.bool:
            raise ValueError(f"expected integer token ids or slots, got a {obj.dtype} tensor")
        return obj.detach().to("cpu", torch.int64).contiguous().numpy().tobytes()
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "iu":
            raise ValueError(f"expected integer token ids or slots, got a {obj.dtype} array")
        return np.ascontiguousarray(obj, dtype=np.int64).tobytes()
    return obj


class PipelineView(LogitsProcessor):
    """Base of processors whose state lives in a ``Pipeline``.

    ``TABLES`` names the core tables the processor needs. Built the vLLM way
    (``cls(vllm_config, device, is_pin_memory)``) a processor gets a pipeline of its own;
    ``build_logitsprocs`` builds one pipeline for all of them and passes ``pipeline=``.
    """

    TABLES: tuple[str, ...] = ()
    COLUMNS: tuple[Any, ...] = ()

    def __init__(
        self,
        vllm_config: Any,
        device: torch.device | str,
        is_pin_memory: bool,
        *,
        pipeline: Pipeline | None = None,
    ) -> None:
        if pipeline is None:
            pipeline = Pipeline(
                vllm_config, device, is_pin_memory, tables=self.TABLES, columns=self.COLUMNS
            )
        self._pipe = pipeline
        self._column_index = self._find_columns()
        pipeline.register(self)

    def _find_columns(self) -> list[int]:
        """Positions of this processor's declared columns in its pipeline (by identity)."""
        out = []
        for c in self.COLUMNS:
            for k, d in enumerate(self._pipe.columns):
                if d is c and k not in out:
                    out.append(k)
                    break
            else:
                raise ValueError(f"{type(self).__name__}: column {c.name!r} is not in the pipeline")
        return out

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

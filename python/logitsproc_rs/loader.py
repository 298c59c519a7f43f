"""Building the processor list: built-ins, entry-point plugins and ``module:Class`` names,
with vLLM 0.25.1's rules (``__init__.py`` §4 of the semantics note)."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Iterable, Sequence
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

import torch

from .builtin import (
    BUILTIN_LOGITS_PROCESSORS,
    OPT_IN_PROCESSORS,
    REASONING_TRANSFORMS,
    SAMPLER_TRANSFORMS_AFTER,
    SAMPLER_TRANSFORMS_BEFORE,
    SPEC_DECODE_BUILTINS,
)
from .errors import BatchUpdateError, ConfigError, LoadError
from .interface import LogitsProcessor, direction_name
from .params import as_engine_config, config_vllm_drafts
from .pipeline import Pipeline, resolve_device
from .state import LogitsProcessors
from .views import PipelineView

STR_POOLING_REJECTS_LOGITSPROCS = "Pooling models do not support custom logits processors."
STR_SPEC_DEC_REJECTS_LOGITSPROCS = (
    "Custom logits processors are not supported when speculative decoding is enabled."
)
STR_SPEC_DEC_WARNS_MIN_P_LOGIT_BIAS = (
    "min_p and logit_bias parameters won't work with speculative decoding."
)
# Our own entry-point group, plus vLLM's so its plugins load here unchanged.
LOGITSPROCS_GROUPS = ("logitsproc_rs.logits_processors", "vllm.logits_processors")
# Where vLLM's own ``LogitsProcessor`` lives: classes derived from it are accepted too.
VLLM_INTERFACE = "vllm.v1.sample.logits_processor.interface"

logger = logging.getLogger("logitsproc_rs")


def vllm_interface(cls: Any) -> ModuleType | None:
    """vLLM's interface module if ``cls`` derives from vLLM's own ``LogitsProcessor``.

    Found through the MRO, so a class that is not from vLLM never makes us import it (a class
    that is has already imported it)."""
    for base in getattr(cls, "__mro__", ()):
        if base.__name__ == "LogitsProcessor" and base.__module__ == VLLM_INTERFACE:
            return sys.modules.get(VLLM_INTERFACE)
    return None


def _is_processor_class(cls: type) -> bool:
    return issubclass(cls, LogitsProcessor) or vllm_interface(cls) is not None


def _load_plugins() -> list[type[LogitsProcessor]]:
    classes = []
    for group in LOGITSPROCS_GROUPS:
        eps = entry_points(group=group)
        if not eps:
            logger.debug("No logitsprocs plugins installed (group %s).", group)
            continue
        logger.debug("Loading installed logitsprocs plugins (group %s):", group)
        for ep in eps:
            logger.debug("- Loading logitproc plugin entrypoint %s", ep)
            try:
                classes.append(ep.load())
            except Exception as e:
                logger.error("Failed to load LogitsProcessor plugin %s: %s", ep, e)
                raise LoadError(f"Failed to load LogitsProcessor plugin {ep}") from e
    return classes


def _load_by_names(lps: Sequence[str | type] | None) -> list[type[LogitsProcessor]]:
    classes: list[type[LogitsProcessor]] = []
    for ldx, lp in enumerate(lps or ()):
        if isinstance(lp, type):
            logger.debug(" - Already-loaded logit processor: %s", lp.__name__)
            if not _is_processor_class(lp):
                raise ConfigError(f"{lp.__name__} is not a subclass of LogitsProcessor")
            classes.append(lp)
            continue
        if not isinstance(lp, str) or lp.count(":") != 1:
            raise ConfigError(
                f"Invalid logits processor FQCN '{lp}'. Expected format: '<module>:<type>'"
            )
        logger.debug("- Loading logits processor %s", lp)
        module_path, qualname = lp.split(":")
        try:
            obj: Any = importlib.import_module(module_path)
        except Exception as e:
            logger.error("Failed to load %sth LogitsProcessor plugin %s: %s", ldx, lp, e)
            raise LoadError(f"Failed to load {ldx}th LogitsProcessor plugin {lp}") from e
        for attr in qualname.split("."):
            obj = getattr(obj, attr)
        if not isinstance(obj, type):
            raise ConfigError("Loaded logit processor must be a type.")
        if not _is_processor_class(obj):
            raise ConfigError(f"{obj.__name__} must be a subclass of LogitsProcessor")
        classes.append(obj)
    return classes


def _vllm_batch_update(module: ModuleType, update: Any) -> Any:
    """``update`` in the types of vLLM's interface ``module`` (its ``BatchUpdate`` and its
    ``MoveDirectionality``, which vLLM's processors compare by identity)."""
    if update is None or isinstance(update, module.BatchUpdate):
        return update
    direction = module.MoveDirectionality
    moved = []
    for a, b, d in update.moved:
        name = direction_name(d)
        if name is None:
            raise BatchUpdateError.at(
                "moved",
                f"direction must be SWAP or UNIDIRECTIONAL, got {d!r}",
                where="batch update: ",
            )
        moved.append((a, b, direction[name]))
    return module.BatchUpdate(
        batch_size=update.batch_size, removed=update.removed, added=update.added, moved=moved
    )


def speak_vllm(proc: Any) -> Any:
    """A processor derived from vLLM's class gets every update in vLLM's types (its
    ``update_state`` is wrapped on the instance, so its type stays the user's own). Our bridges
    (``logitsproc_rs.vllm.v1``) read either kind and are left alone."""
    module = vllm_interface(type(proc))
    if module is None or getattr(proc, "ACCEPTS_ANY_BATCH_UPDATE", False):
        return proc
    own = proc.update_state

    def update_state(batch_update: Any) -> None:
        own(_vllm_batch_update(module, batch_update))

    proc.update_state = update_state
    return proc


def unbuilt_opt_in(tables: Iterable[str]) -> dict[str, str]:
    """The tables of our opt-in processors (ones vLLM does not have, so nobody else applies
    them) that ``tables`` lacks, each with how to get its processor: what a ``Pipeline``
    refuses by default, so a request that asks for one is refused, never run without it."""
    have = set(tables)
    return {
        t: f"build logitsproc_rs.{c.__name__} (build_logitsprocs(..., "
        f"custom_logitsprocs=[logitsproc_rs.{c.__name__}]))"
        for c in OPT_IN_PROCESSORS
        for t in c.TABLES
        if t not in have
    }


def build_logitsprocs(
    vllm_config: Any,
    device: torch.device | str,
    is_pin_memory: bool,
    is_pooling_model: bool = False,
    custom_logitsprocs: Iterable[str | type] = (),
    sampler_transforms: bool = True,
    *,
    token_feed: bool = False,
    stable_slots: bool = False,
    emulate_device: bool = False,
    max_rows: int | None = None,
    kernels: str | None = None,
) -> LogitsProcessors:
    """Every processor of the pipeline, in vLLM's application order.

    ``sampler_transforms`` adds what vLLM hard-codes in its sampler (allowed ids and bad words
    before the built-ins; penalties and, with a reasoning config, the thinking budget after the
    custom processors); with ``False`` the result is exactly vLLM's ``build_logitsprocs``:
    MinTokens, LogitBias, MinP, then plugins, then named processors. Pooling models get none.
    With speculative decoding every processor is built for per-position draft rows
    (``LogitsProcessors.apply_drafts``), a vLLM V1-style custom one only if it opts in
    (``APPLIES_TO_DRAFT_ROWS = True``; else vLLM's rejection); with ``EngineConfig(draft_rows=
    "vllm")`` exactly vLLM 0.25.1: only MinTokens (plus the sampler transforms), custom
    processors rejected.

    Every built-in (and every ``ColumnLogitsProcessor``) shares one ``Pipeline``: one Rust
    core, one update per step, one upload. ``token_feed=True`` makes it take the sampled token
    ids per step (``LogitsProcessors.update_state(update, sampled_token_ids=...)``) instead of
    re-reading the engine's output lists; ``stable_slots=True`` adds the stable-slot front-end
    (``Pipeline.add_request`` / ``apply(logits, row_to_slot)``); ``emulate_device=True`` keeps a
    separate device-side arena even on the CPU (tests of the upload path); ``kernels``
    (``"auto"``, ``"triton"``, ``"torch"``) chooses the device applies (default: the
    ``LOGITSPROC_KERNELS`` environment variable, else ``"auto"``). A mapping of
    ``EngineConfig`` fields is accepted as the config.
    """
    vllm_config = as_engine_config(vllm_config)
    custom = tuple(custom_logitsprocs)
    device = resolve_device(device)
    if is_pooling_model:
        if custom:
            raise ConfigError(STR_POOLING_REJECTS_LOGITSPROCS)
        return LogitsProcessors()
    before: list[Any] = list(SAMPLER_TRANSFORMS_BEFORE) if sampler_transforms else []
    after: list[Any] = list(SAMPLER_TRANSFORMS_AFTER) if sampler_transforms else []
    if sampler_transforms:
        after.extend(c for c in REASONING_TRANSFORMS if c.lacks(vllm_config) is None)
    if config_vllm_drafts(vllm_config):
        if custom:
            logger.error("%s Rejected: %s", STR_SPEC_DEC_REJECTS_LOGITSPROCS, custom)
            raise ConfigError(STR_SPEC_DEC_REJECTS_LOGITSPROCS)
        logger.warning(STR_SPEC_DEC_WARNS_MIN_P_LOGIT_BIAS)
        classes = [*before, *SPEC_DECODE_BUILTINS, *after]
    elif getattr(vllm_config, "speculative_config", None):
        # Per-position draft rows: every processor of ours applies on draft rows; a vLLM
        # V1-style processor only if it says it may (it sees no drafts: APPLIES_TO_DRAFT_ROWS).
        named = _load_by_names(custom)
        refused = [c for c in named if not _draft_ready(c)]
        if refused:
            logger.error("%s Rejected: %s", STR_SPEC_DEC_REJECTS_LOGITSPROCS, refused)
            raise ConfigError(
                f"{STR_SPEC_DEC_REJECTS_LOGITSPROCS} (draft rows: {', '.join(map(_name, refused))} "
                "neither a logitsproc_rs PipelineView nor APPLIES_TO_DRAFT_ROWS = True)"
            )
        plugins = []
        for c in _load_plugins():
            if _draft_ready(c):
                plugins.append(c)
            else:
                logger.warning("%s Skipped plugin: %s", STR_SPEC_DEC_REJECTS_LOGITSPROCS, c)
        classes = [
            *before,
            *BUILTIN_LOGITS_PROCESSORS,
            *plugins,
            *named,
            *after,
        ]
    else:
        classes = [
            *before,
            *BUILTIN_LOGITS_PROCESSORS,
            *_load_plugins(),
            *_load_by_names(custom),
            *after,
        ]
    views = [c for c in classes if isinstance(c, type) and issubclass(c, PipelineView)]
    pipeline = None
    if views or token_feed or stable_slots:
        tables = {t for c in views for t in c.tables_for(vllm_config)}
        columns = [col for c in views for col in c.COLUMNS]
        pipeline = Pipeline(
            vllm_config,
            device,
            is_pin_memory,
            tables=tables,
            columns=columns,
            token_feed=token_feed,
            stable_slots=stable_slots,
            emulate_device=emulate_device,
            max_rows=max_rows,
            kernels=kernels,
            refuse=unbuilt_opt_in(tables),
        )
    procs = [
        ctor(vllm_config, device, is_pin_memory, pipeline=pipeline)
        if isinstance(ctor, type) and issubclass(ctor, PipelineView)
        else speak_vllm(ctor(vllm_config, device, is_pin_memory))
        for ctor in classes
    ]
    return LogitsProcessors(procs, pipeline=pipeline)


STR_SPEC_DEC_REJECTS_MIN_P_LOGIT_BIAS = (
    "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
)


def _draft_ready(cls: Any) -> bool:
    """Whether a processor class may run on draft rows: ours (a ``PipelineView``: per-position
    semantics), or a vLLM V1-style one that opts in (``APPLIES_TO_DRAFT_ROWS = True``: it is
    applied to each draft position as to a batch of committed requests)."""
    return (isinstance(cls, type) and issubclass(cls, PipelineView)) or bool(
        getattr(cls, "APPLIES_TO_DRAFT_ROWS", False)
    )


def _name(cls: Any) -> str:
    return getattr(cls, "__qualname__", None) or repr(cls)


def validate_sampling_params(vllm_config: Any, params: Any) -> None:
    """Front-end checks that depend on the engine, as vLLM's request validation: with
    speculative decoding in vLLM's mode (``draft_rows="vllm"``), min_p and logit_bias are
    rejected (per-position draft rows apply them); a thinking budget needs the reasoning
    start/end ids configured."""
    if config_vllm_drafts(vllm_config) and (
        (getattr(params, "min_p", 0.0) or 0.0) > 1e-5 or getattr(params, "logit_bias", None)
    ):
        raise ConfigError(STR_SPEC_DEC_REJECTS_MIN_P_LOGIT_BIAS)
    if (
        getattr(params, "thinking_token_budget", None) is not None
        and getattr(vllm_config, "reasoning_config", None) is None
    ):
        raise ConfigError(
            "thinking_token_budget is set but reasoning_config is not configured "
            "(set EngineConfig.reasoning_start_token_ids / reasoning_end_token_ids)"
        )


def validate_logits_processors_parameters(
    logits_processors: Sequence[str | type] | None, sampling_params: Any
) -> None:
    """Run every custom processor's ``validate_params`` on one request (built-ins excluded)."""
    for cls in _load_plugins() + _load_by_names(logits_processors):
        cls.validate_params(sampling_params)

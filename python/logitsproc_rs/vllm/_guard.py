"""No request stops the engine: what the bridges check at vLLM's front end, and how a request
that only the worker can refuse is failed closed. Shared by ``v1`` and ``v2``; imports no vLLM.

**At the front end** (``validate_params``, which vLLM calls with the request alone) everything
that needs no vocabulary is checked: types, ranges, unknown fields, and the per-request caps
(vLLM engines always get the default caps, ``params.config_cap``).

**Which processors the engine loaded** is known there too: vLLM calls each loaded class's
``validate_params`` from its validator, whose frame holds the loaded list
(``front_end_classes``), so a field whose processor the engine did not load is refused with
the class to load (``_group.Bridge.validate_params``), an HTTP 400 over ``vllm serve``.

**In the worker**, a token id outside the vocabulary (which ``validate_params`` cannot know) is
refused there. Raising would kill vLLM's engine with every request in flight, and dropping the
request's fields would sample it unconstrained, so the request is *failed closed*: our tables
read it as neutral, and every step its logits row is −inf except its stop tokens (its
``all_stop_token_ids``: EOS and its ``stop_token_ids``; the model's EOS when it has none),
which get 0. It ends at its next token with ``finish_reason="stop"`` (with ``ignore_eos`` it
emits only stop tokens until ``max_tokens``), and the reason is logged at ERROR on the
``logitsproc_rs`` logger, naming the request and the field.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import Any

import torch

from ..errors import RequestError
from ..params import SamplingParams
from ..registry import CAP_DEFAULTS, TABLES, Field
from ._fields import FIELD_TABLE, dict_label

logger = logging.getLogger("logitsproc_rs")

_NEUTRAL = SamplingParams(max_tokens=None)


def _field(attr: str) -> Field:
    """The registry's field read from ``attr`` (or named ``attr``)."""
    return next(f for t in TABLES.values() for f in t.fields if attr in (f.attr, f.name))


def check_caps(
    where: str,
    ours: SamplingParams,
    request: Any,
    tables: Iterable[str],
    label: Callable[[str], str] | None = None,
) -> None:
    """The per-request caps of ``tables``, at the front end (``RequestError`` naming the field
    as ``label(name)``, the form the request used: ``_fields.read_namespace``). Which cap
    bounds which field, its default and what an entry is called come from the core's registry;
    what is counted is what the worker's table is given: distinct allowed ids, and for
    min-tokens the namespace's stop ids, with our min_tokens also the request's own plus EOS,
    which the engine adds after the front end. A cap holds whether or not the field is in use
    (stop ids without min_tokens). ``label`` defaults to the Python form's."""
    tables = set(tables)
    label = label or dict_label()

    def refuse(name: str, detail: str) -> None:
        raise RequestError.located(None, name, detail, label=label(name), where=where)

    def over(name: str, count: int, cap: str, what: str = "entries") -> None:
        if count > CAP_DEFAULTS[cap]:
            refuse(name, f"{count} {what} exceed the per-request cap of {CAP_DEFAULTS[cap]}")

    def counted(attr: str, count: int, what: str = "entries") -> None:
        over(attr, count, _field(attr).caps[0], what)

    for t in TABLES.values():
        if t.name not in tables:
            continue
        for f in t.fields:
            if not f.caps:
                continue
            if f.kind == "int":
                # The core checks these whether or not the processor is on for the request
                # (size or multiplier 0), so the front end does too.
                value, cap = getattr(ours, f.attr), f.caps[0]
                if value > CAP_DEFAULTS[cap]:
                    refuse(
                        f.attr,
                        f"{value} is above the per-request cap of {CAP_DEFAULTS[cap]} ({cap})",
                    )
            elif f.kind == "id_lists":
                lists = getattr(ours, f.attr)
                if lists:
                    over(f.attr, len(lists), f.caps[0], f"{f.item}s")
                    over(f.attr, max(map(len, lists)), f.caps[1], f"tokens in a {f.item}")
    if "logit_bias" in tables and ours.logit_bias:
        counted("logit_bias", len(ours.logit_bias))
    if "min_tokens" in tables:
        # What the worker's table is given (``_fields.Routed``), capped whether or not
        # min_tokens is on: the namespace's stop ids, and with our min_tokens the request's
        # own and EOS too.
        named = set(ours.stop_token_ids or ())
        if ours.min_tokens:
            named |= set(getattr(request, "stop_token_ids", None) or ())
            counted("stop_token_ids", len(named) + 1, "stop ids (with EOS)")
        else:
            counted("stop_token_ids", len(named), "stop ids")
    if "allowed" in tables and ours.allowed_token_ids:
        counted("allowed_token_ids", len(set(ours.allowed_token_ids)))
    if "no_repeat_ngram" in tables and ours.no_repeat_ngram_whitelist:
        counted("no_repeat_ngram_whitelist", len(ours.no_repeat_ngram_whitelist))


def front_end_classes(caller: FrameType) -> Sequence[Any] | None:
    """The logits-processor classes vLLM's front end checks a request with, read from the frame
    that called a bridge's ``validate_params`` (``caller``); ``None`` where that is not a
    validator of vLLM's that this reads (a warning says so once, when it is vLLM's):

    - V1 (vLLM 0.25.1 to 0.32, ``vllm/v1/sample/logits_processor/__init__.py``):
      ``validate_logits_processors_parameters(logits_processors, params)`` loops over
      ``cached_load_custom_logitsprocs(logits_processors)``, an ``lru_cache``: the same call
      again returns the list it loops over (the entry-point plugins included);
    - MRV2 (0.32, ``vllm/v1/worker/gpu/sample/logits_processor/loader.py``): the closure
      ``validate_params`` that ``build_custom_logits_processors_params_validator`` returns
      loops over its ``classes``."""
    code = caller.f_code
    if code.co_name == "validate_logits_processors_parameters":
        load = caller.f_globals.get("cached_load_custom_logitsprocs")
        if callable(load) and "logits_processors" in caller.f_locals:
            return list(load(caller.f_locals["logits_processors"]))
    elif code.co_name == "validate_params" and "classes" in code.co_freevars:
        classes = caller.f_locals.get("classes")
        if isinstance(classes, Sequence):
            return classes
    module = str(caller.f_globals.get("__name__", ""))
    if module.startswith("vllm.") and module not in _UNREAD_VALIDATORS:
        _UNREAD_VALIDATORS.add(module)
        logger.warning(
            "%s.%s calls validate_params in a way this version of logitsproc_rs does not read: "
            "a field whose processor the engine did not load is failed closed in the worker "
            "instead of refused at the front end",
            module,
            code.co_name,
        )
    return None


_UNREAD_VALIDATORS: set[str] = set()


def refused_index(error: ValueError, candidates: Iterable[int]) -> int | None:
    """The request (one of ``candidates``, the step's added indices or slots) whose
    parameters an error refuses: a ``RequestError``'s ``index``; ``None`` for anything else.
    No message is read: a custom processor that wants one request failed closed rather than
    the step refused raises ``RequestError(..., index=i)`` (docs/custom-processors.md)."""
    index = error.index if isinstance(error, RequestError) else None
    return index if index is not None and index in set(candidates) else None


class Refused:
    """A request failed closed, as our tables and columns read it: neutral everywhere (no
    built-in field, no ``extra_args``); everything else from the request."""

    __slots__ = ("_request",)

    all_stop_token_ids: frozenset[int] = frozenset()
    extra_args = None

    def __init__(self, request: Any) -> None:
        self._request = request

    def __getattr__(self, name: str) -> Any:
        if name in FIELD_TABLE:
            return getattr(_NEUTRAL, name)
        return getattr(self._request, name)


def model_eos(vllm_config: Any) -> int:
    """The model's EOS id from vLLM's config (its first, when it lists several); 0 without."""
    hf = getattr(getattr(vllm_config, "model_config", None), "hf_text_config", None)
    eos = getattr(hf, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    return eos if isinstance(eos, int) and eos >= 0 else 0


def forced_tokens(request: Any, vocab_size: int, eos: int) -> list[int]:
    """What a failed-closed request may still emit: its stop tokens inside the vocabulary,
    else the model's EOS."""
    stops = getattr(request, "all_stop_token_ids", None) or ()
    ids = sorted(t for t in stops if isinstance(t, int) and 0 <= t < vocab_size)
    return ids or [eos if 0 <= eos < vocab_size else 0]


def log_refused(what: str, error: Exception, tokens: list[int]) -> None:
    logger.error(
        "%s failed closed: %s. Only its stop tokens %s can be sampled, so it ends at its next "
        "token; the engine and the other requests go on.",
        what,
        error,
        tokens,
    )


class ForcedRows:
    """The rows of failed-closed requests and what each may emit (``rows``: row or slot →
    tokens), applied through index tensors rebuilt only when the set or the batch changes."""

    def __init__(self) -> None:
        self.rows: dict[int, list[int]] = {}
        self._key: Any = None
        self._tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def __bool__(self) -> bool:
        return bool(self.rows)

    def apply_(self, logits: torch.Tensor, row_slots: Any = None) -> torch.Tensor:
        """In place: each listed row −inf but its tokens, which get 0. ``row_slots``: the
        slot of each logits row (stable slots), when ``rows`` is keyed by slot."""
        n = logits.shape[0]
        key = (n, logits.device, None if row_slots is None else id(row_slots))
        if key != self._key or self._tensors is None:
            if row_slots is None:
                rows = [(r, self.rows[r]) for r in sorted(self.rows) if r < n]
            else:
                rows = [(r, self.rows[s]) for r, s in enumerate(row_slots) if s in self.rows]
            dev = logits.device
            self._tensors = (
                torch.tensor([r for r, _ in rows], dtype=torch.int64, device=dev),
                torch.tensor([r for r, ts in rows for _ in ts], dtype=torch.int64, device=dev),
                torch.tensor([t for _, ts in rows for t in ts], dtype=torch.int64, device=dev),
            )
            self._key = key
        rows_t, pair_rows, pair_tokens = self._tensors
        logits.index_fill_(0, rows_t, float("-inf"))
        logits[pair_rows, pair_tokens] = 0.0
        return logits

    def changed(self) -> None:
        """The set changed (the cached index tensors are stale)."""
        self._key = None

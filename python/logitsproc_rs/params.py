"""``SamplingParams`` and ``EngineConfig``: the parts of vLLM's that the processors read.

Field names are vLLM 0.25.1's, so code written for vLLM reads them unchanged; processors also
accept vLLM's own ``SamplingParams`` (they only read attributes). Values are validated on
construction with vLLM's ranges; a bad one raises ``ValueError`` naming the field (a
``RequestError``, or a ``ConfigError`` for the engine's settings, with the field as ``field``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from types import SimpleNamespace
from typing import Any, TypeGuard

from ._core import field_range_error
from .errors import ConfigError, LogitsprocError, RequestError, SizeError
from .registry import CAP_DEFAULTS, INT_FIELD_RANGE, NEUTRAL, OFF_AT_MOST, TABLES

# A request with this repetition penalty (and zero frequency and presence penalties) has
# none: the one neutral value every Python reader compares with.
NEUTRAL_REPETITION_PENALTY = NEUTRAL["repetition_penalty"]
# The per-request caps' defaults (the core's registry): ``EngineConfig``'s, and what a vLLM
# engine gets.
DEFAULT_MAX_LOGIT_BIAS_ENTRIES = CAP_DEFAULTS["max_logit_bias_entries"]
DEFAULT_MAX_STOP_TOKEN_IDS = CAP_DEFAULTS["max_stop_token_ids"]
DEFAULT_MAX_BAD_WORDS = CAP_DEFAULTS["max_bad_words"]
DEFAULT_MAX_BAD_WORD_LEN = CAP_DEFAULTS["max_bad_word_len"]
DEFAULT_MAX_ALLOWED_TOKEN_IDS = CAP_DEFAULTS["max_allowed_token_ids"]

_SAMPLING_EPS = 1e-5  # temperature below this is greedy (vLLM sampler.py:17)
_MAX_TEMP = 1e-2  # 0 < temperature < this is raised to it (vLLM sampling_params.py:449-458)


class SamplingType(IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _as_float(v: Any) -> float | None:
    """A number (not a bool) as a float; ``None`` for anything else, or an int too large for
    a float (``float(10**400)`` raises ``OverflowError``, which is no ``ValueError``)."""
    if not _is_number(v):
        return None
    try:
        return float(v)
    except OverflowError:
        return None


def _show(v: Any) -> str:
    """A value for an error message: its repr, or what it is when that fails (an int of more
    than 4300 digits has no repr; a user object's ``__repr__`` may raise)."""
    try:
        return repr(v)
    except Exception:
        if isinstance(v, int):
            return f"an int of {v.bit_length()} bits"
        return f"a {type(v).__name__}"


def _real(name: str, v: Any) -> float:
    """The one reader of a float request field: an int or a float (not a bool), as a float
    that is no NaN. Anything else, an int too large for a float (``float(10**400)`` raises
    ``OverflowError``, no ``ValueError``) or NaN is a ``RequestError`` naming the field; the
    caller checks the range."""
    if not _is_number(v):
        raise RequestError(f"{name} must be a number, got {_show(v)}", field=name)
    x = _as_float(v)
    if x is None:
        raise RequestError(f"{name} must be a number, got an int too large for a float", field=name)
    if math.isnan(x):
        raise RequestError(f"{name} must be a number, got nan", field=name)
    return x


def _int(name: str, v: Any) -> int:
    """The one reader of an int request field: an int (not a bool) within the core's range
    (``INT_FIELD_RANGE``), else a ``RequestError`` naming the field; the caller checks the
    field's own range (``_in_declared_range``)."""
    if not _is_int(v):
        raise RequestError(f"{name} must be an int, got {_show(v)}", field=name)
    lo, hi = INT_FIELD_RANGE
    if not lo <= v <= hi:
        raise RequestError(
            f"{name} must be in [{lo}, {hi}] (what the core reads), got {_show(v)}", field=name
        )
    return v


def _in_declared_range(name: str, x: float) -> None:
    """``x`` (read by ``_real``, or ``_int`` for an int field) inside field ``name``'s range as
    the core's registry declares it, else a ``RequestError`` naming the field with the core's
    own words (``field_range_error``). A range's engine cap (``dry_penalty_last_n <=
    max_dry_penalty_last_n``) is the core's to check: the front end knows no engine."""
    detail = field_range_error(name, x)
    if detail is not None:
        raise RequestError(f"{name} {detail}", field=name)


def _in_range(
    name: str,
    x: float,
    lo: float,
    hi: float,
    lo_open: bool = False,
    hi_open: bool = False,
    note: str = "",
) -> None:
    """``x`` (read by ``_real``) within ``lo .. hi`` (open ends as asked), else a
    ``RequestError`` naming the field (``note``: after the range in the message)."""
    if (x <= lo if lo_open else x < lo) or (x >= hi if hi_open else x > hi):
        lo_b, hi_b = "(" if lo_open else "[", ")" if hi_open else "]"
        raise RequestError(f"{name} must be in {lo_b}{lo}, {hi}{hi_b}{note}, got {x}", field=name)


# The request fields the core's tables read, by kind: every one is read through the one reader
# of its kind (``SamplingParams._read_registry_fields``), so a new field inherits it.
_FIELDS_OF_KIND: dict[str, tuple[str, ...]] = {
    kind: tuple(dict.fromkeys(f.attr for t in TABLES.values() for f in t.fields if f.kind == kind))
    for kind in ("float", "int", "opt_int")
}


_MAX_SIZE = 2**62


def config_size(value: Any, field: str, least: int = 1) -> int:
    """A size from an engine config: an int (numpy's too) >= ``least``. A bool, float, str or
    anything else is a ``ConfigError`` naming the field (``True`` is no size, ``4.0`` and
    ``"4"`` are not taken as 4)."""
    n = None
    if not isinstance(value, bool):
        with contextlib.suppress(TypeError):
            n = operator.index(value)
    if n is None or n < least:
        raise ConfigError.at(
            field, f"must be an int >= {least}, got {_show(value)}", where="config "
        )
    if n > _MAX_SIZE:
        # Beyond any table (the core names the bound of each); here only so that the
        # conversion to the core's sizes cannot overflow.
        raise SizeError.at(field, f"{_show(n)} is beyond any supported size", where="config ")
    return n


# Most items read from one list of a request (an endless iterable ends in an error); the core's
# per-request caps are far below it.
_MAX_ITEMS = 1 << 22


def _items(name: str, ids: Any, what: str, error: type[LogitsprocError]) -> list[Any]:
    """The items of a list-like field, read once and at most ``_MAX_ITEMS`` of them: a str, a
    non-iterable, or one whose iteration raises (a 0-d tensor, a lying ``__len__``, a user
    ``__iter__``) is ``error`` naming the field; an interrupt propagates."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise error(f"{name} must be {what}, got {_show(ids)}", field=name)
    try:
        out = list(itertools.islice(iter(ids), _MAX_ITEMS + 1))
    except Exception as e:
        raise error(f"{name} must be {what}; reading it raised {e!r}", field=name) from e
    if len(out) > _MAX_ITEMS:
        raise error(f"{name}: more than {_MAX_ITEMS} items", field=name)
    return out


def _token_ids(name: str, ids: Any, error: type[LogitsprocError] = RequestError) -> list[int]:
    out = _items(name, ids, "a list of token ids", error)
    for t in out:
        if not _is_int(t) or not 0 <= t <= INT_FIELD_RANGE[1]:
            raise error(
                f"{name} must contain token ids (ints in [0, {INT_FIELD_RANGE[1]}]), "
                f"got {_show(t)}",
                field=name,
            )
    return out


def _id_lists(name: str, lists: Any, what: str) -> list[list[int]]:
    """A list of non-empty token-id lists (bad words, DRY's breakers): the outer list and each
    inner one read by ``_items`` (bounded, a raising iteration refused), every id by
    ``_token_ids``; an empty inner list is refused (``what``: what one is called)."""
    out = []
    for ids in _items(name, lists, "a list of token-id lists", RequestError):
        ids = _token_ids(name, ids)
        if not ids:
            raise RequestError(f"{name} must not contain an empty {what}", field=name)
        out.append(ids)
    return out


def validate_thinking_token_budget(budget: Any) -> int | None:
    """vLLM's rule: None -> None; -1 -> None (unlimited); an int >= 0 is kept; anything else
    (bool, float, other negative) is an error (the range is the core's declaration)."""
    if budget is None:
        return None
    budget = _int("thinking_token_budget", budget)
    _in_declared_range("thinking_token_budget", budget)
    return None if budget == -1 else budget


@dataclass
class SamplingParams:
    """Per-request sampling parameters (vLLM names)."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = NEUTRAL_REPETITION_PENALTY
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    eos_token_id: int | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words_token_ids: list[list[int]] | None = None
    thinking_token_budget: int | None = None
    # llama.cpp's penalty window (ours, not vLLM's): the three penalties over the last n
    # positions of prompt + output only. None or -1: the whole history (vLLM's), 0: off.
    penalty_last_n: int | None = None
    # HF's no-repeat-ngram (ours, not vLLM's; 0: off): never repeat an n-gram of the sequence.
    no_repeat_ngram_size: int = NEUTRAL["no_repeat_ngram_size"]
    # DeepSeek-OCR's variant (each off by default: HF's rule): only n-grams inside the last w
    # tokens (0: the engine's max_no_repeat_ngram_window), the output alone (not the prompt),
    # token ids never banned.
    no_repeat_ngram_window: int = NEUTRAL["no_repeat_ngram_window"]
    no_repeat_ngram_output_only: bool = False
    no_repeat_ngram_whitelist: list[int] | None = None
    # Truncations beyond vLLM (ours; opt-in, applied after temperature and MinP, before
    # top-k/top-p): llama.cpp's top-n-sigma (<= 0 or None: off, stored as 0.0), HF's typical-p
    # (in (0, 1], 1: off), epsilon and eta cutoffs (in [0, 1), 0: off). None reads as off.
    top_n_sigma: float | None = NEUTRAL["top_n_sigma"]
    typical_p: float | None = NEUTRAL["typical_p"]
    epsilon_cutoff: float | None = NEUTRAL["epsilon_cutoff"]
    eta_cutoff: float | None = NEUTRAL["eta_cutoff"]
    # XTC, "exclude top choices" (ours; llama.cpp's, opt-in, argmax-invariant phase after the
    # truncations): with probability xtc_probability (in [0, 1], 0: off) per step, remove every
    # token with probability >= xtc_threshold (in (0, 1], > 0.5: off) except the least likely.
    # Random rows only: a greedy request's xtc_probability is reset to 0. None reads as off /
    # the default threshold.
    xtc_probability: float | None = NEUTRAL["xtc_probability"]
    xtc_threshold: float | None = NEUTRAL["xtc_threshold"]
    # The kept top-k / top-p (ours; opt-in, TopKTopPLogitsProcessor): vLLM's top-k then top-p
    # kept set, applied last in the argmax-invariant phase by a processor instead of the
    # sampler (kept_top_k: 0 or -1 off, stored as 0; kept_top_p in (0, 1], 1 or None off).
    # Not top_k / top_p above, which Sampler applies itself; reset for a greedy request.
    kept_top_k: int = NEUTRAL["kept_top_k"]
    kept_top_p: float | None = NEUTRAL["kept_top_p"]
    # llama.cpp's DRY (ours; opt-in; dry_multiplier 0: off): penalise the tokens that would
    # extend a repetition of the sequence's suffix (prompt included), multiplier *
    # base^(len - allowed_length); over the last dry_penalty_last_n tokens (-1: the whole
    # sequence up to EngineConfig.max_dry_penalty_last_n, 0: off); a repetition never reaches
    # back past a sequence breaker (token-id sequences, head first; tails past 20 tokens are cut,
    # as llama.cpp does; none by default: we have no tokenizer to find llama.cpp's "\n", ":",
    # "\"", "*").
    dry_multiplier: float = NEUTRAL["dry_multiplier"]
    dry_base: float = NEUTRAL["dry_base"]
    dry_allowed_length: int = NEUTRAL["dry_allowed_length"]
    dry_penalty_last_n: int = NEUTRAL["dry_penalty_last_n"]
    dry_sequence_breakers: list[list[int]] | None = None
    # Free-form per-request arguments for custom processors (vLLM's ``extra_args``).
    extra_args: dict[str, Any] | None = None
    _all_stop_token_ids: set[int] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self._verify()
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.thinking_token_budget = validate_thinking_token_budget(self.thinking_token_budget)
        if self.top_k == -1:
            self.top_k = 0
        for name, (most, neutral) in OFF_AT_MOST.items():  # kept_top_k's -1, top_n_sigma <= 0
            v = getattr(self, name)
            if v is not None and v <= most:
                setattr(self, name, neutral)
        if 0 < self.temperature < _MAX_TEMP:
            self.temperature = _MAX_TEMP
        if self.temperature < _SAMPLING_EPS:
            # Greedy: the random-sampling knobs are reset, as vLLM does.
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            self.kept_top_p, self.kept_top_k = 1.0, 0
            self.xtc_probability = 0.0  # XTC only ever acts on rows that sample randomly
        self._all_stop_token_ids = set(self.stop_token_ids)
        if self.eos_token_id is not None:
            # vLLM adds EOS to the stop set even with ignore_eos.
            self._all_stop_token_ids.add(self.eos_token_id)

    def _read_registry_fields(self) -> None:
        """Every float and int field the core's tables read (the registry), through the one
        reader of its kind, before any field's own range: a float field by ``_real`` (None is
        the neutral value, set by ``_verify_ranges``), an int field by ``_int`` (None only for
        an optional one)."""
        for name in _FIELDS_OF_KIND["float"]:
            v = getattr(self, name, None)
            if v is not None:
                _real(name, v)
        for kind in ("int", "opt_int"):
            for name in _FIELDS_OF_KIND[kind]:
                v = getattr(self, name, None)
                if v is None and (kind == "opt_int" or not hasattr(self, name)):
                    continue
                _int(name, v)

    def _verify_ranges(self) -> None:
        """Every number field of the core's registry (floats and ints) in its declared range:
        the core's own check and words (``_in_declared_range``), after ``_read_registry_fields``
        read it. None reads as a float's neutral value where the field's type allows it (ours
        beyond vLLM's; vLLM's own take no None), and an optional int's None is unset (a value
        where the field is off becomes its neutral one after: ``OFF_AT_MOST``)."""
        for name in _FIELDS_OF_KIND["float"]:
            v = getattr(self, name)
            if v is None and name in _NONE_IS_NEUTRAL:
                setattr(self, name, NEUTRAL[name])
                continue
            _in_declared_range(name, _real(name, v))
        for name in _FIELDS_OF_KIND["int"] + _FIELDS_OF_KIND["opt_int"]:
            v = getattr(self, name, None)
            if v is not None:
                _in_declared_range(name, v)

    def _verify(self) -> None:
        self._read_registry_fields()

        def number(name: str, lo: float, hi: float, lo_open: bool = False) -> None:
            _in_range(name, _real(name, getattr(self, name)), lo, hi, lo_open=lo_open)

        if not _is_int(self.n) or self.n < 1:
            raise RequestError(f"n must be an int >= 1, got {_show(self.n)}", field="n")
        self._verify_ranges()
        number("temperature", 0.0, math.inf)
        if math.isinf(self.temperature):
            raise RequestError("temperature must be finite, got inf", field="temperature")
        number("top_p", 0.0, 1.0, lo_open=True)
        if not _is_int(self.top_k) or self.top_k < -1:
            raise RequestError(
                f"top_k must be -1, 0 (disabled) or a positive int, got {_show(self.top_k)}",
                field="top_k",
            )
        if self.seed is not None and not _is_int(self.seed):
            raise RequestError(f"seed must be an int or None, got {_show(self.seed)}", field="seed")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise RequestError(
                f"max_tokens must be an int >= 1, got {_show(self.max_tokens)}", field="max_tokens"
            )
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise RequestError(
                f"min_tokens must be <= max_tokens={self.max_tokens}, got {self.min_tokens}",
                field="min_tokens",
            )
        if not isinstance(self.no_repeat_ngram_output_only, bool):
            raise RequestError(
                f"no_repeat_ngram_output_only must be a bool, "
                f"got {self.no_repeat_ngram_output_only!r}",
                field="no_repeat_ngram_output_only",
            )
        if self.no_repeat_ngram_whitelist is not None:
            self.no_repeat_ngram_whitelist = _token_ids(
                "no_repeat_ngram_whitelist", self.no_repeat_ngram_whitelist
            )
        if self.dry_sequence_breakers is not None:
            self.dry_sequence_breakers = _id_lists(
                "dry_sequence_breakers", self.dry_sequence_breakers, "sequence"
            )
        if self.logprobs is not None and (not _is_int(self.logprobs) or self.logprobs < 0):
            raise RequestError(
                f"logprobs must be an int >= 0, got {_show(self.logprobs)}", field="logprobs"
            )
        if self.stop_token_ids is not None:
            self.stop_token_ids = _token_ids("stop_token_ids", self.stop_token_ids)
        if self.eos_token_id is not None and (
            not _is_int(self.eos_token_id) or self.eos_token_id < 0
        ):
            raise RequestError(
                f"eos_token_id must be a non-negative int, got {_show(self.eos_token_id)}",
                field="eos_token_id",
            )
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise RequestError(
                    f"logit_bias must be a dict, got {type(self.logit_bias).__name__}",
                    field="logit_bias",
                )
            clean: dict[int, float] = {}
            for k, v in self.logit_bias.items():
                tok = int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k
                if not _is_int(tok) or not 0 <= tok <= INT_FIELD_RANGE[1]:
                    raise RequestError(
                        f"logit_bias keys must be non-negative token ids, got {_show(k)}",
                        field="logit_bias",
                    )
                f = _as_float(v)
                if f is None or not math.isfinite(f):
                    raise RequestError(
                        f"logit_bias value for token {_show(k)} must be a finite number, "
                        f"got {_show(v)}",
                        field="logit_bias",
                    )
                clean[tok] = f
            self.logit_bias = clean
        if self.extra_args is not None and not isinstance(self.extra_args, dict):
            raise RequestError(
                f"extra_args must be a dict or None, got {type(self.extra_args).__name__}",
                field="extra_args",
            )
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = _token_ids("allowed_token_ids", self.allowed_token_ids)
            if not self.allowed_token_ids:
                raise RequestError("allowed_token_ids must not be empty", field="allowed_token_ids")
        if self.bad_words_token_ids is not None:
            self.bad_words_token_ids = _id_lists(
                "bad_words_token_ids", self.bad_words_token_ids, "word"
            )

    @property
    def all_stop_token_ids(self) -> set[int]:
        """stop_token_ids ∪ {eos_token_id} (EOS included even with ignore_eos, as vLLM)."""
        return self._all_stop_token_ids

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < _SAMPLING_EPS:
            return SamplingType.GREEDY
        if self.seed is not None:
            return SamplingType.RANDOM_SEED
        return SamplingType.RANDOM


# The fields where None reads as the neutral value: their type says so (ours beyond vLLM's).
_NONE_IS_NEUTRAL = frozenset(
    f.name for f in dataclasses.fields(SamplingParams) if "None" in str(f.type)
)


@dataclass
class EngineConfig:
    """Engine-wide settings the processors are built with.

    Also answers ``scheduler_config.max_num_seqs``, ``model_config.get_vocab_size()``,
    ``speculative_config`` and ``reasoning_config`` like vLLM's ``VllmConfig``, so processors
    written for vLLM read it unchanged.
    """

    max_num_seqs: int = 256
    vocab_size: int = 32000
    # Stated per-request caps: the Rust tables are sized max_num_seqs × cap and never grow.
    max_logit_bias_entries: int = DEFAULT_MAX_LOGIT_BIAS_ENTRIES
    max_stop_token_ids: int = DEFAULT_MAX_STOP_TOKEN_IDS
    max_bad_words: int = DEFAULT_MAX_BAD_WORDS
    max_bad_word_len: int = DEFAULT_MAX_BAD_WORD_LEN
    max_allowed_token_ids: int = DEFAULT_MAX_ALLOWED_TOKEN_IDS
    max_no_repeat_ngram_size: int = CAP_DEFAULTS["max_no_repeat_ngram_size"]
    max_no_repeat_ngram_window: int = CAP_DEFAULTS["max_no_repeat_ngram_window"]
    max_no_repeat_ngram_whitelist: int = CAP_DEFAULTS["max_no_repeat_ngram_whitelist"]
    max_dry_penalty_last_n: int = CAP_DEFAULTS["max_dry_penalty_last_n"]
    max_dry_sequence_breakers: int = CAP_DEFAULTS["max_dry_sequence_breakers"]
    max_dry_sequence_breaker_len: int = CAP_DEFAULTS["max_dry_sequence_breaker_len"]
    # Speculative decoding: number of draft tokens per request, or None when off.
    num_speculative_tokens: int | None = None
    # How speculative decoding builds and applies the processors: "per_position" (every
    # processor on every draft row, over the history the row follows: ours) or "vllm" (vLLM
    # 0.25.1 exactly: MinTokens only, custom processors, min_p and logit_bias rejected).
    draft_rows: str = "per_position"
    # Reasoning ("thinking") markers; both None when the model has no thinking section.
    reasoning_start_token_ids: list[int] | None = None
    reasoning_end_token_ids: list[int] | None = None

    def __post_init__(self) -> None:
        for name in (
            "max_num_seqs",
            "vocab_size",
            "max_logit_bias_entries",
            "max_stop_token_ids",
            "max_bad_words",
            "max_bad_word_len",
            "max_allowed_token_ids",
            "max_no_repeat_ngram_size",
            "max_no_repeat_ngram_window",
            "max_no_repeat_ngram_whitelist",
            "max_dry_penalty_last_n",
            "max_dry_sequence_breakers",
            "max_dry_sequence_breaker_len",
        ):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise ConfigError(
                    f"EngineConfig.{name} must be an int >= 1, got {_show(v)}", field=name
                )
        if self.vocab_size >= 2**31:
            raise ConfigError(
                "EngineConfig.vocab_size must be < 2**31 (token ids are int32)", field="vocab_size"
            )
        if self.num_speculative_tokens is not None and (
            not _is_int(self.num_speculative_tokens) or self.num_speculative_tokens < 1
        ):
            raise ConfigError(
                f"EngineConfig.num_speculative_tokens must be None or an int >= 1, "
                f"got {_show(self.num_speculative_tokens)}",
                field="num_speculative_tokens",
            )
        if self.draft_rows not in DRAFT_ROW_MODES:
            raise ConfigError(
                f"EngineConfig.draft_rows must be one of {DRAFT_ROW_MODES}, "
                f"got {_show(self.draft_rows)}",
                field="draft_rows",
            )
        starts, ends = self.reasoning_start_token_ids, self.reasoning_end_token_ids
        if (starts is None) != (ends is None):
            raise ConfigError(
                "EngineConfig.reasoning_start_token_ids and reasoning_end_token_ids "
                "must be set together",
                field="reasoning_start_token_ids",
            )
        if starts is not None:
            self.reasoning_start_token_ids = _token_ids(
                "reasoning_start_token_ids", starts, ConfigError
            )
            self.reasoning_end_token_ids = _token_ids("reasoning_end_token_ids", ends, ConfigError)

    @property
    def scheduler_config(self) -> SimpleNamespace:
        return SimpleNamespace(max_num_seqs=self.max_num_seqs)

    @property
    def model_config(self) -> SimpleNamespace:
        return SimpleNamespace(get_vocab_size=lambda: self.vocab_size, logits_processors=None)

    @property
    def speculative_config(self) -> SimpleNamespace | None:
        if self.num_speculative_tokens is None:
            return None
        return SimpleNamespace(num_speculative_tokens=self.num_speculative_tokens)

    @property
    def reasoning_config(self) -> SimpleNamespace | None:
        if self.reasoning_start_token_ids is None:
            return None
        return SimpleNamespace(
            reasoning_start_token_ids=self.reasoning_start_token_ids,
            reasoning_end_token_ids=self.reasoning_end_token_ids,
        )


def as_engine_config(config: Any) -> Any:
    """A config as the processors read it: a mapping of ``EngineConfig`` fields becomes an
    ``EngineConfig`` (unknown keys are a ``ValueError`` naming them); anything else (ours, or
    vLLM's ``VllmConfig``) is returned as it is."""
    if not isinstance(config, Mapping):
        return config
    known = EngineConfig.__dataclass_fields__
    unknown = sorted(str(k) for k in config if k not in known)
    if unknown:
        raise ConfigError(
            f"config: unknown field(s) {unknown}; a config mapping takes EngineConfig's fields "
            f"({', '.join(known)})"
        )
    return EngineConfig(**config)


def config_max_num_seqs(config: Any) -> int:
    """``max_num_seqs`` from our ``EngineConfig`` or vLLM's ``VllmConfig`` (``config_size``)."""
    return config_size(config.scheduler_config.max_num_seqs, "max_num_seqs")


def config_vocab_size(config: Any) -> int:
    """Vocabulary size from our ``EngineConfig`` or vLLM's ``VllmConfig`` (``config_size``)."""
    return config_size(config.model_config.get_vocab_size(), "vocab_size")


def config_cap(config: Any, name: str, default: int) -> int:
    """A per-request cap: ours are ``EngineConfig`` fields; a vLLM config gets the default."""
    return config_size(getattr(config, name, default), name)


DRAFT_ROW_MODES = ("per_position", "vllm")


def config_vllm_drafts(config: Any) -> bool:
    """Whether speculative decoding follows vLLM 0.25.1 exactly (``draft_rows="vllm"``) rather
    than our per-position draft rows (the default, also for a config of vLLM's own)."""
    return bool(getattr(config, "speculative_config", None)) and (
        getattr(config, "draft_rows", "per_position") == "vllm"
    )


def config_spec_tokens(config: Any) -> int:
    """Draft tokens per request under speculative decoding (0 when off, or unset: ``None``)."""
    spec = getattr(config, "speculative_config", None)
    if spec is None:
        return 0
    n = getattr(spec, "num_speculative_tokens", None)
    return 0 if n is None else config_size(n, "num_speculative_tokens", 0)

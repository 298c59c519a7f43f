"""One declaration per fact: a request field's neutral value and range live in the core's
registry (``rust/src/tables/*.rs``: ``FieldSpec``), and every front end derives from it.

- ``SamplingParams``' defaults are the registry's neutral values;
- every float and int field declares its range (``Range``, ``rust/src/fields.rs``), and a
  value outside it is refused by ``SamplingParams`` and by the core (a duck-typed request that
  skips ``SamplingParams``), with the same words: the core's; an engine cap ending a range is
  the core's to check (the front end knows no engine);
- no Python source restates a declared range.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from logitsproc_rs import BatchUpdate, EngineConfig, SamplingParams, _core, build_logitsprocs
from logitsproc_rs.builtin import OPT_IN_PROCESSORS
from logitsproc_rs.errors import RequestError
from logitsproc_rs.registry import TABLES

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "logitsproc_rs"
DEFAULTS = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
FIELDS = {f.attr: (t, f) for t, tab in TABLES.items() for f in tab.fields}


@pytest.mark.parametrize("attr", sorted(FIELDS))
def test_sampling_params_defaults_are_the_registry_neutral_values(attr: str) -> None:
    _, f = FIELDS[attr]
    if attr not in DEFAULTS:
        pytest.skip(f"{attr} is no SamplingParams field (derived from others)")
    default = DEFAULTS[attr]
    if f.kind in ("float", "int"):
        assert default == f.neutral, (attr, default, f.neutral)
    elif f.kind == "bool":
        assert default is False
    else:
        assert default is None  # unset; the core reads it as neutral


NUMBER_KINDS = ("float", "int", "opt_int")
INT_MIN, INT_MAX = _core.INT_FIELD_RANGE
# A small engine cap for the fields bounded by one: its end is checked at values around it.
SMALL_CAP = 4
F32_MAX = float(np.finfo(np.float32).max)


def _declares_a_range(attr: str) -> bool:
    """Whether the core declares a range for the field: NaN is in no float range, and every
    int range has a lower end above int64's."""
    _, f = FIELDS[attr]
    probe: float = math.nan if f.kind == "float" else INT_MIN
    return _core.field_range_error(attr, probe) is not None


RANGED = [a for a, (_, f) in FIELDS.items() if f.kind in NUMBER_KINDS and _declares_a_range(a)]


def _edges(attr: str) -> list[float]:
    """Values around every end a range may have: 0, 1 and the others of the fixed ranges, the
    float32 extremes (what "finite" means for a float32 field), and for an int field -1 and
    the small cap's end."""
    _, f = FIELDS[attr]
    if f.kind == "float":
        near = [-3.0, -2.0, -1.0, -1e-9, -1e-50, 0.0, 1e-50, 1e-45, 1e-9, 0.5, 1.0 - 1e-9, 1.0]
        far = [1.0 + 1e-9, 1.75, 2.0, 2.0 + 1e-9, 3.0, F32_MAX, 3.5e38, -F32_MAX, -3.5e38]
        return [*near, *far, math.inf, -math.inf]
    caps = [SMALL_CAP - 1, SMALL_CAP, SMALL_CAP + 1, 10**6]
    return [INT_MIN, -3, -2, -1, 0, 1, 2, *caps, INT_MAX]


def test_every_number_field_declares_its_range() -> None:
    """Every float and int field of the registry has a range, the ones beyond the truncations'
    floats among them."""
    numbers = {a for a, (_, f) in FIELDS.items() if f.kind in NUMBER_KINDS}
    assert set(RANGED) == numbers
    assert set(RANGED) >= {
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "penalty_last_n",
        "min_tokens",
        "thinking_token_budget",
        "no_repeat_ngram_size",
        "no_repeat_ngram_window",
        "dry_multiplier",
        "dry_base",
        "dry_allowed_length",
        "dry_penalty_last_n",
        "top_n_sigma",
        "typical_p",
        "epsilon_cutoff",
        "eta_cutoff",
        "xtc_probability",
        "xtc_threshold",
    }


def _config(attr: str) -> EngineConfig:
    """A small engine for the field's table: its caps at ``SMALL_CAP``; reasoning markers for
    the thinking budget."""
    table, f = FIELDS[attr]
    extra: dict[str, Any] = {cap: SMALL_CAP for cap in f.caps}
    if table == "thinking":
        extra.update(reasoning_start_token_ids=[1], reasoning_end_token_ids=[2])
    return EngineConfig(max_num_seqs=2, vocab_size=16, **extra)


def _core_refusal(attr: str, x: float) -> str | None:
    """What a pipeline with the field's table (built with ``_config``) says of a duck-typed
    request holding ``x``: the detail of its ``RequestError``, which names index 0 and the
    field."""
    table, _ = FIELDS[attr]
    opt_in = [c for c in OPT_IN_PROCESSORS if table in c.TABLES]
    procs = build_logitsprocs(_config(attr), "cpu", False, custom_logitsprocs=opt_in)
    params: Any = SimpleNamespace(
        **{k: v for k, v in dataclasses.asdict(SamplingParams()).items() if not k.startswith("_")},
        all_stop_token_ids=set(),
    )
    setattr(params, attr, x)
    try:
        procs.update_state(BatchUpdate(1, [], [(0, params, [1], [])], []))
    except RequestError as e:
        assert (e.index, e.field) == (0, attr)
        assert str(e) == f"request at index 0: field '{attr}': {e.detail}"
        return e.detail
    return None


def _front_refusal(attr: str, x: float) -> str | None:
    """What ``SamplingParams`` says of ``x`` in the field (``max_tokens=None``: no relation to
    another field in the way)."""
    try:
        SamplingParams(max_tokens=None, **{attr: x})
    except RequestError as e:
        assert e.field == attr and e.index is None
        return str(e)
    return None


@pytest.mark.parametrize("attr", RANGED)
def test_front_end_and_core_refuse_the_same_values_with_the_same_words(attr: str) -> None:
    """At every edge: ``SamplingParams`` refuses exactly what the declared range refuses
    without the engine's caps, in the core's words; the core (a duck-typed request, skipping
    ``SamplingParams``) exactly what it refuses with a small engine's caps, in the same words,
    so a value both refuse reads the same from both."""
    caps = {cap: SMALL_CAP for cap in FIELDS[attr][1].caps}
    for x in _edges(attr):
        declared = _core.field_range_error(attr, x)
        front = _front_refusal(attr, x)
        assert front == (None if declared is None else f"{attr} {declared}"), (attr, x)
        with_caps = _core.field_range_error(attr, x, caps)
        assert _core_refusal(attr, x) == with_caps, (attr, x)
        if declared is not None:
            assert with_caps == declared, (attr, x)  # the same words where both refuse


CAPPED = [a for a in RANGED if FIELDS[a][1].kind != "float" and FIELDS[a][1].caps]


def test_the_capped_fields() -> None:
    assert set(CAPPED) == {"no_repeat_ngram_size", "no_repeat_ngram_window", "dry_penalty_last_n"}


@pytest.mark.parametrize("attr", CAPPED)
def test_a_cap_end_is_the_cores_to_check(attr: str) -> None:
    """A range's engine cap is checked by the core, which knows the engine, naming the cap
    and its value; the front end, which knows none, takes the value."""
    (cap,) = FIELDS[attr][1].caps
    assert _core_refusal(attr, SMALL_CAP) is None
    refusal = _core_refusal(attr, SMALL_CAP + 1)
    assert refusal == _core.field_range_error(attr, SMALL_CAP + 1, {cap: SMALL_CAP})
    assert refusal is not None and refusal.startswith("must be an int in [")
    assert f", {cap}] " in refusal
    assert refusal.endswith(f", got {SMALL_CAP + 1} > {cap} = {SMALL_CAP}")
    assert _front_refusal(attr, SMALL_CAP + 1) is None
    assert _core.field_range_error(attr, SMALL_CAP + 1) is None


@pytest.mark.parametrize(
    ("attr", "value", "caps", "words"),
    [
        ("min_p", 2.0, None, "must be in [0, 1], got 2"),
        ("typical_p", 0.0, None, "must be in (0, 1] (1: off), got 0"),
        ("dry_multiplier", -1.0, None, "must be a finite float32 >= 0 (0: off), got -1"),
        ("dry_base", math.inf, None, "must be a finite float32 >= 1, got inf"),
        ("dry_base", 3.5e38, None, "must be a finite float32 >= 1, got 3.5e38"),
        ("repetition_penalty", 1e-50, None, "must be a finite float32 > 0 (1: off), got 1e-50"),
        ("top_n_sigma", -math.inf, None, "must be a finite float32 (<= 0: off), got -inf"),
        ("min_tokens", -1, None, "must be an int >= 0, got -1"),
        ("dry_allowed_length", 0, None, "must be an int >= 1, got 0"),
        (
            "penalty_last_n",
            -2,
            None,
            "must be an int >= -1 (None or -1: the whole history; 0: off), got -2",
        ),
        ("thinking_token_budget", -2, None, "must be an int >= -1 (None or -1: unlimited), got -2"),
        (
            "dry_penalty_last_n",
            -2,
            None,
            "must be an int in [-1, max_dry_penalty_last_n] "
            "(-1: the whole sequence up to the cap; 0: off), got -2",
        ),
        (
            "dry_penalty_last_n",
            -2,
            {"max_dry_penalty_last_n": 4096},
            "must be an int in [-1, max_dry_penalty_last_n] "
            "(-1: the whole sequence up to the cap; 0: off), got -2",
        ),
        (
            "dry_penalty_last_n",
            4097,
            {"max_dry_penalty_last_n": 4096},
            "must be an int in [-1, max_dry_penalty_last_n] "
            "(-1: the whole sequence up to the cap; 0: off), "
            "got 4097 > max_dry_penalty_last_n = 4096",
        ),
        (
            "no_repeat_ngram_size",
            129,
            {"max_no_repeat_ngram_size": 128},
            "must be an int in [0, max_no_repeat_ngram_size] (0: off), "
            "got 129 > max_no_repeat_ngram_size = 128",
        ),
        (
            "no_repeat_ngram_window",
            -1,
            None,
            "must be an int in [0, max_no_repeat_ngram_window] (0: the cap), got -1",
        ),
    ],
)
def test_the_words_of_a_range(attr: str, value: float, caps: Any, words: str) -> None:
    """One form, generated from the declaration: the values taken (``in [lo, hi]``, ``>=
    lo``, a float32's finiteness, an int's cap by name), the note, the value; a value past a
    known cap adds the cap's value."""
    assert _core.field_range_error(attr, value, caps) == words


def test_an_int_field_takes_an_int() -> None:
    with pytest.raises(TypeError, match="min_tokens"):
        _core.field_range_error("min_tokens", 1.5)
    with pytest.raises(TypeError, match="min_tokens"):
        _core.field_range_error("min_tokens", True)
    assert _core.field_range_error("no_such_field", 1.5) is None


# What a restated range would read like, next to the field's name: a bracketed range, a bound
# ("must be >= 1", "must be an int >= 1", "must be -1 (...)"), or finiteness.
_RESTATED = r"must be (in [\[(]|an int [>i]|a finite|finite|[<>]=? ?-?\d|-1\b|a non-negative)"


def test_no_python_source_restates_a_declared_range() -> None:
    """The words of a declared range ("must be in [0, 1]", "must be an int >= 1", "must be a
    finite number") appear in no Python source next to the field's name, and no source
    states float32's largest value (what "finite" means for a float32 field): the front ends
    ask the core."""
    for path in PACKAGE.rglob("*.py"):
        if path.name in ("reference.py", "reference_thinking.py"):
            continue  # the reference is independent of the core by design (test_reference.py)
        text = path.read_text()
        for attr in RANGED:
            pattern = rf"{attr}\W[^\n]{{0,40}}{_RESTATED}"
            assert not re.search(pattern, text), (path, attr)
        assert not re.search(r"3\.40282|F32_MAX|finfo\(np\.float32\)\.max", text), path


def test_engine_config_caps_are_the_registry_caps() -> None:
    """Every per-request cap is an ``EngineConfig`` field defaulting to the registry's value."""
    from logitsproc_rs import EngineConfig
    from logitsproc_rs.registry import CAP_DEFAULTS

    defaults = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    for cap, default in CAP_DEFAULTS.items():
        assert defaults.get(cap) == default, cap


def test_the_front_end_caps_name_no_cap_of_their_own() -> None:
    """vLLM's front-end checks (``vllm/_guard.py``) take every cap from the registry."""
    from logitsproc_rs.registry import CAP_DEFAULTS

    text = (PACKAGE / "vllm" / "_guard.py").read_text()
    named = [c for c in CAP_DEFAULTS if c in text]
    assert named == [], named

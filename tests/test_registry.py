"""One declaration per fact: a request field's neutral value and range live in the core's
registry (``rust/src/tables/*.rs``: ``FieldSpec``), and every front end derives from it.

- ``SamplingParams``' defaults are the registry's neutral values;
- a value outside a field's declared range is refused by ``SamplingParams`` and by the core
  (a duck-typed request that skips ``SamplingParams``), with the same words: the core's;
- no Python source restates a declared range.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

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


def _edges(attr: str) -> list[float]:
    """Values just outside and just inside the declared range (by asking the core)."""
    probes = [-3.0, -2.0, -1e-9, 0.0, 1e-9, 0.5, 1.0 - 1e-9, 1.0, 1.0 + 1e-9, 2.0, 3.0, math.inf]
    return [x for x in probes if not (attr == "top_n_sigma" and x <= 0)]


RANGED = [
    a for a, (_, f) in FIELDS.items() if f.kind == "float" and _core.field_range_error(a, math.nan)
]


def test_the_ranged_fields_are_the_ones_declared() -> None:
    assert set(RANGED) >= {
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "typical_p",
        "epsilon_cutoff",
        "eta_cutoff",
        "xtc_probability",
        "xtc_threshold",
    }


def _core_refusal(attr: str, x: float) -> str | None:
    """What a pipeline with the field's table says of a duck-typed request holding ``x``."""
    table, _ = FIELDS[attr]
    opt_in = [c for c in OPT_IN_PROCESSORS if table in c.TABLES]
    procs = build_logitsprocs(
        EngineConfig(max_num_seqs=2, vocab_size=16), "cpu", False, custom_logitsprocs=opt_in
    )
    params: Any = SimpleNamespace(
        **{k: v for k, v in dataclasses.asdict(SamplingParams()).items() if not k.startswith("_")},
        all_stop_token_ids=set(),
    )
    setattr(params, attr, x)
    try:
        procs.update_state(BatchUpdate(1, [], [(0, params, [1], [])], []))
    except RequestError as e:
        assert e.field == attr
        return e.detail
    return None


@pytest.mark.parametrize("attr", RANGED)
def test_front_end_and_core_refuse_the_same_values_with_the_same_words(attr: str) -> None:
    for x in _edges(attr):
        declared = _core.field_range_error(attr, x)
        try:
            SamplingParams(**{attr: x})
            front = None
        except RequestError as e:
            front = str(e)
        if declared is None:
            if attr == "top_n_sigma" and front is not None:
                continue  # its own finiteness rule (a float32)
            assert front is None, (attr, x, front)
        else:
            assert front == f"{attr} {declared}", (attr, x, front)
            assert _core_refusal(attr, x) == declared, (attr, x)


def test_no_python_source_restates_a_declared_range() -> None:
    """The words of a declared range ("must be in [0, 1]") appear in no Python source next to
    the field's name: the front ends ask the core."""
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        for attr in RANGED:
            pattern = rf"{attr}\W[^\n]{{0,40}}must be in [\[(]"
            assert not re.search(pattern, text), (path, attr)


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

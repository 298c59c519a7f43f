"""A field whose processor is not built is never dropped: our front ends refuse it.

Our opt-in processors (no-repeat-ngram, DRY, the truncations, XTC) are not vLLM's, so nobody
else applies their fields. A pipeline that did not build one refuses a request setting a field
that switches it on: a ``RequestError`` naming the request, the field and the class to build,
with every table as before (``Pipeline(refuse=...)``, by default ``unbuilt_opt_in``). A field
that only tunes its processor (DRY's base, XTC's threshold, a window: ``tunes`` in the core's
registry) changes nothing set alone, so it is served. The vLLM bridges' namespaced fields are
in ``test_v1_bridge.py`` and ``test_v2_bridge.py`` (failed closed in the worker, logged);
HF ``generate()`` builds what its requests set (``builtin.asked_for``), checked here.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from logitsproc_rs import BatchUpdate, EngineConfig, SamplingParams, build_logitsprocs
from logitsproc_rs.builtin import OPT_IN_PROCESSORS, asked_for
from logitsproc_rs.errors import RequestError
from logitsproc_rs.registry import TABLES

V = 40
CFG = EngineConfig(max_num_seqs=4, vocab_size=V)

# The fields of the opt-in processors, from the registry, each with its first example value
# (``FieldSpec::examples``): one that switches its processor on for a switching field, and
# any set value for a tuning-only one (set alone: nothing to apply).
_OPT_IN_FIELDS = [f for cls in OPT_IN_PROCESSORS for t in cls.TABLES for f in TABLES[t].fields]
SWITCH_ON: dict[str, Any] = {f.attr: f.examples[0] for f in _OPT_IN_FIELDS if not f.tunes}
TUNE: dict[str, Any] = {f.attr: f.examples[0] for f in _OPT_IN_FIELDS if f.tunes}
CASES = [
    (cls, f.attr)
    for cls in OPT_IN_PROCESSORS
    for t in cls.TABLES
    for f in TABLES[t].fields
    if not f.tunes
]


def test_every_field_of_an_opt_in_processor_is_covered() -> None:
    """The two lists above are every field of the opt-in tables, split as the registry says,
    each with a set value (the registry's first example is not the neutral one)."""
    fields = {
        f.attr: f.tunes for c in OPT_IN_PROCESSORS for t in c.TABLES for f in TABLES[t].fields
    }
    assert {k for k, tunes in fields.items() if not tunes} == set(SWITCH_ON)
    assert {k for k, tunes in fields.items() if tunes} == set(TUNE)
    for f in _OPT_IN_FIELDS:
        assert f.is_set(f.examples[0]), f.attr


def _state(procs: Any) -> Any:
    pipe = procs.pipeline
    return (
        [v.clone() for v in pipe.arena.views],
        pipe.core.status(),
        pipe.core.active(),
    )


def _same(a: Any, b: Any) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a[0], b[0], strict=True)) and a[1:] == b[1:]


def _live(procs: Any) -> None:
    procs.update_state(BatchUpdate(1, [], [(0, SamplingParams(min_p=0.1), [1, 2], [])], []))


@pytest.mark.parametrize(("cls", "field"), CASES, ids=[f for _, f in CASES])
def test_build_logitsprocs_refuses_a_field_of_a_processor_it_did_not_build(
    cls: type, field: str
) -> None:
    procs = build_logitsprocs(CFG, "cpu", False)
    _live(procs)
    before = _state(procs)
    sp = SamplingParams(**{field: SWITCH_ON[field]})
    with pytest.raises(RequestError) as e:
        procs.update_state(BatchUpdate(2, [], [(1, sp, [1, 2], [])], []))
    assert e.value.index == 1 and e.value.field == field
    assert f"logitsproc_rs.{cls.__name__}" in str(e.value)
    assert _same(before, _state(procs))
    # Built, the same request is taken and applied.
    built = build_logitsprocs(CFG, "cpu", False, custom_logitsprocs=[cls])
    built.update_state(BatchUpdate(1, [], [(0, sp, [1, 2, 1], [2])], []))
    assert dict(built.pipeline.core.active())[cls.TABLES[0]] == 1


@pytest.mark.parametrize(("cls", "field"), CASES, ids=[f for _, f in CASES])
def test_stable_slots_refuse_a_field_of_a_processor_not_built(cls: type, field: str) -> None:
    procs = build_logitsprocs(CFG, "cpu", False, stable_slots=True, token_feed=True)
    pipe = procs.pipeline
    pipe.add_request(0, SamplingParams(min_p=0.1), [1], [])
    pipe.step_slots([0])
    before = _state(procs)
    with pytest.raises(RequestError) as e:
        pipe.add_request(2, SamplingParams(**{field: SWITCH_ON[field]}), [1], [])
    assert e.value.field == field and f"logitsproc_rs.{cls.__name__}" in str(e.value)
    pipe.step_slots([0])
    assert pipe.core.active() == before[2]


@pytest.mark.parametrize("field", sorted(TUNE))
def test_a_tuning_field_alone_is_served(field: str) -> None:
    procs = build_logitsprocs(CFG, "cpu", False)
    procs.update_state(
        BatchUpdate(1, [], [(0, SamplingParams(**{field: TUNE[field]}), [1, 2], [])], [])
    )
    assert (
        procs.pipeline.core.active() == build_logitsprocs(CFG, "cpu", False).pipeline.core.active()
    )


def test_hf_builds_what_its_requests_set() -> None:
    """HF ``generate()`` knows its requests up front: each opt-in processor a request switches
    on is built, and one that only tunes is not asked for."""
    for cls, field in CASES:
        assert cls in asked_for([SamplingParams(**{field: SWITCH_ON[field]})]), field
    assert asked_for([SamplingParams(**TUNE)]) == []

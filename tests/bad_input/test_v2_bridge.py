"""Bad input to the Model Runner V2 bridge (``logitsproc_rs.vllm.v2``), with vLLM 0.33.0's own
interface and loader: the cases run in one subprocess (``tests/vllm_drivers/v2_bad_input.py``,
as ``tests/test_vllm_v2.py`` runs its drivers: the pytest process imports no vLLM), each
against a twin runner that never saw the bad call.

- A slot that is not a slot (a bool, negative, beyond ``max_num_reqs``, a float, a str), in
  ``add_request`` or in a step's ``ctx.idx_mapping_np``, is a ``BatchUpdateError`` naming the
  processor and the slot, and changes nothing: ``True`` was taken as a boolean mask (every
  slot's history forgotten), ``-1`` changed the last slot's state before an ``OverflowError``,
  one beyond raised ``IndexError``.
- A request field holding an int too large for a float or a bool is a ``RequestError`` naming
  the field at the front end (``validate_params``); in the worker the request is failed closed
  (``_guard``) and the others go on.
- An interrupt raised by the request's own attributes propagates and changes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _extras import missing

from logitsproc_rs.registry import TABLES

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "vllm_drivers" / "v2_bad_input.py"
TARGET = Path(
    os.environ.get("LOGITSPROC_VLLM_V2_DIR", Path.home() / ".cache/logitsproc_rs/vllm-0.33.0")
)
INTERFACE = TARGET / "vllm/v1/worker/gpu/sample/logits_processor/interface.py"


def _run(which: str) -> dict[str, Any]:
    if not INTERFACE.is_file():
        missing(f"vLLM 0.33.0 not installed in {TARGET} (run make extras)")
    env = {
        **os.environ,
        "PYTHONPATH": f"{TARGET}{os.pathsep}{ROOT / 'python'}",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, str(DRIVER), which],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"driver failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-3000:]
    result: dict[str, Any] = json.loads(lines[0][len("RESULT ") :])
    return result


@pytest.fixture(scope="module")
def slots() -> dict[str, Any]:
    return _run("slots")


@pytest.fixture(scope="module")
def params() -> dict[str, Any]:
    return _run("params")


def _refused_unchanged(r: dict[str, Any], field: str) -> None:
    assert r["raised"] == "BatchUpdateError", r
    assert "ValueError" in r["mro"]
    assert r["field"] == field, r
    assert r["same_state"] and r["same_next"] and r["same_after"], r


SLOT_CASES = [
    "True",
    "False",
    "np.True_",
    "-1",
    "-4",
    "4",
    str(10**30),
    "2.0",
    "'1'",
    "None",
    "np.float64(1.0)",
]


@pytest.mark.parametrize("member", ["first", "last"])
@pytest.mark.parametrize("slot", SLOT_CASES)
def test_add_request_with_a_slot_that_is_not_a_slot(
    slots: dict[str, Any], member: str, slot: str
) -> None:
    r = slots[f"add_request[{member}]({slot})"]
    _refused_unchanged(r, "req_idx")
    assert "add_request" in r["message"] and "LogitsProcessor" in r["message"]


@pytest.mark.parametrize(
    "name", ["negative", "beyond", "bool", "float", "2-d", "list_with_bool", "str"]
)
def test_a_step_whose_ctx_holds_a_slot_that_is_not_a_slot(slots: dict[str, Any], name: str) -> None:
    r = slots[f"ctx.idx_mapping_np[{name}]"]
    _refused_unchanged(r, "idx_mapping")
    assert "apply" in r["message"]


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("float_pos", "expanded_local_pos"),
        ("short_input_ids", "input_ids"),
        ("2-d_input_ids", "input_ids"),
        ("skipped_pos", "local_pos"),
        ("second_run", "local_pos"),
        ("draft_past_vocab", "input_ids"),
        ("negative_draft", "input_ids"),
    ],
)
def test_a_draft_step_whose_layout_is_not_one_is_refused(
    slots: dict[str, Any], name: str, field: str
) -> None:
    """A typed ValueError naming the field; the step changes nothing (a twin that never saw
    it gives the same next steps)."""
    r = slots[f"drafts[{name}]"]
    assert "ValueError" in r["mro"] and "LogitsprocError" in r["mro"], r
    assert r["field"] == field, r
    assert r["same_state"] and r["same_next"] and r["same_after"], r


PARAM_CASES = [
    "min_p=100000000000",
    "min_p=True",
    "presence_penalty=-10000000000",
    "frequency_penalty=100000000000",
    "repetition_penalty=100000000000",
    "logit_bias={1: 10000000",
    "logit_bias={1: True}",
]
# Every float field of the core's registry, 10**400 in the namespace (the driver's
# REGISTRY_FLOATS): the new ones escaped as OverflowError, at the front end and in the
# worker's add_request.
PARAM_CASES += [
    k
    for k in (
        f"{f}=100000000000"
        for f in dict.fromkeys(
            f.attr for t in TABLES.values() for f in t.fields if f.kind == "float"
        )
    )
    if k not in PARAM_CASES
]


@pytest.mark.parametrize("key", PARAM_CASES)
def test_a_field_that_is_no_number_is_a_request_error_at_the_front_end(
    params: dict[str, Any], key: str
) -> None:
    r = params[f"validate_params[{key}]"]
    assert r["raised"] == "RequestError", r
    assert r["field"] == key.split("=")[0]


@pytest.mark.parametrize("key", PARAM_CASES)
def test_a_field_that_is_no_number_fails_the_request_closed_in_the_worker(
    params: dict[str, Any], key: str
) -> None:
    """Raising there would stop the engine: the request's row gets only its stop tokens, the
    others are untouched, and the next request in the slot replaces it."""
    r = params[f"add_request[{key}]"]
    assert r["raised"] is None, r
    assert len(r["forced"]) == 1
    assert r["same_next"] and r["same_after"], r


@pytest.mark.parametrize("exc", ["KeyboardInterrupt", "SystemExit"])
def test_an_interrupt_in_add_request_propagates_and_changes_nothing(
    params: dict[str, Any], exc: str
) -> None:
    r = params[f"interrupt[{exc}]"]
    assert r["raised"] == exc, r
    assert r["same_state"] and r["same_next"] and r["same_after"], r


@pytest.mark.parametrize(
    "field",
    [
        "no_repeat_ngram_size",
        "dry_multiplier",
        "xtc_probability",
        "min_tokens",
        "allowed_token_ids",
    ],
)
def test_a_field_of_a_processor_not_loaded_fails_the_request_closed(
    params: dict[str, Any], field: str
) -> None:
    """Never dropped: a namespaced field whose processor the runner did not load (only MinP,
    LogitBias and the penalties are) fails the request closed; the log names the field and the
    class to load."""
    r = params[f"unbuilt[{field}]"]
    assert r["raised"] is None, r
    assert r["forced"] == [r["slot"]], r
    assert len(r["logged"]) == 1 and f"field '{field}'" in r["logged"][0], r
    assert "logitsproc_rs.vllm.v2:" in r["logged"][0], r


@pytest.mark.parametrize("field", ["dry_base", "xtc_threshold"])
def test_a_field_that_only_tunes_an_unloaded_processor_is_served(
    params: dict[str, Any], field: str
) -> None:
    r = params[f"unbuilt[{field}]"]
    assert r["raised"] is None and r["forced"] == [] and r["logged"] == [], r

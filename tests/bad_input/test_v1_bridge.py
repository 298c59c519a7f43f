"""Bad input to the V1 bridges (``logitsproc_rs.vllm.v1``) in vLLM 0.25.1's own
``build_logitsprocs`` and ``BatchUpdateBuilder``: the cases run in one subprocess
(``tests/vllm_drivers/v1_bad_input.py``; the pytest process imports no vLLM), each against a
twin engine that never saw the bad call.

- A request field that is no number here (an int too large for a float, a bool), namespaced
  (``extra_args["logitsproc_rs"]``) or ordinary (bridges built with ``namespace=None``): a
  ``RequestError`` naming the field at vLLM's front end (``validate_params``; it was an
  ``OverflowError``); in the worker the request is failed closed, the other rows are the
  twin's, and once the slot is re-admitted fixed everything is the twin's (a bool was read as
  1.0 and applied).
- A malformed update (a bool or unknown move direction, a bool index or batch size, an index
  beyond the batch) raises a ``BatchUpdateError`` naming the processor, and every table is as
  before, and as the twin's, at the next steps too (a bool direction was taken as
  UNIDIRECTIONAL).
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
DRIVER = ROOT / "tests" / "vllm_drivers" / "v1_bad_input.py"
VLLM = Path.home() / ".cache" / "logitsproc_rs" / "vllm-0.25.1"


@pytest.fixture(scope="module")
def cases() -> dict[str, Any]:
    if not (VLLM / "vllm" / "v1" / "sample" / "logits_processor" / "interface.py").is_file():
        missing(f"vLLM 0.25.1 is not installed in {VLLM} (tests/extras/vllm_v1.sh, make extras)")
    env = dict(os.environ, PYTHONPATH=f"{VLLM}{os.pathsep}{ROOT / 'python'}", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(DRIVER)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"driver failed:\n{proc.stdout}\n{proc.stderr[-6000:]}"
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


# Every float field of the core's registry, 10**400 in the namespace (the driver's ROUTED_ONLY).
REGISTRY_FLOATS = [
    f"{f}=100000000000"
    for f in dict.fromkeys(f.attr for t in TABLES.values() for f in t.fields if f.kind == "float")
]

FIELDS = [
    "min_p=100000000000",
    "min_p=True",
    "presence_penalty=-10000000000",
    "frequency_penalty=True",
    "repetition_penalty=100000000000",
    "logit_bias={3: 10000000",
    "logit_bias={3: True}",
]


@pytest.mark.parametrize("key", list(dict.fromkeys(FIELDS + REGISTRY_FLOATS)))
def test_a_namespaced_field_that_is_no_number_is_refused_at_the_front_end(
    cases: dict[str, Any], key: str
) -> None:
    r = cases[f"validate_params[routed:{key}]"]
    assert r["raised"] == "RequestError", r
    assert "ValueError" in r["mro"] and r["field"] == key.split("=")[0]


@pytest.mark.parametrize(
    ("mode", "key"),
    [(m, k) for m in ("routed", "plain") for k in FIELDS]
    + [("routed", k) for k in REGISTRY_FLOATS if k not in FIELDS],
)
def test_a_field_that_is_no_number_fails_the_request_closed_in_the_worker(
    cases: dict[str, Any], mode: str, key: str
) -> None:
    """In the worker (the V1 bridge's update_state for the whole batch): the request is
    failed closed, the others untouched; an OverflowError there would stop the engine."""
    r = cases[f"update[{mode}:{key}]"]
    assert r["raised"] is None, r
    assert r["forced"] == [3], r
    assert r["others_same"] and r["same_after"], r


@pytest.mark.parametrize("mode", ["routed", "plain"])
@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("bool_direction", "moved"),
        ("int_direction", "moved"),
        ("slot_beyond", "added"),
        ("bool_slot", "removed"),
        ("batch_size_bool", "batch_size"),
    ],
)
def test_a_malformed_update_changes_nothing(
    cases: dict[str, Any], mode: str, name: str, field: str
) -> None:
    r = cases[f"{mode}:{name}"]
    assert r["raised"] == "BatchUpdateError", r
    assert r["field"] == field
    assert "no table changed" in r["message"] and "LogitsProcessor" in r["message"]
    assert r["same_state"] and r["same_after"], r


UNBUILT = [
    "no_repeat_ngram_size",
    "dry_multiplier",
    "xtc_probability",
    "top_n_sigma",
    "typical_p",
    "min_tokens",
    "allowed_token_ids",
    "bad_words_token_ids",
]


@pytest.mark.parametrize("field", UNBUILT)
def test_a_field_of_a_processor_not_loaded_is_refused_never_dropped(
    cases: dict[str, Any], field: str
) -> None:
    """Never dropped: a namespaced field whose processor vLLM did not load (only MinP, LogitBias
    and the penalties are) is refused at vLLM's front end, naming the field and the class to
    load (what ``vllm serve`` answers with HTTP 400). A request that reaches the worker all the
    same (an engine that skips the front end) is failed closed there, and the log names the
    field and the class to load. With the every-field classes loaded the field is served."""
    front = cases[f"front[{field}]"]
    assert front["raised"] == "RequestError" and "ValueError" in front["mro"], front
    assert f"field 'extra_args['logitsproc_rs']['{field}']'" in front["message"], front
    assert "did not load its processor" in front["message"], front
    assert "logitsproc_rs.vllm.v1:" in front["message"], front
    assert cases[f"front_every_field[{field}]"] == {"raised": None}
    r = cases[f"unbuilt[{field}]"]
    assert r["raised"] is None, r
    assert r["forced"] == [3], r
    assert len(r["logged"]) == 1 and f"field '{field}'" in r["logged"][0], r
    assert "logitsproc_rs.vllm.v1:" in r["logged"][0] and "logits_processors" in r["logged"][0]


@pytest.mark.parametrize("field", ["dry_base", "xtc_threshold", "no_repeat_ngram_window"])
def test_a_field_that_only_tunes_an_unloaded_processor_is_served(
    cases: dict[str, Any], field: str
) -> None:
    """Set alone, a tuning field changes nothing, so the request is served as it is."""
    assert cases[f"front[{field}]"] == {"raised": None}
    r = cases[f"unbuilt[{field}]"]
    assert r["raised"] is None and r["forced"] == [] and r["logged"] == [], r
    assert r["same"], r

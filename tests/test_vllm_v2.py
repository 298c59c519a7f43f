"""Our processors inside vLLM's Model Runner V2 (``logitsproc_rs.vllm.v2``), checked with
vLLM 0.33.0's own interface and loader modules.

vLLM is imported only in subprocesses (``tests/vllm_drivers/v2_*.py``, with
``PYTHONPATH=<vllm-0.33.0 target>:python``): another vLLM version serves other tests, and
the pytest process imports neither. ``tests/extras/vllm_v2.sh`` (``make extras``) installs
it; without it these tests skip, or fail when ``LOGITSPROC_REQUIRE_EXTRAS=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _extras import REQUIRED, missing

ROOT = Path(__file__).resolve().parents[1]
DRIVERS = ROOT / "tests" / "vllm_drivers"
TARGET = Path(
    os.environ.get("LOGITSPROC_VLLM_V2_DIR", Path.home() / ".cache/logitsproc_rs/vllm-0.33.0")
)
INTERFACE = TARGET / "vllm/v1/worker/gpu/sample/logits_processor/interface.py"


@pytest.fixture(scope="module")
def vllm_dir() -> Path:
    if not INTERFACE.is_file():
        why = f"vLLM 0.33.0 not installed in {TARGET} (run make extras: tests/extras/vllm_v2.sh)"
        missing(why)
    return TARGET


def run(
    vllm_dir: Path,
    script: str,
    *args: object,
    fields: str = "namespace",
    environ: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``script`` under ``environ`` (default ``os.environ``) with vLLM's and our paths."""
    env = {
        **(os.environ if environ is None else environ),
        "PYTHONPATH": f"{vllm_dir}{os.pathsep}{ROOT / 'python'}",
        "LOGITSPROC_V2_FIELDS": fields,
    }
    env.setdefault("OMP_NUM_THREADS", "1")  # small tensors; the machine is shared
    return subprocess.run(
        [sys.executable, str(DRIVERS / script), *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def result(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, f"driver failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-3000:]
    return json.loads(lines[0][len("RESULT ") :])


@pytest.mark.parametrize(
    ("seed", "max_num_seqs", "vocab", "steps", "drafts", "faults"),
    [(0, 8, 64, 300, 0, 0), (1, 32, 128, 120, 2, 0), (2, 32, 128, 150, 1, 1)],
)
def test_v2_matches_v1_under_churn(vllm_dir, seed, max_num_seqs, vocab, steps, drafts, faults):
    """Namespace mode (the default: each built-in's fields in extra_args["logitsproc_rs"])."""
    st = result(run(vllm_dir, "v2_churn.py", seed, max_num_seqs, vocab, steps, drafts, faults))
    assert st["pipelines"] == 1  # every processor loaded together shares one pipeline
    assert st["rows"] > steps * max_num_seqs // 4
    assert st["recycled"] > 10 and st["resumed"] > 3
    if max_num_seqs <= 8:  # (a batch of 32 does not turn over to plain requests in time)
        assert st["skipped"] > 0 and st["applied_idle"] > 0  # batches none of ours acts on
    assert (st["draft_rows"] > steps) == bool(drafts)
    if faults:
        assert st["bad_params"] >= 3 and st["failed"] >= 3


def test_v2_plain_fields_match_v1_under_churn(vllm_dir):
    """Bridges built with namespace=None read the ordinary fields."""
    proc = run(vllm_dir, "v2_churn.py", 4, 16, 96, 150, 1, 1, fields="plain")
    st = result(proc)
    assert st["pipelines"] == 1 and st["rows"] > 150 and st["bad_params"] >= 1


def test_v2_wire_fields_match_v1_under_churn(vllm_dir):
    """The same fields in the wire form (flat ``"logitsproc_rs.<field>"`` keys, JSON text for
    nested values: what ``vllm_xargs`` carries over HTTP), drafts and bad params included."""
    proc = run(vllm_dir, "v2_churn.py", 5, 16, 96, 150, 1, 1, fields="wire")
    st = result(proc)
    assert st["pipelines"] == 1 and st["rows"] > 150 and st["bad_params"] >= 1


def test_v2_every_field_classes_match_v1_under_churn(vllm_dir):
    """The recommended load (``EveryFieldLogitsProcessor``, ``EveryFieldSamplingLogitsProcessor``):
    the same rows as V1, drafts included."""
    env = {**os.environ, "LOGITSPROC_V2_LOAD": "every_field"}
    st = result(run(vllm_dir, "v2_churn.py", 6, 8, 96, 300, 1, 0, environ=env))
    assert st["pipelines"] == 1 and st["rows"] > 300 and st["recycled"] > 10
    assert st["draft_rows"] > 100 and st["skipped"] > 0 and st["applied_idle"] > 0


@pytest.mark.parametrize("route", ["no_prefetch", "half_prefetch"])
def test_v2_without_prefetch(vllm_dir, route):
    """The committed tokens read in apply (what a step falls back to for the requests the
    prefetch of apply_staged_writes lacks) give the same logits."""
    st = result(run(vllm_dir, "v2_churn.py", 3, 16, 64, 150, 1, 0, route))
    assert st["rows"] > 150 and st["resumed"] > 0


@pytest.mark.parametrize("mode", ["no_feed", "no_install"])
def test_churn_driver_catches_a_broken_bridge(vllm_dir, mode):
    proc = run(vllm_dir, "v2_churn.py", 0, 8, 64, 300, 0, 0, mode)
    assert proc.returncode != 0 and "V2 differs from V1" in proc.stderr, proc.stderr[-2000:]


def test_v2_min_p_selects_what_vllms_min_p_selects(vllm_dir):
    """Against vLLM 0.33.0's own MRV2 temperature and min_p kernels (Triton's interpreter)."""
    st = result(run(vllm_dir, "v2_min_p.py", 0, 40))
    assert st["rows"] > 300 and st["tempered_rows"] > 100 and st["masked"] > 1000


def test_vllm_loader_with_our_classes(vllm_dir):
    out = result(run(vllm_dir, "v2_loader.py"))
    assert out["loaded"][0] == "AllowedTokenIdsLogitsProcessor"
    assert out["tables"] == [
        "allowed",
        "bad_words",
        "logit_bias",
        "min_p",
        "min_tokens",
        "penalties",
    ]
    assert out["v1_class"].startswith("MinPLogitsProcessor is not a subclass of vllm.v1.worker")
    assert "Expected format" in out["bad_name"]
    assert out["pooling"] == "Pooling models do not support custom logits processors."
    assert "not a processor built on a Pipeline" in out["not_ours"]
    assert "logit_margin" in out["column_validate"]
    assert out["failed_closed"]
    assert "200 words exceed the per-request cap of 128" in out["cap"]
    assert out["acts_min_p_only"] == ["MinPLogitsProcessor"]
    # min_tokens holds EOS back only when min_tokens is set, but acts_on is conservative
    # about stop ids; no table of ours acts on vLLM's own (ordinary) min_p or penalties.
    assert not {"MinPLogitsProcessor", "PenaltiesLogitsProcessor"} & set(
        out["acts_on_plain_fields"]
    )
    assert "extra_args['logitsproc_rs']" in out["bad_namespace"] and "min_p" in out["bad_namespace"]
    assert "unknown field(s) ['top_k']" in out["unknown_namespace"]
    assert "field 'extra_args['logitsproc_rs']['dry_multiplier']'" in out["unloaded"]
    assert "logitsproc_rs.vllm.v2:DryLogitsProcessor' to vLLM's" in out["unloaded"]
    assert out["min_p_kept"] == 1
    # Idle: nobody acts on requests without our fields, and a step of only them does nothing.
    idle = out["idle"]
    assert idle["acts"] is False and idle["same"] and idle["core_steps"] == 0, idle
    assert "idx_mapping_np[1]" in idle["bad_map"], idle
    assert idle["acting"] == ["LogitMargin"] and idle["busy_core_steps"] == 1, idle
    assert idle["busy_changed_rows"] == [2], idle
    # With vLLM 0.33.0's own V1 package importable (tests/extras/vllm_v1.sh installs what it
    # needs), its SamplingParams go through the same processors as ours.
    if out["real_v1_package"] or REQUIRED:
        assert out["real_v1_package"], "vLLM 0.33.0's vllm.sampling_params does not import"
        assert out["vllm_params"] > 20  # allowed ids alone drop 24 of 32

"""vLLM V1 (0.25.1) in both directions: vLLM's processors in our ``build_logitsprocs``, ours
(``logitsproc_rs.vllm.v1``) in vLLM's.

The tests that need the real vLLM run the drivers in ``tests/vllm_drivers/v1_*.py`` in a
subprocess with ``PYTHONPATH=<vllm-0.25.1 target>:python`` (vLLM 0.33.0 is installed too, for
the V2 bridge; this process imports neither). ``tests/extras/vllm_v1.sh`` installs it; without
it they skip, or fail under ``LOGITSPROC_REQUIRE_EXTRAS=1`` (``make test``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from enum import Enum
from pathlib import Path

import pytest
from _extras import missing

from logitsproc_rs import (
    AdapterLogitsProcessor,
    BatchUpdate,
    EngineConfig,
    MoveDirectionality,
    SamplingParams,
    build_logitsprocs,
    process_dict_updates,
)

REPO = Path(__file__).resolve().parents[1]
DRIVERS = REPO / "tests" / "vllm_drivers"
VLLM = Path.home() / ".cache" / "logitsproc_rs" / "vllm-0.25.1"
sys.path[:0] = [str(DRIVERS), str(REPO / "examples")]

import vllm_target_token as example  # noqa: E402
from v1_examples_check import check_examples  # noqa: E402

# --- without vLLM: the helpers and the example in our own form --------------------------------


class OtherMoves(Enum):
    """Another library's enum with the same names (as vLLM's is)."""

    SWAP = 7
    UNIDIRECTIONAL = 8


@pytest.mark.parametrize("moves", [MoveDirectionality, OtherMoves])
def test_process_dict_updates_follows_vllm(moves):
    state = {0: "a", 1: "b", 2: "c"}
    added = [(3, "x", None, []), (1, None, None, [])]  # 1 gets no state: its entry goes
    update = BatchUpdate(5, [2], added, [(0, 4, moves.UNIDIRECTIONAL), (3, 0, moves.SWAP)])
    assert process_dict_updates(state, update, lambda params, _p, _o: params) is True
    assert state == {0: "x", 4: "a"}
    assert process_dict_updates(state, None, lambda *a: None) is False
    # vLLM's quirk: while the dict is empty, removals and moves are not even read.
    assert process_dict_updates({}, BatchUpdate(1, [0], [], [(0, 1, moves.SWAP)]), None) is False


def test_example_processors_in_our_form_under_churn():
    counts = check_examples(
        [example.TargetTokenLogitsProcessor, example.TargetTokenAdapter, example.BanPromptAdapter]
    )
    assert counts["processors"] == 3 and counts["swaps"] > 0 and counts["rows_changed"] > 0


def test_adapter_three_argument_form_needs_prompt_ids():
    procs = build_logitsprocs(
        EngineConfig(max_num_seqs=4, vocab_size=16),
        "cpu",
        False,
        custom_logitsprocs=[example.BanPromptAdapter],
    )
    adapter = next(p for p in procs.all if isinstance(p, AdapterLogitsProcessor))
    update = BatchUpdate(
        1, [], [(0, SamplingParams(extra_args={"ban_prompt": True}), None, [])], []
    )
    with pytest.raises(ValueError, match="Prompt token ids are required"):
        adapter.update_state(update)


def test_loading_a_plain_class_imports_no_vllm():
    cfg = EngineConfig(max_num_seqs=4, vocab_size=16)
    with pytest.raises(ValueError, match="is not a subclass of LogitsProcessor"):
        build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=[dict])
    build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=[example.TargetTokenLogitsProcessor])
    assert "vllm" not in sys.modules


# --- with vLLM 0.25.1, each driver in its own process ----------------------------------------


def run_driver(name: str, *args: str) -> dict:
    if not (VLLM / "vllm" / "v1" / "sample" / "logits_processor" / "interface.py").is_file():
        reason = f"vLLM 0.25.1 is not installed in {VLLM} (tests/extras/vllm_v1.sh, make extras)"
        missing(reason)
    env = dict(os.environ, PYTHONPATH=f"{VLLM}{os.pathsep}{REPO / 'python'}")
    proc = subprocess.run(
        [sys.executable, str(DRIVERS / name), *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{name} failed:\n{proc.stdout}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def test_vllm_processors_run_in_our_build_logitsprocs():
    r = run_driver("v1_vllm_in_ours.py")
    assert r["swaps"] > 0 and r["example_rows_changed"] > 0
    assert r["builtin_compared"] > 0 and r["builtin_changed"] > 0


def test_ours_in_vllm_build_logitsprocs_match_native_under_churn():
    r = run_driver("v1_ours_in_vllm.py", "120")
    for mode in ("routed", "plain", "every_field"):
        c = r[mode]
        assert c["steps"] >= 40 and c["swaps"] > 0 and c["moves"] > c["swaps"], (mode, c)
        assert c["rows_changed"] > c["steps"], (mode, c)
    # The every-field classes without a reasoning config: no thinking table, and a request
    # that asks for a thinking budget is failed closed (its row all -inf but its stop tokens),
    # the log naming the field and the missing config.
    bare = r["without_reasoning"]
    assert "thinking" not in bare["tables"] and "penalties" in bare["tables"], bare
    assert bare["logged"] and "reasoning config" in bare["logged"][0], bare


def test_bridged_errors_fail_one_request_closed_and_leave_state_consistent():
    """A request the worker refuses is failed closed (the engine goes on); a step error that
    is about no one request still raises, naming the processor, with no table changed."""
    r = run_driver("v1_errors.py")
    assert r["checked"] == 7
    assert "failed closed" in r["update_error"] and "'boom'" in r["update_error"]
    assert "logit_bias" in r["field_error"]
    assert "no table changed" in r["step_error"]


def test_vllm_target_holds_no_second_torch():
    """The drivers run the venv's own torch: vLLM went in with --no-deps."""
    if not VLLM.is_dir():
        pytest.skip(f"{VLLM} is not installed")
    assert not (VLLM / "torch").exists()


def test_min_tokens_keeps_a_structured_rows_stop_tokens_when_nothing_else_is_left():
    """vLLM >= 0.32's fix, not 0.25.1's bug (a structured request ended by an engine error)."""
    assert run_driver("v1_structured.py")["checked"] == 3

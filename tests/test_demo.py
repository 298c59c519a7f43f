"""The main job runs end to end (small shape) and reports agreement with the reference."""

from __future__ import annotations

from _forkserver import run_module


def test_demo_agrees_with_reference():
    # ``python -m logitsproc_rs demo ...`` in a child of the fork server (torch already imported).
    args = ["demo", "--steps", "40", "--batch", "8", "--vocab", "512", "--device", "cpu"]
    run = run_module("logitsproc_rs", args, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "mismatches 0" in run.stdout
    assert "thinking_token_budget" in run.stdout  # every processor took part

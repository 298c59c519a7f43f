"""The main job runs end to end (small shape) and reports agreement with the reference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PYTHON_DIR = Path(__file__).resolve().parents[1] / "python"


def test_demo_agrees_with_reference():
    env = {**os.environ, "PYTHONPATH": str(PYTHON_DIR)}
    cmd = [sys.executable, "-m", "logitsproc_rs", "demo", "--steps", "40", "--batch", "8"]
    cmd += ["--vocab", "512", "--device", "cpu"]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "mismatches 0" in run.stdout
    assert "thinking_token_budget" in run.stdout  # every processor took part

"""Long subprocess work that starts as soon as collection ends.

A fixture whose cost is one subprocess (Triton's interpreter, a driver script: 20-60 s of one
core) registers that subprocess here (``job``); ``conftest.py`` starts the registered jobs the
selected tests need on the background thread(s) the real-engine scenarios also use, ahead of
them in the queue, while pytest runs the other tests. The fixture then takes the finished
result, or, if its job has not started yet, runs it itself (``result``): nothing waits behind
an engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

# The environment as the session started (this module is imported by ``conftest.py``): a job
# on a background thread must not see a test's ``monkeypatch``.
_SESSION_ENV = dict(os.environ)
_PYTHON_DIR = str(Path(__file__).resolve().parent.parent / "python")

_JOBS: dict[tuple[str, str], Callable[[], Any]] = {}
_FUTURES: dict[tuple[str, str], Future] = {}
_POOL: ThreadPoolExecutor | None = None
_LOCK = threading.Lock()


def pool() -> ThreadPoolExecutor:
    """The session's background threads (``LOGITSPROC_ENGINE_WORKERS``, default 1: with
    pytest itself, one busy process per core)."""
    global _POOL
    with _LOCK:
        if _POOL is None:
            workers = int(os.environ.get("LOGITSPROC_ENGINE_WORKERS", "1"))
            _POOL = ThreadPoolExecutor(workers, thread_name_prefix="background")
        return _POOL


def job(module: str, fixture: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    """Registers ``fn`` as the work of fixture ``fixture`` of test module ``module``."""

    def register(fn: Callable[[], Any]) -> Callable[[], Any]:
        _JOBS[module, fixture] = fn
        return fn

    return register


def plan(items: Iterable[pytest.Item]) -> None:
    """Start the jobs of the fixtures these tests use (``conftest.py``, after collection)."""
    keys = set()
    for item in items:
        module = getattr(item, "module", None)
        if module is None:
            continue
        keys |= {(module.__name__, f) for f in item.fixturenames if (module.__name__, f) in _JOBS}
    workers = pool()
    for key in sorted(keys):
        with _LOCK:
            if key not in _FUTURES:
                _FUTURES[key] = workers.submit(_JOBS[key])


def result(module: str, fixture: str) -> Any:
    """The job's result: the background run's if it started, else a run here and now."""
    key = (module, fixture)
    with _LOCK:
        future = _FUTURES.pop(key, None)
    if future is None or future.cancel():
        return _JOBS[key]()
    return future.result()


def cancel_all() -> None:
    """The session is over: what has not started never will."""
    with _LOCK:
        for future in _FUTURES.values():
            future.cancel()


def session_env(**extra: str) -> dict[str, str]:
    """The session's starting environment, plus ``extra``."""
    return dict(_SESSION_ENV, **extra)


def interpreter_script(module: str, script: Path, **extra_env: str) -> None:
    """Registers fixture ``interpreted`` of ``module``: ``script`` run by this Python under
    ``TRITON_INTERPRET=1`` with ``python/`` on the path (its checks print one ``RESULTS``
    JSON line; ``results`` reads it)."""

    def run() -> subprocess.CompletedProcess:
        env = session_env(TRITON_INTERPRET="1", **extra_env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (_PYTHON_DIR, env.get("PYTHONPATH"))))
        return subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
        )

    job(module, "interpreted")(run)


def results(proc: subprocess.CompletedProcess) -> dict[str, Any]:
    """The ``RESULTS`` JSON line of an ``interpreter_script`` run that succeeded."""
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULTS ") :])

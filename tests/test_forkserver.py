"""The tests' fork server (``tests/_forkserver.py``) behaves as a fresh interpreter does: the
same exit code, stdout and stderr as ``subprocess.run([sys.executable, "-c", ...])`` for scripts
that print, raise, exit, abort or register atexit handlers; a timeout kills the child and raises
``TimeoutExpired``; the server outlives its children and is replaced when it dies."""

from __future__ import annotations

import os
import subprocess
import sys

import _forkserver
import pytest
from _forkserver import ENV, run_module, run_python

SCRIPTS = {
    "argv_and_streams": (
        "import sys; print(sys.argv, __name__, repr(sys.path[0])); print('e', file=sys.stderr)",
        ["a", "b c"],
    ),
    "raises": ("def f():\n    raise ValueError('boom')\nf()", []),
    "exit_message": ("import sys; sys.exit('bye')", []),
    "exit_code": ("import sys; print('out'); sys.exit(3)", []),
    "abort": ("import os; print('lost', end=''); os.abort()", []),
    "environment": (
        "import os; print([os.environ.get(k) for k in ('PYTHONPATH', 'RUST_BACKTRACE',"
        " 'OMP_NUM_THREADS')], os.getcwd())",
        [],
    ),
    "atexit_and_no_newline": (
        "import atexit; atexit.register(print, 'at exit'); print(1, end='')",
        [],
    ),
    "main_module_classes": (
        "class A: pass\nimport pickle; print(pickle.loads(pickle.dumps(A())).__class__.__module__)",
        [],
    ),
}


def fresh(code: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **ENV},
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_same_as_a_fresh_interpreter(name: str) -> None:
    code, args = SCRIPTS[name]
    want = fresh(code, args)
    got = run_python(code, args, timeout=60)
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)


def test_module_same_as_a_fresh_interpreter() -> None:
    want = subprocess.run(
        [sys.executable, "-m", "calendar", "2024", "2"],
        capture_output=True,
        text=True,
        env={**os.environ, **ENV},
        timeout=60,
        check=False,
    )
    got = run_module("calendar", ["2024", "2"], timeout=60)
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)


needs_server = pytest.mark.skipif(_forkserver.FRESH, reason="LOGITSPROC_CRASH_FRESH=1: no server")


@needs_server
def test_a_child_past_its_timeout_is_killed_and_the_server_stays() -> None:
    pid = _forkserver.server().pid
    code = (
        "import subprocess, sys, time; p = subprocess.Popen(['sleep', '60']);"
        " print(p.pid, flush=True); time.sleep(60)"
    )
    with pytest.raises(subprocess.TimeoutExpired) as e:
        run_python(code, timeout=2)
    # The child's own child went with it (its process group was killed).
    sleeper = int(e.value.output.split()[0])
    try:
        os.kill(sleeper, 0)
        with open(f"/proc/{sleeper}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        assert state == "Z", f"pid {sleeper} still running ({state})"
    except ProcessLookupError:
        pass
    assert _forkserver.server().pid == pid
    assert run_python("print(2)", timeout=60).stdout == "2\n"


@needs_server
def test_a_dead_server_is_a_failing_case_and_is_replaced() -> None:
    pid = _forkserver.server().pid
    with pytest.raises(_forkserver.ServerDied, match="SIGKILL"):
        run_python("import os, signal; os.kill(os.getppid(), signal.SIGKILL)", timeout=60)
    assert run_python("print(3)", timeout=60).stdout == "3\n"
    assert _forkserver.server().pid != pid

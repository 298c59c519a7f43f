"""A fork server for the tests that run Python code in a fresh process only to isolate it (a case
that may abort, segfault, hang or eat memory; a check of interpreter shutdown or of
``sys.modules``).

``run_python(code, args, timeout=...)`` returns what ``subprocess.run([sys.executable, "-c", code,
*args], capture_output=True, text=True, env={**os.environ, **ENV}, timeout=timeout)`` returns (the
exit code, ``-signum`` for a signal, stdout and stderr; ``subprocess.TimeoutExpired`` past the
timeout), and ``run_module(name, args, ...)`` the same for ``python -m name``. Instead of starting
an interpreter and importing torch and logitsproc_rs (5-9 s on the test machine) per case, one
server per pytest process (started on first use, closed at exit) imports them once, with
``torch.set_num_threads(1)`` before any torch op (no OpenMP pool has started, so forking is safe),
and forks a child per case. The child, in a process group of its own, takes the caller's
environment, working directory and ``sys.argv``, gets a fresh ``__main__``, runs the code, and ends
as an interpreter does (``SystemExit``, uncaught exceptions through ``sys.excepthook``, exit code 1,
finalization and atexit handlers); the server reports its wait status. A child that the server has
to kill past the timeout takes its process group with it. The server outlives any child; if the
server itself dies, the case in flight fails with the server's log and the next case starts a new
one. A child maps what the server maps (so a case's ``RLIMIT_AS`` relative to its ``VmSize`` means
what it meant in a fresh interpreter) and costs ~0.4 s on an idle machine, nearly all of it its
exit (the C libraries' exit handlers write to pages it shares with the server: copy on write).

Environment variables read when an interpreter or torch starts (``STARTUP_PREFIXES``: ``PYTHON*``,
``OMP_*``, ``LD_*`` ...) are those of the server's start: a call asking for different values gets a
server started with them.

``LOGITSPROC_CRASH_FRESH=1`` runs every case in a fresh interpreter instead (the old way, for
debugging a case: same command, same environment).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import locale
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "python"

# What every served child runs with, on top of the caller's environment.
ENV = {"PYTHONPATH": str(SRC), "RUST_BACKTRACE": "0", "OMP_NUM_THREADS": "1"}

FRESH = os.environ.get("LOGITSPROC_CRASH_FRESH") == "1"

# Read at interpreter / library start-up: a child cannot change them, so they key the server.
# (Not every TORCH* variable: torch reads most when used, and sets TORCHINDUCTOR_CACHE_DIR in
# os.environ itself once transformers is imported, which would restart the server mid-session.)
STARTUP_PREFIXES = (
    "PYTHON",
    "OMP_",
    "KMP_",
    "GOMP_",
    "MKL_",
    "OPENBLAS_",
    "LD_",
    "MALLOC_",
    "TORCH_CPP_",
    "TORCH_SHOW_CPP_STACKTRACES",
    "PYTORCH_",
    "CUDA_",
)

STARTUP_TIMEOUT_S = 300
# How long past a case's own timeout the server may take to answer before it counts as dead.
ANSWER_GRACE_S = 60


def signal_name(rc: int) -> str:
    """``rc`` as ``subprocess`` reports it, with the signal's name when it is ``-signum``."""
    if rc < 0:
        try:
            return f"{rc} ({signal.Signals(-rc).name})"
        except ValueError:
            return f"{rc} (signal {-rc})"
    return str(rc)


def _text(data: bytes) -> str:
    """Bytes as ``subprocess.run(text=True)`` decodes them (locale encoding, universal
    newlines)."""
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _startup_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES)}


class ServerDied(RuntimeError):
    """The fork server died (or stopped answering) while it ran a case."""


class _Server:
    def __init__(self, env: dict[str, str]) -> None:
        self.key = _startup_env(env)
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (lives as long as the server)
            prefix="logitsproc-forkserver-", suffix=".log", delete=False
        )
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            start_new_session=True,
        )
        self._buf = b""
        ready = self._recv(STARTUP_TIMEOUT_S)
        self.pid = ready["ready"]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self) -> str:
        try:
            return Path(self.log.name).read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def _recv(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise ServerDied(f"the fork server did not answer in {timeout:.0f} s")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                self.proc.wait()
                raise ServerDied(
                    f"the fork server died (rc {signal_name(self.proc.returncode)}); "
                    f"its log:\n{self.log_tail()}"
                )
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def call(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.proc.wait()
            raise ServerDied(
                f"the fork server had died (rc {signal_name(self.proc.returncode)}); "
                f"its log:\n{self.log_tail()}"
            ) from None
        return self._recv(timeout + ANSWER_GRACE_S)

    def close(self) -> None:
        """Stop the server (end of input, then SIGKILL after 10 s) and release its pipes."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
        self.proc.stdout.close()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_server: _Server | None = None


def server(env: dict[str, str] | None = None) -> _Server:
    """The running server for ``env`` (default: the caller's environment plus ``ENV``), started
    (or restarted) when there is none, it died, or ``env``'s start-up variables differ."""
    global _server
    env = {**os.environ, **ENV} if env is None else env
    if _server is not None and (not _server.alive() or _server.key != _startup_env(env)):
        _server.close()
        _server = None
    if _server is None:
        _server = _Server(env)
    return _server


@atexit.register
def _close() -> None:
    global _server
    if _server is not None:
        _server.close()
        _server = None


def _run(
    mode: str,
    target: str,
    args: Sequence[str],
    env: Mapping[str, str] | None,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **ENV, **(env or {})}
    cmd = [sys.executable, mode, target, *args]
    if FRESH:
        return subprocess.run(
            cmd, capture_output=True, text=True, env=full_env, timeout=timeout, check=False
        )
    srv = server(full_env)
    with tempfile.TemporaryDirectory(prefix="logitsproc-case-") as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        out.touch()
        err.touch()
        try:
            answer = srv.call(
                {
                    "mode": mode,
                    "target": target,
                    "args": list(args),
                    "env": full_env,
                    "cwd": os.getcwd(),
                    "stdout": str(out),
                    "stderr": str(err),
                    "timeout": timeout,
                },
                timeout,
            )
        except ServerDied:
            srv.kill()
            raise
        stdout, stderr = _text(out.read_bytes()), _text(err.read_bytes())
    if answer.get("timed_out"):
        raise subprocess.TimeoutExpired(cmd, timeout, output=stdout, stderr=stderr)
    if "error" in answer:
        raise RuntimeError(f"the fork server could not run the case: {answer['error']}")
    return subprocess.CompletedProcess(cmd, answer["rc"], stdout, stderr)


def run_python(
    code: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    """``python -c code *args`` in a forked child (see the module docstring)."""
    return _run("-c", code, args, env, timeout)


def run_module(
    name: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    """``python -m name *args`` in a forked child (see the module docstring)."""
    return _run("-m", name, args, env, timeout)


# ---------------------------------------------------------------------------------------------
# The server (this file run as a script)


def _wait(pid: int, timeout: float) -> int | None:
    """The child's wait status, or None past ``timeout``."""
    deadline = time.monotonic() + timeout
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            wpid, status = os.waitpid(pid, os.WNOHANG)
            if wpid:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if pidfd is not None:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(left, 0.01))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _serve() -> dict[str, Any]:
    """Answer requests until stdin closes (then exit). Returns only in a forked child, with the
    request it is to run."""
    # The protocol moves off fds 0 and 1, so that nothing else writes into it.
    rfile = os.fdopen(os.dup(0), "rb")
    wfd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)

    import torch

    torch.set_num_threads(1)  # before any torch op: no OpenMP pool, so fork is safe
    import logitsproc_rs  # noqa: F401

    # Out of the collector's reach: a child's collections and its shutdown would otherwise touch
    # (copy on write) every object the imports made: 1.3-2.5 s per child, not ~0.4 s (measured).
    gc.freeze()

    def send(msg: dict[str, Any]) -> None:
        os.write(wfd, json.dumps(msg).encode() + b"\n")

    send({"ready": os.getpid()})
    while True:
        line = rfile.readline()
        if not line:
            sys.exit(0)
        req = json.loads(line)
        try:
            out = os.open(req["stdout"], os.O_WRONLY | os.O_TRUNC)
            err = os.open(req["stderr"], os.O_WRONLY | os.O_TRUNC)
        except OSError as e:
            send({"error": repr(e)})
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)
            os.dup2(devnull, 0)
            os.dup2(out, 1)
            os.dup2(err, 2)
            for fd in (out, err, devnull, wfd):
                os.close(fd)
            rfile.close()
            return req
        with contextlib.suppress(OSError):  # the child did it first (or has already exited)
            os.setpgid(pid, pid)
        os.close(out)
        os.close(err)
        status = _wait(pid, req["timeout"])
        if status is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            send({"timed_out": True})
        else:
            send({"rc": os.waitstatus_to_exitcode(status)})


def _run_request(req: dict[str, Any]) -> None:
    """In the forked child: become ``python -c code *args`` (or ``-m``) and run it."""
    import builtins
    import runpy
    import types

    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    if req["mode"] == "-c":
        sys.argv = ["-c", *req["args"]]
        sys.path[0] = ""
        code = compile(req["target"], "<string>", "exec")
    else:
        sys.argv = ["-m", *req["args"]]
        sys.path[0] = os.getcwd()
        code = None
    try:
        if code is not None:
            exec(code, main.__dict__)
        else:
            runpy._run_module_as_main(req["target"], alter_argv=True)  # type: ignore[attr-defined]
    except SystemExit:
        raise
    except BaseException:
        t, v, tb = sys.exc_info()
        assert t is not None and v is not None and tb is not None
        v = v.with_traceback(tb.tb_next)  # without this frame
        sys.excepthook(t, v, v.__traceback__)
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _run_request(_serve())

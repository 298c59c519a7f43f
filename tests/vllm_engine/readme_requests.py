"""The README's ``vllm serve`` example, as written, against a running server (``served.py``):
its ``curl`` command run by bash and its ``openai`` snippet executed, with only the address
and the model name replaced; then the same request body again, with the token ids returned
(``return_token_ids``), and without our fields, so the tests can check the documented effects.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from served import MODEL_NAME

README = Path(__file__).resolve().parents[2] / "README.md"
ADDRESS = "http://localhost:8000"


def _blocks(fence: str) -> list[str]:
    return re.findall(rf"```{fence}\n(.*?)```", README.read_text(), flags=re.S)


def _one(fence: str, needle: str) -> str:
    found = [b for b in _blocks(fence) if needle in b]
    assert len(found) == 1, f"the README has {len(found)} {fence} blocks with {needle!r}"
    return found[0]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        out: dict = json.loads(r.read())
        return out


def run(server: Any) -> dict:
    root = server.base_url.removesuffix("/v1")
    serve = _one("sh", "vllm serve")
    curl = _one("sh", "curl ")
    client = _one("python", "from openai import")
    model = re.search(r'"model": "([^"]+)"', curl)
    assert model is not None, curl
    out: dict[str, Any] = {"classes": re.findall(r"\S+:\w+LogitsProcessor\b", serve)}

    # The curl command as written (address and model replaced), run by bash.
    cmd = curl.replace(ADDRESS, root).replace(model.group(1), MODEL_NAME)
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    out["curl_rc"] = proc.returncode
    out["curl_text"] = json.loads(proc.stdout)["choices"][0]["text"]

    # The same body, the token ids returned; and without our fields.
    body_text = re.search(r"-d '(.*)'", cmd, flags=re.S)
    assert body_text is not None, cmd
    body = json.loads(body_text.group(1))
    out["xargs"] = body["vllm_xargs"]
    url = f"{root}/v1/completions"
    ours = _post(url, {**body, "return_token_ids": True})["choices"][0]
    plain = _post(
        url, {k: v for k, v in body.items() if k != "vllm_xargs"} | {"return_token_ids": True}
    )
    out["prompt_ids"] = ours["prompt_token_ids"]
    out["ids"], out["text"] = ours["token_ids"], ours["text"]
    out["plain_ids"] = plain["choices"][0]["token_ids"]

    # The openai snippet as written (address and model replaced), executed.
    code = client.replace(f"{ADDRESS}/v1", server.base_url).replace(model.group(1), MODEL_NAME)
    printed = io.StringIO()
    namespace: dict[str, Any] = {}
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md openai block", "exec"), namespace)
    out["openai_printed"] = printed.getvalue()
    out["openai_text"] = namespace["completion"].choices[0].text
    return out

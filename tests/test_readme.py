"""The README's Python snippets run as written, in order, in one namespace.

Blocks that import transformers run after the others, and only where it is installed (under
``make test``, which installs it, missing is a failure)."""

from __future__ import annotations

import re
from pathlib import Path

from _extras import import_extra

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def _needs_transformers(code: str) -> bool:
    return re.search(r"^\s*(from|import) transformers\b", code, flags=re.M) is not None


def test_readme_snippets_run() -> None:
    blocks = [b for b in _blocks() if not _needs_transformers(b)]
    assert len(blocks) >= 4
    namespace: dict[str, object] = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"README.md python block {i}", "exec"), namespace)
    assert int(namespace["procs"].bytes_uploaded_last_step) >= 0  # type: ignore[attr-defined]


def test_readme_transformers_snippets_run() -> None:
    blocks = [b for b in _blocks() if _needs_transformers(b)]
    assert blocks, "the README shows logitsproc_rs.hf"
    import_extra("transformers", "transformers not installed (make extras)")
    namespace: dict[str, object] = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"README.md transformers block {i}", "exec"), namespace)

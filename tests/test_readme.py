"""The Python snippets of the README and of ``docs/*.md`` run as written, in order.

The README's snippets run in one namespace. A docs page's snippets continue the README's
example (they use its ``cfg``, ``dev``, ``params``, ``update`` and ``out``, as each page says),
so each page runs in a fresh namespace after the README's snippets. Blocks that import
transformers run after the others, each page's in a namespace of their own, and only where
transformers is installed (under ``make test``, which installs it, missing is a failure).
Every relative link of these pages points to a file that exists, and to a heading of it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _extras import import_extra

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]


def _blocks(page: Path = README) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


def _needs_transformers(code: str) -> bool:
    return re.search(r"^\s*(from|import) transformers\b", code, flags=re.M) is not None


def _needs_a_server(code: str) -> bool:
    """An ``openai`` client's request to ``vllm serve``: run against a real server, as written,
    by ``tests/test_vllm_engine.py`` (``tests/vllm_engine/readme_requests.py``)."""
    return re.search(r"^\s*(from|import) openai\b", code, flags=re.M) is not None


def _plain(page: Path) -> list[str]:
    return [b for b in _blocks(page) if not (_needs_transformers(b) or _needs_a_server(b))]


def _run(page: Path, blocks: list[str], namespace: dict[str, object], kind: str) -> None:
    name = page.relative_to(ROOT)
    for i, code in enumerate(blocks):
        exec(compile(code, f"{name} {kind} block {i}", "exec"), namespace)


def test_readme_snippets_run() -> None:
    blocks = _plain(README)
    # the sampler and the custom processor; the other snippets live in docs/ and run below
    assert len(blocks) >= 2
    assert len(blocks) + sum(len(_plain(p)) for p in DOCS) >= 5
    namespace: dict[str, object] = {}
    _run(README, blocks, namespace, "python")
    assert int(namespace["procs"].bytes_uploaded_last_step) >= 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("page", [p for p in DOCS if _plain(p)], ids=lambda p: p.name)
def test_docs_snippets_run(page: Path) -> None:
    namespace: dict[str, object] = {}
    _run(README, _plain(README), namespace, "python")
    _run(page, _plain(page), namespace, "python")


def test_docs_show_every_front_end_and_bridge() -> None:
    code = "\n".join(b for p in PAGES for b in _blocks(p))
    for needle in ("token_feed=True", "stable_slots=True", "AdapterLogitsProcessor"):
        assert needle in code, f"no snippet shows {needle}"


def test_readme_transformers_snippets_run() -> None:
    pages = [p for p in PAGES if any(_needs_transformers(b) for b in _blocks(p))]
    assert pages, "the docs show logitsproc_rs.hf"
    import_extra("transformers", "transformers not installed (make extras)")
    for page in pages:
        namespace: dict[str, object] = {}
        blocks = [b for b in _blocks(page) if _needs_transformers(b)]
        _run(page, blocks, namespace, "transformers")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: link to missing {target}"
        if anchor:
            assert anchor in _anchors(dest), f"{page.name}: no heading for {target}"

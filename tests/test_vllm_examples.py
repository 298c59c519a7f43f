"""vLLM's own processor code runs here with only its imports changed.

vLLM 0.25.1's wheel ships a real ``AdapterLogitsProcessor`` subclass: DeepSeek-OCR's
``NGramPerReqLogitsProcessor`` with its per-request ``NoRepeatNGramLogitsProcessor``
(``vllm/model_executor/models/deepseek_ocr.py``). The test reads both classes' source from the
installed wheel (``tests/extras/vllm_v1.sh``; nothing of it is copied into this repository),
executes it against ``logitsproc_rs``'s names instead of vLLM's, and drives it under churn
through our ``build_logitsprocs`` and ``Sampler`` against a plain per-row statement of its rule.
No vLLM module is imported.
"""

from __future__ import annotations

import ast
import os
import random
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch
from _extras import missing

import logitsproc_rs as L
from logitsproc_rs.simulate import ChurnSimulator

SOURCE = (
    Path(os.environ.get("LOGITSPROC_VLLM_V1_DIR", Path.home() / ".cache/logitsproc_rs/vllm-0.25.1"))
    / "vllm/model_executor/models/deepseek_ocr.py"
)
CLASSES = ("NoRepeatNGramLogitsProcessor", "NGramPerReqLogitsProcessor")
V = 8  # a small vocabulary: n-grams repeat often


@pytest.fixture(scope="module")
def ngram_cls() -> type:
    if not SOURCE.is_file():
        why = f"vLLM 0.25.1 not installed ({SOURCE} missing; make extras)"
        missing(why)
    tree = ast.parse(SOURCE.read_text())
    found = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in CLASSES}
    assert set(found) == set(CLASSES), f"vLLM's file changed: found {sorted(found)}"
    module = ast.Module(body=[found[c] for c in CLASSES], type_ignores=[])
    # The import line, changed: our names where vLLM's file imports its own.
    namespace = {
        "torch": torch,
        "Iterable": Iterable,
        "AdapterLogitsProcessor": L.AdapterLogitsProcessor,
        "RequestLogitsProcessor": L.RequestLogitsProcessor,
        "SamplingParams": L.SamplingParams,
    }
    exec(compile(module, str(SOURCE), "exec"), namespace)
    return namespace["NGramPerReqLogitsProcessor"]


def banned(output: list[int], n: int, window: int, whitelist: set[int]) -> set[int]:
    """The rule, stated per row: a token that would repeat an n-gram seen in the last
    ``window`` outputs is banned, unless whitelisted."""
    if len(output) < n:
        return set()
    prefix = output[len(output) - (n - 1) :]
    start = max(0, len(output) - window)
    out = set()
    for i in range(start, len(output) - n + 1):
        if output[i : i + n - 1] == prefix:
            out.add(output[i + n - 1])
    return out - whitelist


def make_params(rng: random.Random) -> L.SamplingParams:
    extra = None
    if rng.random() < 0.7:
        extra = {"ngram_size": rng.choice((2, 3)), "window_size": rng.choice((4, 100))}
        if rng.random() < 0.3:
            extra["whitelist_token_ids"] = [rng.randrange(V)]
    return L.SamplingParams(temperature=0.0, max_tokens=None, extra_args=extra)


def test_vllm_ngram_processor_runs_here_under_churn(ngram_cls) -> None:
    cfg = L.EngineConfig(max_num_seqs=16, vocab_size=V)
    procs = L.build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=[ngram_cls])
    ours = next(p for p in procs.all if isinstance(p, ngram_cls))
    sim = ChurnSimulator(16, V, 3, make_params, max_tokens=(4, 40))
    g = torch.Generator().manual_seed(0)
    masked_rows = 0
    for _ in range(150):
        procs.update_state(sim.step())
        rows = sim.batch.rows()
        x = torch.randn(len(rows), V, generator=g)
        got = ours.apply(x.clone())
        want = x.clone()
        for i, r in enumerate(rows):
            e = r.params.extra_args
            if e:
                ban = banned(
                    r.output_token_ids,
                    e["ngram_size"],
                    e["window_size"],
                    set(e.get("whitelist_token_ids") or ()),
                )
                want[i, sorted(ban)] = float("-inf")
                masked_rows += bool(ban)
        assert torch.equal(got, want)
    assert masked_rows > 100  # the rule really banned tokens, on many rows


def test_vllm_ngram_processor_validate_params(ngram_cls) -> None:
    ngram_cls.validate_params(L.SamplingParams(extra_args={"ngram_size": 3}))
    with pytest.raises(ValueError, match="ngram_size"):
        ngram_cls.validate_params(L.SamplingParams(extra_args={"ngram_size": 0}))
    with pytest.raises(ValueError, match="ngram_size"):
        L.validate_logits_processors_parameters(
            [ngram_cls], L.SamplingParams(extra_args={"ngram_size": -1})
        )

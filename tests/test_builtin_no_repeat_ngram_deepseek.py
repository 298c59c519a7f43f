"""No-repeat-ngram, DeepSeek-OCR's variant (``no_repeat_ngram_output_only``,
``no_repeat_ngram_window``, ``no_repeat_ngram_whitelist``): against the plain reference under
seeded churn on every route, against DeepSeek-OCR's own ``NGramPerReqLogitsProcessor`` (its
source read from the installed vLLM 0.25.1 wheel at test time, as ``test_vllm_examples.py``
does; nothing of it is copied here), the defaults staying HF's rule, and its bad input."""

from __future__ import annotations

import ast
import os
import random
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _extras import missing
from _helpers import routes_match_reference, upd

import logitsproc_rs as L
from logitsproc_rs import (
    EngineConfig,
    NoRepeatNGramLogitsProcessor,
    RequestError,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.pipeline import Pipeline
from logitsproc_rs.reference import RefNoRepeatNGramLogitsProcessor
from logitsproc_rs.simulate import ChurnSimulator

V = 12
CAP = 6
SOURCE = (
    Path(os.environ.get("LOGITSPROC_VLLM_V1_DIR", Path.home() / ".cache/logitsproc_rs/vllm-0.25.1"))
    / "vllm/model_executor/models/deepseek_ocr.py"
)
CLASSES = ("NoRepeatNGramLogitsProcessor", "NGramPerReqLogitsProcessor")


def small_tokens(rng: random.Random, _req: Any) -> int:
    return rng.randrange(4)


def make_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(
        no_repeat_ngram_size=rng.choice((0, 1, 2, 2, 3, 4)),
        no_repeat_ngram_window=rng.choice((0, 0, 1, 3, 5, 9, 100)),
        no_repeat_ngram_output_only=rng.random() < 0.6,
        no_repeat_ngram_whitelist=rng.choice((None, [], [1], [0, 3])),
        max_tokens=None,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_route_matches_the_reference_under_churn(seed: int) -> None:
    sim = ChurnSimulator(
        CAP, V, seed, make_params, next_token=small_tokens, prompt_len=(0, 9), max_tokens=(4, 60)
    )
    g = torch.Generator().manual_seed(seed)
    masked = routes_match_reference(
        NoRepeatNGramLogitsProcessor,
        RefNoRepeatNGramLogitsProcessor,
        sim,
        CAP,
        V,
        lambda _k, rows: torch.randn(rows, V, generator=g),
    )
    assert masked > 100


@pytest.fixture(scope="module")
def deepseek_cls() -> type:
    if not SOURCE.is_file():
        missing(f"vLLM 0.25.1 not installed ({SOURCE} missing; make extras)")
    tree = ast.parse(SOURCE.read_text())
    found = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in CLASSES}
    assert set(found) == set(CLASSES), f"vLLM's file changed: found {sorted(found)}"
    module = ast.Module(body=[found[c] for c in CLASSES], type_ignores=[])
    namespace = {  # the file's imports, answered with our names
        "torch": torch,
        "Iterable": Iterable,
        "AdapterLogitsProcessor": L.AdapterLogitsProcessor,
        "RequestLogitsProcessor": L.RequestLogitsProcessor,
        "SamplingParams": L.SamplingParams,
    }
    exec(compile(module, str(SOURCE), "exec"), namespace)
    return namespace["NGramPerReqLogitsProcessor"]


def both(rng: random.Random) -> SamplingParams:
    """One request as DeepSeek-OCR's processor reads it (``extra_args``) and as ours does (our
    fields), the same settings; ``n >= 2`` (``n = 1``: see the test below)."""
    if rng.random() < 0.2:
        return SamplingParams(max_tokens=None)
    n = rng.choice((2, 3, 4))
    window = rng.choice((None, 2, 4, 7, 100))
    whitelist = rng.choice((None, [], [1], [0, 2]))
    extra: dict[str, Any] = {"ngram_size": n}
    if window is not None:
        extra["window_size"] = window
    if whitelist is not None:
        extra["whitelist_token_ids"] = whitelist
    return SamplingParams(
        max_tokens=None,
        extra_args=extra,
        no_repeat_ngram_size=n,
        no_repeat_ngram_window=100 if window is None else window,  # DeepSeek's default: 100
        no_repeat_ngram_output_only=True,
        no_repeat_ngram_whitelist=whitelist,
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_equals_deepseek_ocrs_own_processor_under_churn(deepseek_cls: type, seed: int) -> None:
    cfg = EngineConfig(max_num_seqs=CAP, vocab_size=V)
    extra = [deepseek_cls, NoRepeatNGramLogitsProcessor]
    one = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=extra)
    emu = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=extra, emulate_device=True)
    sim = ChurnSimulator(
        CAP, V, seed, both, next_token=small_tokens, prompt_len=(0, 9), max_tokens=(4, 80)
    )
    g = torch.Generator().manual_seed(seed)
    masked = 0
    for k in range(200):
        update = sim.step()
        one.update_state(update)
        emu.update_state(update)
        x = torch.randn(len(sim.batch.rows()), V, generator=g)
        theirs = next(p for p in one.all if isinstance(p, deepseek_cls)).apply(x.clone())
        for procs in (one, emu):
            ours = next(p for p in procs.all if isinstance(p, NoRepeatNGramLogitsProcessor))
            assert torch.equal(ours.apply(x.clone()), theirs), f"step {k}"
        masked += int(torch.isinf(theirs).sum())
    assert masked > 200


def test_size_one_bans_the_window_unlike_deepseeks_code(deepseek_cls: type) -> None:
    """The one documented difference: ``n = 1`` bans every token of the window (HF's 1-gram);
    DeepSeek-OCR's code bans nothing (its prefix ``output_ids[-0:]`` is the whole output)."""
    cfg = EngineConfig(max_num_seqs=1, vocab_size=V)
    sp = SamplingParams(
        extra_args={"ngram_size": 1, "window_size": 2},
        no_repeat_ngram_size=1,
        no_repeat_ngram_window=2,
        no_repeat_ngram_output_only=True,
    )
    procs = build_logitsprocs(
        cfg, "cpu", False, custom_logitsprocs=[deepseek_cls, NoRepeatNGramLogitsProcessor]
    )
    procs.update_state(upd(1, added=[(0, sp, [7], [1, 2, 3])]))
    theirs = next(p for p in procs.all if isinstance(p, deepseek_cls)).apply(torch.zeros(1, V))
    ours = next(p for p in procs.all if isinstance(p, NoRepeatNGramLogitsProcessor))
    got = ours.apply(torch.zeros(1, V))
    assert not torch.isinf(theirs).any()
    assert torch.isinf(got[0]).nonzero().flatten().tolist() == [2, 3]


def test_defaults_are_hfs_rule_bit_for_bit() -> None:
    """Window 0, output-only false, an empty or absent whitelist: HF's bans (prompt included,
    the engine's window), as a request that names none of the fields."""
    cfg = EngineConfig(max_num_seqs=4, vocab_size=V, max_no_repeat_ngram_window=6)
    params = [
        SimpleNamespace(no_repeat_ngram_size=2),
        SamplingParams(no_repeat_ngram_size=2),
        SamplingParams(no_repeat_ngram_size=2, no_repeat_ngram_whitelist=[]),
        SimpleNamespace(
            no_repeat_ngram_size=2,
            no_repeat_ngram_window=None,
            no_repeat_ngram_output_only=None,
            no_repeat_ngram_whitelist=None,
        ),
    ]
    rng = random.Random(3)
    prompt = [rng.randrange(4) for _ in range(5)]
    for proc in (
        NoRepeatNGramLogitsProcessor(cfg, "cpu", False),
        RefNoRepeatNGramLogitsProcessor(cfg, torch.device("cpu"), False),
    ):
        outs: list[list[int]] = [[] for _ in params]
        proc.update_state(upd(4, added=[(i, p, prompt, outs[i]) for i, p in enumerate(params)]))
        for _ in range(40):
            t = rng.randrange(4)
            for o in outs:
                o.append(t)
            proc.update_state(None)
            y = proc.apply(torch.zeros(4, V))
            for r in range(1, 4):
                assert torch.equal(y[r], y[0])


def test_bad_input_names_the_request_and_field() -> None:
    for kwargs, field in (
        ({"no_repeat_ngram_window": -1}, "no_repeat_ngram_window"),
        ({"no_repeat_ngram_window": 2.0}, "no_repeat_ngram_window"),
        ({"no_repeat_ngram_output_only": 1}, "no_repeat_ngram_output_only"),
        ({"no_repeat_ngram_whitelist": [-1]}, "no_repeat_ngram_whitelist"),
        ({"no_repeat_ngram_whitelist": "12"}, "no_repeat_ngram_whitelist"),
    ):
        with pytest.raises(RequestError) as ei:
            SamplingParams(**kwargs)
        assert ei.value.field == field
    cfg = EngineConfig(
        max_num_seqs=2, vocab_size=V, max_no_repeat_ngram_window=8, max_no_repeat_ngram_whitelist=2
    )
    emu = Pipeline(cfg, "cpu", False, tables=("no_repeat_ngram",), emulate_device=True)
    for proc in (
        NoRepeatNGramLogitsProcessor(cfg, "cpu", False),
        NoRepeatNGramLogitsProcessor(cfg, "cpu", False, pipeline=emu),
    ):
        proc.update_state(
            upd(1, added=[(0, SamplingParams(no_repeat_ngram_size=2), [1, 2, 1], [])])
        )
        for bad, field, what in (
            ({"no_repeat_ngram_window": 9}, "no_repeat_ngram_window", "max_no_repeat_ngram_window"),
            ({"no_repeat_ngram_window": -1}, "no_repeat_ngram_window", "no_repeat_ngram_window"),
            ({"no_repeat_ngram_output_only": 1}, "no_repeat_ngram_output_only", "bool"),
            ({"no_repeat_ngram_whitelist": [V]}, "no_repeat_ngram_whitelist", "outside"),
            ({"no_repeat_ngram_whitelist": [0, 1, 2]}, "no_repeat_ngram_whitelist", "cap"),
        ):
            params = SimpleNamespace(no_repeat_ngram_size=2, **bad)
            with pytest.raises(ValueError, match=what) as e:
                proc.update_state(upd(2, added=[(1, params, [1], [])]))
            assert getattr(e.value, "index", None) == 1
            assert getattr(e.value, "field", None) == field
        # Nothing changed: slot 0 still bans token 2 (after "1"), slot 1 is free.
        out = proc.apply(torch.zeros(1, V))
        assert torch.isinf(out[0]).nonzero().flatten().tolist() == [2]

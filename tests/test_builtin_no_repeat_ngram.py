"""No-repeat-ngram (HF's ``no_repeat_ngram_size``, prompt included): against HF's own
``NoRepeatNGramLogitsProcessor``, against the plain reference under seeded churn on every
route (one call, vLLM's loop, the device path, the token feed, stable slots), and its bad input.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _helpers import routes_match_reference

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    NoRepeatNGramLogitsProcessor,
    RequestError,
    SamplingParams,
)
from logitsproc_rs.pipeline import Pipeline
from logitsproc_rs.reference import RefNoRepeatNGramLogitsProcessor
from logitsproc_rs.simulate import ChurnSimulator

V = 12
CAP = 6


def small_tokens(rng: random.Random, _req: Any) -> int:
    """Few distinct tokens, so n-grams repeat and bans are frequent."""
    return rng.randrange(5)


def make_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(no_repeat_ngram_size=rng.choice((0, 1, 2, 2, 3, 4, 7)), max_tokens=None)


def churn(seed: int) -> ChurnSimulator:
    return ChurnSimulator(
        CAP, V, seed, make_params, next_token=small_tokens, prompt_len=(0, 9), max_tokens=(4, 60)
    )


def config(window: int | None = None) -> EngineConfig:
    if window is None:
        return EngineConfig(max_num_seqs=CAP, vocab_size=V)
    return EngineConfig(max_num_seqs=CAP, vocab_size=V, max_no_repeat_ngram_window=window)


def route(kind: str, cfg: EngineConfig) -> Any:
    if kind == "emulated":
        pipe = Pipeline(cfg, "cpu", False, tables=("no_repeat_ngram",), emulate_device=True)
        return NoRepeatNGramLogitsProcessor(cfg, "cpu", False, pipeline=pipe)
    return NoRepeatNGramLogitsProcessor(cfg, "cpu", False)


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("kind", ["host", "emulated"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_churn_matches_the_reference(seed: int, kind: str, window: int | None) -> None:
    cfg = config(window)
    ours, ref = route(kind, cfg), RefNoRepeatNGramLogitsProcessor(cfg, torch.device("cpu"), False)
    sim = churn(seed)
    g = torch.Generator().manual_seed(seed)
    banned = 0
    for step in range(150):
        update = sim.step()
        ours.update_state(update)
        ref.update_state(update)
        rows = sim.batch.num_reqs
        logits = torch.randn(rows, V, generator=g)
        want = ref.apply(logits.clone())
        got = ours.apply(logits.clone())
        assert torch.equal(got, want), f"step {step}\n{got}\n{want}"
        banned += int(torch.isinf(want).sum())
    assert banned > 50  # the churn did ban


def test_every_route_of_one_pipeline_agrees() -> None:
    """One call, vLLM's loop over a pipeline's processors, the device path, the token feed,
    stable slots (a request keeps its slot; rows map to slots) and the view alone all give the
    reference's logits."""
    g = torch.Generator().manual_seed(7)
    routes_match_reference(
        NoRepeatNGramLogitsProcessor,
        RefNoRepeatNGramLogitsProcessor,
        churn(7),
        CAP,
        V,
        lambda _step, rows: torch.randn(rows, V, generator=g),
        steps=150,
    )


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_bans_equal_transformers(n: int) -> None:
    """Against HF's own processor (the transformers version the test extras install): the
    same rows banned, a prompt included, for histories that repeat often."""
    hf = pytest.importorskip("transformers.generation.logits_process")
    rng = random.Random(n)
    cfg = config()
    ours = NoRepeatNGramLogitsProcessor(cfg, "cpu", False)
    rows = 4
    prompts = [[rng.randrange(4) for _ in range(6)] for _ in range(rows)]
    outputs: list[list[int]] = [[] for _ in range(rows)]
    added = [
        (i, SamplingParams(no_repeat_ngram_size=n, max_tokens=None), prompts[i], outputs[i])
        for i in range(rows)
    ]
    ours.update_state(BatchUpdate(batch_size=rows, removed=[], added=added, moved=[]))
    theirs = hf.NoRepeatNGramLogitsProcessor(n)
    for step in range(40):
        ids = torch.tensor([p + o for p, o in zip(prompts, outputs, strict=True)])
        scores = torch.zeros(rows, V)
        want = theirs(ids, scores.clone())
        got = ours.apply(scores.clone())
        assert torch.equal(torch.isinf(got), torch.isinf(want)), f"n={n} step {step}"
        for o in outputs:
            o.append(rng.randrange(4))
        ours.update_state(None)


def test_bad_sizes_name_the_request_and_field() -> None:
    with pytest.raises(RequestError) as ei:
        SamplingParams(no_repeat_ngram_size=-1)
    assert ei.value.field == "no_repeat_ngram_size"
    cfg = EngineConfig(max_num_seqs=2, vocab_size=V, max_no_repeat_ngram_size=3)
    ours = NoRepeatNGramLogitsProcessor(cfg, "cpu", False)
    for bad, what in ((4, "max_no_repeat_ngram_size"), (True, "bool"), (2.5, "int")):
        params = SimpleNamespace(no_repeat_ngram_size=bad)
        with pytest.raises(ValueError, match=what) as e:
            ours.update_state(
                BatchUpdate(batch_size=2, removed=[], added=[(1, params, [1], [])], moved=[])
            )
        assert getattr(e.value, "index", None) == 1
        assert getattr(e.value, "field", None) == "no_repeat_ngram_size"
    # Nothing was added: the next update still finds both slots free.
    ours.update_state(
        BatchUpdate(
            batch_size=1,
            removed=[],
            added=[(0, SamplingParams(no_repeat_ngram_size=2), [1, 2, 1], [])],
            moved=[],
        )
    )
    out = ours.apply(torch.zeros(1, V))
    assert math.isinf(out[0, 2]) and int(torch.isinf(out).sum()) == 1


def test_hf_generate_gives_transformers_own_tokens(tiny_llama: Any) -> None:
    """In ``model.generate()`` on a tiny random Llama: our no-repeat-ngram, per row through
    ``HFLogitsProcessor``, gives the tokens of HF's own ``no_repeat_ngram_size`` (greedy, a
    model that repeats itself without it)."""
    transformers = pytest.importorskip("transformers")
    from logitsproc_rs.hf import HFLogitsProcessor, neutral_generate_kwargs

    model = tiny_llama
    ids = torch.randint(3, 60, (3, 8), generator=torch.Generator().manual_seed(1))
    for n in (2, 3):
        with torch.no_grad():
            theirs = model.generate(ids, max_new_tokens=40, do_sample=False, no_repeat_ngram_size=n)
            plain = model.generate(ids, max_new_tokens=40, do_sample=False)
            proc = HFLogitsProcessor(
                [SamplingParams(temperature=0.0, no_repeat_ngram_size=n, max_tokens=None)] * 3
            )
            ours = model.generate(
                ids,
                logits_processor=transformers.LogitsProcessorList([proc]),
                max_new_tokens=40,
                **neutral_generate_kwargs(),
            )
        assert torch.equal(ours, theirs), f"n={n}"
        assert not torch.equal(plain, theirs)  # the ban changed what the model says

"""The penalty window (``penalty_last_n``, llama.cpp's): repetition over prompt + output, frequency
and presence over the output, each restricted to the last ``n`` positions of prompt + output.
Against the plain reference under seeded churn on every route (windows smaller than the prompt
included), with async placeholders and shrinking outputs, unset staying exactly today's
penalties, and its bad input."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _helpers import routes_match_reference, upd

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    PenaltiesLogitsProcessor,
    RequestError,
    SamplingParams,
)
from logitsproc_rs.pipeline import Pipeline
from logitsproc_rs.reference import RefPenaltiesLogitsProcessor
from logitsproc_rs.simulate import ChurnSimulator

V = 10
CAP = 6
WINDOWS = (None, -1, 0, 1, 2, 3, 5, 8, 30)


def make_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(
        repetition_penalty=rng.choice((1.0, 1.3, 0.7)),
        frequency_penalty=rng.choice((0.0, 0.5, -0.25)),
        presence_penalty=rng.choice((0.0, 0.75)),
        penalty_last_n=rng.choice(WINDOWS),
        max_tokens=None,
    )


def small_tokens(rng: random.Random, _req: Any) -> int:
    return rng.randrange(6)  # few distinct tokens: counts above one, windows that differ


def random_logits(seed: int) -> Any:
    g = torch.Generator().manual_seed(seed)
    return lambda _step, rows: torch.randn(rows, V, generator=g) * 3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_route_matches_the_reference_under_churn(seed: int) -> None:
    # Prompts up to 12 tokens: windows of 1-8 lie inside the prompt at first.
    sim = ChurnSimulator(
        CAP,
        V,
        seed,
        make_params,
        next_token=small_tokens,
        prompt_len=(0, 12),
        max_tokens=(2, 40),
    )
    routes_match_reference(
        PenaltiesLogitsProcessor, RefPenaltiesLogitsProcessor, sim, CAP, V, random_logits(seed)
    )


def windowed_differs(seed: int) -> int:
    """Steps where a windowed reference differs from the whole-history one (the window does
    something in the churn above)."""
    cfg = EngineConfig(max_num_seqs=CAP, vocab_size=V)
    sim = ChurnSimulator(
        CAP, V, seed, make_params, next_token=small_tokens, prompt_len=(0, 12), max_tokens=(2, 40)
    )
    ref = RefPenaltiesLogitsProcessor(cfg, torch.device("cpu"), False)
    whole = RefPenaltiesLogitsProcessor(cfg, torch.device("cpu"), False)
    g = torch.Generator().manual_seed(seed)
    differ = 0
    for _ in range(120):
        u = sim.step()
        ref.update_state(u)
        whole.update_state(u)
        whole.windows.clear()
        x = torch.randn(len(sim.batch.rows()), V, generator=g)
        differ += not torch.equal(ref.apply(x.clone()), whole.apply(x.clone()))
    return differ


def test_the_churn_exercises_the_window() -> None:
    assert windowed_differs(0) > 30


def pen(last_n: Any, rep: float = 1.5, freq: float = 0.5, pres: float = 0.25) -> Any:
    return SimpleNamespace(
        repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres, penalty_last_n=last_n
    )


def routes(cfg: EngineConfig) -> list[Any]:
    """The host route (Rust's CPU apply) and the device route (count matrix, torch apply)."""
    emu = Pipeline(cfg, "cpu", False, tables=("penalties",), emulate_device=True)
    return [
        PenaltiesLogitsProcessor(cfg, "cpu", False),
        PenaltiesLogitsProcessor(cfg, "cpu", False, pipeline=emu),
    ]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_async_placeholders_and_shrinks_match_the_reference(seed: int) -> None:
    """vLLM's async order: each step appends a placeholder, ``update_state`` sees it, the engine
    fills it in before the sampler (sometimes not: it stays -1 through apply); now and then the
    engine drops the last tokens (rejected drafts). Windows smaller and larger than the
    prompt."""
    rng = random.Random(seed)
    cfg = EngineConfig(max_num_seqs=4, vocab_size=V)
    ours = routes(cfg)
    ref = RefPenaltiesLogitsProcessor(cfg, torch.device("cpu"), False)
    outs: list[list[int]] = [[] for _ in range(4)]
    added = [
        (i, pen(n), [rng.randrange(6) for _ in range(rng.randrange(10))], outs[i])
        for i, n in enumerate((1, 3, 7, 25))
    ]
    update: BatchUpdate | None = upd(4, added=added)
    g = torch.Generator().manual_seed(seed)
    for k in range(200):
        for p in (*ours, ref):
            p.update_state(update)
        update = None
        for out in outs:
            if out and out[-1] == -1 and rng.random() < 0.8:
                out[-1] = rng.randrange(V + 1)  # filled in between update_state and apply
        x = torch.randn(4, V, generator=g)
        want = ref.apply(x.clone())
        for p in ours:
            assert torch.equal(p.apply(x.clone()), want), f"step {k}"
        for out in outs:
            if out and out[-1] == -1:
                out[-1] = rng.randrange(6)
            if len(out) > 3 and rng.random() < 0.1:
                del out[-rng.randint(1, 3) :]
            out.append(-1)


def test_unset_and_minus_one_stay_todays_penalties() -> None:
    """``penalty_last_n`` unset, ``None``, ``-1`` or a window longer than the sequence: the same
    logits, bit for bit, as a request without the field."""
    cfg = EngineConfig(max_num_seqs=5, vocab_size=V)
    rng = random.Random(5)
    prompt = [rng.randrange(6) for _ in range(8)]
    without = SimpleNamespace(repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.25)
    ours = SamplingParams(repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.25)
    params = [without, pen(None), pen(-1), pen(10_000), ours]
    for proc in routes(cfg):
        outs: list[list[int]] = [[] for _ in range(5)]
        proc.update_state(upd(5, added=[(i, p, prompt, outs[i]) for i, p in enumerate(params)]))
        g = torch.Generator().manual_seed(0)
        for _ in range(60):
            t = rng.randrange(6)
            for o in outs:
                o.append(t)
            proc.update_state(None)
            x = torch.randn(1, V, generator=g).expand(5, V).clone()
            y = proc.apply(x)
            for r in range(1, 5):
                assert torch.equal(y[r], y[0])


def test_window_inside_the_prompt_by_hand() -> None:
    """``n = 2`` over prompt [1, 2, 3] and output [4]: positions 3 and 4 of the sequence, so
    prompt token 3 gets the repetition penalty, output token 4 all three; 1 and 2 nothing."""
    cfg = EngineConfig(max_num_seqs=1, vocab_size=V)
    for proc in routes(cfg):
        out = [4]
        proc.update_state(upd(1, added=[(0, pen(2, rep=2.0, freq=1.0, pres=0.5), [1, 2, 3], out)]))
        got = proc.apply(torch.full((1, V), 4.0))
        want = torch.full((1, V), 4.0)
        want[0, 3] = 2.0
        want[0, 4] = 2.0 - 1.0 - 0.5
        assert torch.equal(got, want)
        out += [4, 4]  # window [4, 4]: the prompt left it, token 4 counted twice
        proc.update_state(None)
        got = proc.apply(torch.full((1, V), 4.0))
        want = torch.full((1, V), 4.0)
        want[0, 4] = 2.0 - 2.0 - 0.5
        assert torch.equal(got, want)


def test_zero_is_off() -> None:
    cfg = EngineConfig(max_num_seqs=1, vocab_size=V)
    for proc in routes(cfg):
        proc.update_state(upd(1, added=[(0, pen(0), [1, 2], [1])]))
        x = torch.randn(1, V)
        assert torch.equal(proc.apply(x.clone()), x)
        assert dict(proc.pipeline.core.active())["penalties"] == 0


def test_bad_input_names_the_request_and_field() -> None:
    for bad in (-2, True, 1.5, "3"):
        with pytest.raises(RequestError) as ei:
            SamplingParams(penalty_last_n=bad)
        assert ei.value.field == "penalty_last_n"
    cfg = EngineConfig(max_num_seqs=2, vocab_size=V)
    for proc in routes(cfg):
        proc.update_state(upd(1, added=[(0, pen(2), [1], [])]))
        for bad, what in ((-2, "penalty_last_n"), (True, "bool"), (2.5, "int")):
            with pytest.raises(ValueError, match=what) as e:
                proc.update_state(upd(2, added=[(1, pen(bad), [1], [])]))
            assert getattr(e.value, "index", None) == 1
            assert getattr(e.value, "field", None) == "penalty_last_n"
        # Nothing changed: slot 0 still penalised over its window, slot 1 free.
        assert dict(proc.pipeline.core.active())["penalties"] == 1
        got = proc.apply(torch.full((1, V), 4.0))
        want = torch.full((1, V), 4.0)
        want[0, 1] = 4.0 * (1.0 / torch.tensor(1.5))  # vLLM's CPU form: the reciprocal
        assert torch.equal(got, want)

"""The ``Sampler``: vLLM's order of transforms, greedy rows, temperature, top-k ties, seeded
generators."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _helpers import _vparams, upd

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    LogitBiasLogitsProcessor,
    LogitsProcessor,
    LogitsProcessors,
    MinPLogitsProcessor,
    Sampler,
    SamplingMetadata,
    SamplingParams,
)

V = 16
CFG = EngineConfig(max_num_seqs=8, vocab_size=V)
CPU = torch.device("cpu")
NEG_INF = float("-inf")


class _Proc(LogitsProcessor):
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.invariant = bool(vllm_config)

    def is_argmax_invariant(self) -> bool:
        return self.invariant

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


class SpyInvariant(_Proc):
    def __init__(self) -> None:
        self.calls = 0

    def is_argmax_invariant(self) -> bool:
        return True

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return logits


def _md(params: list[SamplingParams], generators: dict[int, torch.Generator] | None = None):
    return SamplingMetadata.from_params(params, V, CPU, generators)


def test_all_greedy_returns_argmax_and_skips_invariant() -> None:
    spy = SpyInvariant()
    minp = MinPLogitsProcessor(CFG, CPU, False)
    bias = LogitBiasLogitsProcessor(CFG, CPU, False)
    greedy = SamplingParams(temperature=0.0, min_p=0.9)
    bias.update_state(upd(3, added=[(2, _vparams(logit_bias={0: 100.0}), None, [])]))
    minp.update_state(upd(3, added=[(i, _vparams(min_p=0.9), None, []) for i in range(3)]))
    sampler = Sampler(LogitsProcessors([spy, minp, bias]))
    x = torch.randn(3, V)
    md = _md([greedy] * 3)
    assert md.all_greedy and md.temperature is None
    out = sampler(x.clone(), md)
    want = x.argmax(-1)
    want[2] = 0  # the non-invariant bias still runs for greedy rows
    assert torch.equal(out.sampled_token_ids, want)
    assert spy.calls == 0
    # MinP did not run: only the biased entry changed.
    expect = x.clone()
    expect[2, 0] += 100.0
    assert torch.equal(out.logits, expect)


def test_random_rows_run_invariant_after_temperature() -> None:
    spy = SpyInvariant()
    minp = MinPLogitsProcessor(CFG, CPU, False)
    minp.update_state(
        upd(2, added=[(0, _vparams(min_p=0.5), None, []), (1, _vparams(min_p=0.5), None, [])])
    )
    sampler = Sampler(LogitsProcessors([spy, minp]))
    row = torch.tensor([0.0, -1.0] + [-30.0] * (V - 2))
    x = torch.stack([row, row])
    # e^-1 = 0.37 < 0.5 at T = 1 (masked); e^(-1/2) = 0.61 >= 0.5 at T = 2 (kept).
    md = _md(
        [SamplingParams(temperature=1.0, min_p=0.5), SamplingParams(temperature=2.0, min_p=0.5)]
    )
    out = sampler(x.clone(), md)
    assert spy.calls == 1
    assert out.logits[0, 1].item() == NEG_INF
    assert out.logits[1, 1].item() == -0.5
    assert out.sampled_token_ids[0].item() == 0


def test_temperature_scaling_and_greedy_rows_divided_by_one() -> None:
    sampler = Sampler(LogitsProcessors())
    x = torch.randn(3, V)
    md = _md(
        [
            SamplingParams(temperature=0.5),
            SamplingParams(temperature=0.0),
            SamplingParams(temperature=2.0),
        ]
    )
    assert not md.all_greedy and not md.all_random
    out = sampler(x.clone(), md)
    assert torch.allclose(out.logits[0], x[0] / 0.5)
    assert torch.equal(out.logits[1], x[1])
    assert torch.allclose(out.logits[2], x[2] / 2.0)
    assert out.sampled_token_ids[1].item() == x[1].argmax().item()
    assert out.sampled_token_ids.dtype == torch.int64 and out.sampled_token_ids.shape == (3,)


@pytest.mark.parametrize("top_p", [None, 0.999])
def test_top_k_keeps_ties(top_p: float | None) -> None:
    sampler = Sampler(LogitsProcessors())
    row = torch.tensor([1.0, 3.0, 3.0, 0.0, 2.0] + [-5.0] * (V - 5))
    x = torch.stack([row, row])
    kw: dict[str, Any] = {"top_k": 1} if top_p is None else {"top_k": 1, "top_p": top_p}
    md = _md([SamplingParams(temperature=1.0, **kw), SamplingParams(temperature=1.0)])
    seen = set()
    for s in range(40):
        gens = {0: torch.Generator().manual_seed(s)}
        out = sampler(
            x.clone(), _md([SamplingParams(temperature=1.0, **kw), SamplingParams()], gens)
        )
        seen.add(out.sampled_token_ids[0].item())
    assert seen == {1, 2}
    out = sampler(x.clone(), md)
    kept = (out.logits[0] > NEG_INF).nonzero().flatten().tolist()
    assert kept == [1, 2]
    assert (out.logits[1] > NEG_INF).all()  # the row without top-k is untouched


def test_top_k_two_keeps_tied_second() -> None:
    sampler = Sampler(LogitsProcessors())
    row = torch.tensor([5.0, 1.0, 3.0, 3.0, 3.0] + [-5.0] * (V - 5))
    out = sampler(row[None].clone(), _md([SamplingParams(temperature=1.0, top_k=2)]))
    assert (out.logits[0] > NEG_INF).nonzero().flatten().tolist() == [0, 2, 3, 4]


def test_seeded_generators_reproducible() -> None:
    sampler = Sampler(LogitsProcessors())
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, V, generator=g) * 0.1  # nearly uniform: many possible tokens
    params = [SamplingParams(temperature=1.0, seed=s) for s in (11, 12, 13, 14)]

    def run(seeds: tuple[int, ...]) -> list[list[int]]:
        gens = {i: torch.Generator().manual_seed(s) for i, s in enumerate(seeds)}
        return [sampler(x.clone(), _md(params, gens)).sampled_token_ids.tolist() for _ in range(10)]

    a, b = run((11, 12, 13, 14)), run((11, 12, 13, 14))
    assert a == b
    assert run((21, 22, 23, 24)) != a
    # A row's samples depend only on its own generator, not on the other rows.
    c = run((11, 99, 98, 97))
    assert [r[0] for r in c] == [r[0] for r in a]

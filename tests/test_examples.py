"""The two custom processors in ``examples/``, built on declared columns, against plain per-row
versions of the same rules, over seeded churn (adds, removals, condense moves, swaps), through the
container call, vLLM's per-processor loop and the stable-slot front-end."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    Sampler,
    SamplingMetadata,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.simulate import ChurnSimulator

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from logit_margin import LogitMarginLogitsProcessor
from token_boost import TokenBoostLogitsProcessor

VOCAB = 40


def ref_margin(row: torch.Tensor, params: Any) -> torch.Tensor:
    m = (params.extra_args or {}).get("logit_margin")
    if not m:
        return row
    keep = row >= row.max() - torch.tensor(m, dtype=torch.float32)
    return torch.where(keep, row, torch.tensor(float("-inf")))


def ref_boost(row: torch.Tensor, params: Any) -> torch.Tensor:
    args = params.extra_args or {}
    ids, b = args.get("boost_tokens") or [], args.get("boost")
    row = row.clone()
    for t in ids:
        row[t] += torch.tensor(0.0 if b is None else b, dtype=torch.float32)
    return row


def make_params(rng: random.Random) -> SamplingParams:
    extra: dict[str, Any] = {}
    if rng.random() < 0.5:
        extra["logit_margin"] = rng.choice((0.5, 1.0, 2.5))
    if rng.random() < 0.5:
        extra["boost_tokens"] = rng.sample(range(VOCAB), rng.randint(0, 16))
        if rng.random() < 0.8:
            extra["boost"] = rng.choice((-3.0, 0.5, 4.0))
    return SamplingParams(temperature=1.0, extra_args=extra or None, min_p=rng.choice((0.0, 0.2)))


@pytest.mark.parametrize("seed", [0, 1])
def test_column_processors_match_plain_versions(seed: int) -> None:
    cfg = EngineConfig(max_num_seqs=24, vocab_size=VOCAB)
    custom = [TokenBoostLogitsProcessor, LogitMarginLogitsProcessor]
    call = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=custom)
    loop = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=custom)
    slots = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=custom, stable_slots=True)
    sim = ChurnSimulator(24, VOCAB, seed, make_params, finish_prob=1 / 15, swap_prob=0.2)
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    slot_of: dict[int, int] = {}
    free = list(range(24))
    active_rows = 0
    for _ in range(250):
        update = sim.step()
        rows = sim.batch.rows()
        call.update_state(update)
        for p in loop.all:
            p.update_state(update)
        live = {r.req_id for r in rows}
        for rid in [rid for rid in slot_of if rid not in live]:
            slots.pipeline.remove_request(slot_of[rid])
            free.append(slot_of.pop(rid))
        for r in rows:
            if r.req_id not in slot_of:
                slot_of[r.req_id] = free.pop(rng.randrange(len(free)))
                slots.pipeline.add_request(slot_of[r.req_id], r.params, None, r.output_token_ids)
        slots.pipeline.step_slots([slot_of[r.req_id] for r in rows])
        x = torch.randn(len(rows), VOCAB, generator=g) * 2
        want = (
            torch.stack(
                [ref_margin(ref_boost(x[i], r.params), r.params) for i, r in enumerate(rows)]
            )
            if rows
            else x
        )
        for procs, rowspace in ((call, False), (loop, False), (slots, True)):
            boost = next(p for p in procs.all if isinstance(p, TokenBoostLogitsProcessor))
            margin = next(p for p in procs.all if isinstance(p, LogitMarginLogitsProcessor))
            apply = (lambda p, t: p.apply_rows(t)) if rowspace else (lambda p, t: p.apply(t))
            got = apply(margin, apply(boost, x.clone()))
            assert torch.equal(got, want)
        active_rows += sum(bool(r.params.extra_args) for r in rows)
    assert active_rows > 500


def test_argmax_invariance_is_declared_and_respected_by_the_sampler() -> None:
    cfg = EngineConfig(max_num_seqs=4, vocab_size=VOCAB)
    procs = build_logitsprocs(
        cfg,
        "cpu",
        False,
        custom_logitsprocs=[LogitMarginLogitsProcessor, TokenBoostLogitsProcessor],
    )
    assert any(isinstance(p, LogitMarginLogitsProcessor) for p in procs.argmax_invariant)
    assert any(isinstance(p, TokenBoostLogitsProcessor) for p in procs.non_argmax_invariant)
    sp = SamplingParams(temperature=0.0, extra_args={"boost_tokens": [7], "boost": 50.0})
    procs.update_state(BatchUpdate(1, [], [(0, sp, None, [])], []))
    md = SamplingMetadata.from_params([sp], VOCAB)
    out = Sampler(procs)(torch.zeros(1, VOCAB), md)
    assert out.sampled_token_ids.tolist() == [7]


@pytest.mark.parametrize(
    ("extra", "msg"),
    [
        ({"logit_margin": "wide"}, "'logit_margin': must be a number, got 'wide'"),
        ({"logit_margin": True}, "'logit_margin': must be a number, got True"),
        ({"boost_tokens": list(range(17))}, "cap of 16"),
        ({"boost_tokens": [VOCAB]}, "outside"),
        ({"boost_tokens": [1], "boost": float("inf")}, "finite"),
    ],
)
def test_bad_column_values_name_request_and_column_and_change_nothing(extra, msg) -> None:
    cfg = EngineConfig(max_num_seqs=4, vocab_size=VOCAB)
    custom = [TokenBoostLogitsProcessor, LogitMarginLogitsProcessor]
    procs = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=custom)
    good = SamplingParams(extra_args={"boost_tokens": [3], "boost": 1.0, "logit_margin": 1.0})
    procs.update_state(BatchUpdate(1, [], [(0, good, None, [])], []))
    before = [v.clone() for v in procs.pipeline.arena.views]
    bad = SamplingParams()
    object.__setattr__(bad, "extra_args", extra)
    update = BatchUpdate(3, [], [(1, good, None, []), (2, bad, None, [])], [])
    with pytest.raises(ValueError, match=r"request at index 2: field 'column'") as e:
        procs.update_state(update)
    assert msg in str(e.value)
    after = [v.clone() for v in procs.pipeline.arena.views]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert procs.pipeline.status[0] == 1


def test_validate_params_of_an_example() -> None:
    with pytest.raises(ValueError, match="logit_margin"):
        LogitMarginLogitsProcessor.validate_params(SamplingParams(extra_args={"logit_margin": -1}))
    LogitMarginLogitsProcessor.validate_params(SamplingParams(extra_args={"logit_margin": 2}))

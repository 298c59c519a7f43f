"""The ``Sampler``'s logprobs modes against the reference: shapes, values and ranks, processed
and raw logits."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import assert_same, upd

from logitsproc_rs import (
    EngineConfig,
    LogitBiasLogitsProcessor,
    LogitsProcessors,
    Sampler,
    SamplingMetadata,
    SamplingParams,
)
from logitsproc_rs.reference import (
    ReferenceSampler,
    RefLogitBiasLogitsProcessor,
    RefLogitsProcessors,
)

INF = math.inf
V = 8
CFG = EngineConfig(max_num_seqs=4, vocab_size=V)


def make(cls: type, cfg: EngineConfig = CFG) -> Any:
    return cls(cfg, torch.device("cpu"), False)


def pack(allowed_rows: list[set[int]], words: int) -> np.ndarray:
    """Pack sets of allowed tokens into int32 words, LSB first (built independently of both
    implementations)."""
    out = np.zeros((len(allowed_rows), words), dtype=np.uint32)
    for r, allowed in enumerate(allowed_rows):
        for t in allowed:
            out[r, t // 32] |= np.uint32(1) << np.uint32(t % 32)
    return out.view(np.int32)


RAW = torch.tensor(
    [
        [3.0, 1.0, 3.0, 0.0, -INF, 2.0],
        [0.5, 4.0, -1.0, 4.0, 2.0, 0.0],
    ]
)


def _sampler_pair(mode: str, bias: dict[int, float]):
    cfg = EngineConfig(max_num_seqs=2, vocab_size=6)
    procs = LogitsProcessors([make(LogitBiasLogitsProcessor, cfg)])
    refs = RefLogitsProcessors([make(RefLogitBiasLogitsProcessor, cfg)])
    added = [(0, SamplingParams(logit_bias=bias), None, []), (1, SamplingParams(), None, [])]
    for p in (*procs.all, *refs.all):
        p.update_state(upd(2, added=added))
    return Sampler(procs, mode), ReferenceSampler(refs, mode)


def _run(mode: str, temps=(0.0, 0.0), logprobs=2, bitmask=None):
    sampler, ref_sampler = _sampler_pair(mode, {5: 10.0})
    params = [SamplingParams(temperature=t, logprobs=logprobs) for t in temps]
    outs = []
    for s in (sampler, ref_sampler):
        gens = {i: torch.Generator().manual_seed(i) for i in range(2)}
        md = SamplingMetadata.from_params(params, 6, generators=gens)
        outs.append(s(RAW.clone(), md, bitmask))
    return outs


@pytest.mark.parametrize(
    "mode", ["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"]
)
@pytest.mark.parametrize("n", [0, 1, 3])
def test_logprobs_shapes_and_match_reference(mode, n):
    out, ref = _run(mode, temps=(0.0, 0.5), logprobs=n)
    lp, lr = out.logprobs_tensors, ref.logprobs_tensors
    assert lp is not None and lr is not None
    assert lp.logprob_token_ids.shape == (2, n + 1) and lp.logprob_token_ids.dtype == torch.int32
    assert lp.logprobs.shape == (2, n + 1) and lp.logprobs.dtype == torch.float32
    assert lp.selected_token_ranks.shape == (2,) and lp.selected_token_ranks.dtype == torch.int64
    assert torch.equal(lp.logprob_token_ids[:, 0], out.sampled_token_ids.to(torch.int32))
    assert_same(out.sampled_token_ids, ref.sampled_token_ids)
    assert_same(lp.logprob_token_ids, lr.logprob_token_ids)
    assert_same(lp.logprobs, lr.logprobs)
    assert_same(lp.selected_token_ranks, lr.selected_token_ranks)


def test_logprobs_none_when_not_requested():
    out, ref = _run("raw_logprobs", logprobs=None)
    assert out.logprobs_tensors is None and ref.logprobs_tensors is None


def test_logprobs_values_and_ranks_tiny_example():
    """All greedy. Row 0 has logit_bias {5: +10}, so it samples 5 (raw logit 2.0); row 1
    samples 1 (first of the tied 4.0s)."""
    # raw_logits: values before the processors; rank counts values >= (ties included).
    out, _ = _run("raw_logits")
    lp = out.logprobs_tensors
    assert out.sampled_token_ids.tolist() == [5, 1]
    assert lp.logprobs[:, 0].tolist() == [2.0, 4.0]
    assert lp.selected_token_ranks.tolist() == [3, 2]  # {3, 3, 2} >= 2; {4, 4} >= 4
    assert lp.logprobs[:, 1:].tolist() == [[3.0, 3.0], [4.0, 4.0]]
    assert sorted(lp.logprob_token_ids[0, 1:].tolist()) == [0, 2]
    assert sorted(lp.logprob_token_ids[1, 1:].tolist()) == [1, 3]

    # raw_logprobs: log_softmax of the raw logits, same ranks.
    out, _ = _run("raw_logprobs")
    lp = out.logprobs_tensors
    expected = RAW.log_softmax(-1)
    assert_same(lp.logprobs[:, 0], torch.stack([expected[0, 5], expected[1, 1]]))
    assert lp.selected_token_ranks.tolist() == [3, 2]

    # processed_logits: after the processors (all greedy: no temperature).
    out, _ = _run("processed_logits")
    lp = out.logprobs_tensors
    assert lp.logprobs[:, 0].tolist() == [12.0, 4.0]
    assert lp.selected_token_ranks.tolist() == [1, 2]
    assert lp.logprob_token_ids[0].tolist() == [5, 5, 0] or lp.logprob_token_ids[0].tolist() == [
        5,
        5,
        2,
    ]

    # processed_logprobs: log_softmax of those.
    out, _ = _run("processed_logprobs")
    lp = out.logprobs_tensors
    processed = RAW.clone()
    processed[0, 5] += 10.0
    assert_same(lp.logprobs[0, :2], processed.log_softmax(-1)[0, [5, 5]])
    assert lp.selected_token_ranks.tolist() == [1, 2]


def test_processed_logits_include_temperature_and_raw_see_the_bitmask():
    """With a random row, processed logits are after temperature (greedy rows ÷ 1); the raw
    modes already reflect the grammar bitmask (applied before the sampler)."""
    mask = pack([set(range(6)) - {5}, set(range(6))], 1)
    out, ref = _run("processed_logits", temps=(2.0, 0.0), bitmask=mask)
    assert_same(out.logits, ref.logits)
    expected = RAW.clone()
    expected[0, 5] = -INF  # the bitmask wins over the +10 bias
    expected[0] /= 2.0
    assert_same(out.logits, expected)
    tok = int(out.sampled_token_ids[0])
    assert out.logprobs_tensors.logprobs[0, 0] == expected[0, tok]
    out, ref = _run("raw_logits", temps=(2.0, 0.0), bitmask=mask)
    assert out.logprobs_tensors.logprobs[0, 1:].tolist() == [3.0, 3.0]
    assert_same(out.logprobs_tensors.logprobs, ref.logprobs_tensors.logprobs)
    assert int(out.sampled_token_ids[0]) != 5


def test_raw_logprobs_from_low_precision_logits():
    sampler, ref_sampler = _sampler_pair("raw_logprobs", {})
    params = [SamplingParams(temperature=0.0, logprobs=2)] * 2
    md = SamplingMetadata.from_params(params, 6)
    raw = RAW.to(torch.bfloat16)
    out, ref = sampler(raw.clone(), md), ref_sampler(raw.clone(), md)
    assert out.logprobs_tensors.logprobs.dtype == torch.float32
    assert_same(out.logprobs_tensors.logprobs, ref.logprobs_tensors.logprobs)
    assert_same(out.logprobs_tensors.logprobs[:, 0], raw.float().log_softmax(-1)[[0, 1], [0, 1]])

"""On the CPU, MinP and the penalties run in Rust directly on the logits' memory; on a GPU the
torch forms run. Both must give the same logits: drive churn through processors of each kind
(the torch form run on the CPU through a pipeline built with ``emulate_device=True``: its own
arena tensor, uploads, the device penalty matrix) and compare, exactly."""

from __future__ import annotations

import random

import pytest
import torch

import logitsproc_rs as L
from logitsproc_rs.pipeline import Pipeline
from logitsproc_rs.simulate import ChurnSimulator

VOCAB = 300


def _params(rng: random.Random) -> L.SamplingParams:
    return L.SamplingParams(
        max_tokens=None,
        temperature=rng.choice([0.0, 0.7, 1.0]),
        min_p=rng.choice([0.0, 0.0, 0.05, 0.2, 1.0]),
        repetition_penalty=rng.choice([1.0, 0.7, 1.3, 2.0]),
        frequency_penalty=rng.choice([0.0, 0.5, -1.25, 2.0]),
        presence_penalty=rng.choice([0.0, 0.25, -2.0]),
    )


def _pair(cls, cfg):
    fast = cls(cfg, torch.device("cpu"), False)
    # The torch (device) form, on the CPU: a pipeline of its own that emulates a device.
    emulated = Pipeline(cfg, torch.device("cpu"), False, tables=cls.TABLES, emulate_device=True)
    slow = cls(cfg, torch.device("cpu"), False, pipeline=emulated)
    assert fast.pipeline is not slow.pipeline
    assert fast.pipeline.host_kernels and fast.pipeline.arena.zero_copy
    assert not slow.pipeline.host_kernels and not slow.pipeline.arena.zero_copy
    # The emulated side reads its own arena tensor, the fast side the Rust buffers.
    name = "min_p.log_min_p" if cls is L.MinPLogitsProcessor else "penalties.repetition"
    for p in (fast, slow):
        index = [s[0] for s in p.pipeline.core.sections()].index(name)
        host = p.pipeline.core.buffer(index).data_ptr
        assert (p.pipeline.section(name).data_ptr() == host) is (p is fast)
    arena = slow.pipeline.arena.arena
    start = slow.pipeline.section(name).data_ptr() - arena.data_ptr()
    assert 0 <= start < arena.numel()
    return fast, slow


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_host_kernels_match_torch_forms(seed):
    cfg = L.EngineConfig(max_num_seqs=48, vocab_size=VOCAB)
    pairs = [_pair(L.MinPLogitsProcessor, cfg), _pair(L.PenaltiesLogitsProcessor, cfg)]
    hot = [3, 7, 11]

    def next_token(rng, req):
        return rng.choice(hot) if rng.random() < 0.3 else rng.randrange(VOCAB)

    sim = ChurnSimulator(48, VOCAB, seed, _params, finish_prob=1 / 20, next_token=next_token)
    gen = torch.Generator().manual_seed(seed)
    for step in range(250):
        update = sim.step()
        rows = sim.batch.num_reqs
        logits = torch.randn(rows, VOCAB, generator=gen) * 3
        logits[:, 5] = float("-inf")
        if step % 7 == 0:
            logits[:, 6] = 0.0
            logits[:, 8] = -0.0
        for fast, slow in pairs:
            fast.update_state(update)
            slow.update_state(update)
            a = fast.apply(logits.clone())
            b = slow.apply(logits.clone())
            assert torch.equal(a, b), (type(fast).__name__, step)


def test_penalties_host_kernel_on_non_contiguous_logits():
    cfg = L.EngineConfig(max_num_seqs=2, vocab_size=8)
    fast, slow = _pair(L.PenaltiesLogitsProcessor, cfg)
    out = [1, 1, 2]
    update = L.BatchUpdate(
        batch_size=2,
        removed=[],
        added=[(0, L.SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5), [3], out)],
        moved=[],
    )
    fast.update_state(update)
    slow.update_state(update)
    base = torch.arange(32, dtype=torch.float32).view(8, 4).t() - 10  # [4, 8], not contiguous
    expected = slow.apply(base[:2].contiguous())
    view = base[:2]
    assert not view.is_contiguous()
    # Rows that are not contiguous are refused (issue 9: a clear error, never a kernel that
    # walks a row as one array), and the logits are left untouched.
    before = view.clone()
    with pytest.raises(ValueError, match="rows must be contiguous"):
        fast.apply(view)
    assert torch.equal(view, before)
    got = fast.apply(view.contiguous())
    assert torch.equal(got, expected)
    # Rows apart but each contiguous (vLLM slices a padded vocabulary) go through the kernel.
    padded = torch.full((2, 12), 99.0)
    padded[:, :8] = base[:2]
    sliced = padded[:, :8]
    assert not sliced.is_contiguous() and sliced.stride(1) == 1
    got = fast.apply(sliced)
    assert got is sliced and torch.equal(got, expected)
    assert bool((padded[:, 8:] == 99.0).all())


def _sparse_params(rng: random.Random) -> L.SamplingParams:
    return L.SamplingParams(
        max_tokens=None,
        logit_bias=rng.choice([None, {3: 2.5, 40: -1.0}, {rng.randrange(VOCAB): 9.0}]),
        min_tokens=rng.choice([0, 0, 3, 12]),
        stop_token_ids=rng.choice([[], [7], [7, 11, 299]]),
        eos_token_id=rng.choice([None, 2]),
        bad_words_token_ids=rng.choice([None, [[3]], [[7, 11], [5, 3, 3]]]),
        allowed_token_ids=rng.choice([None, None, [3, 7, 11, 50], list(range(0, VOCAB, 3))]),
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_sparse_host_kernels_match_torch_forms(seed):
    """LogitBias, MinTokens, bad words and allowed ids: Rust's one pass over the triples on
    the CPU, and the torch indexed writes (the device form), give the same logits."""
    cfg = L.EngineConfig(max_num_seqs=32, vocab_size=VOCAB)
    classes = [
        L.AllowedTokenIdsLogitsProcessor,
        L.BadWordsLogitsProcessor,
        L.MinTokensLogitsProcessor,
        L.LogitBiasLogitsProcessor,
    ]
    fast_pipe = Pipeline(cfg, "cpu", False, tables={t for c in classes for t in c.TABLES})
    slow_pipe = Pipeline(
        cfg, "cpu", False, tables={t for c in classes for t in c.TABLES}, emulate_device=True
    )
    assert fast_pipe.host_kernels and not slow_pipe.host_kernels
    fast = [c(cfg, "cpu", False, pipeline=fast_pipe) for c in classes]
    slow = [c(cfg, "cpu", False, pipeline=slow_pipe) for c in classes]

    def next_token(rng, req):
        return rng.choice([3, 7, 11, 5]) if rng.random() < 0.4 else rng.randrange(VOCAB)

    sim = ChurnSimulator(32, VOCAB, seed, _sparse_params, finish_prob=1 / 15, next_token=next_token)
    gen = torch.Generator().manual_seed(seed)
    changed = 0
    for step in range(200):
        update = sim.step()
        logits = torch.randn(sim.batch.num_reqs, VOCAB, generator=gen)
        a, b = logits.clone(), logits.clone()
        for f, s in zip(fast, slow, strict=True):
            f.update_state(update)
            s.update_state(update)
        for f, s in zip(fast, slow, strict=True):
            a, b = f.apply(a), s.apply(b)
            assert torch.equal(a, b), (type(f).__name__, step)
        changed += not torch.equal(a, logits)
    assert changed > 150

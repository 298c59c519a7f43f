"""Penalties (``builtin/penalties.py``: repetition, frequency, presence) on hand-written updates:
the math (vLLM's CPU fallback included), counts that move with their request, incremental counting,
async placeholders, shrinking outputs."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from _helpers import applied, assert_same, built, step, upd

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    MoveDirectionality,
    PenaltiesLogitsProcessor,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.pipeline import Pipeline
from logitsproc_rs.reference import (
    RefPenaltiesLogitsProcessor,
)

INF = math.inf
SWAP = MoveDirectionality.SWAP
UNI = MoveDirectionality.UNIDIRECTIONAL
V = 8
CFG = EngineConfig(max_num_seqs=4, vocab_size=V)


def make_emulated(cls: type, cfg: EngineConfig = CFG) -> Any:
    """A processor on a pipeline of its own that runs the device path on the CPU (a separate
    arena tensor, uploads, torch applies; for penalties the device count matrix)."""
    pipe = Pipeline(cfg, torch.device("cpu"), False, tables=cls.TABLES, emulate_device=True)
    return cls(cfg, torch.device("cpu"), False, pipeline=pipe)


def counted(proc: Any, slot: int) -> list[int] | None:
    """Output tokens the penalties counted for ``slot`` (None if untracked)."""
    return proc.pipeline.core.penalties_counted(slot)


class _ChunkCounter:
    """Wraps a ``_core.Pipeline`` to count the non-empty penalty upload chunks handed out."""

    def __init__(self, core: Any) -> None:
        self._core = core
        self.chunks = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)

    def next_penalty_chunk(self) -> int:
        m = self._core.next_penalty_chunk()
        self.chunks += m > 0
        return m


def pen(rep: float = 1.0, freq: float = 0.0, pres: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres)


# --- penalties ---------------------------------------------------------------------------------


def test_penalty_math_tiny_incl_negative_zero_and_neg_inf():
    """Row 0: rep 2, freq 0.5, pres 0.25, prompt [1, 2, 4], output [2, 3, 3, 6]."""
    ours, ref = built(PenaltiesLogitsProcessor, CFG), built(RefPenaltiesLogitsProcessor, CFG)
    out0, out1 = [2, 3, 3, 6], [1]
    step(
        (ours, ref),
        upd(2, added=[(0, pen(2.0, 0.5, 0.25), [1, 2, 4], out0), (1, pen(), [5], out1)]),
    )
    logits = torch.tensor(
        [
            [1.0, 4.0, -3.0, -INF, 0.0, 5.0, -1.0, 0.0],
            [1.0, 4.0, -3.0, -INF, 0.0, 5.0, -1.0, -0.0],
        ]
    )
    expected = logits.clone()
    # tok1 prompt only, positive: 4 / 2, no frequency / presence.
    # tok2 prompt + output once, negative: -3 * 2 - 0.5 * 1 - 0.25.
    # tok3 output twice, -inf stays -inf. tok4 prompt only, zero: 0 * 2 = 0.
    # tok6 output once: -1 * 2 - 0.5 - 0.25. tok0, tok5, tok7 untouched.
    expected[0] = torch.tensor([1.0, 2.0, -6.75, -INF, 0.0, 5.0, -2.75, 0.0])
    got = applied(ours, logits)
    assert_same(got, expected)
    assert_same(applied(ref, logits), expected)
    assert got[1, 7].item() == 0.0 and math.copysign(1, got[1, 7].item()) == -1  # neutral row


def test_repetition_below_one_boosts_and_zero_logit_is_multiplied():
    ours, ref = built(PenaltiesLogitsProcessor, CFG), built(RefPenaltiesLogitsProcessor, CFG)
    step((ours, ref), upd(1, added=[(0, pen(rep=0.5), None, [0, 1, 2])]))
    logits = torch.tensor([[4.0, -3.0, 0.0, 4.0, -3.0, 0.0, 1.0, 1.0]])
    expected = torch.tensor([[8.0, -1.5, 0.0, 4.0, -3.0, 0.0, 1.0, 1.0]])
    assert_same(applied(ours, logits), expected)
    assert_same(applied(ref, logits), expected)


def test_prompt_only_tokens_get_repetition_but_not_frequency_or_presence():
    ours, ref = built(PenaltiesLogitsProcessor, CFG), built(RefPenaltiesLogitsProcessor, CFG)
    # Only frequency / presence: prompt-only tokens must be untouched.
    step((ours, ref), upd(2, added=[(0, pen(1.0, 2.0, 2.0), [1, 2], [2]), (1, pen(1.5), [1], [])]))
    logits = torch.full((2, V), 3.0)
    expected = logits.clone()
    expected[0, 2] = 3.0 - 2.0 - 2.0  # in the output once
    expected[1, 1] = 2.0  # prompt-only, repetition 1.5: 3 / 1.5
    assert_same(applied(ours, logits), expected)
    assert_same(applied(ref, logits), expected)


def test_counts_move_with_their_request_on_swap_and_condense():
    ours, ref = built(PenaltiesLogitsProcessor, CFG), built(RefPenaltiesLogitsProcessor, CFG)
    outs = [[1, 1], [2], [3, 3, 3]]
    added = [(i, pen(1.0, 1.0, 0.0), None, outs[i]) for i in range(3)]
    step((ours, ref), upd(3, added=added))
    logits = torch.zeros(3, V)
    before = applied(ours, logits)
    assert before[0, 1] == -2 and before[1, 2] == -1 and before[2, 3] == -3

    step((ours, ref), upd(3, moved=[(0, 2, SWAP)]))
    got = applied(ours, logits)
    assert_same(got, before[[2, 1, 0]])
    assert_same(got, applied(ref, logits))
    assert counted(ours, 0) == [3, 3, 3] and counted(ours, 2) == [1, 1]

    # Slot 1 finished; condense moves 2 -> 1 (UNIDIRECTIONAL). Grow it afterwards too.
    step((ours, ref), upd(2, moved=[(2, 1, UNI)]))
    outs[0].append(1)
    step((ours, ref), None)
    got = applied(ours, torch.zeros(2, V))
    expected = torch.zeros(2, V)
    expected[0, 3], expected[1, 1] = -3, -3
    assert_same(got, expected)
    assert_same(got, applied(ref, torch.zeros(2, V)))
    assert counted(ours, 1) == [1, 1, 1] and counted(ours, 2) is None

    # A new request without penalties at the old source slot starts from nothing.
    step((ours, ref), upd(3, added=[(2, pen(1.0, 1.0, 0.0), None, [])]))
    got = applied(ours, torch.zeros(3, V))
    assert_same(got[2], torch.zeros(V))
    assert_same(got, applied(ref, torch.zeros(3, V)))


def test_counted_equals_output_after_1000_tokens():
    """Incremental counting stays exact over a long generation with async placeholders,
    shrinks and a SWAP on the way."""
    cfg = EngineConfig(max_num_seqs=4, vocab_size=50)
    ours, ref = built(PenaltiesLogitsProcessor, cfg), built(RefPenaltiesLogitsProcessor, cfg)
    rng = np.random.default_rng(0)
    out, other = [], [7]
    step(
        (ours, ref),
        upd(2, added=[(0, pen(1.25, 0.5, 0.5), [1, 2], out), (1, pen(freq=1.0), None, other)]),
    )
    slot = 0
    for i in range(1000):
        if out and out[-1] == -1:
            out[-1] = int(rng.integers(50))  # the placeholder becomes a real token
        out.append(-1 if rng.random() < 0.1 else int(rng.integers(50)))
        if i % 97 == 50:
            del out[-2:]
        update = None
        if i == 500:
            update, slot = upd(2, moved=[(0, 1, SWAP)]), 1
        step((ours, ref), update)
    assert len(out) > 900
    real = [t for t in out if t != -1]
    assert out[:-1] == real[: len(out) - 1] or out == real
    assert counted(ours, slot) == real
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(0))
    assert_same(applied(ours, logits), applied(ref, logits))


def test_more_count_updates_than_one_upload_chunk():
    """A resumed request with a long prompt and a long pre-filled output: more (row, token,
    delta) additions than one upload chunk holds (16,384 here). The device path (emulated on
    the CPU) uploads them in several chunks into its count matrix; the host path counts in
    Rust. Both must match the reference."""
    cfg = EngineConfig(max_num_seqs=2, vocab_size=30_000)
    dev = make_emulated(PenaltiesLogitsProcessor, cfg)
    host = built(PenaltiesLogitsProcessor, cfg)
    ref = built(RefPenaltiesLogitsProcessor, cfg)
    assert (
        not dev.pipeline.host_kernels and dev.pipeline.device_state["penalties"].cells is not None
    )
    assert host.pipeline.host_kernels
    chunk = len(dev.pipeline.section("penalties.ops_rows"))
    assert chunk == 16_384
    dev.pipeline.core = chunks = _ChunkCounter(dev.pipeline.core)
    rng = np.random.default_rng(1)
    prompt = rng.permutation(30_000)[:20_000].tolist()
    out = rng.integers(0, 30_000, 18_000).tolist()
    step((dev, host, ref), upd(2, added=[(1, pen(1.5, 0.25, -0.5), prompt, out)]))
    assert chunks.chunks >= 2  # prompt flags and output counts: more than one chunk
    logits = torch.randn(2, 30_000, generator=torch.Generator().manual_seed(1)) * 3
    want = applied(ref, logits)
    assert_same(applied(dev, logits), want)
    assert_same(applied(host, logits), want)
    before = chunks.chunks
    out.extend(rng.integers(0, 30_000, 17_000).tolist())
    step((dev, host, ref), None)
    assert chunks.chunks - before >= 2  # this step alone needs more than one chunk too
    want = applied(ref, logits)
    assert_same(applied(dev, logits), want)
    assert_same(applied(host, logits), want)
    assert counted(dev, 1) == out and counted(host, 1) == out


def test_placeholder_is_counted_once_filled():
    ours, ref = built(PenaltiesLogitsProcessor, CFG), built(RefPenaltiesLogitsProcessor, CFG)
    out = [1]
    step((ours, ref), upd(1, added=[(0, pen(freq=1.0), None, out)]))
    out.append(-1)
    step((ours, ref), None)
    expected = torch.zeros(1, V)
    expected[0, 1] = -1
    assert_same(applied(ours, torch.zeros(1, V)), expected)  # -1 not counted (vLLM: padding)
    assert_same(applied(ref, torch.zeros(1, V)), expected)
    out[-1] = 4
    out.append(-1)
    step((ours, ref), None)
    expected[0, 4] = -1
    assert_same(applied(ours, torch.zeros(1, V)), expected)
    assert_same(applied(ref, torch.zeros(1, V)), expected)


def test_placeholder_filled_between_update_state_and_apply_is_counted():
    """vLLM's async order (semantics note 9.1 steps 7-8): ``update_state`` sees the ``-1``
    placeholder, then ``update_async_output_token_ids`` fills it in place *before* the
    sampler, and vLLM's penalties (built from the lists at sampling time) count the token in
    that same step. Expected: token 4 penalised at this step."""
    ours, ref = built(PenaltiesLogitsProcessor, CFG), built(RefPenaltiesLogitsProcessor, CFG)
    out = [1]
    step((ours, ref), upd(1, added=[(0, pen(freq=1.0), None, out)]))
    out.append(-1)
    step((ours, ref), None)  # update_state: the tail is still -1
    out[-1] = 4  # the engine fills the placeholder, then samples
    expected = torch.zeros(1, V)
    expected[0, 1] = expected[0, 4] = -1
    assert_same(applied(ref, torch.zeros(1, V)), expected)
    assert_same(applied(ours, torch.zeros(1, V)), expected)


def test_shrink_then_regrow_to_same_length_recounts():
    """An output list edited in place between two steps (last token dropped, a different one
    appended: same length) must be counted as it now is, as vLLM's rebuild does."""
    ours, ref = built(PenaltiesLogitsProcessor, CFG), built(RefPenaltiesLogitsProcessor, CFG)
    out = [1, 2, 3]
    step((ours, ref), upd(1, added=[(0, pen(freq=1.0), None, out)]))
    del out[-1:]
    out.append(5)
    step((ours, ref), None)
    expected = torch.zeros(1, V)
    expected[0, [1, 2, 5]] = -1
    assert_same(applied(ref, torch.zeros(1, V)), expected)
    assert_same(applied(ours, torch.zeros(1, V)), expected)


def test_cpu_penalties_multiply_by_the_reciprocal_like_vllm_torch_fallback() -> None:
    """vLLM's CPU path (``_custom_ops.py`` torch fallback) scales positive logits by
    ``1.0 / rep``; its CUDA kernel divides. On the CPU ours must match the fallback exactly,
    including where the two forms differ by an ulp."""
    V = 4096
    cfg = EngineConfig(max_num_seqs=1, vocab_size=V)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1, V, generator=g) * 20 - 5
    rep = torch.tensor([[1.3]], dtype=torch.float32)
    pen = torch.ones(1, V)  # every token in the prompt: the repetition penalty applies to all
    fallback = x * torch.where(x > 0, 1.0 / (pen * rep), pen * rep)
    assert not torch.equal(fallback, torch.where(x > 0, x / rep, x * rep))  # forms differ here
    for emulate in (False, True):
        procs = build_logitsprocs(cfg, "cpu", False, emulate_device=emulate)
        sp = SamplingParams(repetition_penalty=1.3)
        procs.update_state(BatchUpdate(1, [], [(0, sp, list(range(V)), [])], []))
        got = x.clone()
        for p in procs.non_argmax_invariant:
            got = p.apply(got)
        assert torch.equal(got, fallback), f"emulate_device={emulate}"


def test_float64_logits_are_penalised_without_a_float32_round_trip() -> None:
    V = 512
    cfg = EngineConfig(max_num_seqs=1, vocab_size=V)
    procs = build_logitsprocs(cfg, "cpu", False)
    sp = SamplingParams(repetition_penalty=1.3, frequency_penalty=0.25)
    out = [3, 3, 7]
    procs.update_state(BatchUpdate(1, [], [(0, sp, [5], out)], []))
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(1, V, generator=g, dtype=torch.float64) * 20 - 5) + 1e-12  # not float32
    mask = torch.zeros(1, V, dtype=torch.bool)
    mask[0, [3, 5, 7]] = True
    counts = torch.zeros(1, V, dtype=torch.int64)
    counts[0, 3], counts[0, 7] = 2, 1
    pen = torch.where(mask, torch.tensor(1.3, dtype=torch.float32), torch.tensor(1.0))
    want = x * torch.where(x > 0, 1.0 / pen, pen)  # float32 scaling, float64 product (vLLM)
    want -= torch.tensor([[0.25]], dtype=torch.float32) * counts
    got = x.clone()
    for p in procs.non_argmax_invariant:
        got = p.apply(got)
    assert got.dtype == torch.float64
    assert torch.equal(got, want)

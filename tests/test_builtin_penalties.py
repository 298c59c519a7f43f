"""Unit tests of the sampler transforms: penalties, bad words, allowed token ids, the grammar
bitmask, per-request front-end validation, the thinking budget parameter and logprobs modes.

Each test builds the processor under test directly (``cls(config, "cpu", False)``), drives it
with hand-written ``BatchUpdate``s and checks ``apply`` against hand-computed expectations and,
where it helps, against ``logitsproc_rs.reference``. Params are duck-typed ``SimpleNamespace``
objects when a value must bypass ``SamplingParams`` validation.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from logitsproc_rs import (
    STR_SPEC_DEC_REJECTS_MIN_P_LOGIT_BIAS,
    AllowedTokenIdsLogitsProcessor,
    BadWordsLogitsProcessor,
    BatchUpdate,
    EngineConfig,
    LogitBiasLogitsProcessor,
    LogitsProcessors,
    MoveDirectionality,
    PenaltiesLogitsProcessor,
    Sampler,
    SamplingMetadata,
    SamplingParams,
    apply_token_bitmask_,
    build_logitsprocs,
    validate_sampling_params,
)
from logitsproc_rs.params import validate_thinking_token_budget
from logitsproc_rs.pipeline import Pipeline
from logitsproc_rs.reference import (
    RefAllowedTokenIdsLogitsProcessor,
    RefBadWordsLogitsProcessor,
    ReferenceSampler,
    RefLogitBiasLogitsProcessor,
    RefPenaltiesLogitsProcessor,
    build_reference_logitsprocs,
    ref_apply_token_bitmask,
)

INF = math.inf
SWAP = MoveDirectionality.SWAP
UNI = MoveDirectionality.UNIDIRECTIONAL
V = 8
CFG = EngineConfig(max_num_seqs=4, vocab_size=V)


def make(cls: type, cfg: EngineConfig = CFG) -> Any:
    return cls(cfg, torch.device("cpu"), False)


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


def upd(batch_size: int, added=(), removed=(), moved=()) -> BatchUpdate:
    return BatchUpdate(
        batch_size=batch_size, removed=list(removed), added=list(added), moved=list(moved)
    )


def pen(rep: float = 1.0, freq: float = 0.0, pres: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres)


def step(procs, update) -> None:
    for p in procs:
        p.update_state(update)


def applied(proc, logits: torch.Tensor) -> torch.Tensor:
    return proc.apply(logits.clone())


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert torch.equal(a, b), f"\n{a}\n!=\n{b}"


# --- penalties ---------------------------------------------------------------------------------


def test_penalty_math_tiny_incl_negative_zero_and_neg_inf():
    """Row 0: rep 2, freq 0.5, pres 0.25, prompt [1, 2, 4], output [2, 3, 3, 6]."""
    ours, ref = make(PenaltiesLogitsProcessor), make(RefPenaltiesLogitsProcessor)
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
    ours, ref = make(PenaltiesLogitsProcessor), make(RefPenaltiesLogitsProcessor)
    step((ours, ref), upd(1, added=[(0, pen(rep=0.5), None, [0, 1, 2])]))
    logits = torch.tensor([[4.0, -3.0, 0.0, 4.0, -3.0, 0.0, 1.0, 1.0]])
    expected = torch.tensor([[8.0, -1.5, 0.0, 4.0, -3.0, 0.0, 1.0, 1.0]])
    assert_same(applied(ours, logits), expected)
    assert_same(applied(ref, logits), expected)


def test_prompt_only_tokens_get_repetition_but_not_frequency_or_presence():
    ours, ref = make(PenaltiesLogitsProcessor), make(RefPenaltiesLogitsProcessor)
    # Only frequency / presence: prompt-only tokens must be untouched.
    step((ours, ref), upd(2, added=[(0, pen(1.0, 2.0, 2.0), [1, 2], [2]), (1, pen(1.5), [1], [])]))
    logits = torch.full((2, V), 3.0)
    expected = logits.clone()
    expected[0, 2] = 3.0 - 2.0 - 2.0  # in the output once
    expected[1, 1] = 2.0  # prompt-only, repetition 1.5: 3 / 1.5
    assert_same(applied(ours, logits), expected)
    assert_same(applied(ref, logits), expected)


def test_counts_move_with_their_request_on_swap_and_condense():
    ours, ref = make(PenaltiesLogitsProcessor), make(RefPenaltiesLogitsProcessor)
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


@pytest.mark.parametrize(
    ("cls", "params"),
    [
        (PenaltiesLogitsProcessor, pen(1.0, 1.0, 0.0)),
        (BadWordsLogitsProcessor, SimpleNamespace(bad_words_token_ids=[[1]])),
        (AllowedTokenIdsLogitsProcessor, SimpleNamespace(allowed_token_ids=[1])),
    ],
)
def test_no_active_request_returns_same_object_and_slot_reuse_starts_fresh(cls, params):
    p = make(cls)
    assert p.apply(torch.zeros(0, V)) is not None
    x = torch.zeros(1, V)
    p.update_state(upd(1, added=[(0, SimpleNamespace(), [1], [])]))  # nothing set
    p.update_state(None)
    assert p.apply(x) is x and bool((x == 0).all())
    p.update_state(upd(1, added=[(0, params, None, [1, 1])]))
    assert not torch.equal(applied(p, x), x)
    p.update_state(upd(0, removed=[0]))  # the only request finishes
    p.update_state(None)
    x = torch.zeros(0, V)
    assert p.apply(x) is x
    # A new request at the same slot: nothing of the old one's state (counts) survives.
    out = [2]
    p.update_state(upd(1, added=[(0, params, None, out)]))
    expected = torch.zeros(1, V)
    if cls is PenaltiesLogitsProcessor:
        expected[0, 2] = -1
    elif cls is BadWordsLogitsProcessor:
        expected[0, 1] = -INF
    else:
        expected[0] = -INF
        expected[0, 1] = 0
    assert_same(applied(p, torch.zeros(1, V)), expected)


def test_counted_equals_output_after_1000_tokens():
    """Incremental counting stays exact over a long generation with async placeholders,
    shrinks and a SWAP on the way."""
    cfg = EngineConfig(max_num_seqs=4, vocab_size=50)
    ours, ref = make(PenaltiesLogitsProcessor, cfg), make(RefPenaltiesLogitsProcessor, cfg)
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
    host = make(PenaltiesLogitsProcessor, cfg)
    ref = make(RefPenaltiesLogitsProcessor, cfg)
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
    ours, ref = make(PenaltiesLogitsProcessor), make(RefPenaltiesLogitsProcessor)
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
    ours, ref = make(PenaltiesLogitsProcessor), make(RefPenaltiesLogitsProcessor)
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
    ours, ref = make(PenaltiesLogitsProcessor), make(RefPenaltiesLogitsProcessor)
    out = [1, 2, 3]
    step((ours, ref), upd(1, added=[(0, pen(freq=1.0), None, out)]))
    del out[-1:]
    out.append(5)
    step((ours, ref), None)
    expected = torch.zeros(1, V)
    expected[0, [1, 2, 5]] = -1
    assert_same(applied(ref, torch.zeros(1, V)), expected)
    assert_same(applied(ours, torch.zeros(1, V)), expected)


# --- bad words ---------------------------------------------------------------------------------


def bw(*words: list[int]) -> SimpleNamespace:
    return SimpleNamespace(bad_words_token_ids=[list(w) for w in words])


def banned(proc, rows: int) -> list[set[int]]:
    x = applied(proc, torch.zeros(rows, V))
    return [set(torch.nonzero(x[r] == -INF).flatten().tolist()) for r in range(rows)]


def test_single_token_bad_word_always_banned():
    ours, ref = make(BadWordsLogitsProcessor), make(RefBadWordsLogitsProcessor)
    out = []
    step((ours, ref), upd(1, added=[(0, bw([3], [6]), [3, 6], out)]))
    for _ in range(3):
        assert banned(ours, 1) == banned(ref, 1) == [{3, 6}]
        out.append(1)
        step((ours, ref), None)


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ([], set()),
        ([5], set()),  # prefix [5, 6] not matched yet; [6, 7] neither
        ([5, 6], {7}),
        ([1, 5, 6], {7}),
        ([5, 6, 1], set()),
        ([6], {7}),  # word [6, 7]: prefix [6]
        ([5, 6, 6], {7}),  # [6, 7] matches via its own prefix
        ([5, 6, -1], set()),  # an async placeholder never matches
    ],
)
def test_multi_token_bad_word_only_on_prefix_match(output, expected):
    ours, ref = make(BadWordsLogitsProcessor), make(RefBadWordsLogitsProcessor)
    step((ours, ref), upd(1, added=[(0, bw([5, 6, 7], [6, 7]), None, list(output))]))
    assert banned(ours, 1) == banned(ref, 1) == [expected]


def test_bad_word_longer_than_output_plus_one_is_skipped():
    """vLLM skips a word longer than ``len(output) + 1``: [2, 3, 4] with output [3] bans
    nothing even though the output ends with part of its prefix."""
    ours, ref = make(BadWordsLogitsProcessor), make(RefBadWordsLogitsProcessor)
    out = [3]
    step((ours, ref), upd(1, added=[(0, bw([2, 3, 4]), None, out)]))
    assert banned(ours, 1) == banned(ref, 1) == [set()]
    out[0] = 2
    out.append(3)
    step((ours, ref), None)
    assert banned(ours, 1) == banned(ref, 1) == [{4}]


def test_bad_words_reevaluated_on_none_steps():
    ours, ref = make(BadWordsLogitsProcessor), make(RefBadWordsLogitsProcessor)
    out0, out1 = [], [9 % V]
    step(
        (ours, ref),
        upd(2, added=[(0, bw([1, 2], [4]), None, out0), (1, bw([1, 2, 3]), None, out1)]),
    )
    assert banned(ours, 2) == banned(ref, 2) == [{4}, set()]
    for tok0, tok1, exp in [
        (1, 1, [{4, 2}, set()]),
        (0, 2, [{4}, {3}]),
        (1, 0, [{4, 2}, set()]),
    ]:
        out0.append(tok0)
        out1.append(tok1)
        step((ours, ref), None)
        assert banned(ours, 2) == banned(ref, 2) == exp


def test_bad_words_move_with_request():
    ours, ref = make(BadWordsLogitsProcessor), make(RefBadWordsLogitsProcessor)
    step((ours, ref), upd(3, added=[(0, bw([1]), None, []), (2, bw([2]), None, [])]))
    step((ours, ref), upd(3, moved=[(0, 1, SWAP)]))
    assert banned(ours, 3) == banned(ref, 3) == [set(), {1}, {2}]
    step((ours, ref), upd(2, moved=[(2, 0, UNI)]))
    assert banned(ours, 2) == banned(ref, 2) == [{2}, {1}]
    step((ours, ref), upd(3, added=[(2, SimpleNamespace(), None, [])]))
    assert banned(ours, 3) == banned(ref, 3) == [{2}, {1}, set()]


def test_bad_word_prefix_filled_between_update_state_and_apply_bans():
    """vLLM's async order: the output's last token is a ``-1`` placeholder at
    ``update_state`` and is filled in place before the sampler; vLLM matches bad words at
    sampling time, so [5, 6] bans 6 right after 5 was generated. Expected: 6 banned."""
    ours, ref = make(BadWordsLogitsProcessor), make(RefBadWordsLogitsProcessor)
    out = [1]
    step((ours, ref), upd(1, added=[(0, bw([5, 6]), None, out)]))
    out.append(-1)
    step((ours, ref), None)  # update_state: the tail is still -1
    out[-1] = 5  # the engine fills the placeholder, then samples
    assert banned(ref, 1) == [{6}]
    assert banned(ours, 1) == [{6}]


# --- allowed token ids -------------------------------------------------------------------------


def allow(ids) -> SimpleNamespace:
    return SimpleNamespace(allowed_token_ids=None if ids is None else list(ids))


def allowed_sets(proc, rows: int) -> list[set[int]]:
    x = applied(proc, torch.zeros(rows, V))
    return [set(torch.nonzero(x[r] != -INF).flatten().tolist()) for r in range(rows)]


ALL_IDS = set(range(V))


def test_allowed_ids_mask_everything_else():
    ours, ref = make(AllowedTokenIdsLogitsProcessor), make(RefAllowedTokenIdsLogitsProcessor)
    step((ours, ref), upd(2, added=[(0, allow([3, 1, 3]), None, []), (1, allow(None), None, [])]))
    logits = torch.arange(2 * V, dtype=torch.float32).view(2, V)
    got = applied(ours, logits)
    expected = logits.clone()
    expected[0, [0, 2, 4, 5, 6, 7]] = -INF
    assert_same(got, expected)
    assert_same(applied(ref, logits), expected)


def test_allowed_swap_of_two_rows_with_different_sets_exchanges_them():
    """vLLM 0.25.1 bug 1 (swap_states aliases two row views: both rows end with one mask)."""
    ours, ref = make(AllowedTokenIdsLogitsProcessor), make(RefAllowedTokenIdsLogitsProcessor)
    step((ours, ref), upd(3, added=[(0, allow([1, 2]), None, []), (1, allow([5]), None, [])]))
    step((ours, ref), upd(3, moved=[(0, 1, SWAP)]))
    assert allowed_sets(ours, 3) == allowed_sets(ref, 3) == [{5}, {1, 2}, ALL_IDS]
    # One side without a set: the set moves, the other row becomes unrestricted.
    step((ours, ref), upd(3, moved=[(1, 2, SWAP)]))
    assert allowed_sets(ours, 3) == allowed_sets(ref, 3) == [{5}, ALL_IDS, {1, 2}]


def test_allowed_condense_then_new_request_at_source_inherits_nothing():
    """vLLM 0.25.1 bug 2 (condense copies the mask row without clearing the source): slot 0
    finishes, slot 1 (with a set) is condensed into it, and the next request added at slot 1
    without allowed ids must not be restricted."""
    ours, ref = make(AllowedTokenIdsLogitsProcessor), make(RefAllowedTokenIdsLogitsProcessor)
    step((ours, ref), upd(2, added=[(0, allow(None), None, []), (1, allow([4, 6]), None, [])]))
    step((ours, ref), upd(1, moved=[(1, 0, UNI)]))
    assert allowed_sets(ours, 1) == allowed_sets(ref, 1) == [{4, 6}]
    step((ours, ref), upd(2, added=[(1, allow(None), None, [])]))
    assert allowed_sets(ours, 2) == allowed_sets(ref, 2) == [{4, 6}, ALL_IDS]
    # and the restricted request can itself be replaced by an unrestricted one
    step((ours, ref), upd(2, added=[(0, SimpleNamespace(), None, [])]))
    assert allowed_sets(ours, 2) == allowed_sets(ref, 2) == [ALL_IDS, ALL_IDS]


def test_allowed_keeps_values_and_neg_inf():
    ours = make(AllowedTokenIdsLogitsProcessor)
    ours.update_state(upd(1, added=[(0, allow([0, 1, 2]), None, [])]))
    logits = torch.tensor([[-INF, -5.5, 7.25, 1.0, 2.0, 3.0, 4.0, 5.0]])
    assert_same(applied(ours, logits), torch.tensor([[-INF, -5.5, 7.25] + [-INF] * 5]))


# --- grammar bitmask ---------------------------------------------------------------------------


def pack(allowed_rows: list[set[int]], words: int) -> np.ndarray:
    """Pack sets of allowed tokens into int32 words, LSB first (built independently of both
    implementations)."""
    out = np.zeros((len(allowed_rows), words), dtype=np.uint32)
    for r, allowed in enumerate(allowed_rows):
        for t in allowed:
            out[r, t // 32] |= np.uint32(1) << np.uint32(t % 32)
    return out.view(np.int32)


def test_bitmask_bit_layout_lsb_first():
    logits = torch.zeros(2, 70)
    words = np.zeros((2, 3), dtype=np.uint32)
    words[0] = [0b101, 1 << 31, 1 << 1]  # tokens 0 and 2; 32 + 31 = 63; 64 + 1 = 65
    words[1] = 0xFFFFFFFF
    words[1, 0] ^= 1 << 3  # everything but token 3
    mask = words.view(np.int32)
    got = apply_token_bitmask_(logits.clone(), mask)
    assert_same(got, ref_apply_token_bitmask(logits.clone(), mask))
    assert set(torch.nonzero(got[0] == 0).flatten().tolist()) == {0, 2, 63, 65}
    assert set(torch.nonzero(got[1] == -INF).flatten().tolist()) == {3}
    assert (pack([{0, 2, 63, 65}], 3) == mask[:1]).all()


def test_bitmask_minus_one_rows_untouched_and_returns_same_tensor():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    logits[1, 5] = -INF
    mask = pack([set(), set(), {7}], 2)
    mask[0] = -1
    mask[1] = -1
    x = logits.clone()
    out = apply_token_bitmask_(x, mask)
    assert out is x
    assert_same(out[:2], logits[:2])
    assert out[2, 7] == logits[2, 7] and int((out[2] == -INF).sum()) == 39


@pytest.mark.parametrize(("vocab", "words"), [(70, 2), (40, 2), (64, 2), (33, 1)])
def test_bitmask_columns_past_min_vocab_and_words_untouched(vocab, words):
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(vocab))
    mask = np.zeros((2, words), dtype=np.int32)  # everything blocked where it applies
    got = apply_token_bitmask_(logits.clone(), mask)
    width = min(vocab, 32 * words)
    assert bool((got[:, :width] == -INF).all())
    assert_same(got[:, width:], logits[:, width:])
    assert_same(got, ref_apply_token_bitmask(logits.clone(), mask))


@pytest.mark.parametrize(
    "make_indices",
    [
        lambda ix: list(ix),
        lambda ix: np.array(ix, dtype=np.int64),
        lambda ix: np.array(ix, dtype=np.int32),
        lambda ix: torch.tensor(ix, dtype=torch.int32),
        lambda ix: torch.tensor(ix, dtype=torch.int64),
    ],
    ids=["list", "numpy64", "numpy32", "tensor32", "tensor64"],
)
@pytest.mark.parametrize("as_numpy", [True, False], ids=["np-mask", "tensor-mask"])
def test_bitmask_indices_kinds(make_indices, as_numpy):
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(1))
    np_mask = pack([{1, 2}, {40, 49}], 2)
    mask = np_mask if as_numpy else torch.from_numpy(np_mask.copy())
    got = apply_token_bitmask_(logits.clone(), mask, make_indices([3, 1]))
    ref = ref_apply_token_bitmask(logits.clone(), np_mask, [3, 1])
    assert_same(got, ref)
    assert_same(got[[0, 2, 4]], logits[[0, 2, 4]])
    assert set(torch.nonzero(got[3] != -INF).flatten().tolist()) == {1, 2}
    assert set(torch.nonzero(got[1] != -INF).flatten().tolist()) == {40, 49}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_bitmask_low_precision_logits(dtype):
    logits = torch.randn(3, 45, generator=torch.Generator().manual_seed(2)).to(dtype)
    mask = pack([{0, 44}, set(range(45)), {31, 32}], 2)
    got = apply_token_bitmask_(logits.clone(), mask)
    assert got.dtype == dtype
    assert_same(got, ref_apply_token_bitmask(logits.clone(), mask))
    assert_same(got[1], logits[1])
    keep = got[0] != -INF
    assert keep.tolist() == [i in (0, 44) for i in range(45)]
    assert_same(got[0][keep], logits[0][keep])


def test_bitmask_zero_rows_with_empty_indices_is_a_no_op():
    """No structured request this step: a ``[0, words]`` bitmask with empty indices."""
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(3))
    got = apply_token_bitmask_(logits.clone(), np.zeros((0, 2), dtype=np.int32), [])
    assert_same(got, logits)


@pytest.mark.parametrize(
    ("mask", "indices", "match"),
    [
        (np.full((2, 2), -1, dtype=np.int64), None, "int32"),
        (np.full((2, 2), -1.0, dtype=np.float32), None, "int32"),
        (torch.full((2, 2), -1, dtype=torch.int64), None, "int32"),
        (torch.full((2, 2), -1.0), None, "int32"),
        (np.full((2,), -1, dtype=np.int32), None, "rows, words"),
        (np.full((2, 2, 1), -1, dtype=np.int32), None, "rows, words"),
        (np.full((3, 2), -1, dtype=np.int32), None, "rows"),
        (np.full((1, 2), -1, dtype=np.int32), None, "rows"),
        (np.full((1, 2), -1, dtype=np.int32), [2], r"indices must be in \[0, 2\)"),
        (np.full((1, 2), -1, dtype=np.int32), [-1], r"indices must be in \[0, 2\)"),
        (np.full((1, 2), -1, dtype=np.int32), np.array([5]), r"indices must be in \[0, 2\)"),
        (np.full((2, 2), -1, dtype=np.int32), [0], "indices"),
        ([[-1, -1], [-1, -1]], None, "numpy array or a tensor"),
    ],
    ids=[
        "np-int64",
        "np-float",
        "tensor-int64",
        "tensor-float",
        "ndim1",
        "ndim3",
        "too-many-rows",
        "too-few-rows",
        "index-past-end",
        "index-negative",
        "numpy-index-past-end",
        "rows-vs-indices",
        "list-mask",
    ],
)
def test_bitmask_bad_input(mask, indices, match):
    logits = torch.randn(2, 40, generator=torch.Generator().manual_seed(4))
    x = logits.clone()
    with pytest.raises(ValueError, match=match):
        apply_token_bitmask_(x, mask, indices)
    assert_same(x, logits)


# --- bad input for the new processors -----------------------------------------------------------


BASE_OUT = [1, 2, 2]


def _world(cls: type):
    """A processor with two valid requests and one grown output list."""
    p = make(cls)
    full = SimpleNamespace(
        repetition_penalty=1.5,
        frequency_penalty=0.5,
        presence_penalty=0.25,
        bad_words_token_ids=[[3], [2, 4]],
        allowed_token_ids=[1, 2, 4],
    )
    p.update_state(upd(2, added=[(0, full, [5, 6], list(BASE_OUT)), (1, full, [0], [])]))
    return p


def _bad_update(bad_params: Any, prompt: Any = None) -> BatchUpdate:
    """A valid add and a SWAP besides the bad request at index 2: all must be rejected."""
    ok = SimpleNamespace(repetition_penalty=2.0, bad_words_token_ids=[[1]], allowed_token_ids=[0])
    return upd(3, added=[(1, ok, [1], []), (2, bad_params, prompt, [])], moved=[(0, 1, SWAP)])


BAD_CASES = [
    (PenaltiesLogitsProcessor, dict(presence_penalty=2.5), None, "presence_penalty"),
    (PenaltiesLogitsProcessor, dict(presence_penalty=-2.01), None, "presence_penalty"),
    (PenaltiesLogitsProcessor, dict(presence_penalty=math.nan), None, "presence_penalty"),
    (PenaltiesLogitsProcessor, dict(frequency_penalty=3.0), None, "frequency_penalty"),
    (PenaltiesLogitsProcessor, dict(frequency_penalty=-INF), None, "frequency_penalty"),
    (PenaltiesLogitsProcessor, dict(frequency_penalty=math.nan), None, "frequency_penalty"),
    (PenaltiesLogitsProcessor, dict(repetition_penalty=0.0), None, "repetition_penalty"),
    (PenaltiesLogitsProcessor, dict(repetition_penalty=-1.0), None, "repetition_penalty"),
    (PenaltiesLogitsProcessor, dict(repetition_penalty=INF), None, "repetition_penalty"),
    (PenaltiesLogitsProcessor, dict(repetition_penalty=math.nan), None, "repetition_penalty"),
    (PenaltiesLogitsProcessor, dict(repetition_penalty=1.5), [1, V], "prompt_tok_ids"),
    (PenaltiesLogitsProcessor, dict(frequency_penalty=1.0), [-2], "prompt_tok_ids"),
    (BadWordsLogitsProcessor, dict(bad_words_token_ids=[[1], []]), None, "bad_words"),
    (BadWordsLogitsProcessor, dict(bad_words_token_ids=[[1, V]]), None, "bad_words"),
    (BadWordsLogitsProcessor, dict(bad_words_token_ids=[[-1]]), None, "bad_words"),
    (AllowedTokenIdsLogitsProcessor, dict(allowed_token_ids=[]), None, "allowed_token_ids"),
    (AllowedTokenIdsLogitsProcessor, dict(allowed_token_ids=[0, V]), None, "allowed_token_ids"),
    (AllowedTokenIdsLogitsProcessor, dict(allowed_token_ids=[-1]), None, "allowed_token_ids"),
]


@pytest.mark.parametrize(
    ("cls", "fields", "prompt", "field"),
    BAD_CASES,
    ids=[f"{c.__name__[:8]}-{f}-{i}" for i, (c, _, _, f) in enumerate(BAD_CASES)],
)
def test_new_processors_reject_bad_params_and_keep_state(cls, fields, prompt, field):
    p = _world(cls)
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(5))
    before = applied(p, logits)
    with pytest.raises(ValueError) as e:
        p.update_state(_bad_update(SimpleNamespace(**fields), prompt))
    msg = str(e.value)
    assert "index 2" in msg and field in msg, msg
    assert_same(applied(p, logits), before)
    # and it keeps working: the next (valid) step behaves like a twin's that never saw it
    twin = _world(cls)
    for q in (p, twin):
        q.update_state(upd(2, moved=[(0, 1, SWAP)]))
    assert_same(applied(p, logits), applied(twin, logits))


# --- front-end validation and the thinking budget ----------------------------------------------


SPEC = EngineConfig(max_num_seqs=4, vocab_size=V, num_speculative_tokens=2)
REASONING = EngineConfig(
    max_num_seqs=4, vocab_size=V, reasoning_start_token_ids=[1], reasoning_end_token_ids=[2]
)


@pytest.mark.parametrize(
    "params",
    [SamplingParams(min_p=0.1), SamplingParams(min_p=1.1e-5), SamplingParams(logit_bias={1: 1.0})],
)
def test_speculative_config_rejects_min_p_and_logit_bias(params):
    with pytest.raises(ValueError) as e:
        validate_sampling_params(SPEC, params)
    assert str(e.value) == STR_SPEC_DEC_REJECTS_MIN_P_LOGIT_BIAS
    assert STR_SPEC_DEC_REJECTS_MIN_P_LOGIT_BIAS == (
        "The min_p and logit_bias sampling parameters are not yet supported with speculative "
        "decoding."
    )
    validate_sampling_params(CFG, params)  # fine without speculative decoding


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(min_p=1e-5),
        SamplingParams(min_p=0.0),
        SamplingParams(logit_bias={}),
        SamplingParams(repetition_penalty=1.2, bad_words_token_ids=[[1]]),
    ],
)
def test_speculative_config_accepts_the_rest(params):
    validate_sampling_params(SPEC, params)


def test_thinking_budget_needs_reasoning_ids():
    p = SamplingParams(thinking_token_budget=10)
    with pytest.raises(ValueError, match="reasoning"):
        validate_sampling_params(CFG, p)
    with pytest.raises(ValueError, match="reasoning"):
        validate_sampling_params(SPEC, p)
    validate_sampling_params(REASONING, p)
    validate_sampling_params(CFG, SamplingParams(thinking_token_budget=-1))  # -1 means None


@pytest.mark.parametrize(("value", "expected"), [(None, None), (-1, None), (0, 0), (7, 7)])
def test_thinking_token_budget_values(value, expected):
    assert SamplingParams(thinking_token_budget=value).thinking_token_budget == expected
    assert validate_thinking_token_budget(value) == expected


@pytest.mark.parametrize("value", [True, False, 1.0, 2.5, -2, -100, "3"])
def test_thinking_token_budget_rejects(value):
    with pytest.raises(ValueError, match="thinking_token_budget"):
        SamplingParams(thinking_token_budget=value)


# --- logprobs modes ----------------------------------------------------------------------------


RAW = torch.tensor(
    [
        [3.0, 1.0, 3.0, 0.0, -INF, 2.0],
        [0.5, 4.0, -1.0, 4.0, 2.0, 0.0],
    ]
)


def _sampler_pair(mode: str, bias: dict[int, float]):
    cfg = EngineConfig(max_num_seqs=2, vocab_size=6)
    procs, refs = (
        LogitsProcessors([make(c, cfg)])
        for c in (LogitBiasLogitsProcessor, RefLogitBiasLogitsProcessor)
    )
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


# --- build order -------------------------------------------------------------------------------


def test_reference_build_order_matches_ours():
    for sampler_transforms in (True, False):
        for cfg in (CFG, SPEC):
            ours = build_logitsprocs(cfg, "cpu", False, sampler_transforms=sampler_transforms)
            ref = build_reference_logitsprocs(cfg, "cpu", sampler_transforms=sampler_transforms)
            names = [type(p).__name__ for p in ours.all]
            ref_names = [type(p).__name__.removeprefix("Ref") for p in ref.all]
            assert names == ref_names

"""Bad token feeds (``update_state(update, sampled_token_ids=...)`` on a ``token_feed=True``
pipeline) and bad output lists (the V1 history read): a typed ``ValueError`` naming the field
and the position of the bad item, every table exactly as before (also as a later valid step
sees it, against a twin that never saw the bad call), never a silent acceptance.

A feed is one entry per row of the last step (before this step's update), −1 for a row that
got no token: a list (or any ordered iterable) of ints, or a 1-D integer tensor or array.
numpy integer scalars are ints. Anything else is refused, as is a feed of the wrong length.
``KeyboardInterrupt`` / ``SystemExit`` raised by the caller's own objects propagate untouched.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import assert_unchanged

from logitsproc_rs import BatchUpdate, EngineConfig, SamplingParams, build_logitsprocs
from logitsproc_rs.errors import LogitsprocError, RequestError
from logitsproc_rs.reference import build_reference_logitsprocs

CFG = EngineConfig(max_num_seqs=6, vocab_size=16)
V = CFG.vocab_size
ROWS = 3
FIELD = "sampled_token_ids"


def _params(i: int) -> SamplingParams:
    return SamplingParams(
        presence_penalty=0.25 * (i + 1),
        frequency_penalty=0.25,
        repetition_penalty=1.5,
        min_tokens=4,
        stop_token_ids=[2],
        bad_words_token_ids=[[5, 6]],
        logit_bias={3: 1.0},
        min_p=0.1 * i,
    )


def world(token_feed: bool = True) -> Any:
    """Every processor on one pipeline, three requests in rows 0..2."""
    procs = build_logitsprocs(CFG, "cpu", False, token_feed=token_feed)
    adds = [(i, _params(i), [1, 2], [4]) for i in range(ROWS)]
    procs.update_state(BatchUpdate(ROWS, [], adds, []))
    procs.update_state(None, sampled_token_ids=[5, -1, 7])
    return procs


def logits(rows: int = ROWS, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, V, generator=g) * 3


def run(procs: Any, x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    for p in procs.all:
        y = p.apply(y)
    return y


def held(procs: Any) -> dict[str, Any]:
    """What a pipeline holds, read without applying (an apply re-reads placeholders)."""
    pipe = procs.pipeline
    core = pipe.core
    return {
        "views": [v.clone() for v in pipe.arena.views],
        "status": core.status(),
        "py_status": list(pipe.status),
        "active": core.active(),
        "batch_size": core.batch_size,
        "counted": [core.penalties_counted(i) for i in range(CFG.max_num_seqs)],
        "device": {k: s.cells.clone() for k, s in pipe.device_state.items()},
    }


def snapshot(procs: Any) -> dict[str, Any]:
    """What a pipeline holds, and what it makes of some logits."""
    return {**held(procs), "logits": run(procs, logits(procs.pipeline.core.batch_size))}


def follow_up(procs: Any) -> None:
    """A valid feed and a churn step: what hidden state (histories, counts) would show."""
    procs.update_state(None, sampled_token_ids=[6, 2, -1])
    procs.update_state(
        BatchUpdate(4, [1], [(1, _params(3), [9], []), (3, _params(1), None, [2, 2])], []),
        sampled_token_ids=[5, 5, 6],
    )


def check_refused(
    bad: Any,
    update: Any = None,
    index: int | None = None,
    position: int | None = None,
    exc: type[BaseException] = ValueError,
    field: str = FIELD,
    **kwargs: Any,
) -> BaseException:
    procs, twin = world(), world()
    before = snapshot(procs)
    with pytest.raises(exc) as ei:
        if kwargs:  # a feed keyed by slot: the pipeline's own step
            procs.pipeline.step(update, sampled_token_ids=bad, **kwargs)
        else:
            procs.update_state(update, sampled_token_ids=bad)
    e = ei.value
    if exc is ValueError:
        assert isinstance(e, LogitsprocError), f"untyped {type(e).__name__}: {e}"
        assert e.field == field, e
        assert field in str(e)
        if index is not None:
            assert e.index == index, e
        if position is not None:
            assert f"position {position}" in str(e), e
    assert_unchanged(before, snapshot(procs))
    follow_up(procs)
    follow_up(twin)
    assert_unchanged(snapshot(twin), snapshot(procs))
    return e


def one_add() -> BatchUpdate:
    return BatchUpdate(4, [], [(3, _params(2), [1], [])], [])


# --- the length of a feed ------------------------------------------------------------------


@pytest.mark.parametrize("with_update", [False, True])
@pytest.mark.parametrize(
    ("feed", "position"),
    [([5, 6], 2), ([5, 6, 7, 8], 3), ([], 0), ([-1], 1), ([-1] * 7, 3)],
    ids=["short", "long", "empty", "one", "over_capacity"],
)
def test_a_feed_must_have_one_entry_per_row_of_the_last_step(
    feed: list[int], position: int, with_update: bool
) -> None:
    e = check_refused(feed, one_add() if with_update else None)
    assert isinstance(e, ValueError)
    assert "rows" in str(e)
    if len(feed) <= CFG.max_num_seqs:
        assert e.index == position
        assert f"position {position}" in str(e)


def test_an_empty_feed_is_fine_while_no_rows_exist() -> None:
    procs = build_logitsprocs(CFG, "cpu", False, token_feed=True)
    procs.update_state(None, sampled_token_ids=[])
    procs.update_state(BatchUpdate(1, [], [(0, _params(0), None, [])], []), sampled_token_ids=[])
    procs.update_state(None, sampled_token_ids=torch.tensor([3]))
    assert procs.pipeline.core.penalties_counted(0) == [3]


# --- what a feed may be ---------------------------------------------------------------------


def _u64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.uint64)


BAD_FEEDS: list[tuple[str, Any]] = [
    ("dict", {0: 5, 1: 6, 2: 7}),
    ("ordered_dict", OrderedDict([(0, 5), (1, 6), (2, 7)])),
    ("set", {5, 6, 7}),
    ("frozenset", frozenset({5, 6, 7})),
    ("dict_keys", {5: 0, 6: 0, 7: 0}.keys()),
    ("array_2d", np.array([[5, 6, 7]])),
    ("array_2d_col", np.array([[5], [6], [7]])),
    ("tensor_2d", torch.tensor([[5, 6, 7]])),
    ("tensor_0d", torch.tensor(5)),
    ("array_0d", np.array(5)),
    ("bytes_zero", b"\x00" * 24),
    ("bytes_empty", b""),
    ("bytearray", bytearray(24)),
    ("memoryview", memoryview(bytes(24))),
    ("str", "567"),
    ("int", 5),
    ("np_int", np.int64(5)),
    ("none_items", [None, None, None]),
    ("uint64_past_int64", _u64([2**64 - 1, 2**63, 5])),
    ("uint64_minus_one_bits", _u64([2**64 - 1] * 3)),
    ("float_list", [5.0, 6.0, 7.0]),
    ("float_tensor", torch.tensor([5.0, 6.0, 7.0])),
    ("float_array", np.array([5.0, 6.0, 7.0])),
    ("bool_tensor", torch.tensor([True, False, True])),
    ("bool_array", np.array([True, False, True])),
    ("complex_tensor", torch.tensor([5, 6, 7], dtype=torch.complex64)),
    ("object_array", np.array([5, 6, 7], dtype=object)),
    ("str_array", np.array(["5", "6", "7"])),
    ("meta_tensor", torch.empty(3, dtype=torch.int64, device="meta")),
    ("masked_array", np.ma.masked_array([5, 6, 7], mask=[0, 1, 0])),
    ("nested", [[5], [6], [7]]),
]
if hasattr(torch, "uint64"):
    BAD_FEEDS.append(("uint64_tensor_past_int64", torch.tensor([2**63, 5, 6], dtype=torch.uint64)))


@pytest.mark.parametrize("with_update", [False, True])
@pytest.mark.parametrize(("kind", "bad"), BAD_FEEDS, ids=[k for k, _ in BAD_FEEDS])
def test_a_feed_of_the_wrong_kind_is_refused(kind: str, bad: Any, with_update: bool) -> None:
    check_refused(bad, one_add() if with_update else None)


@pytest.mark.parametrize(
    ("item", "why"),
    [
        (True, "bool"),
        (np.bool_(True), "bool"),
        (1.0, "float"),
        (np.float64(1.0), "float"),
        ("1", "str"),
        (None, "None"),
        ([1], "list"),
        (2**70, "huge"),
        (2**63, "past int64"),
        (-(2**63) - 1, "below int64"),
        (-2, "below -1"),
        (V, "out of vocab"),
        (np.uint64(2**64 - 1), "np past int64"),
        (torch.tensor(True), "bool tensor"),
        (torch.tensor(1.0), "float tensor"),
    ],
    ids=lambda v: repr(v) if not isinstance(v, str) else v,
)
@pytest.mark.parametrize("position", [0, 2])
def test_a_bad_item_names_its_own_position(item: Any, why: str, position: int) -> None:
    feed: list[Any] = [5, -1, 7]
    feed[position] = item
    e = check_refused(feed, one_add(), index=position, position=position)
    assert isinstance(e, RequestError)


class Boom:
    """An object whose ``__index__`` raises: not an int to us (never called)."""

    calls = 0

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __index__(self) -> int:
        Boom.calls += 1
        raise self.exc


class RaisingIter:
    def __init__(self, exc: BaseException, after: int = 0) -> None:
        self.exc, self.after = exc, after

    def __len__(self) -> int:
        return ROWS

    def __iter__(self) -> Any:
        yield from [5, 6, 7][: self.after]
        raise self.exc


class BadIterCall:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __iter__(self) -> Any:
        raise self.exc


class LyingLen(list):
    """A list whose ``__len__`` lies (nothing may trust it)."""

    def __len__(self) -> int:
        return 10**12


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)])
@pytest.mark.parametrize(
    "make",
    [lambda e: RaisingIter(e, 1), lambda e: BadIterCall(e)],
    ids=["next", "iter"],
)
def test_interrupts_from_the_callers_objects_propagate(make: Any, exc: BaseException) -> None:
    raised = check_refused(make(exc), one_add(), exc=type(exc))
    assert raised is exc


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3), RuntimeError()])
def test_an_object_with_index_is_no_int_and_its_code_never_runs(exc: BaseException) -> None:
    """Only ints and numpy integers are ints: nothing of the caller's runs while a feed is
    read, so nothing of theirs can raise or lie there."""
    Boom.calls = 0
    check_refused([5, Boom(exc), 7], one_add(), index=1, position=1)
    assert Boom.calls == 0


@pytest.mark.parametrize(
    "bad",
    [
        RaisingIter(RuntimeError("no"), 2),
        BadIterCall(OSError("no")),
        iter(range(10**9)),  # endless for all purposes: bounded, then refused
    ],
    ids=["next", "iter", "endless"],
)
def test_other_errors_from_the_callers_objects_are_value_errors(bad: Any) -> None:
    check_refused(bad, one_add())


def test_a_lying_len_is_not_trusted() -> None:
    procs, twin = world(), world()
    procs.update_state(None, sampled_token_ids=LyingLen([5, 6, 7]))
    twin.update_state(None, sampled_token_ids=[5, 6, 7])
    assert_unchanged(snapshot(twin), snapshot(procs))


GOOD_FEEDS: list[tuple[str, Any]] = [
    ("list", [5, -1, 7]),
    ("tuple", (5, -1, 7)),
    ("np_scalars", [np.int64(5), np.int32(-1), np.uint8(7)]),
    ("range_like_iter", iter([5, -1, 7])),
    ("tensor_int64", torch.tensor([5, -1, 7])),
    ("tensor_strided", torch.tensor([5, 0, -1, 0, 7, 0])[::2]),
    ("array_strided", np.array([5, 0, -1, 0, 7, 0])[::2]),
    ("array_uint64_small", np.array([5, 6, 7], dtype=np.uint64)),
]
for _dt in (torch.int8, torch.int16, torch.int32, torch.int64):
    GOOD_FEEDS.append((f"tensor_{_dt}", torch.tensor([5, -1, 7], dtype=_dt)))
for _dt in (torch.uint8,):
    GOOD_FEEDS.append((f"tensor_{_dt}", torch.tensor([5, 6, 7], dtype=_dt)))
for _ndt in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32):
    GOOD_FEEDS.append((f"array_{_ndt.__name__}", np.array([5, 6, 7], dtype=_ndt)))


@pytest.mark.parametrize(("kind", "feed"), GOOD_FEEDS, ids=[k for k, _ in GOOD_FEEDS])
def test_every_integer_form_of_a_feed_is_the_same_feed(kind: str, feed: Any) -> None:
    procs, twin = world(), world()
    procs.update_state(one_add(), sampled_token_ids=feed)
    plain = [int(t) for t in (feed.tolist() if hasattr(feed, "tolist") else [5, -1, 7])]
    twin.update_state(one_add(), sampled_token_ids=plain)
    assert_unchanged(snapshot(twin), snapshot(procs))


# --- the slots of a feed keyed by slot --------------------------------------------------------


@pytest.mark.parametrize(
    ("slots", "position"),
    [([0, 1, 9], 2), ([0, -1, 2], 1), ([True, 1, 2], 0), ([0, 1, 2.0], 2)],
    ids=["out_of_range", "negative", "bool", "float"],
)
def test_a_bad_feed_slot_names_slots_and_its_position(slots: list[Any], position: int) -> None:
    check_refused([5, 6, 7], index=position, position=position, field="slots", slots=slots)


def test_feed_and_slots_of_different_lengths_are_refused() -> None:
    check_refused([5, 6], slots=[0, 1, 2])


# --- the engine's output lists (the history read) ---------------------------------------------


def _ref_logits(ref: Any, x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    for p in ref.non_argmax_invariant:
        y = p.apply(y)
    return y


def _our_logits(procs: Any, x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    for p in procs.non_argmax_invariant:
        y = p.apply(y)
    return y


@pytest.mark.parametrize("token_feed", [False, True])
def test_numpy_ints_in_an_output_list_are_ints(token_feed: bool) -> None:
    """The same logits as the reference with the same list, and as plain ints give."""
    outputs = [[np.int64(3), np.int32(5), 4], [np.uint8(2), np.int16(6)]]
    plain = [[int(t) for t in o] for o in outputs]
    got = []
    for lists in (outputs, plain):
        ours = build_logitsprocs(CFG, "cpu", False, token_feed=token_feed)
        ref = build_reference_logitsprocs(CFG, "cpu")
        update = BatchUpdate(2, [], [(i, _params(i + 1), [1], lists[i]) for i in range(2)], [])
        ours.update_state(update)
        ref.update_state(update)
        x = logits(2)
        a, b = _our_logits(ours, x), _ref_logits(ref, x)
        assert torch.equal(a, b)
        got.append(a)
    assert torch.equal(got[0], got[1])


def test_numpy_ints_appended_to_a_live_list_are_ints() -> None:
    out: list[Any] = [4]
    ours = build_logitsprocs(CFG, "cpu", False)
    ref = build_reference_logitsprocs(CFG, "cpu")
    update = BatchUpdate(1, [], [(0, _params(1), [1], out)], [])
    ours.update_state(update)
    ref.update_state(update)
    out.extend([np.int64(3), np.int64(3), np.int32(9)])
    ours.update_state(None)
    ref.update_state(None)
    x = logits(1)
    assert torch.equal(_our_logits(ours, x), _ref_logits(ref, x))
    assert ours.pipeline.core.penalties_counted(0) == [4, 3, 3, 9]


MIDDLE = [[3, -1, 4], [-1, 3], [3, -1, -1, 5], [-1, -1, 0]]


@pytest.mark.parametrize("token_feed", [False, True])
@pytest.mark.parametrize("output", MIDDLE, ids=str)
def test_a_placeholder_before_a_token_is_refused_at_add(
    output: list[int], token_feed: bool
) -> None:
    """Async placeholders (−1) are only ever a suffix of an output list: one before a token is
    refused by ours and by the reference, naming the request, the field and the position."""
    pos = next(i for i, t in enumerate(output) if t >= 0 and -1 in output[:i])
    ours = build_logitsprocs(CFG, "cpu", False, token_feed=token_feed)
    ref = build_reference_logitsprocs(CFG, "cpu")
    good = (0, _params(1), [1], [2])
    update = BatchUpdate(3, [], [good, (2, _params(2), [1], list(output))], [])
    for target in (ours, ref):
        with pytest.raises(ValueError, match=rf"index 2\b.*output_tok_ids.*position {pos}\b"):
            target.update_state(update)
    assert ours.pipeline.core.batch_size == 0
    assert (
        ours.pipeline.core.active() == build_logitsprocs(CFG, "cpu", False).pipeline.core.active()
    )


@pytest.mark.parametrize("output", [[3, -1], [3, -1, -1], [-1], [-1, -1], []], ids=str)
def test_placeholders_as_a_suffix_are_fine(output: list[int]) -> None:
    ours = build_logitsprocs(CFG, "cpu", False)
    ref = build_reference_logitsprocs(CFG, "cpu")
    update = BatchUpdate(1, [], [(0, _params(1), [1], list(output))], [])
    ours.update_state(update)
    ref.update_state(update)
    x = logits(1)
    assert torch.equal(_our_logits(ours, x), _ref_logits(ref, x))


def test_a_placeholder_left_in_the_middle_of_a_live_list_is_refused() -> None:
    """The engine left a −1 behind and appended after it: the step that reads it is refused
    (ours and the reference), naming the request's index, the field and the position."""
    outs: list[list[int]] = [[4], [2]]
    ours = build_logitsprocs(CFG, "cpu", False)
    ref = build_reference_logitsprocs(CFG, "cpu")
    update = BatchUpdate(2, [], [(i, _params(i + 1), [1], outs[i]) for i in range(2)], [])
    ours.update_state(update)
    ref.update_state(update)
    outs[1].extend([-1, 5])
    before = snapshot(ours)
    for target in (ours, ref):
        with pytest.raises(ValueError, match=r"index 1\b.*output_tok_ids.*position 2\b"):
            target.update_state(None)
    assert_unchanged(before, snapshot(ours))
    outs[1][1] = 6  # the engine repairs it: both go on
    ours.update_state(None)
    ref.update_state(None)
    x = logits(2)
    assert torch.equal(_our_logits(ours, x), _ref_logits(ref, x))


@pytest.mark.parametrize("emulate_device", [False, True], ids=["cpu", "emulated_device"])
def test_a_placeholder_re_read_refused_at_apply_is_refused_again(emulate_device: bool) -> None:
    """The engine appended a token after a −1 it has not filled, between the step and the
    apply: the step's re-read of placeholders (at the first apply) is refused, and so is every
    apply after it, alike, changing nothing; once the engine repairs the list the logits are
    the reference's. A refused re-read used to count as the step's one re-read, so the next
    apply went ahead on the same bad list."""
    outs: list[list[int]] = [[4], [2, -1]]
    ours = build_logitsprocs(CFG, "cpu", False, emulate_device=emulate_device)
    ref = build_reference_logitsprocs(CFG, "cpu")
    update = BatchUpdate(2, [], [(i, _params(i + 1), [1], outs[i]) for i in range(2)], [])
    ours.update_state(update)
    ref.update_state(update)
    assert ours.pipeline.count("placeholders")
    outs[1].append(5)
    before = held(ours)
    x = logits(2)
    refusals = []
    for _ in range(2):
        with pytest.raises(RequestError, match=r"index 1\b.*output_tok_ids.*position 2\b") as ei:
            _our_logits(ours, x)
        e = ei.value
        refusals.append((type(e), str(e), e.index, e.field))
        assert_unchanged(before, held(ours))
    assert refusals[0] == refusals[1]
    outs[1][1] = 6  # the engine fills the placeholder: the step goes on
    assert torch.equal(_our_logits(ours, x), _ref_logits(ref, x))
    assert ours.pipeline.core.penalties_counted(1) == outs[1] == [2, 6, 5]


@pytest.mark.parametrize("at_apply", [False, True], ids=["step", "apply"])
def test_a_refused_read_keeps_a_rewrite_it_found_in_another_list(at_apply: bool) -> None:
    """In the step (or the re-read of placeholders at apply) that refuses request 1's list,
    request 0's list was truncated and regrown with the end of its thinking. Once request 1's
    list is repaired, the logits are those of a twin that never saw the refusal. The refused
    read used to drop what it found replaced, and request 0 was forced to end its thinking."""
    cfg = EngineConfig(
        max_num_seqs=4, vocab_size=V, reasoning_start_token_ids=[5], reasoning_end_token_ids=[7]
    )
    tail = [-1] if at_apply else []

    def world() -> tuple[Any, list[list[int]]]:
        procs = build_logitsprocs(cfg, "cpu", False)
        outs = [[5, 3, 4, *tail], [2, *tail]]
        params = SamplingParams(thinking_token_budget=8)
        procs.update_state(BatchUpdate(2, [], [(i, params, [1], outs[i]) for i in range(2)], []))
        outs[0][:] = [5, 7, 6] + [3] * 7  # past the budget, but thinking ended at position 1
        return procs, outs

    def go_on(procs: Any) -> torch.Tensor:
        if not at_apply:
            procs.update_state(None)
        return run(procs, logits(2))

    ours, outs = world()
    twin, twin_outs = world()
    outs[1].extend([-1, 9])
    bad = len(outs[1]) - 1
    with pytest.raises(RequestError, match=rf"index 1\b.*output_tok_ids.*position {bad}\b"):
        go_on(ours)
    outs[1][:] = twin_outs[1][:] = [2, 9]
    assert torch.equal(go_on(ours), go_on(twin))
    assert ours.pipeline.core.thinking_forced() == twin.pipeline.core.thinking_forced() == []

"""Bad input to the stable-slot front-end (``add_request`` / ``remove_request`` /
``step_slots`` / ``apply``): a typed ``ValueError`` naming the slot (or the field and the
position of a bad row-map item), and every table exactly as before, pending changes included
(a later valid step gives what a twin that never saw the bad call gives)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from _helpers import assert_unchanged

from logitsproc_rs import BatchUpdate, EngineConfig, SamplingParams, build_logitsprocs
from logitsproc_rs.errors import LogitsprocError, RequestError

CAP = 6
CFG = EngineConfig(max_num_seqs=CAP, vocab_size=16)
V = CFG.vocab_size


def _params(i: int) -> SamplingParams:
    return SamplingParams(
        presence_penalty=0.25 * (i + 1),
        repetition_penalty=1.5,
        min_tokens=3,
        stop_token_ids=[2],
        logit_bias={3: 1.0 + i},
        min_p=0.1,
    )


def world() -> Any:
    """Slots 1 and 4 live; a pending add into slot 2 and a pending removal of slot 4."""
    procs = build_logitsprocs(CFG, "cpu", False, stable_slots=True, token_feed=True)
    pipe = procs.pipeline
    pipe.add_request(1, _params(0), [1], [4])
    pipe.add_request(4, _params(1), [2], [])
    pipe.step_slots([1, 4, 4])
    pipe.add_request(2, _params(2), [5], [6])
    pipe.remove_request(4)
    return procs


def logits(rows: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, V, generator=g) * 3


def state(procs: Any) -> dict[str, Any]:
    pipe = procs.pipeline
    core = pipe.core
    return {
        "views": [v.clone() for v in pipe.arena.views],
        "status": core.status(),
        "py_status": list(pipe.status),
        "active": core.active(),
        "counted": [core.penalties_counted(i) for i in range(CAP)],
    }


def follow_up(procs: Any) -> torch.Tensor:
    pipe = procs.pipeline
    out = pipe.apply(logits(4), [1, 2, 2, 1], sampled_token_ids=[3, 2], slots=[1, 4])
    pipe.add_request(0, _params(3), None, [])
    out2 = pipe.apply(logits(3, 1), [0, 2, 1], sampled_token_ids=[7, 7], slots=[2, 1])
    return torch.cat([out, out2])


def check_refused(
    call: Any,
    index: int | None = None,
    field: str | None = None,
    position: int | None = None,
    typed: bool = True,
) -> BaseException:
    procs, twin = world(), world()
    before = state(procs)
    with pytest.raises(ValueError) as ei:
        call(procs.pipeline)
    e = ei.value
    assert not typed or isinstance(e, LogitsprocError), f"untyped {type(e).__name__}: {e}"
    if field is not None:
        assert e.field == field, e
    if index is not None:
        assert e.index == index, e
    if position is not None:
        assert f"position {position}" in str(e), e
    assert_unchanged(before, state(procs))
    assert torch.equal(follow_up(twin), follow_up(procs)), "hidden state changed"
    return e


BAD_SLOTS: list[Any] = [
    -1,
    CAP,
    2**64,
    2**70,
    -(2**70),
    1.0,
    float("nan"),
    "1",
    None,
    True,
    False,
    np.bool_(True),
    np.float64(1.0),
    np.int64(-1),
    np.uint64(2**64 - 1),
    [1],
    torch.tensor(1),
    torch.tensor(True),
]


@pytest.mark.parametrize("slot", BAD_SLOTS, ids=repr)
@pytest.mark.parametrize("what", ["add_request", "remove_request"])
def test_a_bad_slot_is_a_typed_value_error_naming_the_slot(slot: Any, what: str) -> None:
    def call(pipe: Any) -> None:
        if what == "add_request":
            pipe.add_request(slot, _params(0), [1], [])
        else:
            pipe.remove_request(slot)

    e = check_refused(call, field="slot")
    assert "slot" in str(e)
    if isinstance(slot, (int, np.integer)) and not isinstance(slot, (bool, np.bool_)):
        assert str(int(slot)) in str(e)
        assert e.index == (int(slot) if 0 <= int(slot) < 2**63 else None)


class Index:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __index__(self) -> int:
        raise self.exc


@pytest.mark.parametrize("what", ["add_request", "remove_request"])
def test_numpy_int_slots_are_ints(what: str) -> None:
    a, b = world(), world()
    for procs, slot in ((a, np.int64(3)), (b, 3)):
        if what == "add_request":
            procs.pipeline.add_request(slot, _params(4), [1], [])
        else:
            procs.pipeline.remove_request(slot)
    assert torch.equal(follow_up(a), follow_up(b))


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(2)])
def test_an_object_with_index_is_no_slot(exc: BaseException) -> None:
    check_refused(lambda pipe: pipe.add_request(Index(exc), _params(0), [1], []), field="slot")
    check_refused(lambda pipe: pipe.remove_request(Index(exc)), field="slot")


# --- row maps ---------------------------------------------------------------------------------

BAD_MAPS: list[tuple[str, Any, int | None]] = [
    ("bool_item", [1, True], 1),
    ("np_bool_item", [1, np.bool_(False)], 1),
    ("float_item", [1, 2.0], 1),
    ("str_item", [1, "2"], 1),
    ("none_item", [None, 1], 0),
    ("negative", [1, -1], 1),
    ("over_capacity", [1, CAP], 1),
    ("huge", [1, 2**70], 1),
    ("dict", {0: 1, 1: 2}, None),
    ("set", {1, 2}, None),
    ("array_2d", np.array([[1, 2]]), None),
    ("tensor_2d", torch.tensor([[1, 2]]), None),
    ("tensor_0d", torch.tensor(1), None),
    ("array_0d", np.array(1), None),
    ("bytes", b"\x00" * 16, None),
    ("str", "12", None),
    ("int", 1, None),
    ("uint64_past_int64", np.array([1, 2**64 - 1], dtype=np.uint64), 1),
    ("bool_tensor", torch.tensor([True, False]), None),
    ("bool_array", np.array([True, False]), None),
    ("float_tensor", torch.tensor([1.0, 2.0]), None),
]


@pytest.mark.parametrize(("kind", "bad", "position"), BAD_MAPS, ids=[k for k, *_ in BAD_MAPS])
@pytest.mark.parametrize("how", ["step_slots", "apply"])
def test_a_bad_row_map_is_refused_before_anything_changes(
    kind: str, bad: Any, position: int | None, how: str
) -> None:
    def call(pipe: Any) -> None:
        if how == "apply":
            pipe.apply(logits(2), bad, sampled_token_ids=[5], slots=[1])
        else:
            pipe.step_slots(bad, [5], [1])

    check_refused(call, index=position, field="row_to_slot", position=position)


@pytest.mark.parametrize(
    ("tokens", "slots", "field", "position"),
    [
        ([5, 6], [1], "sampled_token_ids", 1),
        ([5], None, "slots", None),
        (None, [1], "slots", None),
        ([5, V], [1, 4], "sampled_token_ids", 1),
        ([5, 6], [1, CAP], "slots", 1),
        ([5, 6], [1, True], "slots", 1),
        ({5: 1}, [1], "sampled_token_ids", None),
    ],
)
def test_a_bad_feed_on_stable_slots_is_refused(
    tokens: Any, slots: Any, field: str, position: int | None
) -> None:
    check_refused(
        lambda pipe: pipe.step_slots([1, 2], tokens, slots),
        index=position,
        field=field,
        position=position,
    )


def test_sampled_tokens_for_a_list_feed_request_are_the_containers_error() -> None:
    """Stable slots read a request with an output list from that list (the list feed): a
    sampled token for it was a ProtocolError (a RuntimeError), while the same misuse through
    the container is a ValueError. Both are a RequestError naming sampled_token_ids, and
    nothing changes."""
    procs = build_logitsprocs(CFG, "cpu", False, stable_slots=True)
    pipe = procs.pipeline
    out = [4]
    pipe.add_request(1, _params(0), [1], out)
    pipe.step_slots([1])
    before = state(procs)
    with pytest.raises(RequestError) as ei:
        pipe.step_slots([1], [3], [1])
    assert ei.value.field == "sampled_token_ids" and ei.value.index == 0, ei.value
    assert "token_feed=True" in str(ei.value)
    assert_unchanged(before, state(procs))
    listed = build_logitsprocs(CFG, "cpu", False)
    with pytest.raises(RequestError) as ei:
        listed.update_state(None, sampled_token_ids=[3])
    assert ei.value.field == "sampled_token_ids" and "token_feed=True" in str(ei.value)
    out.append(3)  # the list feed: the engine's list grows, and the step reads it
    pipe.step_slots([1])
    assert procs.pipeline.core.penalties_counted(1) == [4, 3]


# --- apply refused for bad logits -----------------------------------------------------------

BAD_LOGITS: list[tuple[str, Any]] = [
    ("too_few_rows", lambda: logits(2)),
    ("too_many_rows", lambda: logits(4)),
    ("old_row_count", lambda: logits(3)),
    ("narrow", lambda: logits(3)[:, :-1]),
    ("int", lambda: torch.zeros(3, V, dtype=torch.int64)),
    ("bool", lambda: torch.zeros(3, V, dtype=torch.bool)),
    ("one_d", lambda: logits(1)[0]),
    ("three_d", lambda: logits(3)[None]),
    ("meta", lambda: torch.empty(3, V, device="meta")),
    ("transposed", lambda: torch.randn(V, 3).t()),
    ("list", lambda: logits(3).tolist()),
    ("array", lambda: logits(3).numpy()),
    # Rows sharing memory: a write to one row would land in another (found by
    # tests/test_property_slots.py: accepted, a bias added twice).
    ("expanded", lambda: torch.zeros(1, V).expand(3, V)),
    ("overlapping", lambda: torch.zeros(3 + V).as_strided((3, V), (1, 1))),
]


@pytest.mark.parametrize(("kind", "make"), BAD_LOGITS, ids=[k for k, _ in BAD_LOGITS])
def test_apply_refused_for_bad_logits_commits_nothing(kind: str, make: Any) -> None:
    """The logits are checked against the NEW row map (3 rows; for ``old_row_count`` 2, while
    the last step had 3) before the pending changes are committed or the tokens fed."""
    row_map = [1, 2] if kind == "old_row_count" else [1, 2, 2]

    def call(pipe: Any) -> None:
        pipe.apply(make(), row_map, sampled_token_ids=[5, 6], slots=[1, 4])

    e = check_refused(call, typed=False)
    assert "apply" in str(e)


@pytest.mark.parametrize("kind", ["expanded", "overlapping"])
def test_logits_whose_rows_overlap_are_refused_by_every_apply(kind: str) -> None:
    """``apply_rows`` (stable slots) and ``apply`` (V1) refuse logits whose rows share memory,
    and leave them as they were: written in place, one row's bias or mask would land in
    another (the logit bias of slot 1 was added twice through an ``expand``ed row)."""

    def make() -> torch.Tensor:
        if kind == "expanded":
            return torch.zeros(1, V).expand(3, V)
        return torch.zeros(3 + V).as_strided((3, V), (1, 1))

    procs = world()
    pipe = procs.pipeline
    pipe.step_slots([1, 1, 2])
    before = state(procs)
    for p in procs.all:
        x = make()
        with pytest.raises(ValueError, match="overlap"):
            p.apply_rows(x)
        assert not x.any(), f"{type(p).__name__} wrote refused logits"
    assert_unchanged(before, state(procs))
    v1 = build_logitsprocs(CFG, "cpu", False)
    v1.update_state(BatchUpdate(3, [], [(i, _params(i), [1], []) for i in range(3)], []))
    for p in v1.all:
        x = make()
        with pytest.raises(ValueError, match="overlap"):
            p.apply(x)
        assert not x.any(), f"{type(p).__name__} wrote refused logits"
    # One row, or rows apart (a padded vocabulary), are fine.
    out = pipe.apply(torch.zeros(1, V + 4)[:, :V], [1])
    assert out[0, 3] == 1.0 + 0  # slot 1's bias
    padded = torch.zeros(3, V + 4)[:, :V]
    assert torch.equal(pipe.apply(padded, [1, 2, 1])[:, 3], torch.tensor([1.0, 3.0, 1.0]))


# --- draft layouts (speculative decoding: local_pos and input_ids) ---------------------------

BAD_DRAFTS: list[tuple[str, list[int], Any, Any, str]] = [
    ("draft outside the vocabulary", [1, 1], [0, 1], [0, V], "input_ids"),
    ("negative draft", [1, 1], [0, 1], [0, -1], "input_ids"),
    ("a position skipped", [1, 1], [0, 2], [0, 3], "local_pos"),
    ("a run starting past 0", [1, 1], [1, 0], [3, 3], "local_pos"),
    ("a slot's second run", [1, 1], [0, 0], [3, 3], "local_pos"),
    ("a run crossing slots", [1, 2], [0, 1], [3, 3], "local_pos"),
    ("too few positions", [1, 1], [0], [3, 3], "local_pos"),
    ("too few tokens", [1, 1], [0, 1], [3], "input_ids"),
    ("positions without tokens", [1, 1], [0, 1], None, "input_ids"),
    ("tokens without positions", [1, 1], None, [0, 1], "input_ids"),
    ("a negative position", [1, 1], [0, -1], [3, 3], "local_pos"),
    ("float positions", [1, 1], torch.tensor([0.0, 1.0]), [3, 3], "local_pos"),
    ("a bool token", [1, 1], [0, 1], [0, True], "input_ids"),
    ("beyond the row space's positions", [1, 1, 1], [0, 1, 2], [3, 3, 3], "local_pos"),
]


@pytest.mark.parametrize(("what", "row_map", "pos", "ids", "field"), BAD_DRAFTS, ids=lambda x: x)
@pytest.mark.parametrize("route", ["step_slots", "apply"])
def test_a_bad_draft_layout_is_refused_and_changes_nothing(
    what: str, row_map: list[int], pos: Any, ids: Any, field: str, route: str
) -> None:
    def call(pipe: Any) -> None:
        if route == "step_slots":
            pipe.step_slots(row_map, [5], [1], local_pos=pos, input_ids=ids)
        else:
            pipe.apply(logits(len(row_map)), row_map, None, [5], [1], local_pos=pos, input_ids=ids)

    e = check_refused(call, field=field)
    assert field in str(e), e


def test_a_good_draft_layout_after_a_bad_one_is_what_a_twin_gets() -> None:
    """Draft rows at position 1 see the draft: min_tokens (3) counts it, the penalties count
    it; position 0 rows see the committed history only, as a twin given no drafts."""
    procs, twin = world(), world()
    with pytest.raises(ValueError):
        procs.pipeline.step_slots([1, 1], local_pos=[0, 1], input_ids=[0, V])
    x = logits(3)
    got = procs.pipeline.apply(x.clone(), [1, 1, 2], local_pos=[0, 1, 0], input_ids=[9, 7, 9])
    plain = twin.pipeline.apply(x.clone(), [1, 1, 2])
    assert torch.equal(got[0], plain[0]) and torch.equal(got[2], plain[2])
    assert got[1, 7] != plain[1, 7]  # the draft 7 is penalized on the row after it

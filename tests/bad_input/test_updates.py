"""Malformed batch updates: indices beyond the capacity or of the wrong type, bad moves and
directions, batch sizes, entries of the wrong shape, lists that are not lists, bools where ints
belong. Each is a ``ValueError`` naming the field (and the index where there is one), and a
rejected update leaves every table exactly as it was (``_checks.check_rejected``), also with
logits that do not match the batch it declared."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    MoveDirectionality,
    SamplingParams,
    build_logitsprocs,
)

from ._checks import (
    ALL,
    CAP,
    LOGIT_BIAS,
    MIN_P,
    MIN_TOKENS,
    SWAP,
    UNI,
    VALID_MOVE,
    P,
    V,
    World,
    assert_same,
    bad_update,
    check_rejected,
    err_re,
    snapshot,
    valid_add,
)

# ---------------------------------------------------------------------------------------------
# Batch structure: every processor rejects these


@pytest.mark.parametrize("proc", ALL)
@pytest.mark.parametrize("index", [CAP, CAP + 1, 10**6])
def test_added_index_beyond_capacity(proc: str, index: int) -> None:
    check_rejected(proc, bad_update((index, P(), None, [])), index, "added")


@pytest.mark.parametrize("proc", ALL)
def test_removed_index_beyond_capacity(proc: str) -> None:
    update = BatchUpdate(batch_size=4, removed=[2, CAP], added=[valid_add()], moved=[])
    check_rejected(proc, update, CAP, "removed")


@pytest.mark.parametrize("proc", ALL)
@pytest.mark.parametrize("move", [(0, CAP, SWAP), (CAP, 0, SWAP), (CAP + 3, 1, UNI), (1, CAP, UNI)])
def test_move_out_of_range_slot(proc: str, move: tuple) -> None:
    update = BatchUpdate(batch_size=4, removed=[], added=[valid_add()], moved=[VALID_MOVE, move])
    bad = move[0] if move[0] >= CAP else move[1]
    check_rejected(proc, update, bad, "moved")


@pytest.mark.parametrize("proc", ALL)
@pytest.mark.parametrize("direction", [SWAP, UNI])
def test_self_move_rejected(proc: str, direction: Any) -> None:
    update = BatchUpdate(
        batch_size=4, removed=[], added=[valid_add()], moved=[VALID_MOVE, (1, 1, direction)]
    )
    check_rejected(proc, update, 1, "moved")


@pytest.mark.parametrize("proc", ALL)
@pytest.mark.parametrize("batch_size", [CAP + 1, 10**9])
def test_batch_size_over_capacity(proc: str, batch_size: int) -> None:
    check_rejected(proc, bad_update((4, P(), None, []), batch_size=batch_size), None, "batch_size")
    with pytest.raises(ValueError, match="batch_size"):
        World().procs[proc].update_state(BatchUpdate(batch_size, [], [], []))


@pytest.mark.parametrize("proc", ALL)
def test_index_added_twice(proc: str) -> None:
    update = BatchUpdate(
        batch_size=5,
        removed=[],
        added=[valid_add(), (4, P(0.1), None, []), (3, P(0.2), None, [])],
        moved=[],
    )
    check_rejected(proc, update, 3, "added")


@pytest.mark.parametrize("proc", ALL)
@pytest.mark.parametrize(
    "entry",
    [
        (4, P(), None),
        (4, P(), None, [], "extra"),
        (4,),
        "abcd",
        4,
        None,
        [],
    ],
    ids=["3-tuple", "5-tuple", "1-tuple", "str", "int", "None", "empty"],
)
def test_added_entry_not_a_4_tuple(proc: str, entry: Any) -> None:
    check_rejected(proc, bad_update(entry), None, "added")


@pytest.mark.parametrize("proc", ALL)
@pytest.mark.parametrize(
    "entry",
    [(0, 1), (0, 1, SWAP, 1), "ab", 3],
    ids=["2-tuple", "4-tuple", "str", "int"],
)
def test_moved_entry_not_a_3_tuple(proc: str, entry: Any) -> None:
    update = BatchUpdate(batch_size=4, removed=[], added=[valid_add()], moved=[VALID_MOVE, entry])
    check_rejected(proc, update, None, "moved")


class Direction(Enum):
    FORWARD = 1
    BOTH = 2


@pytest.mark.parametrize("proc", ALL)
@pytest.mark.parametrize(
    "direction",
    ["SWAP", "UNIDIRECTIONAL", 3, 0, None, 1.5, Direction.FORWARD, Direction.BOTH],
)
def test_move_direction_not_swap_or_unidirectional(proc: str, direction: Any) -> None:
    update = BatchUpdate(
        batch_size=4, removed=[], added=[valid_add()], moved=[VALID_MOVE, (1, 0, direction)]
    )
    check_rejected(proc, update, 1, "moved")


@pytest.mark.parametrize("proc", ALL)
@pytest.mark.parametrize(
    ("where", "field"),
    [("added", "added"), ("removed", "removed"), ("moved_from", "moved"), ("moved_to", "moved")],
)
@pytest.mark.parametrize("value", [-1, -(2**70), 2**70, 1.0, "1"])
def test_bad_index_values(proc: str, where: str, field: str, value: Any) -> None:
    added = [valid_add()]
    removed: list[Any] = []
    moved: list[Any] = [VALID_MOVE]
    if where == "added":
        added.append((value, P(), None, []))
    elif where == "removed":
        removed.append(value)
    elif where == "moved_from":
        moved.append((value, 1, SWAP))
    else:
        moved.append((1, value, UNI))
    check_rejected(proc, BatchUpdate(5, removed, added, moved), None, field)


@pytest.mark.parametrize("proc", ALL)
@pytest.mark.parametrize("batch_size", [-1, 2.0, "3", None])
def test_bad_batch_size_values(proc: str, batch_size: Any) -> None:
    check_rejected(proc, bad_update((4, P(), None, []), batch_size=batch_size), None, "batch_size")


@pytest.mark.parametrize("field", ["removed", "added", "moved"])
def test_update_lists_not_iterable(field: str) -> None:
    # A malformed update is a ValueError like every other, never a TypeError from the parser.
    for proc in ALL:
        for value in (None, 5):
            fields: dict[str, Any] = {
                "batch_size": 4,
                "removed": [],
                "added": [valid_add()],
                "moved": [VALID_MOVE],
            }
            fields[field] = value
            check_rejected(proc, SimpleNamespace(**fields), None, field)


def test_rejected_update_on_every_processor_of_a_vllm_like_update() -> None:
    """A vLLM-shaped update (different dataclass and enum) with one bad value: each processor
    that reads that value rejects it; the others accept the whole update. Processors are
    independent only when each has a pipeline of its own (built alone, the vLLM way); on one
    shared pipeline the step is one update, so every processor rejects it and nothing changes."""

    class VDir(Enum):
        UNIDIRECTIONAL = 1
        SWAP = 2

    @dataclass(frozen=True)
    class VUpdate:
        batch_size: int
        removed: list
        added: list
        moved: list

    update = VUpdate(
        batch_size=4,
        removed=[],
        added=[(3, P(0.4, {60: 1.0}, 2, {1}), None, [])],
        moved=[(0, 1, VDir.SWAP)],
    )
    shared = World()
    befores = {name: snapshot(p) for name, p in shared.procs.items()}
    for name in ALL:
        with pytest.raises(ValueError, match=err_re(3, "logit_bias")):
            shared.procs[name].update_state(update)
        for other, p in shared.procs.items():
            assert_same(befores[other], snapshot(p))

    world = World(alone=True)
    before = snapshot(world.procs[LOGIT_BIAS])
    with pytest.raises(ValueError, match=err_re(3, "logit_bias")):
        world.procs[LOGIT_BIAS].update_state(update)
    assert_same(before, snapshot(world.procs[LOGIT_BIAS]))
    world.procs[MIN_P].update_state(update)
    world.procs[MIN_TOKENS].update_state(update)
    assert dict(world.procs[MIN_P].pipeline.core.active())["min_p"] == 3
    assert dict(world.procs[MIN_TOKENS].pipeline.core.active())["min_tokens"] == 4


# ---------------------------------------------------------------------------------------------
# apply with logits that do not match the batch


@pytest.mark.parametrize("proc", ALL)
@pytest.mark.parametrize(
    "shape", [(2, V), (4, V), (3, V - 1), (3, V + 1), (3 * V,), (1, 3, V)], ids=str
)
def test_apply_shape_mismatch(proc: str, shape: tuple[int, ...]) -> None:
    world = World()
    p = world.procs[proc]
    before = snapshot(p)
    x = torch.randn(shape)
    x0 = x.clone()
    with pytest.raises(ValueError, match=r"shape|rows|vocab|batch"):
        p.apply(x)
    assert torch.equal(x, x0), "rejected logits must not be modified"
    assert_same(before, snapshot(p))


def test_bools_are_not_indices_counts_or_token_ids() -> None:
    procs = build_logitsprocs(EngineConfig(max_num_seqs=4, vocab_size=8), "cpu", False)
    with pytest.raises(ValueError, match="got a bool"):
        procs.update_state(BatchUpdate(2, [], [(True, SamplingParams(), None, [])], []))
    with pytest.raises(ValueError, match="got a bool"):
        procs.update_state(BatchUpdate(2, [], [], [(0, True, MoveDirectionality.SWAP)]))
    sp = SamplingParams(min_tokens=1)
    object.__setattr__(sp, "min_tokens", True)
    with pytest.raises(ValueError, match="field 'min_tokens'"):
        procs.update_state(BatchUpdate(1, [], [(0, sp, None, [])], []))
    sp = SamplingParams()
    object.__setattr__(sp, "allowed_token_ids", [True])
    with pytest.raises(ValueError, match="field 'allowed_token_ids'"):
        procs.update_state(BatchUpdate(1, [], [(0, sp, None, [])], []))

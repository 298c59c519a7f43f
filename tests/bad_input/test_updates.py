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
from _helpers import assert_unchanged

from logitsproc_rs import (
    BatchUpdate,
    BatchUpdateError,
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
            assert_unchanged(befores[other], snapshot(p))

    world = World(alone=True)
    before = snapshot(world.procs[LOGIT_BIAS])
    with pytest.raises(ValueError, match=err_re(3, "logit_bias")):
        world.procs[LOGIT_BIAS].update_state(update)
    assert_unchanged(before, snapshot(world.procs[LOGIT_BIAS]))
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
    assert_unchanged(before, snapshot(p))


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


# --- lying sequences and user code that raises (issue 18) -----------------------------------


class LyingEntry:
    """An added / moved entry that is a sequence only by its word: ``__len__`` says ``n``,
    ``__getitem__`` raises ``error`` (for item ``bad`` or from the start), or ``__len__``
    raises ``error`` itself (``in_len``)."""

    def __init__(self, items: tuple, error: BaseException, bad: int = 0, in_len: bool = False):
        self.items, self.error, self.bad, self.in_len = items, error, bad, in_len

    def __len__(self) -> int:
        if self.in_len:
            raise self.error
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        if i >= self.bad:
            raise self.error
        return self.items[i]


def _lying_cases(items: tuple) -> dict[str, LyingEntry]:
    return {
        "getitem-KeyError": LyingEntry(items, KeyError("nope")),
        "getitem-IndexError-last": LyingEntry(items, IndexError("short"), bad=len(items) - 1),
        "getitem-TypeError": LyingEntry(items, TypeError("no")),
        "len-KeyError": LyingEntry(items, KeyError("len"), in_len=True),
        "len-IndexError": LyingEntry(items, IndexError("len"), in_len=True),
    }


ADDED_CASES = list(_lying_cases((4, P(0.2), None, [])).items())
MOVED_CASES = list(_lying_cases((0, 1, SWAP)).items())


@pytest.mark.parametrize("proc", ALL)
@pytest.mark.parametrize("case", ADDED_CASES, ids=[k for k, _ in ADDED_CASES])
def test_lying_added_entry_is_a_batch_update_error_naming_its_position(proc, case) -> None:
    _, entry = case
    check_rejected(proc, bad_update(entry), None, "added", extra="entry 1")
    with pytest.raises(BatchUpdateError) as ei:
        World().procs[proc].update_state(bad_update(entry))
    assert ei.value.field == "added"


@pytest.mark.parametrize("proc", ALL)
@pytest.mark.parametrize("case", MOVED_CASES, ids=[k for k, _ in MOVED_CASES])
def test_lying_moved_entry_is_a_batch_update_error_naming_its_position(proc, case) -> None:
    _, entry = case
    update = BatchUpdate(batch_size=4, removed=[], added=[valid_add()], moved=[VALID_MOVE, entry])
    check_rejected(proc, update, None, "moved", extra="entry 1")


def test_bad_index_names_its_position_in_the_list() -> None:
    update = BatchUpdate(batch_size=3, removed=[0, -1], added=[], moved=[])
    with pytest.raises(BatchUpdateError, match=r"'removed': entry 1: index must be"):
        World().procs[MIN_P].update_state(update)


class Raises:
    """An object whose every protocol method raises ``error``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __len__(self) -> int:
        raise self.error

    def __iter__(self) -> Any:
        raise self.error

    def __index__(self) -> int:
        raise self.error

    def __getitem__(self, i: int) -> Any:
        raise self.error


class RaisingParams:
    """Params whose ``min_p`` property raises ``error``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.logit_bias = None
        self.min_tokens = 0
        self.all_stop_token_ids: set[int] = set()

    @property
    def min_p(self) -> float:
        raise self.error


class RaisingUpdate:
    """A batch update whose attribute ``bad`` raises ``error``."""

    def __init__(self, error: BaseException, bad: str) -> None:
        self.error, self.bad = error, bad
        self.values = {"batch_size": 4, "removed": [], "added": [valid_add()], "moved": []}

    def __getattr__(self, name: str) -> Any:
        if name == self.bad:
            raise self.error
        return self.values[name]


def _fatal_updates(error: BaseException) -> dict[str, Any]:
    raising = Raises(error)
    bu = lambda **kw: BatchUpdate(  # noqa: E731
        **{"batch_size": 4, "removed": [], "added": [valid_add()], "moved": [], **kw}
    )
    return {
        "entry-len": bu(added=[valid_add(), LyingEntry((4, P(), None, []), error, in_len=True)]),
        "entry-getitem": bu(added=[valid_add(), LyingEntry((4, P(), None, []), error, bad=2)]),
        "added-index": bu(added=[valid_add(), (raising, P(), None, [])]),
        "removed-index": bu(removed=[raising]),
        "moved-index": bu(moved=[(0, raising, SWAP)]),
        "removed-iter": bu(removed=raising),
        "added-iter": bu(added=raising),
        "batch_size-index": bu(batch_size=raising),
        "batch_size-attr": RaisingUpdate(error, "batch_size"),
        "moved-attr": RaisingUpdate(error, "moved"),
        "params-property": bu(added=[valid_add(), (4, RaisingParams(error), None, [])]),
        "logit-bias-value": bu(added=[valid_add(), (4, P(0.0, {1: raising}), None, [])]),
    }


FATAL_KEYS = list(_fatal_updates(KeyboardInterrupt()))


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit], ids=lambda e: e.__name__)
@pytest.mark.parametrize("where", FATAL_KEYS)
@pytest.mark.parametrize("proc", ALL)
def test_keyboard_interrupt_from_user_code_propagates_untouched(proc, where, error) -> None:
    """KeyboardInterrupt / SystemExit raised by an update's user code (a ``__len__``,
    ``__iter__``, ``__index__``, ``__getitem__`` or a params property) reaches the caller as
    itself, never a ValueError, and nothing changed."""
    world = World()
    p = world.procs[proc]
    before = snapshot(p)
    raised = error("from user code")
    with pytest.raises(error) as ei:
        p.update_state(_fatal_updates(raised)[where])
    assert ei.value is raised
    assert_unchanged(before, snapshot(p))


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit], ids=lambda e: e.__name__)
@pytest.mark.parametrize("where", ["iter", "item"])
def test_keyboard_interrupt_from_a_prompt_propagates_untouched(where, error) -> None:
    """The penalties read the prompt: its ``__iter__`` or an item's ``__index__`` raising
    KeyboardInterrupt reaches the caller as itself."""
    procs = build_logitsprocs(EngineConfig(max_num_seqs=4, vocab_size=V), "cpu", False)
    raised = error("from user code")
    prompt: Any = Raises(raised) if where == "iter" else [1, Raises(raised)]
    params = SamplingParams(repetition_penalty=1.5)
    with pytest.raises(error) as ei:
        procs.update_state(BatchUpdate(1, [], [(0, params, prompt, [])], []))
    assert ei.value is raised
    procs.update_state(BatchUpdate(1, [], [(0, params, [1], [])], []))

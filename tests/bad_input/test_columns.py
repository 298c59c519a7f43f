"""Bad input to column processors (``logitsproc_rs.columns``): declarations, values read from a
request's params, readers that raise or lie, and a transform that raises inside the ``Sampler``.

A refused value is a ``RequestError`` naming the request's index, the field ``column`` and the
column (``.column``), with the position of a bad item of a sequence; a refused declaration a
``ValueError`` naming the column. Every table of the pipeline stays exactly as it was (host
buffers, counts, what ``transform`` sees), also as seen by a later valid step against a twin
that never saw the refused one. ``KeyboardInterrupt`` / ``SystemExit`` raised by user code
propagate as themselves, with the same guarantee.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import assert_unchanged

from logitsproc_rs import (
    ArrayColumn,
    BatchUpdate,
    ColumnLogitsProcessor,
    EngineConfig,
    FloatColumn,
    IntColumn,
    MoveDirectionality,
    Sampler,
    SamplingMetadata,
    TokensColumn,
    build_logitsprocs,
)
from logitsproc_rs.columns import Column
from logitsproc_rs.errors import RequestError

from . import _checks

CFG = EngineConfig(max_num_seqs=8, vocab_size=50)
V = CFG.vocab_size
SWAP = MoveDirectionality.SWAP
WIDTH = 3
MAX_LEN = 4
INT_MAX = 2**63 - 1
INT_MIN = -(2**63)


def reader(name: str) -> Any:
    """Reads ``params.cols[name]`` (missing: unset)."""
    return lambda sp: sp.cols.get(name)


def columns() -> tuple[Column, ...]:
    return (
        FloatColumn("f", default=0.5, read=reader("f")),
        IntColumn("i", default=-7, read=reader("i")),
        ArrayColumn("a", width=WIDTH, default=1.0, read=reader("a")),
        TokensColumn("t", max_len=MAX_LEN, read=reader("t")),
    )


def make_class(cols: tuple[Column, ...] | None = None, transform: Any = None) -> type:
    """A column processor of ``cols`` whose ``transform`` records what it saw."""

    def default_transform(self: Any, logits: torch.Tensor, c: Any, n: int) -> torch.Tensor:
        self.seen = {k: v.clone() for k, v in c.items()}
        self.seen_active = n
        return logits

    return type(
        "Cols",
        (ColumnLogitsProcessor,),
        {
            "COLUMNS": columns() if cols is None else cols,
            "is_argmax_invariant": lambda self: False,
            "transform": transform or default_transform,
        },
    )


def P(**cols: Any) -> SimpleNamespace:
    """Duck-typed params: the column values, and nothing the built-ins would refuse."""
    return SimpleNamespace(cols=cols)


GOOD = [
    P(f=1.5, i=3, a=[0.1, 0.2, 0.3], t=[1, 2]),
    P(),
    P(i=INT_MAX, t=[4, 5, 6, 7]),
]


class World:
    """One column processor (alone, or in ``build_logitsprocs`` with the built-ins) with three
    live requests."""

    def __init__(self, shared: bool = False, cls: type | None = None) -> None:
        cls = cls or make_class()
        if shared:
            procs = build_logitsprocs(CFG, "cpu", False, custom_logitsprocs=[cls])
            self.proc = next(p for p in procs.all if isinstance(p, cls))
            self.procs = procs
        else:
            self.proc = cls(CFG, "cpu", False)
            self.procs = None
        self.step(BatchUpdate(3, [], [(k, sp, [1], []) for k, sp in enumerate(GOOD)], []))

    def step(self, update: Any) -> None:
        if self.procs is not None:
            self.procs.update_state(update)
        else:
            self.proc.update_state(update)

    def snapshot(self) -> dict[str, Any]:
        core = self.proc.pipeline.core
        rows = core.batch_size
        out = self.proc.apply(torch.zeros(rows, V))
        return {
            "apply": out.clone(),
            "seen": {k: v.clone() for k, v in self.proc.seen.items()},
            "active": self.proc.seen_active,
            "status": core.status(),
            "core_active": dict(core.active()),
            "batch_size": rows,
            "py_status": list(self.proc.pipeline.status),
            "buffers": [
                torch.from_dlpack(core.buffer(i)).clone() for i in range(len(core.sections()))
            ],
        }


def bad_update(sp: Any) -> BatchUpdate:
    """A valid add and a move before the bad request at index 4."""
    return BatchUpdate(
        5, [], [(3, P(f=9.0, i=9, t=[9]), [1], []), (4, sp, [1], [])], [(0, 2, SWAP)]
    )


def follow_up(world: World) -> None:
    world.step(None)
    world.step(BatchUpdate(3, [], [(1, P(f=2.0, a=[3, 2, 1], t=[3]), [1], [])], [(2, 0, SWAP)]))


def check_refused(
    sp: Any,
    column: str,
    expect: type[BaseException] = RequestError,
    match: str | None = None,
    shared: bool = False,
    cls: type | None = None,
) -> BaseException:
    """The update with ``sp`` at index 4 raises ``expect`` (a ``RequestError`` naming index 4,
    field and column, unless another class is expected) and changes nothing."""
    world, twin = World(shared, cls), World(shared, cls)
    before = world.snapshot()
    with pytest.raises(expect) as ei:
        world.step(bad_update(sp))
    e = ei.value
    if expect is RequestError:
        assert isinstance(e, ValueError)
        assert (e.index, e.field, e.column) == (4, "column", column), str(e)
        assert str(e).startswith(f"request at index 4: field 'column': '{column}': "), str(e)
    else:
        assert type(e) is expect, repr(e)
    if match is not None:
        assert re.search(match, str(e)), str(e)
    assert_unchanged(before, world.snapshot())
    follow_up(world)
    follow_up(twin)
    assert_unchanged(twin.snapshot(), world.snapshot())
    return e


def test_world_reads_back_what_was_set() -> None:
    w = World()
    s = w.snapshot()
    assert s["seen"]["f"].flatten().tolist() == [1.5, 0.5, 0.5]
    assert s["seen"]["i"].flatten().tolist() == [3, -7, INT_MAX]
    want = torch.tensor([[0.1, 0.2, 0.3], [1, 1, 1], [1, 1, 1]])
    assert torch.equal(s["seen"]["a"], want)
    assert s["seen"]["t"].tolist() == [[1, 2, -1, -1], [-1] * 4, [4, 5, 6, 7]]
    assert s["seen"]["t_len"].flatten().tolist() == [2, 0, 4]


# --------------------------------------------------------------------------------------------
# Lying sequences: read at most width + 1 items, never trusting __len__ (the endless ones,
# which would eat the machine's memory on a regression, are in test_crash_cases_columns.py)


class HugeLen:
    def __len__(self) -> int:
        return 2**62

    def __iter__(self) -> Iterator[float]:
        return iter([1, 2, 3])


class RaisingLen:
    def __len__(self) -> int:
        raise RuntimeError("len boom")

    def __iter__(self) -> Iterator[float]:
        return iter([1, 2, 3])


class RaisingIter:
    def __len__(self) -> int:
        return 3

    def __iter__(self) -> Iterator[float]:
        raise RuntimeError("iter boom")


def short_then_raise() -> Iterator[int]:
    yield 1
    raise RuntimeError("mid-iteration boom")


@pytest.mark.parametrize(
    ("col", "value", "match"),
    [
        ("a", [1.0] * 4, "than the width of 3"),
        ("a", [1.0] * 2, "expected 3 values, got 2"),
        # A __len__ that raises is a broken sequence: refused (it was read by iteration), as
        # are a dict (read by its keys) and a set (no order).
        ("a", RaisingLen(), "len boom"),
        ("t", RaisingLen(), "len boom"),
        ("a", {1.0: 0, 2.0: 0, 3.0: 0}, "not a mapping or a set"),
        ("a", {1.0, 2.0, 3.0}, "not a mapping or a set"),
        ("a", frozenset({1.0, 2.0, 3.0}), "not a mapping or a set"),
        ("t", {1: 0, 2: 0}, "not a mapping or a set"),
        ("t", {1, 2}, "not a mapping or a set"),
        ("a", RaisingIter(), "iter boom"),
        ("a", "short_then_raise", "mid-iteration boom"),
        ("t", RaisingIter(), "iter boom"),
        ("t", "short_then_raise", "mid-iteration boom"),
        ("t", [1] * 5, "than the cap of 4"),
    ],
)
def test_lying_or_endless_sequence(col: str, value: Any, match: str | None) -> None:
    if value == "short_then_raise":
        value = short_then_raise()
    if match is None:
        # Three items read by iteration: accepted (the column reads no __len__).
        w = World()
        w.step(BatchUpdate(4, [], [(3, P(**{col: value}), [1], [])], []))
        assert w.snapshot()["seen"][col][3].tolist() == [1, 2, 3]
        return
    check_refused(P(**{col: value}), col, match=match)


def test_huge_len_array_is_read_by_iteration() -> None:
    w = World()
    w.step(BatchUpdate(4, [], [(3, P(a=HugeLen()), [1], [])], []))
    assert w.snapshot()["seen"]["a"][3].tolist() == [1, 2, 3]


# --------------------------------------------------------------------------------------------
# Values: wrong types, out of range, bools, numpy scalars, tensors


@pytest.mark.parametrize(
    ("col", "value", "match"),
    [
        ("i", 2**63, "int64"),
        ("i", -(2**63) - 1, "int64"),
        ("i", 2**64, "int64"),
        ("i", 2**200, "int64"),
        ("i", np.uint64(2**63), "int64"),
        ("i", float(2**53), "an int"),
        ("i", 1.5, "an int"),
        ("i", "3", "an int"),
        ("i", True, "bool"),
        ("i", np.bool_(True), "bool"),
        ("i", torch.tensor(True), "bool"),
        ("i", torch.tensor(1.0), "an int"),
        ("i", torch.tensor([1, 2]), "an int"),
        ("i", [3], "an int"),
        ("f", True, "must be a number, got True"),
        ("f", np.bool_(False), "must be a number"),
        ("f", torch.tensor(True), "must be a number"),
        ("f", "0.5", "must be a number"),
        ("f", b"0.5", "must be a number"),
        ("f", [0.5], "must be a number"),
        ("f", 1 + 2j, "must be a number"),
        ("f", float("nan"), "finite"),
        ("f", float("inf"), "finite"),
        ("f", 1e39, "finite"),
        ("f", 2**1000, "finite|must be a number"),
        ("f", 10**400, "finite|must be a number"),
        ("a", "abc", "str"),
        ("a", b"abc", "bytes|a sequence"),
        ("a", 0.5, "a sequence"),
        ("a", [0.5, True, 0.5], r"item 1: must be a number, got True"),
        ("a", [0.5, np.bool_(True), 0.5], r"item 1: must be a number"),
        ("a", [0.5, 0.5, "x"], r"item 2\b"),
        ("a", [0.5, float("nan"), 0.5], r"item 1\b.*finite"),
        ("a", [0.5, 1e39, 0.5], r"item 1\b.*finite"),
        ("a", [0.5, None, 0.5], r"item 1\b"),
        ("a", torch.tensor([[1.0, 2.0, 3.0]]), r"item 0\b"),
        ("a", torch.tensor([True, False, True]), r"item 0: must be a number"),
        ("t", "abc", "str"),
        ("t", [1, True], r"item 1\b.*bool"),
        ("t", [1, np.bool_(True)], r"item 1\b.*bool"),
        ("t", [1, 2.0], r"item 1\b"),
        ("t", [1, V], r"item 1\b.*outside"),
        ("t", [-1], r"item 0\b.*outside"),
        ("t", [1, 2**63], r"item 1\b"),
        ("t", [1, 2**31], r"item 1\b.*outside"),
        ("t", [None], r"item 0\b"),
        ("t", 5, "a sequence"),
        ("t", torch.tensor([1.0, 2.0]), r"item 0\b"),
    ],
)
def test_bad_value(col: str, value: Any, match: str) -> None:
    check_refused(P(**{col: value}), col, match=match)


@pytest.mark.parametrize(
    ("col", "value", "expect"),
    [
        ("i", INT_MAX, INT_MAX),
        ("i", INT_MIN, INT_MIN),
        ("i", 2**53 + 1, 2**53 + 1),
        ("i", np.int64(INT_MIN), INT_MIN),
        ("i", np.uint64(5), 5),
        ("i", torch.tensor(5), 5),
        ("f", np.float32(0.25), 0.25),
        ("f", np.float64(0.25), 0.25),
        ("f", np.int32(2), 2.0),
        ("f", 3, 3.0),
        ("a", np.array([0.5, 1.5, 2.5], dtype=np.float32), [0.5, 1.5, 2.5]),
        ("a", torch.tensor([0.5, 1.5, 2.5]), [0.5, 1.5, 2.5]),
        ("a", (x / 2 for x in range(3)), [0.0, 0.5, 1.0]),
        ("a", (1, np.int64(2), np.float16(3)), [1.0, 2.0, 3.0]),
        ("t", np.array([3, 4], dtype=np.int64), [3, 4, -1, -1]),
        ("t", torch.tensor([3, 4], dtype=torch.int32), [3, 4, -1, -1]),
        ("t", range(4), [0, 1, 2, 3]),
        ("t", (), [-1] * 4),
    ],
)
def test_good_value_reads_back_exactly(col: str, value: Any, expect: Any) -> None:
    w = World()
    w.step(BatchUpdate(4, [], [(3, P(**{col: value}), [1], [])], []))
    got = w.snapshot()["seen"][col][3]
    assert got.tolist() == (expect if isinstance(expect, list) else [expect])


def test_refused_with_the_builtins_sharing_the_pipeline() -> None:
    """Every table of the shared pipeline (built-ins too) stays as it was."""
    check_refused(P(i=2**63), "i", match="int64", shared=True)
    check_refused(P(a=[1.0] * 4), "a", match="than the width of 3", shared=True)


# --------------------------------------------------------------------------------------------
# Readers and values whose code raises: Exceptions are refusals, interrupts propagate


class Raises:
    """An object whose every conversion raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __index__(self) -> int:
        raise self.exc

    def __float__(self) -> float:
        raise self.exc

    def __iter__(self) -> Any:
        raise self.exc

    def __len__(self) -> int:
        raise self.exc

    def __repr__(self) -> str:
        raise self.exc


def raising_reader(exc: BaseException) -> Any:
    def read(sp: Any) -> Any:
        if getattr(sp, "boom", False):
            raise exc
        return sp.cols.get("f")

    return read


def gen_raising(exc: BaseException) -> Iterator[int]:
    yield 1
    raise exc


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3), GeneratorExit()])
def test_interrupt_in_a_reader_propagates(exc: BaseException) -> None:
    cls = make_class((FloatColumn("f", 0.0, raising_reader(exc)),))
    sp = SimpleNamespace(cols={}, boom=True)
    check_refused(sp, "f", expect=type(exc), cls=cls)


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)])
@pytest.mark.parametrize(
    ("col", "value"),
    [
        ("i", "raises"),
        ("f", "raises"),
        ("a", "raises"),
        ("t", "raises"),
        ("a", "gen"),
        ("t", "gen"),
        ("a", "item"),
        ("t", "item"),
    ],
)
def test_interrupt_in_a_value_propagates(exc: BaseException, col: str, value: str) -> None:
    v: Any
    if value == "raises":
        v = Raises(exc)
    elif value == "gen":
        v = gen_raising(exc)
    else:
        v = [1, Raises(exc), 2]
    check_refused(P(**{col: v}), col, expect=type(exc))


def test_exception_in_a_reader_is_a_request_error() -> None:
    cls = make_class((FloatColumn("f", 0.0, raising_reader(ZeroDivisionError("zde"))),))
    e = check_refused(SimpleNamespace(cols={}, boom=True), "f", cls=cls, match="zde")
    assert isinstance(e.__cause__, ZeroDivisionError)


def test_unprintable_bad_value_is_still_a_request_error() -> None:
    class Unprintable:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    check_refused(P(f=Unprintable()), "f", match="must be a number")


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)])
def test_interrupt_in_repr_of_a_bad_value_propagates(exc: BaseException) -> None:
    class Unprintable:
        def __repr__(self) -> str:
            raise exc

    check_refused(P(f=Unprintable()), "f", expect=type(exc))


# --------------------------------------------------------------------------------------------
# Declarations


def r(sp: Any) -> None:
    return None


@pytest.mark.parametrize(
    "make",
    [
        lambda: ArrayColumn("c", -1, 0.0, r),
        lambda: ArrayColumn("c", 0, 0.0, r),
        lambda: ArrayColumn("c", 1.5, 0.0, r),
        lambda: ArrayColumn("c", 2.0, 0.0, r),
        lambda: ArrayColumn("c", True, 0.0, r),
        lambda: ArrayColumn("c", "3", 0.0, r),
        lambda: ArrayColumn("c", None, 0.0, r),
        lambda: ArrayColumn("c", 2**64, 0.0, r),
        lambda: ArrayColumn("c", 2**31, 0.0, r),
        lambda: ArrayColumn("c", 3, True, r),
        lambda: ArrayColumn("c", 3, "0", r),
        lambda: ArrayColumn("c", 3, float("nan"), r),
        lambda: ArrayColumn("c", 3, 1e39, r),
        lambda: TokensColumn("c", -1, r),
        lambda: TokensColumn("c", 0, r),
        lambda: TokensColumn("c", 1.5, r),
        lambda: TokensColumn("c", True, r),
        lambda: TokensColumn("c", np.bool_(True), r),
        lambda: TokensColumn("c", None, r),
        lambda: TokensColumn("c", 2**31, r),
        lambda: IntColumn("c", 2**63, r),
        lambda: IntColumn("c", -(2**63) - 1, r),
        lambda: IntColumn("c", 2**64, r),
        lambda: IntColumn("c", 1.5, r),
        lambda: IntColumn("c", 2.0**53, r),
        lambda: IntColumn("c", True, r),
        lambda: IntColumn("c", "3", r),
        lambda: IntColumn("c", None, r),
        lambda: FloatColumn("c", True, r),
        lambda: FloatColumn("c", "0.5", r),
        lambda: FloatColumn("c", None, r),
        lambda: FloatColumn("c", float("nan"), r),
        lambda: FloatColumn("c", float("inf"), r),
        lambda: FloatColumn("c", 1e39, r),
        lambda: FloatColumn("c", 0.0, "not callable"),
        lambda: FloatColumn("c", 0.0, None),
        lambda: Column("c", "weird", 1, 0.0, r),
        lambda: Column("c", "float", 2, 0.0, r),
    ],
)
def test_bad_declaration_names_the_column(make: Any) -> None:
    with pytest.raises(ValueError, match="column 'c'") as ei:
        make()
    assert getattr(ei.value, "column", None) == "c"


@pytest.mark.parametrize("name", [3, None, b"c", ("c",), ""])
def test_bad_column_name(name: Any) -> None:
    for make in (
        lambda: FloatColumn(name, 0.0, r),
        lambda: IntColumn(name, 0, r),
        lambda: ArrayColumn(name, 2, 0.0, r),
        lambda: TokensColumn(name, 2, r),
    ):
        with pytest.raises(ValueError, match="column name"):
            make()


@pytest.mark.parametrize(
    ("default", "expect"),
    [
        (2**53 + 1, 2**53 + 1),
        (INT_MAX, INT_MAX),
        (INT_MIN, INT_MIN),
        (np.int64(-5), -5),
        (np.uint64(2**62), 2**62),
    ],
)
def test_int_default_reads_back_exactly(default: Any, expect: int) -> None:
    cls = make_class((IntColumn("i", default, reader("i")),))
    p = cls(CFG, "cpu", False)
    p.update_state(BatchUpdate(2, [], [(0, P(), [1], []), (1, P(i=1), [1], [])], []))
    p.apply(torch.zeros(2, V))
    assert p.seen["i"].flatten().tolist() == [expect, 1]


@pytest.mark.parametrize(
    ("width", "default"), [(np.int64(2), np.float32(0.5)), (2, 1), (2, np.float64(-0.25))]
)
def test_numpy_declarations_accepted(width: Any, default: Any) -> None:
    cls = make_class((ArrayColumn("a", width, default, reader("a")),))
    p = cls(CFG, "cpu", False)
    p.update_state(BatchUpdate(1, [], [(0, P(), [1], [])], []))
    p.apply(torch.zeros(1, V))
    assert p.seen["a"].tolist() == [[float(default)] * 2]


@pytest.mark.parametrize(
    "cols",
    [
        (FloatColumn("x", 0.0, r), IntColumn("x", 0, r)),
        (TokensColumn("x", 2, r), FloatColumn("x_len", 0.0, r)),
        (FloatColumn("x_len", 0.0, r), TokensColumn("x", 2, r)),
    ],
)
def test_clashing_column_names_in_one_processor(cols: tuple[Column, ...]) -> None:
    with pytest.raises(ValueError, match="column 'x"):
        make_class(cols)(CFG, "cpu", False)


@pytest.mark.parametrize("cols", [(FloatColumn("x", 0.0, r), "x"), [FloatColumn("x", 0.0, r)]])
def test_columns_not_a_tuple_of_columns(cols: Any) -> None:
    with pytest.raises(ValueError, match="COLUMNS"):
        make_class(cols)(CFG, "cpu", False)


# --------------------------------------------------------------------------------------------
# A transform that raises inside the Sampler


def _raising_transform(exc: BaseException) -> Any:
    def transform(self: Any, logits: torch.Tensor, c: Any, n: int) -> torch.Tensor:
        raise exc

    return transform


def _sample(cls: type) -> None:
    procs = build_logitsprocs(CFG, "cpu", False, custom_logitsprocs=[cls])
    procs.update_state(BatchUpdate(2, [], [(i, P(f=1.0), [1], []) for i in range(2)], []))
    Sampler(procs)(torch.zeros(2, V), SamplingMetadata(None, all_greedy=True, all_random=False))


def test_transform_raising_is_a_runtime_error_naming_the_processor() -> None:
    cls = make_class(transform=_raising_transform(ZeroDivisionError("zde")))
    with pytest.raises(RuntimeError, match=r"Cols\.apply raised ZeroDivisionError") as ei:
        _sample(cls)
    assert isinstance(ei.value.__cause__, ZeroDivisionError)


def test_transform_raising_value_error_names_the_processor() -> None:
    cls = make_class(transform=_raising_transform(ValueError("bad shape")))
    with pytest.raises(ValueError, match=r"^Cols\.apply: bad shape") as ei:
        _sample(cls)
    assert isinstance(ei.value.__cause__, ValueError)


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)])
def test_transform_interrupt_propagates(exc: BaseException) -> None:
    cls = make_class(transform=_raising_transform(exc))
    with pytest.raises(type(exc)) as ei:
        _sample(cls)
    assert ei.value is exc


# --------------------------------------------------------------------------------------------
# Interrupts raised by user code anywhere the bindings read a step (built-in fields, the
# update's structure, output lists): they propagate as themselves and change nothing.


class _Prop:
    """Params whose ``field`` property raises ``exc`` (the others: the _checks defaults)."""

    def __init__(self, field: str, exc: BaseException) -> None:
        self._field, self._exc = field, exc
        self._base = _checks.P(0.2, {1: 1.0}, 2, {3})

    def __getattr__(self, name: str) -> Any:
        if name == self._field:
            raise self._exc
        return getattr(self._base, name)


def _gen(exc: BaseException) -> Iterator[int]:
    yield 1
    raise exc


def _interrupt_updates(exc: BaseException) -> dict[str, Any]:
    P3 = _checks.P
    bad = Raises(exc)
    out: dict[str, Any] = {
        "min_p property": _checks.bad_update((4, _Prop("min_p", exc), None, [])),
        "min_tokens property": _checks.bad_update((4, _Prop("min_tokens", exc), None, [])),
        "min_p __float__": _checks.bad_update((4, P3(min_p=bad), None, [])),
        "min_tokens __index__": _checks.bad_update((4, P3(min_tokens=bad), None, [])),
        "logit_bias key": _checks.bad_update((4, P3(logit_bias={bad: 1.0}), None, [])),
        "logit_bias value": _checks.bad_update((4, P3(logit_bias={1: bad}), None, [])),
        "stop ids iterator": _checks.bad_update(
            (4, P3(min_tokens=3, all_stop_token_ids=()), None, [])
        ),
        # An output-list item is never converted with its own code (no __index__ runs: only
        # ints and numpy ints are token ids), so it cannot interrupt: see test_token_feed's
        # test_an_object_with_index_is_no_int_and_its_code_never_runs.
        "added entry __len__": _checks.bad_update(bad),
        "removed iterator": BatchUpdate(3, _gen(exc), [], []),
        "removed __index__": BatchUpdate(3, [bad], [], []),
        "moved direction": BatchUpdate(3, [], [], [(0, 1, _Named(exc))]),
        "batch_size __index__": BatchUpdate(bad, [], [], []),
        "update attribute": _RaisingUpdate(exc),
    }
    # The stop ids are a set in _checks.P: replace them with an iterator that raises.
    out["stop ids iterator"].added[1][1].all_stop_token_ids = _gen(exc)
    return out


class _Named:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    @property
    def _name_(self) -> str:
        raise self.exc


class _RaisingUpdate:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.batch_size = 3

    def __getattr__(self, name: str) -> Any:
        raise self.exc


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("where", sorted(_interrupt_updates(KeyboardInterrupt())))
def test_interrupt_while_reading_a_step_propagates(exc_type: type, where: str) -> None:
    exc = exc_type()
    update = _interrupt_updates(exc)[where]
    world, twin = _checks.World(), _checks.World()
    proc = world.procs[_checks.LOGIT_BIAS]
    before = _checks.snapshot(proc)
    with pytest.raises(exc_type) as ei:
        proc.update_state(update)
    assert ei.value is exc
    assert_unchanged(before, _checks.snapshot(proc))
    for w in (world, twin):
        w.step_all(None)
    for name in world.procs:
        assert_unchanged(_checks.snapshot(twin.procs[name]), _checks.snapshot(world.procs[name]))

"""Column processors' crash cases, each in a subprocess under a memory limit and a watchdog
(the machinery of ``test_crash_cases``): readers returning endless or lying sequences, and
absurd column sizes. Before the bounded read, an ``ArrayColumn`` value whose ``__len__`` said
``width`` but whose iteration never ended grew a buffer until the allocator aborted the
interpreter (SIGABRT)."""

from __future__ import annotations

import pytest

from .test_crash_cases import EITHER, RAISED, run_case

# Imports for the child, after test_crash_cases' prelude.
SETUP = """
from logitsproc_rs import ArrayColumn, ColumnLogitsProcessor, FloatColumn, IntColumn, TokensColumn

class LyingLen:
    # __len__ says n; iteration never ends.
    def __init__(self, n):
        self.n = n
    def __len__(self):
        return self.n
    def __iter__(self):
        return itertools.repeat(1)
    def __getitem__(self, i):
        return 1

class LyingList(list):
    # A list subclass whose __len__ and __iter__ lie.
    def __len__(self):
        return 3
    def __iter__(self):
        return itertools.repeat(1)

def processor(*columns):
    cls = type("Cols", (ColumnLogitsProcessor,), {
        "COLUMNS": columns,
        "is_argmax_invariant": lambda self: False,
        "transform": lambda self, logits, cols, n: logits,
    })
    return cls(EngineConfig(max_num_seqs=4, vocab_size=50), "cpu", False)

def read_x(sp):
    return sp.x

def one(proc, value):
    proc.update_state(BatchUpdate(1, [], [(0, SimpleNamespace(x=value), [1], [])], []))
    return proc.apply(torch.zeros(1, 50)).shape
"""

VALUES = {
    "lying_len": "LyingLen(3)",
    "lying_huge_len": "LyingLen(2**62)",
    "lying_list": "LyingList([1, 2, 3])",
    "repeat": "itertools.repeat(1)",
    "count": "itertools.count()",
    "endless_generator": "(1 for _ in itertools.count())",
}

COLUMNS = {
    "array": "ArrayColumn('x', 3, 0.0, read_x)",
    "tokens": "TokensColumn('x', 3, read_x)",
}


@pytest.mark.parametrize("value", sorted(VALUES))
@pytest.mark.parametrize("column", sorted(COLUMNS))
def test_endless_or_lying_column_value(column: str, value: str) -> None:
    run_case(
        SETUP
        + f"""
def case():
    return one(processor({COLUMNS[column]}), {VALUES[value]})
""",
        RAISED,
        extra_gib=1,
    )


def test_endless_column_value_leaves_state_unchanged() -> None:
    """After the refused step the processor still holds what it held, and steps on."""
    line = run_case(
        SETUP
        + """
def case():
    p = processor(ArrayColumn('x', 3, 0.0, read_x), TokensColumn('t', 2, lambda sp: [1]))
    seen = {}
    type(p).transform = lambda self, logits, cols, n: seen.update(cols) or logits
    one(p, [1.0, 2.0, 3.0])
    for bad in (LyingLen(3), itertools.repeat(1.0)):
        try:
            one(p, bad)
        except ValueError as e:
            assert e.column == "x" and e.index == 0, e
        else:
            raise AssertionError("accepted")
    p.apply(torch.zeros(1, 50))
    assert seen["x"].tolist() == [[1.0, 2.0, 3.0]], seen
    one(p, [4.0, 5.0, 6.0])
    assert seen["x"].tolist() == [[4.0, 5.0, 6.0]], seen
    return "unchanged"
""",
        ("OK",),
        extra_gib=1,
    )
    assert "unchanged" in line


@pytest.mark.parametrize(
    "decl",
    [
        "ArrayColumn('x', 2**31 - 1, 1.0, read_x)",
        "ArrayColumn('x', 2**30, 0.0, read_x)",
        "TokensColumn('x', 2**31 - 1, read_x)",
    ],
)
def test_huge_column_width(decl: str) -> None:
    """A column too large for the memory limit: a MemoryError (or a ValueError), never an
    abort; if it fits, it works."""
    run_case(
        SETUP
        + f"""
def case():
    return one(processor({decl}), None)
""",
        EITHER,
        extra_gib=2,
    )

"""Stateful property test of column processors: every column kind under random churn.

A ``RuleBasedStateMachine`` drives a ``ColumnLogitsProcessor`` with one column of each kind
(``FloatColumn``, ``IntColumn``, ``ArrayColumn``, ``TokensColumn``), sharing its pipeline with
vLLM's built-ins (``build_logitsprocs``), through random updates: adds (into any slot) with
random values, removals, UNIDIRECTIONAL moves and SWAPs in one update, in the core's replay
order (added, removed, moved). A plain per-slot reference (a list of dicts) replays the same.

Some updates carry one bad value (a wrong type, a bool, out of int64 / float32 / vocabulary
range, a wrong length, a lying sequence) or a value that raises ``KeyboardInterrupt``: the
update must be refused with a ``RequestError`` naming the request's index and the column (or
the interrupt itself), and change nothing: every host buffer of the pipeline, the status and
what ``transform`` sees are as before (the reference never sees it, so the later valid steps
also prove that no hidden state changed).

After every step the tensors ``transform`` gets equal the reference's, row by row, and
``num_active`` is the reference's count. ``LOGITSPROC_PROPERTY_EXAMPLES`` /
``LOGITSPROC_PROPERTY_STEPS`` as in ``test_property``.
"""

from __future__ import annotations

import os
from collections import Counter
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from logitsproc_rs import (
    ArrayColumn,
    BatchUpdate,
    ColumnLogitsProcessor,
    EngineConfig,
    FloatColumn,
    IntColumn,
    MoveDirectionality,
    TokensColumn,
    build_logitsprocs,
)
from logitsproc_rs.errors import RequestError

EXAMPLES = int(os.environ.get("LOGITSPROC_PROPERTY_EXAMPLES", "25"))
STEPS = int(os.environ.get("LOGITSPROC_PROPERTY_STEPS", "30"))

CAP = 6
V = 20
WIDTH = 2
MAX_LEN = 3
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
DEFAULTS = {"f": 0.5, "i": -3, "a": [1.0] * WIDTH}
NAMES = ("f", "i", "a", "t")
# What the machine did, over all examples (checked by the last test).
EXERCISED: Counter[str] = Counter()


def _read(name: str) -> Any:
    return lambda sp: sp.cols.get(name)


class Cols(ColumnLogitsProcessor):
    COLUMNS = (
        FloatColumn("f", default=DEFAULTS["f"], read=_read("f")),
        IntColumn("i", default=DEFAULTS["i"], read=_read("i")),
        ArrayColumn("a", width=WIDTH, default=1.0, read=_read("a")),
        TokensColumn("t", max_len=MAX_LEN, read=_read("t")),
    )

    def is_argmax_invariant(self) -> bool:
        return False

    def transform(self, logits: torch.Tensor, cols: Any, num_active: int) -> torch.Tensor:
        self.seen = {k: v.clone() for k, v in cols.items()}
        self.seen_active = num_active
        return logits


class _Lying:
    """``__len__`` says WIDTH; iteration yields one item more."""

    def __len__(self) -> int:
        return WIDTH

    def __iter__(self) -> Any:
        return iter([0.5] * (WIDTH + 1))


class _Interrupt:
    def __index__(self) -> int:
        raise KeyboardInterrupt

    def __float__(self) -> float:
        raise KeyboardInterrupt

    def __iter__(self) -> Any:
        raise KeyboardInterrupt


f32 = st.floats(-1e6, 1e6, width=32)
GOOD = {
    "f": st.one_of(f32, st.integers(-1000, 1000), f32.map(np.float32)),
    "i": st.one_of(
        st.integers(INT_MIN, INT_MAX),
        st.sampled_from([INT_MIN, INT_MAX, 2**53 + 1]),
        st.integers(-100, 100).map(np.int64),
    ),
    "a": st.lists(f32, min_size=WIDTH, max_size=WIDTH).flatmap(
        lambda xs: st.sampled_from([xs, tuple(xs), np.array(xs, dtype=np.float32)])
    ),
    "t": st.lists(st.integers(0, V - 1), max_size=MAX_LEN),
}
BAD = {
    "f": st.sampled_from([True, np.bool_(True), "0.5", float("nan"), float("inf"), 1e39, [0.5]]),
    "i": st.sampled_from([2**63, INT_MIN - 1, 1.5, True, "3", np.bool_(False), torch.tensor(1.0)]),
    "a": st.sampled_from(
        [[0.5], [0.5] * (WIDTH + 1), [True, 0.5], "ab", 0.5, [0.5, float("nan")], _Lying()]
    ),
    "t": st.sampled_from([[V], [-1], [0] * (MAX_LEN + 1), [1.5], "ab", [True], 3, [2**63]]),
}


def _stored(name: str, value: Any) -> Any:
    """What the reference keeps for a good value (as the device holds it)."""
    if name == "f":
        return float(np.float32(float(value)))
    if name == "i":
        return int(value)
    if name == "a":
        return [float(np.float32(float(x))) for x in value]
    return [int(x) for x in value]


class ColumnMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        cfg = EngineConfig(max_num_seqs=CAP, vocab_size=V)
        self.procs = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=[Cols])
        self.proc = next(p for p in self.procs.all if isinstance(p, Cols))
        # Per slot: None (empty) or {column: stored value} (a missing column: unset).
        self.slots: list[dict[str, Any] | None] = [None] * CAP
        self.batch_size = 0

    # --- the reference ------------------------------------------------------------------

    def replay(self, update: BatchUpdate, values: dict[int, dict[str, Any]]) -> None:
        for index, *_ in update.added:
            self.slots[index] = values[index]
        for index in update.removed:
            self.slots[index] = None
        for a, b, d in update.moved:
            if d == MoveDirectionality.SWAP:
                self.slots[a], self.slots[b] = self.slots[b], self.slots[a]
            else:
                self.slots[b], self.slots[a] = self.slots[a], None
        self.batch_size = update.batch_size

    def expected(self) -> dict[str, Any]:
        rows = self.batch_size
        f = torch.full((rows, 1), DEFAULTS["f"], dtype=torch.float32)
        i = torch.full((rows, 1), DEFAULTS["i"], dtype=torch.int64)
        a = torch.full((rows, WIDTH), 1.0, dtype=torch.float32)
        t = torch.full((rows, MAX_LEN), -1, dtype=torch.int32)
        t_len = torch.zeros((rows, 1), dtype=torch.int32)
        for r in range(rows):
            s = self.slots[r] or {}
            if "f" in s:
                f[r, 0] = s["f"]
            if "i" in s:
                i[r, 0] = s["i"]
            if "a" in s:
                a[r] = torch.tensor(s["a"], dtype=torch.float32)
            if "t" in s:
                t[r, : len(s["t"])] = torch.tensor(s["t"], dtype=torch.int32)
                t_len[r, 0] = len(s["t"])
        active = max(sum(1 for s in self.slots if s and n in s) for n in NAMES)
        return {"f": f, "i": i, "a": a, "t": t, "t_len": t_len, "active": active}

    # --- ours -----------------------------------------------------------------------------

    def seen(self) -> dict[str, Any]:
        self.proc.apply(torch.zeros(self.batch_size, V))
        return {**self.proc.seen, "active": self.proc.seen_active}

    def snapshot(self) -> dict[str, Any]:
        core = self.proc.pipeline.core
        return {
            "status": core.status(),
            "active": dict(core.active()),
            "batch_size": core.batch_size,
            "buffers": [
                torch.from_dlpack(core.buffer(k)).clone() for k in range(len(core.sections()))
            ],
        }

    def check(self) -> None:
        got, want = self.seen(), self.expected()
        assert got.keys() == want.keys()
        for k in want:
            if k == "active":
                assert got[k] == want[k]
            else:
                assert got[k].dtype == want[k].dtype, k
                assert torch.equal(got[k], want[k]), (k, got[k], want[k])

    # --- the step -------------------------------------------------------------------------

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        batch_size = data.draw(st.integers(1, CAP), label="batch_size")
        adds = data.draw(st.lists(st.integers(0, CAP - 1), unique=True, max_size=3), label="adds")
        removed = data.draw(st.lists(st.integers(0, CAP - 1), max_size=2), label="removed")
        moved = data.draw(
            st.lists(
                st.tuples(
                    st.integers(0, CAP - 1),
                    st.integers(0, CAP - 1),
                    st.sampled_from(list(MoveDirectionality)),
                ).filter(lambda m: m[0] != m[1]),
                max_size=3,
            ),
            label="moved",
        )
        # One bad value (or an interrupt) in one add, sometimes.
        bad = None
        if adds and data.draw(st.integers(0, 3), label="bad?") == 0:
            bad = (
                data.draw(st.integers(0, len(adds) - 1), label="bad add"),
                data.draw(st.sampled_from(NAMES), label="bad column"),
                data.draw(st.integers(0, 5), label="interrupt?") == 0,
            )
        added, values = [], {}
        for k, index in enumerate(adds):
            cols: dict[str, Any] = {}
            stored: dict[str, Any] = {}
            for name in NAMES:
                if bad is not None and bad[0] == k and bad[1] == name:
                    cols[name] = _Interrupt() if bad[2] else data.draw(BAD[name], label=name)
                elif data.draw(st.booleans(), label=f"set {name}"):
                    v = data.draw(GOOD[name], label=name)
                    cols[name] = v
                    stored[name] = _stored(name, v)
            values[index] = stored
            added.append((index, SimpleNamespace(cols=cols), [1], []))
        update = BatchUpdate(batch_size, removed, added, moved)
        if bad is None:
            self.procs.update_state(update)
            self.replay(update, values)
        else:
            before, seen_before = self.snapshot(), self.seen()
            if bad[2]:
                with pytest.raises(KeyboardInterrupt):
                    self.procs.update_state(update)
            else:
                with pytest.raises(RequestError) as ei:
                    self.procs.update_state(update)
                e = ei.value
                assert (e.index, e.field, e.column) == (adds[bad[0]], "column", bad[1]), str(e)
            after = self.snapshot()
            assert before["status"] == after["status"]
            assert before["active"] == after["active"]
            assert before["batch_size"] == after["batch_size"]
            for x, y in zip(before["buffers"], after["buffers"], strict=True):
                assert torch.equal(x, y)
            seen_after = self.seen()
            for k in seen_before:
                if k == "active":
                    assert seen_before[k] == seen_after[k]
                else:
                    assert torch.equal(seen_before[k], seen_after[k]), k
            EXERCISED["interrupted" if bad[2] else f"refused {bad[1]}"] += 1
        EXERCISED[f"moves {len(moved)}"] += 1
        EXERCISED["steps"] += 1
        self.check()

    @rule()
    def no_change(self) -> None:
        self.procs.update_state(None)
        self.check()


TestColumnMachine = ColumnMachine.TestCase
TestColumnMachine.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    report_multiple_bugs=False,
    print_blob=True,
)


def test_the_machine_exercised_everything() -> None:
    """Runs after the machine (file order): every kind of refusal happened."""
    wanted = ["interrupted", "moves 3", *(f"refused {n}" for n in NAMES)]
    assert all(EXERCISED[k] for k in wanted), EXERCISED

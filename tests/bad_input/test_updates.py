"""Bad input never breaks the processors.

Every invalid value in a batch update is a ``ValueError`` naming the request index and the
field, and a rejected update leaves every table exactly as it was: we prove it by comparing
``apply`` output, the exposed counters and the raw host buffers before and after, and by
feeding the same valid follow-up update to the rejected processor and to a twin that never saw
the bad update. Each bad update carries a valid add (and a move) *before* the bad entry, so
"nothing changed" means the whole update was validated before any table was touched.

Params are duck-typed ``SimpleNamespace`` objects (what a vLLM ``SamplingParams`` is to us), so
values that our own ``SamplingParams`` would refuse still reach the Rust core.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from logitsproc_rs import (
    BUILTIN_LOGITS_PROCESSORS,
    BatchUpdate,
    BatchUpdateBuilder,
    EngineConfig,
    MoveDirectionality,
    SamplingParams,
    build_logitsprocs,
)

CFG = EngineConfig(max_num_seqs=8, vocab_size=50)
V = CFG.vocab_size
CAP = CFG.max_num_seqs
SWAP = MoveDirectionality.SWAP
UNI = MoveDirectionality.UNIDIRECTIONAL

MIN_P = "MinPLogitsProcessor"
LOGIT_BIAS = "LogitBiasLogitsProcessor"
MIN_TOKENS = "MinTokensLogitsProcessor"
ALL = (MIN_P, LOGIT_BIAS, MIN_TOKENS)


def P(
    min_p: Any = 0.0,
    logit_bias: Any = None,
    min_tokens: Any = 0,
    all_stop_token_ids: Any = (),
) -> SimpleNamespace:
    """A duck-typed (vLLM-like) SamplingParams: no validation on our side."""
    return SimpleNamespace(
        min_p=min_p,
        logit_bias=logit_bias,
        min_tokens=min_tokens,
        all_stop_token_ids=set(all_stop_token_ids),
    )


def build(cfg: EngineConfig = CFG, alone: bool = False) -> dict[str, Any]:
    """vLLM's own set (MinTokens, LogitBias, MinP): the sampler transforms read more fields
    than these duck-typed params carry. By default they share one pipeline (what
    ``build_logitsprocs`` does); ``alone=True`` builds each the vLLM way, with a pipeline of its
    own."""
    if alone:
        return {cls.__name__: cls(cfg, "cpu", False) for cls in BUILTIN_LOGITS_PROCESSORS}
    procs = build_logitsprocs(cfg, "cpu", False, sampler_transforms=False)
    return {type(p).__name__: p for p in procs.all}


class World:
    """One set of built-in processors with three live requests in slots 0..2."""

    def __init__(self, cfg: EngineConfig = CFG, alone: bool = False) -> None:
        self.procs = build(cfg, alone)
        self.outputs = [[], [7], []]
        seed = BatchUpdate(
            batch_size=3,
            removed=[],
            added=[
                (0, P(0.3, {1: 2.0, 7: -1.5}, 4, {2, 3}), [5, 6], self.outputs[0]),
                (1, P(0.0, {4: 3.0}, 3, {9}), None, self.outputs[1]),
                (2, P(0.5, None, 2, {2}), [1], self.outputs[2]),
            ],
            moved=[],
        )
        for p in self.procs.values():
            p.update_state(seed)

    def step_all(self, update: BatchUpdate | None) -> None:
        for p in self.procs.values():
            p.update_state(update)


def logits(rows: int = 3, vocab: int = V, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * 3


def host_buffers(proc: Any) -> list[torch.Tensor]:
    """Copies of the Rust host buffers behind a processor: every section of its pipeline (the
    processor's own tables and any other table the pipeline shares with it), read from the
    tables' own buffers (``core.buffer(i)``, zero-copy)."""
    core = proc.pipeline.core
    sections = core.sections()
    names = [name for name, *_ in sections]
    own = {f"{t}." for t in proc.TABLES}
    assert any(n.startswith(tuple(own)) for n in names), (names, proc.TABLES)
    return [torch.from_dlpack(core.buffer(i)).clone() for i in range(len(sections))]


def counters(proc: Any) -> dict[str, Any]:
    pipe = proc.pipeline
    core = pipe.core
    # Requests each table tracks (MinP: slots with min_p != 0; the others: active entries).
    exposed: dict[str, Any] = {"active": dict(core.active()), "batch_size": core.batch_size}
    if "min_p" in pipe.tables:
        exposed["values"] = [core.min_p(i) for i in range(CAP)]
    # Padded triple counts of the sparse tables (and the rest of the core's status).
    exposed["core_status"] = core.status()
    # The Python side's own copy of the status (batch size for apply's shape check, counts).
    return {**exposed, "py_status": list(pipe.status)}


def snapshot(proc: Any, rows: int = 3) -> dict[str, Any]:
    x = logits(rows)
    out = proc.apply(x.clone())
    return {"apply": out.clone(), "counters": counters(proc), "buffers": host_buffers(proc)}


def assert_same(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert torch.equal(before["apply"], after["apply"])
    assert before["counters"] == after["counters"]
    for a, b in zip(before["buffers"], after["buffers"], strict=True):
        assert torch.equal(a, b)


def err_re(index: int | None, field: str) -> str:
    if index is None:
        return rf"\b{re.escape(field)}\b"
    return rf"index {index}\b.*\b{re.escape(field)}\b"


def valid_add() -> tuple:
    """A valid request for a free slot, placed before the bad entry: it must not be applied
    when the update is rejected (nor may ``VALID_MOVE``)."""
    return (3, P(0.9, {0: 5.0, 1: 5.0}, 5, {0, 1}), [1], [])


VALID_MOVE = (0, 2, SWAP)


def bad_update(bad_entry: tuple, batch_size: int = 5) -> BatchUpdate:
    return BatchUpdate(
        batch_size=batch_size,
        removed=[],
        added=[valid_add(), bad_entry],
        moved=[VALID_MOVE],
    )


def check_rejected(
    proc_name: str,
    update: Any,
    index: int | None,
    field: str,
    cfg: EngineConfig = CFG,
    extra: str | None = None,
) -> None:
    """``update`` is rejected by ``proc_name`` with a ValueError naming index and field, and the
    processor's state is untouched (also as seen by a later valid update)."""
    world, twin = World(cfg), World(cfg)
    proc, twin_proc = world.procs[proc_name], twin.procs[proc_name]
    before = snapshot(proc)
    with pytest.raises(ValueError, match=err_re(index, field)) as ei:
        proc.update_state(update)
    if extra is not None:
        assert extra in str(ei.value)
    assert_same(before, snapshot(proc))

    # Hidden state too: the same valid follow-up gives the same result as a processor that never
    # saw the bad update (a None step, then a churn step with a remove, an add and moves).
    for w in (world, twin):
        w.outputs[0].append(11)
    follow = BatchUpdate(
        batch_size=3,
        removed=[],
        added=[(1, P(0.2, {5: 1.0}, 6, {4, 5}), None, [])],
        moved=[(2, 0, SWAP)],
    )
    for p in (proc, twin_proc):
        p.update_state(None)
        p.update_state(follow)
    assert_same(snapshot(twin_proc), snapshot(proc))


# ---------------------------------------------------------------------------------------------
# Per-request parameter values


@pytest.mark.parametrize("value", [math.nan, -0.1, -1e-30, 1.0000001, 1.5, math.inf, -math.inf])
def test_min_p_out_of_range(value: float) -> None:
    check_rejected(MIN_P, bad_update((4, P(min_p=value), None, [])), 4, "min_p")


@pytest.mark.parametrize("value", ["0.1", [0.1], object(), 1j])
def test_min_p_wrong_type(value: Any) -> None:
    check_rejected(MIN_P, bad_update((4, P(min_p=value), None, [])), 4, "min_p")


@pytest.mark.parametrize("token", [V, V + 1, 10**6, -1, -V, 2**31, -(2**40)])
def test_logit_bias_token_outside_vocab(token: int) -> None:
    check_rejected(
        LOGIT_BIAS, bad_update((4, P(logit_bias={0: 1.0, token: 1.0}), None, [])), 4, "logit_bias"
    )


@pytest.mark.parametrize("bias", [math.inf, -math.inf, math.nan, 1e39, -3.5e38])
def test_logit_bias_non_finite(bias: float) -> None:
    check_rejected(
        LOGIT_BIAS, bad_update((4, P(logit_bias={3: 1.0, 4: bias}), None, [])), 4, "logit_bias"
    )


@pytest.mark.parametrize("lb", [[(1, 1.0)], {"1": 1.0}, {1: "x"}, {1.5: 1.0}, 3.0])
def test_logit_bias_wrong_type(lb: Any) -> None:
    check_rejected(LOGIT_BIAS, bad_update((4, P(logit_bias=lb), None, [])), 4, "logit_bias")


def test_logit_bias_over_cap_default_config() -> None:
    cap = CFG.max_logit_bias_entries
    lb = {t: 0.5 for t in range(cap + 1)}
    check_rejected(
        LOGIT_BIAS, bad_update((4, P(logit_bias=lb), None, [])), 4, "logit_bias", extra="cap"
    )


def test_logit_bias_over_cap_in_vocab() -> None:
    cfg = EngineConfig(max_num_seqs=8, vocab_size=50, max_logit_bias_entries=4)
    # 4 entries is fine, 5 (all inside the vocabulary) is over the cap.
    World(cfg).procs[LOGIT_BIAS].update_state(
        BatchUpdate(5, [], [(4, P(logit_bias={t: 1.0 for t in range(4)}), None, [])], [])
    )
    lb = {t: 1.0 for t in range(10, 15)}
    check_rejected(
        LOGIT_BIAS, bad_update((4, P(logit_bias=lb), None, [])), 4, "logit_bias", cfg, extra="cap"
    )


@pytest.mark.parametrize("value", [-1, -(2**40)])
def test_negative_min_tokens(value: int) -> None:
    check_rejected(MIN_TOKENS, bad_update((4, P(min_tokens=value), None, [])), 4, "min_tokens")


@pytest.mark.parametrize("value", ["3", 2.5, [3]])
def test_min_tokens_wrong_type(value: Any) -> None:
    check_rejected(MIN_TOKENS, bad_update((4, P(min_tokens=value), None, [])), 4, "min_tokens")


@pytest.mark.parametrize("stop", [{V}, {1, V + 7}, {-1}, {2**33}])
def test_stop_ids_outside_vocab(stop: set[int]) -> None:
    check_rejected(
        MIN_TOKENS,
        bad_update((4, P(min_tokens=3, all_stop_token_ids=stop), None, [])),
        4,
        "stop_token_ids",
    )


def test_stop_ids_wrong_type() -> None:
    params = SimpleNamespace(min_p=0.0, logit_bias=None, min_tokens=3, all_stop_token_ids={"eos"})
    check_rejected(MIN_TOKENS, bad_update((4, params, None, [])), 4, "stop_token_ids")


def test_stop_ids_over_cap() -> None:
    cfg = EngineConfig(max_num_seqs=8, vocab_size=50, max_stop_token_ids=3)
    stop = {1, 2, 3, 4}
    check_rejected(
        MIN_TOKENS,
        bad_update((4, P(min_tokens=3, all_stop_token_ids=stop), None, [])),
        4,
        "stop_token_ids",
        cfg,
        extra="cap",
    )


@pytest.mark.parametrize(
    ("proc", "field"), [(MIN_P, "min_p"), (LOGIT_BIAS, "logit_bias"), (MIN_TOKENS, "min_tokens")]
)
def test_params_property_raising(proc: str, field: str) -> None:
    """A params attribute whose getter raises is a ValueError naming request and field."""

    class Params:
        def __getattr__(self, name: str) -> Any:
            if name == field:
                raise RuntimeError("boom")
            return getattr(P(), name)

    check_rejected(proc, bad_update((4, Params(), None, [])), 4, field)


@pytest.mark.parametrize("proc", ALL)
def test_params_missing_attribute_reads_as_unset(proc: str) -> None:
    """Duck-typed params need only the fields a processor reads; a missing one is "not set"."""
    world = World()
    p = world.procs[proc]
    update = BatchUpdate(4, [], [(3, SimpleNamespace(), None, [])], [])
    p.update_state(update)
    before = snapshot(p, rows=4)
    twin = World().procs[proc]
    twin.update_state(BatchUpdate(4, [], [(3, P(), None, [])], []))
    assert_same(snapshot(twin, rows=4), before)


@pytest.mark.parametrize("output", [(1, 2), None, "abc", 5])
def test_output_list_not_a_list(output: Any) -> None:
    check_rejected(MIN_TOKENS, bad_update((4, P(min_tokens=3), None, output)), 4, "output_tok_ids")


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


# ---------------------------------------------------------------------------------------------
# SamplingParams construction: a bad value is a ValueError naming the field

BAD_PARAMS: list[tuple[str, Any]] = [
    ("n", 0),
    ("n", 1.5),
    ("n", True),
    ("presence_penalty", 2.5),
    ("presence_penalty", -2.01),
    ("presence_penalty", math.nan),
    ("frequency_penalty", -3.0),
    ("frequency_penalty", "0.1"),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("repetition_penalty", math.inf),
    ("repetition_penalty", math.nan),
    ("temperature", -0.5),
    ("temperature", math.inf),
    ("temperature", math.nan),
    ("top_p", 0.0),
    ("top_p", 1.01),
    ("top_p", math.nan),
    ("top_k", -2),
    ("top_k", 1.5),
    ("min_p", -0.01),
    ("min_p", 1.01),
    ("min_p", math.nan),
    ("seed", 1.5),
    ("seed", "7"),
    ("max_tokens", 0),
    ("max_tokens", 2.0),
    ("min_tokens", -1),
    ("min_tokens", 1.0),
    ("logprobs", -1),
    ("stop_token_ids", [-1]),
    ("stop_token_ids", [1.5]),
    ("stop_token_ids", "abc"),
    ("stop_token_ids", 5),
    ("eos_token_id", -1),
    ("eos_token_id", "2"),
    ("logit_bias", [(1, 1.0)]),
    ("logit_bias", {-1: 1.0}),
    ("logit_bias", {"x": 1.0}),
    ("logit_bias", {1: math.inf}),
    ("logit_bias", {1: math.nan}),
    ("logit_bias", {1: "big"}),
    ("allowed_token_ids", []),
    ("allowed_token_ids", [-3]),
    ("bad_words_token_ids", [[]]),
    ("bad_words_token_ids", [[1, -2]]),
    ("thinking_token_budget", -2),
    ("thinking_token_budget", 1.5),
    ("thinking_token_budget", True),
]


@pytest.mark.parametrize(("field", "value"), BAD_PARAMS, ids=lambda v: repr(v)[:20])
def test_sampling_params_rejects(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        SamplingParams(**{field: value})


def test_sampling_params_min_tokens_above_max_tokens() -> None:
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=10, max_tokens=5)
    SamplingParams(min_tokens=5, max_tokens=5)
    SamplingParams(min_tokens=50, max_tokens=None)


# ---------------------------------------------------------------------------------------------
# BatchUpdateBuilder misuse


@pytest.mark.parametrize("read", ["removed", "peek_removed", "pop_removed"])
def test_removed_append_after_read_is_runtime_error(read: str) -> None:
    b = BatchUpdateBuilder()
    b.removed_append(3)
    b.removed_append(1)
    attr = getattr(b, read)
    if callable(attr):
        attr()
    with pytest.raises(RuntimeError, match=re.escape("after self.removed has been read")):
        b.removed_append(2)
    # Registration reopens with the next step.
    b.get_and_reset(4)
    b.removed_append(2)
    assert b.removed == [2]


# ---------------------------------------------------------------------------------------------
# Absurd capacities: an exception, never a process abort

_LOAD_CORE = """
import glob, importlib.util, os, sys
path = glob.glob(os.path.join(sys.argv[1], "logitsproc_rs", "_core*.so"))[0]
spec = importlib.util.spec_from_file_location("logitsproc_rs._core", path)
_core = importlib.util.module_from_spec(spec)
spec.loader.exec_module(_core)
"""


@pytest.mark.parametrize(
    "expr",
    [
        "_core.Pipeline(2**62, 50, tables=['min_p'])",
        "_core.Pipeline(2**40, 50, tables=['logit_bias'], "
        "caps=[('max_logit_bias_entries', 2**30)])",
        "_core.Pipeline(2**33, 50, tables=['min_tokens'], caps=[('max_stop_token_ids', 2**31)])",
        "_core.Pipeline(2**62, 50, tables=['logit_bias'], caps=[('max_logit_bias_entries', 4)])",
        "build_logitsprocs(EngineConfig(max_num_seqs=2**40, vocab_size=50), 'cpu', False)",
    ],
)
def test_huge_capacity_raises_instead_of_aborting(expr: str) -> None:
    """A capacity whose tables cannot be allocated (or whose size overflows) must raise an
    ordinary ``Exception`` (ValueError / MemoryError / OverflowError), not abort the process
    (allocation failure) or raise pyo3's ``PanicException`` (a ``BaseException``)."""
    src = Path(__file__).resolve().parents[2] / "python"
    if expr.startswith("build_logitsprocs"):
        setup = "from logitsproc_rs import EngineConfig, build_logitsprocs\n"
    else:
        setup = _LOAD_CORE
    script = setup + textwrap.dedent(
        f"""
        try:
            {expr}
        except (ValueError, MemoryError, OverflowError) as e:
            print("raised", type(e).__name__)
        except BaseException as e:
            print("bad exception", type(e).__module__, type(e).__name__)
        else:
            print("no error")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(src), "RUST_BACKTRACE": "0"}
    r = subprocess.run(
        [sys.executable, "-c", script, str(src)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, f"process died (rc {r.returncode}): {r.stderr[-500:]}"
    assert r.stdout.startswith("raised"), r.stdout


@pytest.mark.parametrize("cap_field", ["max_logit_bias_entries", "max_stop_token_ids"])
def test_cap_overflow_never_panics(cap_field: str) -> None:
    """``max_num_seqs * cap`` overflowing usize must be refused up front (ValueError /
    MemoryError / OverflowError), not wrap to a tiny buffer that panics on the first update."""
    try:
        cfg = EngineConfig(max_num_seqs=16, vocab_size=50, **{cap_field: 2**60})
        procs = build(cfg)
    except (ValueError, MemoryError, OverflowError):
        return
    update = BatchUpdate(
        batch_size=1,
        removed=[],
        added=[(0, P(logit_bias={1: 1.0}, min_tokens=2, all_stop_token_ids={3}), None, [])],
        moved=[],
    )
    for name, p in procs.items():
        try:
            p.update_state(update)
            p.apply(torch.zeros(1, 50))
        except Exception:
            raise
        except BaseException as e:  # pyo3's PanicException
            pytest.fail(f"{name}: {type(e).__name__}: {e}")

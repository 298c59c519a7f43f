"""The rejection check shared by the bad-input tests of batch updates and params: three live
requests in the vLLM built-ins (MinTokens, LogitBias, MinP), a bad update carrying a valid add and
a move before the bad entry, and ``check_rejected``: a ``ValueError`` naming index and field, and
every table (``apply`` output, counters, raw host buffers, and a later valid step against a twin)
exactly as before.

Params are duck-typed ``SimpleNamespace`` objects (what a vLLM ``SamplingParams`` is to us), so
values that our own ``SamplingParams`` would refuse still reach the Rust core."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _helpers import assert_unchanged

from logitsproc_rs import (
    BUILTIN_LOGITS_PROCESSORS,
    BatchUpdate,
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
    assert_unchanged(before, snapshot(proc))

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
    assert_unchanged(snapshot(twin_proc), snapshot(proc))


# The small config and one-request update the logits and call checks use.
SMALL_V = 16
SMALL_CFG = EngineConfig(max_num_seqs=4, vocab_size=SMALL_V)
# vLLM's three built-ins (the processor classes vLLM itself builds).
TRIO = list(BUILTIN_LOGITS_PROCESSORS)


def bias_update(n: int = 1) -> BatchUpdate:
    """``n`` requests, each with a logit bias."""
    return BatchUpdate(
        n, [], [(i, SamplingParams(logit_bias={3: 5.0}), [1], []) for i in range(n)], []
    )

"""``BatchUpdate`` (``interface.py``), ``BatchUpdateBuilder`` and the ``LogitsProcessors``
container (``state.py``) by vLLM 0.25.1's rules, and vLLM's own update and params objects
duck-typed."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import pytest
import torch
from _helpers import _vparams, active, upd

from logitsproc_rs import (
    BatchUpdate,
    BatchUpdateBuilder,
    EngineConfig,
    LogitsProcessor,
    LogitsProcessors,
    MoveDirectionality,
    SamplingParams,
    build_logitsprocs,
)

V = 16
CFG = EngineConfig(max_num_seqs=8, vocab_size=V)
CPU = torch.device("cpu")
SWAP = MoveDirectionality.SWAP
UNI = MoveDirectionality.UNIDIRECTIONAL
NEG_INF = float("-inf")


def builtins(cfg: EngineConfig = CFG) -> dict[str, Any]:
    procs = build_logitsprocs(cfg, CPU, False, sampler_transforms=False)
    return {type(p).__name__: p for p in procs.all}


# ---------------------------------------------------------------------------------------------
# BatchUpdate and BatchUpdateBuilder


def test_batch_update_is_frozen_dataclass_in_vllm_field_order() -> None:
    assert dataclasses.is_dataclass(BatchUpdate)
    assert [f.name for f in dataclasses.fields(BatchUpdate)] == [
        "batch_size",
        "removed",
        "added",
        "moved",
    ]
    bu = BatchUpdate(batch_size=3, removed=[2], added=[], moved=[(0, 1, SWAP)])
    assert bu == BatchUpdate(3, [2], [], [(0, 1, SWAP)])
    with pytest.raises(dataclasses.FrozenInstanceError):
        bu.batch_size = 4  # type: ignore[misc]


def test_builder_lowest_freed_slot_first_and_removed_descending() -> None:
    b = BatchUpdateBuilder()
    for i in (5, 1, 7, 3):
        b.removed_append(i)
    assert b.has_removed()
    assert b.removed == [7, 5, 3, 1]
    assert b.removed is b.removed  # the internal list itself, as vLLM
    assert b.peek_removed() == 1
    assert b.pop_removed() == 1
    assert b.pop_removed() == 3
    assert b.peek_removed() == 5
    assert b.removed == [7, 5]


def test_builder_runtime_error_after_read() -> None:
    for read in (lambda b: b.removed, lambda b: b.peek_removed(), lambda b: b.pop_removed()):
        b = BatchUpdateBuilder()
        b.removed_append(2)
        read(b)
        with pytest.raises(RuntimeError):
            b.removed_append(4)


def test_builder_pop_peek_empty() -> None:
    b = BatchUpdateBuilder()
    assert b.peek_removed() is None
    assert b.pop_removed() is None
    assert not b.has_removed()
    # Reading an empty list still closes registration (vLLM sorts on peek/pop only if non-empty).
    b.removed_append(0)
    assert b.pop_removed() == 0
    assert b.pop_removed() is None


def test_builder_get_and_reset() -> None:
    b = BatchUpdateBuilder()
    assert b.get_and_reset(0) is None
    b.batch_changed = True
    assert b.get_and_reset(0) is None  # batch_changed alone is not a change
    assert b.batch_changed is False

    out: list[int] = []
    params = SamplingParams()
    b.removed_append(4)
    b.removed_append(2)
    slot = b.pop_removed()
    assert slot == 2
    b.added.append((slot, params, [1], out))
    b.moved.append((5, 4, UNI))
    removed_list, added_list, moved_list = b.removed, b.added, b.moved
    u = b.get_and_reset(batch_size=5)
    assert isinstance(u, BatchUpdate)
    assert u.batch_size == 5
    assert u.removed == [4] and u.removed is removed_list
    assert u.added is added_list and u.added[0][3] is out
    assert u.moved is moved_list and u.moved == [(5, 4, UNI)]
    # Fresh lists afterwards: the handed-out update is never mutated.
    b.removed_append(1)  # registration is open again
    assert b.removed == [1] and b.added == [] and b.moved == []
    assert b.removed is not removed_list
    assert b.get_and_reset(4) is not None
    assert u.removed == [4]
    assert b.get_and_reset(4) is None


def test_builder_reset_returns_batch_changed() -> None:
    b = BatchUpdateBuilder()
    b.removed_append(3)
    assert b.removed == [3]
    assert b.reset() is True
    assert b.reset() is False
    b.removed_append(1)  # reset reopens registration


class _Proc(LogitsProcessor):
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.invariant = bool(vllm_config)

    def is_argmax_invariant(self) -> bool:
        return self.invariant

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


def test_container_partition_and_all_order() -> None:
    a, b, c, d = (
        _Proc(True, CPU, False),
        _Proc(False, CPU, False),
        _Proc(True, CPU, False),
        _Proc(False, CPU, False),
    )
    lps = LogitsProcessors([a, b, c, d])
    assert lps.argmax_invariant == [a, c]
    assert lps.non_argmax_invariant == [b, d]
    assert list(lps.all) == [a, c, b, d]
    assert list(lps.all) == [a, c, b, d]  # a fresh iterator each time
    empty = LogitsProcessors()
    assert list(empty.all) == [] and LogitsProcessors(None).argmax_invariant == []
    # Any iterable (a generator) works, consumed once.
    assert list(LogitsProcessors(p for p in [b, a]).all) == [a, b]


class VllmDirection(enum.Enum):
    # A different enum class; values deliberately opposite to ours, so only the name counts.
    SWAP = 1
    UNIDIRECTIONAL = 2


@dataclasses.dataclass(frozen=True)
class VllmBatchUpdate:
    batch_size: int
    removed: list
    added: list
    moved: list


def test_duck_typed_update_enum_and_params_match_ours() -> None:
    ours, theirs = builtins(), builtins()
    outs_a = [[], [], []]
    outs_b = [[], [], []]
    specs = [
        dict(min_p=0.5, logit_bias={1: 1.0}, min_tokens=3, stop=[2]),
        dict(min_p=0.0, logit_bias={3: -2.0}, min_tokens=0),
        dict(min_p=0.9, logit_bias=None, min_tokens=2, stop=[4, 5]),
    ]
    a1 = upd(3, added=[(i, _vparams(**s), None, outs_a[i]) for i, s in enumerate(specs)])
    b1 = VllmBatchUpdate(
        3, [], [(i, _vparams(**s), None, outs_b[i]) for i, s in enumerate(specs)], []
    )
    # Slot 1 finishes; condense moves 2 -> 1; then a reorder swap.
    a2 = upd(2, moved=[(2, 1, UNI), (0, 1, SWAP)])
    b2 = VllmBatchUpdate(
        2, [], [], [(2, 1, VllmDirection.UNIDIRECTIONAL), (0, 1, VllmDirection.SWAP)]
    )
    g = torch.Generator().manual_seed(1)
    for ua, ub in ((a1, b1), (a2, b2)):
        x = torch.randn(ua.batch_size, V, generator=g)
        for name in ours:
            ours[name].update_state(ua)
            theirs[name].update_state(ub)
            assert torch.equal(ours[name].apply(x.clone()), theirs[name].apply(x.clone())), name
    # After the swap: row 0 holds request 2, row 1 holds request 0.
    x = torch.zeros(2, V)
    y = theirs["LogitBiasLogitsProcessor"].apply(x.clone())
    assert y[1, 1].item() == 1.0 and y[0].abs().sum().item() == 0.0
    y = theirs["MinTokensLogitsProcessor"].apply(x.clone())
    assert y[0, 4].item() == NEG_INF and y[0, 5].item() == NEG_INF and y[1, 2].item() == NEG_INF


def test_vllm_auto_enum_values() -> None:
    class AutoDir(enum.Enum):
        UNIDIRECTIONAL = enum.auto()
        SWAP = enum.auto()

    procs = builtins()
    p = procs["LogitBiasLogitsProcessor"]
    p.update_state(upd(2, added=[(0, _vparams(logit_bias={7: 3.0}), None, [])]))
    p.update_state(VllmBatchUpdate(2, [], [], [(0, 1, AutoDir.SWAP)]))
    y = p.apply(torch.zeros(2, V))
    assert y[1, 7].item() == 3.0 and y[0, 7].item() == 0.0
    p.update_state(VllmBatchUpdate(1, [], [], [(1, 0, AutoDir.UNIDIRECTIONAL)]))
    y = p.apply(torch.zeros(1, V))
    assert y[0, 7].item() == 3.0


def test_our_sampling_params_and_tuple_lists_accepted() -> None:
    procs = builtins()
    sp = SamplingParams(min_p=0.2, logit_bias={3: 1.5}, min_tokens=2, stop_token_ids=[6])
    bu = BatchUpdate(batch_size=1, removed=(), added=((0, sp, (1, 2), []),), moved=())
    for p in procs.values():
        p.update_state(bu)
    assert active(procs["MinPLogitsProcessor"]) == 1
    assert active(procs["LogitBiasLogitsProcessor"]) == 1
    assert active(procs["MinTokensLogitsProcessor"]) == 1

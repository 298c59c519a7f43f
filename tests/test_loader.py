"""The public API and vLLM 0.25.1's semantics on tiny, hand-checkable tensors.

Covers: public names, ``BatchUpdate`` / ``BatchUpdateBuilder`` / ``LogitsProcessors`` rules,
loading custom processors (classes, ``module:Class`` names, entry points) with vLLM's errors,
speculative decoding and pooling, ``EngineConfig`` / ``SamplingParams`` behaviour, duck typing
of vLLM's own objects, each built-in's semantics, and the ``Sampler``'s order of transforms.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import sys
import textwrap
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import logitsproc_rs
from logitsproc_rs import (
    BUILTIN_LOGITS_PROCESSORS,
    STR_POOLING_REJECTS_LOGITSPROCS,
    STR_SPEC_DEC_REJECTS_LOGITSPROCS,
    AllowedTokenIdsLogitsProcessor,
    BadWordsLogitsProcessor,
    BatchUpdate,
    BatchUpdateBuilder,
    EngineConfig,
    LogitBiasLogitsProcessor,
    LogitsProcessor,
    LogitsProcessors,
    MinPLogitsProcessor,
    MinTokensLogitsProcessor,
    MoveDirectionality,
    PenaltiesLogitsProcessor,
    Sampler,
    SamplingMetadata,
    SamplingParams,
    SamplingType,
    build_logitsprocs,
    validate_logits_processors_parameters,
)
from logitsproc_rs import loader as loader_mod

V = 16
CFG = EngineConfig(max_num_seqs=8, vocab_size=V)
CPU = torch.device("cpu")
SWAP = MoveDirectionality.SWAP
UNI = MoveDirectionality.UNIDIRECTIONAL
NEG_INF = float("-inf")


def upd(batch_size: int, removed=(), added=(), moved=()) -> BatchUpdate:
    return BatchUpdate(
        batch_size=batch_size, removed=list(removed), added=list(added), moved=list(moved)
    )


def builtins(cfg: EngineConfig = CFG) -> dict[str, Any]:
    procs = build_logitsprocs(cfg, CPU, False, sampler_transforms=False)
    return {type(p).__name__: p for p in procs.all}


TABLE = {
    "MinPLogitsProcessor": "min_p",
    "LogitBiasLogitsProcessor": "logit_bias",
    "MinTokensLogitsProcessor": "min_tokens",
}


def active(proc: Any) -> int:
    """Requests the processor's table tracks in the Rust core (MinP: slots with min_p != 0)."""
    return dict(proc.pipeline.core.active())[TABLE[type(proc).__name__]]


# ---------------------------------------------------------------------------------------------
# Public names


PUBLIC = [
    "BUILTIN_LOGITS_PROCESSORS",
    "STR_POOLING_REJECTS_LOGITSPROCS",
    "STR_SPEC_DEC_REJECTS_LOGITSPROCS",
    "AddedRequest",
    "BatchUpdate",
    "BatchUpdateBuilder",
    "EngineConfig",
    "LogitBiasLogitsProcessor",
    "LogitsProcessor",
    "LogitsProcessors",
    "MinPLogitsProcessor",
    "MinTokensLogitsProcessor",
    "MoveDirectionality",
    "MovedRequest",
    "RemovedRequest",
    "Sampler",
    "SamplerOutput",
    "SamplingMetadata",
    "SamplingParams",
    "SamplingType",
    "build_logitsprocs",
    "validate_logits_processors_parameters",
]


@pytest.mark.parametrize("name", PUBLIC)
def test_public_name_importable(name: str) -> None:
    assert name in logitsproc_rs.__all__
    assert getattr(logitsproc_rs, name) is not None


def test_all_names_exist_and_version() -> None:
    for name in logitsproc_rs.__all__:
        assert hasattr(logitsproc_rs, name), name
    assert logitsproc_rs.__version__ == logitsproc_rs._core.__version__


def test_vllm_constants() -> None:
    assert STR_POOLING_REJECTS_LOGITSPROCS == (
        "Pooling models do not support custom logits processors."
    )
    assert STR_SPEC_DEC_REJECTS_LOGITSPROCS == (
        "Custom logits processors are not supported when speculative decoding is enabled."
    )
    assert [
        MinTokensLogitsProcessor,
        LogitBiasLogitsProcessor,
        MinPLogitsProcessor,
    ] == BUILTIN_LOGITS_PROCESSORS
    assert MoveDirectionality.UNIDIRECTIONAL.value == 1
    assert MoveDirectionality.SWAP.value == 2
    assert [m.name for m in MoveDirectionality] == ["UNIDIRECTIONAL", "SWAP"]


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


# ---------------------------------------------------------------------------------------------
# LogitsProcessors container and build_logitsprocs


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


def test_build_builtin_order() -> None:
    # sampler_transforms=False is exactly vLLM's build_logitsprocs.
    lps = build_logitsprocs(CFG, "cpu", False, sampler_transforms=False)
    assert [type(p) for p in lps.argmax_invariant] == [MinPLogitsProcessor]
    assert [type(p) for p in lps.non_argmax_invariant] == [
        MinTokensLogitsProcessor,
        LogitBiasLogitsProcessor,
    ]
    assert [type(p) for p in lps.all] == [
        MinPLogitsProcessor,
        MinTokensLogitsProcessor,
        LogitBiasLogitsProcessor,
    ]
    assert all(p.is_argmax_invariant() is isinstance(p, MinPLogitsProcessor) for p in lps.all)


def test_build_default_adds_sampler_transforms_in_vllm_order() -> None:
    lps = build_logitsprocs(CFG, "cpu", False)
    assert [type(p) for p in lps.argmax_invariant] == [MinPLogitsProcessor]
    # vLLM's sampler order: allowed ids, bad words, MinTokens, LogitBias, (custom), penalties.
    assert [type(p) for p in lps.non_argmax_invariant] == [
        AllowedTokenIdsLogitsProcessor,
        BadWordsLogitsProcessor,
        MinTokensLogitsProcessor,
        LogitBiasLogitsProcessor,
        PenaltiesLogitsProcessor,
    ]


def test_engine_config_vllm_shape() -> None:
    cfg = EngineConfig(max_num_seqs=12, vocab_size=99)
    assert cfg.scheduler_config.max_num_seqs == 12
    assert cfg.model_config.get_vocab_size() == 99
    assert cfg.speculative_config is None
    assert EngineConfig(num_speculative_tokens=2).speculative_config.num_speculative_tokens == 2
    for bad in ({"max_num_seqs": 0}, {"vocab_size": -1}, {"num_speculative_tokens": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            EngineConfig(**bad)


def test_speculative_decoding_builds_only_min_tokens() -> None:
    cfg = EngineConfig(max_num_seqs=4, vocab_size=V, num_speculative_tokens=2)
    lps = build_logitsprocs(cfg, "cpu", False, sampler_transforms=False)
    assert [type(p) for p in lps.all] == [MinTokensLogitsProcessor]
    # With the sampler transforms: still no LogitBias or MinP.
    kinds = [type(p) for p in build_logitsprocs(cfg, "cpu", False).all]
    assert MinTokensLogitsProcessor in kinds
    assert LogitBiasLogitsProcessor not in kinds and MinPLogitsProcessor not in kinds
    with pytest.raises(ValueError) as ei:
        build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=[_Proc])
    assert str(ei.value) == STR_SPEC_DEC_REJECTS_LOGITSPROCS
    with pytest.raises(ValueError, match="speculative decoding"):
        build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=["x:Y"])


def test_pooling_rejects_custom_and_builds_nothing() -> None:
    lps = build_logitsprocs(CFG, "cpu", False, is_pooling_model=True)
    assert list(lps.all) == []
    with pytest.raises(ValueError) as ei:
        build_logitsprocs(CFG, "cpu", False, is_pooling_model=True, custom_logitsprocs=[_Proc])
    assert str(ei.value) == STR_POOLING_REJECTS_LOGITSPROCS


# ---------------------------------------------------------------------------------------------
# Custom processors: classes, "module:Class" names, entry points

PLUGIN_SOURCE = '''
import torch
from logitsproc_rs import LogitsProcessor

CALLS = []


class BoostFirstToken(LogitsProcessor):
    """Written against vLLM's interface: positional ctor, dict state keyed by batch index."""

    def __init__(self, vllm_config, device, is_pin_memory, /):
        CALLS.append(("init", vllm_config, device, is_pin_memory))
        self.boost = {}

    @classmethod
    def validate_params(cls, sampling_params):
        if getattr(sampling_params, "boost", 0) < 0:
            raise ValueError("boost is not >= 0")

    def is_argmax_invariant(self):
        return False

    def update_state(self, batch_update):
        if not batch_update:
            return
        for index, params, _, _ in batch_update.added:
            b = getattr(params, "boost", 0)
            if b:
                self.boost[index] = b
            else:
                self.boost.pop(index, None)
        for index in batch_update.removed:
            self.boost.pop(index, None)
        for a, b, direct in batch_update.moved:
            va, vb = self.boost.pop(a, None), self.boost.pop(b, None)
            if va is not None:
                self.boost[b] = va
            if vb is not None and direct.name == "SWAP":
                self.boost[a] = vb

    def apply(self, logits):
        for index, b in self.boost.items():
            logits[index, 0] += b
        return logits


class Outer:
    class Invariant(BoostFirstToken):
        def is_argmax_invariant(self):
            return True


NOT_A_TYPE = 3


class NotAProcessor:
    pass
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    name = f"lp_plugin_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(PLUGIN_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_custom_class_and_fqcn_load(plugin: str) -> None:
    import importlib

    mod = importlib.import_module(plugin)
    lps = build_logitsprocs(
        CFG,
        "cpu",
        False,
        custom_logitsprocs=[
            mod.BoostFirstToken,
            f"{plugin}:Outer.Invariant",
            f"{plugin}:BoostFirstToken",
        ],
        sampler_transforms=False,
    )
    kinds = [type(p) for p in lps.all]
    assert kinds == [
        MinPLogitsProcessor,
        mod.Outer.Invariant,
        MinTokensLogitsProcessor,
        LogitBiasLogitsProcessor,
        mod.BoostFirstToken,
        mod.BoostFirstToken,
    ]
    # Constructed positionally with (vllm_config, device, is_pin_memory).
    assert len(mod.CALLS) == 3
    assert all(c == ("init", CFG, CPU, False) for c in mod.CALLS)

    # It runs in our container next to the built-ins, on our BatchUpdate.
    out: list[int] = []
    params = SimpleNamespace(
        min_p=0.0, logit_bias={1: 1.0}, min_tokens=0, all_stop_token_ids=set(), boost=2.5
    )
    bu = upd(2, added=[(1, params, None, out)])
    for p in lps.all:
        p.update_state(bu)
    x = torch.zeros(2, V)
    sampler = Sampler(lps)
    y = sampler.apply_logits_processors(x.clone())
    assert y[1, 0].item() == 5.0 and y[1, 1].item() == 1.0
    assert y[0].abs().sum().item() == 0.0

    # validate_params of custom classes only (built-ins are not included).
    validate_logits_processors_parameters([f"{plugin}:BoostFirstToken"], params)
    with pytest.raises(ValueError, match="is not >= 0"):
        validate_logits_processors_parameters([mod.BoostFirstToken], SimpleNamespace(boost=-1))


def test_fqcn_errors_as_vllm(plugin: str) -> None:
    def build(*lps: Any) -> Any:
        return build_logitsprocs(CFG, "cpu", False, custom_logitsprocs=list(lps))

    # Not exactly one ':' (0.25.1: Python's unpack ValueError; a clearer ValueError here).
    for bad in (plugin, f"{plugin}:A:B", ""):
        with pytest.raises(ValueError):
            build(bad)
    # Import failure: RuntimeError naming the position and the name, chained.
    with pytest.raises(RuntimeError, match=r"Failed to load 1th LogitsProcessor plugin") as ei:
        build(f"{plugin}:BoostFirstToken", "no_such_module_xyz:Foo")
    assert "no_such_module_xyz:Foo" in str(ei.value)
    assert ei.value.__cause__ is not None
    # Missing attribute: the AttributeError from the getattr walk.
    with pytest.raises(AttributeError):
        build(f"{plugin}:Missing")
    with pytest.raises(AttributeError):
        build(f"{plugin}:Outer.Missing")
    with pytest.raises(ValueError, match=r"^Loaded logit processor must be a type\.$"):
        build(f"{plugin}:NOT_A_TYPE")
    with pytest.raises(ValueError, match=r"^NotAProcessor must be a subclass of LogitsProcessor$"):
        build(f"{plugin}:NotAProcessor")

    class Plain:
        pass

    with pytest.raises(ValueError, match=r"^Plain is not a subclass of LogitsProcessor$"):
        build(Plain)


class _FakeEntryPoint:
    def __init__(self, name: str, target: Any) -> None:
        self.name = name
        self.target = target

    def load(self) -> Any:
        if isinstance(self.target, Exception):
            raise self.target
        return self.target

    def __repr__(self) -> str:
        return f"EntryPoint(name={self.name!r})"


def test_entry_point_plugins_load_first(monkeypatch) -> None:
    class Plug(_Proc):
        def is_argmax_invariant(self) -> bool:
            return False

    class Named(Plug):
        pass

    seen_groups = []

    def fake_entry_points(group: str):
        seen_groups.append(group)
        return [_FakeEntryPoint("plug", Plug)] if group == "vllm.logits_processors" else []

    monkeypatch.setattr(loader_mod, "entry_points", fake_entry_points)
    cfg = EngineConfig(max_num_seqs=4, vocab_size=V)
    lps = build_logitsprocs(
        SimpleNamespace(**vars(cfg), **_cfg_props(cfg)),
        "cpu",
        False,
        custom_logitsprocs=[Named],
        sampler_transforms=False,
    )
    assert "vllm.logits_processors" in seen_groups
    kinds = [type(p) for p in lps.non_argmax_invariant]
    assert kinds == [MinTokensLogitsProcessor, LogitBiasLogitsProcessor, Plug, Named]


def _cfg_props(cfg: EngineConfig) -> dict[str, Any]:
    """A vLLM-like config object: only the attributes processors read."""
    return {
        "scheduler_config": cfg.scheduler_config,
        "model_config": cfg.model_config,
        "speculative_config": None,
    }


def test_entry_point_failure_is_runtime_error(monkeypatch) -> None:
    def fake_entry_points(group: str):
        return [_FakeEntryPoint("broken", ImportError("boom"))]

    monkeypatch.setattr(loader_mod, "entry_points", fake_entry_points)
    with pytest.raises(RuntimeError, match="Failed to load LogitsProcessor plugin") as ei:
        build_logitsprocs(CFG, "cpu", False)
    assert isinstance(ei.value.__cause__, ImportError)
    # Speculative decoding and pooling never load plugins.
    spec = EngineConfig(max_num_seqs=4, vocab_size=V, num_speculative_tokens=1)
    assert len(list(build_logitsprocs(spec, "cpu", False, sampler_transforms=False).all)) == 1
    assert list(build_logitsprocs(CFG, "cpu", False, is_pooling_model=True).all) == []


# ---------------------------------------------------------------------------------------------
# SamplingParams


def test_all_stop_token_ids_is_stop_union_eos() -> None:
    assert SamplingParams(stop_token_ids=[3, 4], eos_token_id=2).all_stop_token_ids == {2, 3, 4}
    # EOS stays in the set even with ignore_eos (vLLM 0.25.1).
    assert SamplingParams(
        stop_token_ids=[3], eos_token_id=2, ignore_eos=True
    ).all_stop_token_ids == {
        2,
        3,
    }
    assert SamplingParams().all_stop_token_ids == set()
    assert SamplingParams(eos_token_id=0).all_stop_token_ids == {0}
    assert SamplingParams(stop_token_ids=[5, 5]).all_stop_token_ids == {5}


def test_greedy_resets_random_knobs() -> None:
    p = SamplingParams(temperature=0.0, top_p=0.5, top_k=7, min_p=0.3)
    assert (p.top_p, p.top_k, p.min_p) == (1.0, 0, 0.0)
    assert p.sampling_type == SamplingType.GREEDY


@pytest.mark.parametrize("t", [1e-9, 1e-5, 0.005, 0.00999])
def test_tiny_temperature_raised_to_1e_2(t: float) -> None:
    p = SamplingParams(temperature=t, min_p=0.2, top_k=3)
    assert p.temperature == pytest.approx(1e-2)
    assert p.sampling_type == SamplingType.RANDOM
    assert (p.min_p, p.top_k) == (0.2, 3)


def test_sampling_type_and_top_k_minus_one() -> None:
    assert SamplingParams(temperature=0.7).sampling_type == SamplingType.RANDOM
    assert SamplingParams(temperature=0.7, seed=1).sampling_type == SamplingType.RANDOM_SEED
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(temperature=0.01).temperature == 0.01


# ---------------------------------------------------------------------------------------------
# Duck typing: vLLM's own BatchUpdate / MoveDirectionality / SamplingParams


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


def _vparams(min_p=0.0, logit_bias=None, min_tokens=0, stop=()):
    return SimpleNamespace(
        min_p=min_p, logit_bias=logit_bias, min_tokens=min_tokens, all_stop_token_ids=set(stop)
    )


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


# ---------------------------------------------------------------------------------------------
# Built-in semantics on tiny tensors


def expected(kind: str, params: SimpleNamespace | None, output: list[int], row: torch.Tensor):
    """What one built-in does to one row (vLLM semantics; MinP in logit space, float32)."""
    row = row.clone()
    if params is None:
        return row
    if kind == "MinTokensLogitsProcessor":
        if params.min_tokens and len(output) < params.min_tokens:
            for t in params.all_stop_token_ids:
                row[t] = NEG_INF
    elif kind == "LogitBiasLogitsProcessor":
        for t, b in (params.logit_bias or {}).items():
            row[t] += b
    elif kind == "MinPLogitsProcessor" and params.min_p:
        log_min_p = torch.tensor(params.min_p, dtype=torch.float32).log()
        row[row < row.max() + log_min_p] = NEG_INF
    return row


KINDS = ["MinTokensLogitsProcessor", "LogitBiasLogitsProcessor", "MinPLogitsProcessor"]
REQ = {
    "a": _vparams(min_p=0.5, logit_bias={1: 2.0, 9: -1.0}, min_tokens=4, stop=[2, 3]),
    "b": _vparams(min_p=0.9, logit_bias={3: 10.0}, min_tokens=5, stop=[4]),
    "c": _vparams(),  # nothing for any processor
    "d": _vparams(min_p=0.2, logit_bias={0: -3.0}, min_tokens=2, stop=[0, 15]),
}


def check_rows(kind: str, proc: Any, layout: list[str | None], seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(layout), V, generator=g) * 2
    got = proc.apply(x.clone())
    want = torch.stack(
        [expected(kind, REQ[r] if r else None, [], x[i]) for i, r in enumerate(layout)]
    )
    assert torch.equal(got, want), (kind, layout)


@pytest.mark.parametrize("kind", KINDS)
def test_unidirectional_move_discards_destination_state(kind: str) -> None:
    proc = builtins()[kind]
    proc.update_state(
        upd(3, added=[(0, REQ["a"], None, []), (1, REQ["b"], None, []), (2, REQ["c"], None, [])])
    )
    check_rows(kind, proc, ["a", "b", "c"])
    # b (slot 1) finished; condense moves c (no state) from 2 into 1: b's stale state must go.
    proc.update_state(upd(2, moved=[(2, 1, UNI)]))
    check_rows(kind, proc, ["a", "c"])
    # Growing back exposes slot 2 empty (the source of the move was emptied).
    proc.update_state(upd(3, added=[(2, REQ["c"], None, [])]))
    check_rows(kind, proc, ["a", "c", "c"])
    assert active(proc) == 1
    # And a state-holding source overwrites the destination.
    proc.update_state(upd(3, added=[(2, REQ["d"], None, [])]))
    proc.update_state(upd(2, moved=[(2, 0, UNI)]))
    check_rows(kind, proc, ["d", "c"])


@pytest.mark.parametrize("kind", KINDS)
def test_swap_with_one_side_empty_moves_state(kind: str) -> None:
    proc = builtins()[kind]
    proc.update_state(upd(2, added=[(0, REQ["a"], None, []), (1, REQ["c"], None, [])]))
    proc.update_state(upd(2, moved=[(0, 1, SWAP)]))
    check_rows(kind, proc, ["c", "a"])
    proc.update_state(upd(3, added=[(2, REQ["b"], None, [])], moved=[(2, 0, SWAP)]))
    check_rows(kind, proc, ["b", "a", "c"])
    # Both sides hold state: exchanged.
    proc.update_state(upd(3, moved=[(1, 0, SWAP)]))
    check_rows(kind, proc, ["a", "b", "c"])


@pytest.mark.parametrize("kind", KINDS)
def test_added_moves_use_pre_move_indices_and_removed_clears(kind: str) -> None:
    proc = builtins()[kind]
    proc.update_state(
        upd(3, added=[(0, REQ["a"], None, []), (1, REQ["b"], None, []), (2, REQ["d"], None, [])])
    )
    # Slot 2 removed (tail, stays empty); a new request replaces slot 0; then swap 0 <-> 1.
    proc.update_state(upd(2, removed=[2], added=[(0, REQ["d"], None, [])], moved=[(0, 1, SWAP)]))
    check_rows(kind, proc, ["b", "d"])
    proc.update_state(upd(3, added=[(2, REQ["c"], None, [])]))
    check_rows(kind, proc, ["b", "d", "c"])


@pytest.mark.parametrize("kind", KINDS)
def test_no_active_request_returns_same_object(kind: str) -> None:
    proc = builtins()[kind]
    x = torch.randn(3, V)
    x0 = x.clone()
    assert proc.apply(x[:0]) is not None
    proc.update_state(None)
    proc.update_state(upd(3, added=[(i, REQ["c"], None, []) for i in range(3)]))
    # Nothing active: the same object comes back untouched (no work). Its shape is still
    # checked against the batch (test_misuse.py), so it must have the batch's rows.
    assert proc.apply(x) is x and torch.equal(x, x0)
    proc.update_state(upd(3, added=[(1, REQ["a"], None, [])]))
    assert proc.apply(x.clone()) is not None
    proc.update_state(upd(1, removed=[2, 1]))
    y = x[:1]
    assert proc.apply(y) is y and torch.equal(y, x0[:1])


def test_min_tokens_masks_until_live_output_reaches_min() -> None:
    proc = MinTokensLogitsProcessor(CFG, CPU, False)
    out0: list[int] = []
    out1: list[int] = []
    sp = SamplingParams(min_tokens=3, stop_token_ids=[5], eos_token_id=2, ignore_eos=True)
    proc.update_state(upd(2, added=[(0, sp, [1], out0), (1, SamplingParams(), [1], out1)]))
    masked = torch.zeros(2, V)
    masked[0, 2] = masked[0, 5] = NEG_INF
    for step in range(3):
        assert len(out0) == step
        y = proc.apply(torch.zeros(2, V))
        assert torch.equal(y, masked), step
        out0.append(7)  # the engine appends to the live list in place
        out1.append(7)
        proc.update_state(None)
    # len(out0) == 3 == min_tokens: the entry is gone, also without a batch change.
    assert active(proc) == 0
    x = torch.zeros(2, V)
    assert proc.apply(x) is x and torch.equal(x, torch.zeros(2, V))
    # Shrinking the list afterwards does not revive it (vLLM drops the entry).
    del out0[:]
    proc.update_state(None)
    assert active(proc) == 0


def test_min_tokens_rechecked_on_batch_change_steps_too() -> None:
    proc = MinTokensLogitsProcessor(CFG, CPU, False)
    out: list[int] = [1]
    proc.update_state(upd(1, added=[(0, _vparams(min_tokens=2, stop=[3]), None, out)]))
    assert proc.apply(torch.zeros(1, V))[0, 3].item() == NEG_INF
    out.append(1)
    proc.update_state(upd(2, added=[(1, _vparams(), None, [])]))
    x = torch.zeros(2, V)
    assert proc.apply(x) is x


@pytest.mark.parametrize("n_out", [3, 4, 10])
def test_min_tokens_entry_never_created_when_output_long_enough(n_out: int) -> None:
    proc = MinTokensLogitsProcessor(CFG, CPU, False)
    out = list(range(n_out))
    proc.update_state(upd(1, added=[(0, _vparams(min_tokens=3, stop=[1]), None, out)]))
    assert active(proc) == 0
    x = torch.zeros(1, V)
    assert proc.apply(x) is x
    # Even if the list later shrinks (KV-load failure), no entry appears.
    del out[1:]
    proc.update_state(None)
    assert active(proc) == 0


def test_min_tokens_empty_stop_set_masks_nothing() -> None:
    proc = MinTokensLogitsProcessor(CFG, CPU, False)
    proc.update_state(upd(1, added=[(0, _vparams(min_tokens=3), None, [])]))
    assert active(proc) == 1
    x = torch.randn(1, V)
    assert torch.equal(proc.apply(x.clone()), x)


def test_logit_bias_adds() -> None:
    proc = LogitBiasLogitsProcessor(CFG, CPU, False)
    sp = SamplingParams(logit_bias={0: 1.5, 7: -100.0, 15: 0.25})
    proc.update_state(upd(2, added=[(1, sp, None, [])]))
    x = torch.randn(2, V)
    want = x.clone()
    want[1, 0] += 1.5
    want[1, 7] += -100.0
    want[1, 15] += 0.25
    y = proc.apply(x.clone())
    assert torch.equal(y, want)
    # -inf stays -inf; applied every step (not only once).
    z = torch.full((2, V), NEG_INF)
    assert torch.equal(proc.apply(z.clone()), z)
    assert torch.equal(proc.apply(x.clone()), want)


def test_logit_bias_empty_dict_is_no_bias() -> None:
    proc = LogitBiasLogitsProcessor(CFG, CPU, False)
    proc.update_state(upd(1, added=[(0, _vparams(logit_bias={}), None, [])]))
    assert active(proc) == 0
    x = torch.randn(1, V)
    assert proc.apply(x) is x


def _softmax_keep(row: torch.Tensor, min_p: float) -> torch.Tensor:
    p = row.softmax(-1)
    return p >= min_p * p.max()


@pytest.mark.parametrize("min_p", [0.01, 0.1, 0.3, 0.5, 0.9])
def test_min_p_keeps_p_at_least_min_p_times_pmax(min_p: float) -> None:
    proc = MinPLogitsProcessor(CFG, CPU, False)
    proc.update_state(
        upd(3, added=[(0, _vparams(min_p=min_p), None, []), (2, _vparams(min_p=min_p), None, [])])
    )
    g = torch.Generator().manual_seed(int(min_p * 100))
    x = torch.randn(3, V, generator=g) * 3
    y = proc.apply(x.clone())
    assert torch.equal(y[1], x[1])  # min_p 0: untouched
    for r in (0, 2):
        keep = _softmax_keep(x[r], min_p)
        ratio = x[r].softmax(-1) / x[r].softmax(-1).max()
        clear = (ratio - min_p).abs() > 1e-5  # away from the float-rounding band
        assert torch.equal((y[r] > NEG_INF)[clear], keep[clear])
        assert torch.equal(y[r][keep & clear], x[r][keep & clear])  # kept values unchanged
        assert keep[x[r].argmax()] and y[r].max() == x[r].max()


def test_min_p_tie_at_threshold_is_kept() -> None:
    proc = MinPLogitsProcessor(CFG, CPU, False)
    proc.update_state(
        upd(2, added=[(0, _vparams(min_p=1.0), None, []), (1, _vparams(min_p=0.5), None, [])])
    )
    # min_p = 1.0: every token tied with the max is kept, every other one masked.
    row0 = torch.tensor([2.0, 2.0, 1.0, 2.0] + [0.0] * (V - 4))
    # min_p = 0.5: a logit exactly max + ln(0.5) (float32, as stored) is kept; one ulp below is not.
    thr = float(proc.pipeline.section("min_p.log_min_p")[1])
    assert thr == pytest.approx(math.log(0.5))
    below = float(torch.nextafter(torch.tensor(thr), torch.tensor(-math.inf)))
    assert below < thr
    row1 = torch.tensor([0.0, thr, below, -5.0] + [-1.0] * (V - 4))
    x = torch.stack([row0, row1])
    y = proc.apply(x.clone())
    assert (y[0, :4] > NEG_INF).tolist() == [True, True, False, True]
    assert (y[0, 4:] == NEG_INF).all()
    assert (y[1, :4] > NEG_INF).tolist() == [True, True, False, False]
    assert (y[1, 4:] == NEG_INF).all()


def test_min_p_all_neg_inf_row_unchanged() -> None:
    proc = MinPLogitsProcessor(CFG, CPU, False)
    proc.update_state(
        upd(2, added=[(0, _vparams(min_p=0.5), None, []), (1, _vparams(min_p=0.1), None, [])])
    )
    x = torch.randn(2, V)
    x[0] = NEG_INF
    y = proc.apply(x.clone())
    assert torch.equal(y[0], x[0])
    assert not torch.isnan(y).any()


def test_min_p_count_and_storage() -> None:
    proc = MinPLogitsProcessor(CFG, CPU, False)
    proc.update_state(
        upd(
            3,
            added=[
                (0, _vparams(min_p=0.1), None, []),
                (1, _vparams(), None, []),
                (2, _vparams(min_p=1.0), None, []),
            ],
        )
    )
    assert active(proc) == 2
    assert proc.get_min_p_by_index(0) == float(torch.tensor(0.1, dtype=torch.float32))
    assert proc.get_min_p_by_index(1) == 0.0
    proc.update_state(upd(2, removed=[2]))
    assert active(proc) == 1 and proc.get_min_p_by_index(2) == 0.0
    proc.update_state(upd(2, added=[(0, _vparams(), None, [])]))
    assert active(proc) == 0
    x = torch.randn(2, V)
    assert proc.apply(x) is x


def test_get_min_p_by_index_out_of_range_is_index_error() -> None:
    # vLLM: float(self.min_p_cpu[index]) on a [max_num_seqs] numpy array -> IndexError.
    proc = MinPLogitsProcessor(CFG, CPU, False)
    with pytest.raises(IndexError):
        proc.get_min_p_by_index(CFG.max_num_seqs)


# ---------------------------------------------------------------------------------------------
# Sampler


class SpyInvariant(_Proc):
    def __init__(self) -> None:
        self.calls = 0

    def is_argmax_invariant(self) -> bool:
        return True

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return logits


def _md(params: list[SamplingParams], generators: dict[int, torch.Generator] | None = None):
    return SamplingMetadata.from_params(params, V, CPU, generators)


def test_all_greedy_returns_argmax_and_skips_invariant() -> None:
    spy = SpyInvariant()
    minp = MinPLogitsProcessor(CFG, CPU, False)
    bias = LogitBiasLogitsProcessor(CFG, CPU, False)
    greedy = SamplingParams(temperature=0.0, min_p=0.9)
    bias.update_state(upd(3, added=[(2, _vparams(logit_bias={0: 100.0}), None, [])]))
    minp.update_state(upd(3, added=[(i, _vparams(min_p=0.9), None, []) for i in range(3)]))
    sampler = Sampler(LogitsProcessors([spy, minp, bias]))
    x = torch.randn(3, V)
    md = _md([greedy] * 3)
    assert md.all_greedy and md.temperature is None
    out = sampler(x.clone(), md)
    want = x.argmax(-1)
    want[2] = 0  # the non-invariant bias still runs for greedy rows
    assert torch.equal(out.sampled_token_ids, want)
    assert spy.calls == 0
    # MinP did not run: only the biased entry changed.
    expect = x.clone()
    expect[2, 0] += 100.0
    assert torch.equal(out.logits, expect)


def test_random_rows_run_invariant_after_temperature() -> None:
    spy = SpyInvariant()
    minp = MinPLogitsProcessor(CFG, CPU, False)
    minp.update_state(
        upd(2, added=[(0, _vparams(min_p=0.5), None, []), (1, _vparams(min_p=0.5), None, [])])
    )
    sampler = Sampler(LogitsProcessors([spy, minp]))
    row = torch.tensor([0.0, -1.0] + [-30.0] * (V - 2))
    x = torch.stack([row, row])
    # e^-1 = 0.37 < 0.5 at T = 1 (masked); e^(-1/2) = 0.61 >= 0.5 at T = 2 (kept).
    md = _md(
        [SamplingParams(temperature=1.0, min_p=0.5), SamplingParams(temperature=2.0, min_p=0.5)]
    )
    out = sampler(x.clone(), md)
    assert spy.calls == 1
    assert out.logits[0, 1].item() == NEG_INF
    assert out.logits[1, 1].item() == -0.5
    assert out.sampled_token_ids[0].item() == 0


def test_temperature_scaling_and_greedy_rows_divided_by_one() -> None:
    sampler = Sampler(LogitsProcessors())
    x = torch.randn(3, V)
    md = _md(
        [
            SamplingParams(temperature=0.5),
            SamplingParams(temperature=0.0),
            SamplingParams(temperature=2.0),
        ]
    )
    assert not md.all_greedy and not md.all_random
    out = sampler(x.clone(), md)
    assert torch.allclose(out.logits[0], x[0] / 0.5)
    assert torch.equal(out.logits[1], x[1])
    assert torch.allclose(out.logits[2], x[2] / 2.0)
    assert out.sampled_token_ids[1].item() == x[1].argmax().item()
    assert out.sampled_token_ids.dtype == torch.int64 and out.sampled_token_ids.shape == (3,)


@pytest.mark.parametrize("top_p", [None, 0.999])
def test_top_k_keeps_ties(top_p: float | None) -> None:
    sampler = Sampler(LogitsProcessors())
    row = torch.tensor([1.0, 3.0, 3.0, 0.0, 2.0] + [-5.0] * (V - 5))
    x = torch.stack([row, row])
    kw: dict[str, Any] = {"top_k": 1} if top_p is None else {"top_k": 1, "top_p": top_p}
    md = _md([SamplingParams(temperature=1.0, **kw), SamplingParams(temperature=1.0)])
    seen = set()
    for s in range(40):
        gens = {0: torch.Generator().manual_seed(s)}
        out = sampler(
            x.clone(), _md([SamplingParams(temperature=1.0, **kw), SamplingParams()], gens)
        )
        seen.add(out.sampled_token_ids[0].item())
    assert seen == {1, 2}
    out = sampler(x.clone(), md)
    kept = (out.logits[0] > NEG_INF).nonzero().flatten().tolist()
    assert kept == [1, 2]
    assert (out.logits[1] > NEG_INF).all()  # the row without top-k is untouched


def test_top_k_two_keeps_tied_second() -> None:
    sampler = Sampler(LogitsProcessors())
    row = torch.tensor([5.0, 1.0, 3.0, 3.0, 3.0] + [-5.0] * (V - 5))
    out = sampler(row[None].clone(), _md([SamplingParams(temperature=1.0, top_k=2)]))
    assert (out.logits[0] > NEG_INF).nonzero().flatten().tolist() == [0, 2, 3, 4]


def test_seeded_generators_reproducible() -> None:
    sampler = Sampler(LogitsProcessors())
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, V, generator=g) * 0.1  # nearly uniform: many possible tokens
    params = [SamplingParams(temperature=1.0, seed=s) for s in (11, 12, 13, 14)]

    def run(seeds: tuple[int, ...]) -> list[list[int]]:
        gens = {i: torch.Generator().manual_seed(s) for i, s in enumerate(seeds)}
        return [sampler(x.clone(), _md(params, gens)).sampled_token_ids.tolist() for _ in range(10)]

    a, b = run((11, 12, 13, 14)), run((11, 12, 13, 14))
    assert a == b
    assert run((21, 22, 23, 24)) != a
    # A row's samples depend only on its own generator, not on the other rows.
    c = run((11, 99, 98, 97))
    assert [r[0] for r in c] == [r[0] for r in a]

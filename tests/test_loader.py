"""``build_logitsprocs`` (``loader.py``): the built-ins in vLLM's order, the sampler transforms,
speculative decoding and pooling, and custom processors loaded as classes, ``module:Class`` names
and entry points, with vLLM's errors."""

from __future__ import annotations

import sys
import textwrap
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _helpers import upd

from logitsproc_rs import (
    STR_POOLING_REJECTS_LOGITSPROCS,
    STR_SPEC_DEC_REJECTS_LOGITSPROCS,
    AllowedTokenIdsLogitsProcessor,
    BadWordsLogitsProcessor,
    BatchUpdate,
    EngineConfig,
    LogitBiasLogitsProcessor,
    LogitsProcessor,
    MinPLogitsProcessor,
    MinTokensLogitsProcessor,
    PenaltiesLogitsProcessor,
    Sampler,
    build_logitsprocs,
    validate_logits_processors_parameters,
)
from logitsproc_rs import loader as loader_mod

V = 16
CFG = EngineConfig(max_num_seqs=8, vocab_size=V)
CPU = torch.device("cpu")


class _Proc(LogitsProcessor):
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.invariant = bool(vllm_config)

    def is_argmax_invariant(self) -> bool:
        return self.invariant

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


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


def test_speculative_decoding_builds_only_min_tokens() -> None:
    """vLLM's mode (``draft_rows="vllm"``); the default builds everything (test_spec_decode)."""
    cfg = EngineConfig(max_num_seqs=4, vocab_size=V, num_speculative_tokens=2, draft_rows="vllm")
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
    # Speculative decoding in vLLM's mode and pooling never load plugins.
    spec = EngineConfig(max_num_seqs=4, vocab_size=V, num_speculative_tokens=1, draft_rows="vllm")
    assert len(list(build_logitsprocs(spec, "cpu", False, sampler_transforms=False).all)) == 1
    assert list(build_logitsprocs(CFG, "cpu", False, is_pooling_model=True).all) == []

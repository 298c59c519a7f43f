"""The reference (``reference.py``) is an independent oracle: it imports nothing of the pipeline
it checks, and its own order, constants and types agree with ours."""

from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from logitsproc_rs import (
    EngineConfig,
    build_logitsprocs,
    builtin,
    reference,
    sampler,
)
from logitsproc_rs.builtin.xtc import xtc_seed
from logitsproc_rs.params import _SAMPLING_EPS, NEUTRAL_REPETITION_PENALTY
from logitsproc_rs.reference import (
    REFERENCE_ORDER,
    build_reference_logitsprocs,
    reference_class,
    reference_of,
    reference_stage,
)
from logitsproc_rs.registry import CAP_DEFAULTS

V = 8
CFG = EngineConfig(max_num_seqs=4, vocab_size=V)
SPEC = EngineConfig(max_num_seqs=4, vocab_size=V, num_speculative_tokens=2)
SPEC_VLLM = EngineConfig(max_num_seqs=4, vocab_size=V, num_speculative_tokens=2, draft_rows="vllm")
THINK = EngineConfig(
    max_num_seqs=4, vocab_size=V, reasoning_start_token_ids=[5], reasoning_end_token_ids=[6]
)
OPT_IN_NAMES = [f"Ref{c.__name__}" for c in builtin.OPT_IN_PROCESSORS]


def _names(procs, prefix: str = "") -> list[str]:
    return [type(p).__name__.removeprefix(prefix) for p in procs]


# --- independence ------------------------------------------------------------------------------

SOURCES = Path(reference.__file__).parent
ALLOWED_TOP = set(sys.stdlib_module_names) | {"numpy", "torch"}


@pytest.mark.parametrize("module", ["reference.py", "reference_thinking.py"])
def test_the_reference_imports_nothing_of_the_pipeline(module: str) -> None:
    """Only the standard library, numpy and torch, and (the thinking budget) the reference
    itself: a bug in our types, order or constants cannot reach the oracle."""
    tree = ast.parse((SOURCES / module).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name.split(".")[0] in ALLOWED_TOP, (module, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert node.module == "reference", (module, node.module)
            else:
                assert node.module is not None
                assert node.module.split(".")[0] in ALLOWED_TOP, (module, node.module)
    # The reference's own dynamic imports (``reference_class``) stay inside it.
    for _stage, name in REFERENCE_ORDER:
        assert reference_class(name).__module__ in (
            "logitsproc_rs.reference",
            "logitsproc_rs.reference_thinking",
        )


# --- order -------------------------------------------------------------------------------------


def test_reference_order_is_ours_stage_by_stage() -> None:
    """``REFERENCE_ORDER`` (written out from vLLM 0.25.1) against ``builtin.BUILTINS``: the same
    processors in each stage, in the same order; each view's ``REFERENCE`` is its reference."""
    stages = {c.STAGE.value for c in builtin.BUILTINS}
    assert stages == {s for s, _ in REFERENCE_ORDER}
    for stage in stages:
        ours = [f"Ref{c.__name__}" for c in builtin.BUILTINS if c.STAGE.value == stage]
        assert reference_stage(stage) == ours, stage
    assert len(REFERENCE_ORDER) == len(builtin.BUILTINS)
    for view in builtin.BUILTINS:
        assert reference_of(view) is reference_class(f"Ref{view.__name__}")
    assert list(reference.SPEC_DECODE_BUILTINS) == [
        f"Ref{c.__name__}" for c in builtin.SPEC_DECODE_BUILTINS
    ]


def test_reference_phases_are_ours() -> None:
    """What the samplers run, phase by phase: ours built with every opt-in processor (passed as
    custom processors, in ``OPT_IN_PROCESSORS``' order) and a reasoning config, against the
    reference built from its own order; each reference says the same argmax invariance."""
    ours = build_logitsprocs(THINK, "cpu", False, custom_logitsprocs=builtin.OPT_IN_PROCESSORS)
    ref = build_reference_logitsprocs(THINK, "cpu", opt_in=OPT_IN_NAMES)
    assert _names(ref.non_argmax_invariant, "Ref") == _names(ours.non_argmax_invariant)
    assert _names(ref.argmax_invariant, "Ref") == _names(ours.argmax_invariant)
    assert _names(ours.non_argmax_invariant) == [
        "AllowedTokenIdsLogitsProcessor",
        "BadWordsLogitsProcessor",
        "MinTokensLogitsProcessor",
        "LogitBiasLogitsProcessor",
        "NoRepeatNGramLogitsProcessor",
        "DryLogitsProcessor",
        "PenaltiesLogitsProcessor",
        "ThinkingBudgetLogitsProcessor",
    ]
    for view in builtin.BUILTINS:
        proc = reference_class(f"Ref{view.__name__}")(THINK, torch.device("cpu"), False)
        assert proc.is_argmax_invariant() is view.ARGMAX_INVARIANT, view.__name__


def test_reference_build_order_matches_ours() -> None:
    for sampler_transforms in (True, False):
        for cfg in (CFG, SPEC, SPEC_VLLM, THINK):
            ours = build_logitsprocs(cfg, "cpu", False, sampler_transforms=sampler_transforms)
            ref = build_reference_logitsprocs(cfg, "cpu", sampler_transforms=sampler_transforms)
            assert _names(ref.all, "Ref") == _names(ours.all)
            assert _names(ref.non_argmax_invariant, "Ref") == _names(ours.non_argmax_invariant)


def test_reference_opt_in_is_checked() -> None:
    with pytest.raises(ValueError, match="not opt-in"):
        build_reference_logitsprocs(CFG, "cpu", opt_in=["RefMinPLogitsProcessor"])
    with pytest.raises(ValueError, match="custom processors"):
        build_reference_logitsprocs(SPEC_VLLM, "cpu", opt_in=OPT_IN_NAMES[:1])
    with pytest.raises(ValueError):
        build_logitsprocs(SPEC_VLLM, "cpu", False, custom_logitsprocs=builtin.OPT_IN_PROCESSORS)


# --- constants ---------------------------------------------------------------------------------


def test_reference_constants_are_ours() -> None:
    """The cap defaults the reference reads are the registry's; vLLM's constants are ours."""
    for cap, default in reference.CAP_DEFAULTS.items():
        assert CAP_DEFAULTS[cap] == default, cap
    assert reference._SAMPLING_EPS == _SAMPLING_EPS
    assert reference.NEUTRAL_REPETITION_PENALTY == NEUTRAL_REPETITION_PENALTY
    assert reference.LOGPROBS_MODES == sampler.LOGPROBS_MODES
    for seed in (0, 1, 7, 2**31, 2**63, 2**64 - 1, 2**64, -1, -(2**70)):
        assert reference.ref_xtc_seed(seed) == xtc_seed(seed), seed


def test_reference_caps_are_read_from_the_config() -> None:
    cfg = EngineConfig(
        max_num_seqs=2, vocab_size=V, max_dry_penalty_last_n=7, max_no_repeat_ngram_window=5
    )
    dev = torch.device("cpu")
    assert reference.RefDryLogitsProcessor(cfg, dev, False).max_window == 7
    assert reference.RefNoRepeatNGramLogitsProcessor(cfg, dev, False).window == 5
    bare = object()  # a config without the caps: the defaults
    dry = reference.RefDryLogitsProcessor(bare, dev, False)
    ngram = reference.RefNoRepeatNGramLogitsProcessor(bare, dev, False)
    assert dry.max_window == CAP_DEFAULTS["max_dry_penalty_last_n"]
    assert ngram.window == CAP_DEFAULTS["max_no_repeat_ngram_window"]


# --- types -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (sampler.SamplingMetadata, reference.RefSamplingMetadata),
        (sampler.LogprobsTensors, reference.RefLogprobsTensors),
        (sampler.SamplerOutput, reference.RefSamplerOutput),
    ],
    ids=lambda c: c.__name__,
)
def test_reference_types_have_our_fields(ours: type, theirs: type) -> None:
    """The tests compare outputs field by field: the same field names, in the same order, with
    the same defaults."""

    def fields(cls: type) -> list[tuple[str, object]]:
        return [(f.name, f.default) for f in dataclasses.fields(cls)]

    assert fields(theirs) == fields(ours)


def test_reference_container_is_vllms() -> None:
    """Split by argmax invariance in construction order; ``all`` is the invariant ones first
    (vLLM's ``update_state`` order), as ours."""
    ref = build_reference_logitsprocs(THINK, "cpu", opt_in=OPT_IN_NAMES)
    ours = build_logitsprocs(THINK, "cpu", False, custom_logitsprocs=builtin.OPT_IN_PROCESSORS)
    assert _names(ref.all, "Ref") == _names(ours.all)
    assert _names(ref.argmax_invariant, "Ref")[0] == "MinPLogitsProcessor"

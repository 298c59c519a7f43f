"""The public names of ``logitsproc_rs`` and vLLM 0.25.1's constants."""

from __future__ import annotations

import pytest

import logitsproc_rs
from logitsproc_rs import (
    BUILTIN_LOGITS_PROCESSORS,
    STR_POOLING_REJECTS_LOGITSPROCS,
    STR_SPEC_DEC_REJECTS_LOGITSPROCS,
    LogitBiasLogitsProcessor,
    MinPLogitsProcessor,
    MinTokensLogitsProcessor,
    MoveDirectionality,
)

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

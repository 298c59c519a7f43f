"""Per-request front-end validation (``validate_sampling_params``): speculative decoding in
vLLM's mode refuses min_p and logit_bias (the default, per-position draft rows, applies them),
the thinking budget needs reasoning ids, and its accepted values."""

from __future__ import annotations

import pytest

from logitsproc_rs import (
    STR_SPEC_DEC_REJECTS_MIN_P_LOGIT_BIAS,
    EngineConfig,
    SamplingParams,
    validate_sampling_params,
)
from logitsproc_rs.params import validate_thinking_token_budget

V = 8
CFG = EngineConfig(max_num_seqs=4, vocab_size=V)
SPEC = EngineConfig(max_num_seqs=4, vocab_size=V, num_speculative_tokens=2, draft_rows="vllm")
PER_POSITION = EngineConfig(max_num_seqs=4, vocab_size=V, num_speculative_tokens=2)


REASONING = EngineConfig(
    max_num_seqs=4, vocab_size=V, reasoning_start_token_ids=[1], reasoning_end_token_ids=[2]
)


@pytest.mark.parametrize(
    "params",
    [SamplingParams(min_p=0.1), SamplingParams(min_p=1.1e-5), SamplingParams(logit_bias={1: 1.0})],
)
def test_speculative_config_rejects_min_p_and_logit_bias(params):
    with pytest.raises(ValueError) as e:
        validate_sampling_params(SPEC, params)
    assert str(e.value) == STR_SPEC_DEC_REJECTS_MIN_P_LOGIT_BIAS
    assert STR_SPEC_DEC_REJECTS_MIN_P_LOGIT_BIAS == (
        "The min_p and logit_bias sampling parameters are not yet supported with speculative "
        "decoding."
    )
    validate_sampling_params(CFG, params)  # fine without speculative decoding
    validate_sampling_params(PER_POSITION, params)  # and with per-position draft rows


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(min_p=1e-5),
        SamplingParams(min_p=0.0),
        SamplingParams(logit_bias={}),
        SamplingParams(repetition_penalty=1.2, bad_words_token_ids=[[1]]),
    ],
)
def test_speculative_config_accepts_the_rest(params):
    validate_sampling_params(SPEC, params)


def test_thinking_budget_needs_reasoning_ids():
    p = SamplingParams(thinking_token_budget=10)
    with pytest.raises(ValueError, match="reasoning"):
        validate_sampling_params(CFG, p)
    with pytest.raises(ValueError, match="reasoning"):
        validate_sampling_params(SPEC, p)
    validate_sampling_params(REASONING, p)
    validate_sampling_params(CFG, SamplingParams(thinking_token_budget=-1))  # -1 means None


@pytest.mark.parametrize(("value", "expected"), [(None, None), (-1, None), (0, 0), (7, 7)])
def test_thinking_token_budget_values(value, expected):
    assert SamplingParams(thinking_token_budget=value).thinking_token_budget == expected
    assert validate_thinking_token_budget(value) == expected


@pytest.mark.parametrize("value", [True, False, 1.0, 2.5, -2, -100, "3"])
def test_thinking_token_budget_rejects(value):
    with pytest.raises(ValueError, match="thinking_token_budget"):
        SamplingParams(thinking_token_budget=value)

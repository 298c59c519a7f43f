"""``EngineConfig`` and ``SamplingParams`` (``params.py``) behave like vLLM 0.25.1's: config shape,
stop ids, greedy and tiny temperatures, sampling type."""

from __future__ import annotations

import pytest

from logitsproc_rs import (
    EngineConfig,
    SamplingParams,
    SamplingType,
)


def test_engine_config_vllm_shape() -> None:
    cfg = EngineConfig(max_num_seqs=12, vocab_size=99)
    assert cfg.scheduler_config.max_num_seqs == 12
    assert cfg.model_config.get_vocab_size() == 99
    assert cfg.speculative_config is None
    assert EngineConfig(num_speculative_tokens=2).speculative_config.num_speculative_tokens == 2
    for bad in ({"max_num_seqs": 0}, {"vocab_size": -1}, {"num_speculative_tokens": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            EngineConfig(**bad)


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

"""What the vLLM bridges do so that no request stops the engine (``logitsproc_rs.vllm._guard``)
and the engine-start errors a user sees, without vLLM: caps checked up front, the
fail-closed rows, and a thinking budget without reasoning ids."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from logitsproc_rs import BatchUpdate, EngineConfig, RequestError, SamplingParams
from logitsproc_rs.builtin import MinTokensLogitsProcessor
from logitsproc_rs.pipeline import Pipeline
from logitsproc_rs.registry import INT_FIELD_RANGE, TABLES
from logitsproc_rs.vllm import _guard
from logitsproc_rs.vllm._fields import Routed, routed_params
from logitsproc_rs.vllm._group import Bridge

ALL_TABLES = ("logit_bias", "min_tokens", "bad_words", "allowed", "no_repeat_ngram", "dry")


def ns(**fields) -> SamplingParams:
    return routed_params(
        None, SimpleNamespace(extra_args={"logitsproc_rs": fields}), "logitsproc_rs"
    )


@pytest.mark.parametrize(
    ("fields", "own_stops", "words"),
    [
        (
            {"logit_bias": {i: 1.0 for i in range(1025)}},
            (),
            "1025 entries exceed the per-request cap of 1024",
        ),
        ({"bad_words_token_ids": [[5]] * 129}, (), "129 words exceed"),
        ({"bad_words_token_ids": [[5] * 65]}, (), "65 tokens in a word exceed"),
        ({"allowed_token_ids": list(range(4097))}, (), "4097 entries exceed"),
        ({"min_tokens": 3, "stop_token_ids": list(range(100))}, range(100, 128), "129 stop ids"),
        ({"stop_token_ids": list(range(5000))}, (), "5000 stop ids exceed"),
        ({"stop_token_ids": list(range(129))}, range(1000), "129 stop ids exceed"),
        ({"no_repeat_ngram_size": 129}, (), "129 is above the per-request cap of 128"),
        ({"no_repeat_ngram_window": 2049}, (), "2049 is above the per-request cap of 2048"),
        ({"no_repeat_ngram_whitelist": list(range(1025))}, (), "1025 entries exceed"),
        ({"dry_penalty_last_n": 8193}, (), "8193 is above the per-request cap of 8192"),
        ({"dry_sequence_breakers": [[5]] * 513}, (), "513 breakers exceed"),
        ({"dry_sequence_breakers": [[5] * 65]}, (), "65 tokens in a breaker exceed"),
    ],
)
def test_caps_are_checked_at_the_front_end(fields, own_stops, words) -> None:
    request = SimpleNamespace(stop_token_ids=list(own_stops))
    with pytest.raises(ValueError, match="field 'extra_args") as e:
        _guard.check_caps("request", ns(**fields), request, ALL_TABLES)
    assert words in str(e.value)


def test_caps_at_the_limit_and_of_absent_tables_pass() -> None:
    request = SimpleNamespace(stop_token_ids=list(range(100, 127)))
    _guard.check_caps(
        "request", ns(min_tokens=3, stop_token_ids=list(range(100))), request, ALL_TABLES
    )
    _guard.check_caps("request", ns(bad_words_token_ids=[[5]] * 200), request, ("logit_bias",))
    at_caps = {
        "no_repeat_ngram_size": 128,
        "no_repeat_ngram_window": 2048,
        "no_repeat_ngram_whitelist": list(range(1024)),
        "dry_penalty_last_n": 8192,
        "dry_sequence_breakers": [[5] * 64] * 512,
    }
    _guard.check_caps("request", ns(**at_caps), request, ALL_TABLES)
    _guard.check_caps("request", ns(dry_penalty_last_n=8193), request, ("no_repeat_ngram",))
    # Without our min_tokens, the request's own stop ids are vLLM's: not capped, not held back.
    many = SimpleNamespace(stop_token_ids=list(range(500)), all_stop_token_ids=set(range(500)))
    _guard.check_caps("request", ns(), many, ALL_TABLES)
    assert Routed(many, ns()).all_stop_token_ids == set()
    assert Routed(many, ns(min_tokens=2)).all_stop_token_ids == set(range(500))


def test_the_namespaces_stop_ids_are_capped_without_min_tokens() -> None:
    """A cap holds whether or not its field is in use: the namespace's 5,000 stop ids passed
    the front end while our min_tokens was not set. They reach the worker's table either way
    (where the core caps them too); the request's own join them only with our min_tokens."""
    request = SimpleNamespace(
        stop_token_ids=[7], all_stop_token_ids={7, 0}, extra_args={"logitsproc_rs": {}}
    )
    request.extra_args["logitsproc_rs"]["stop_token_ids"] = list(range(5000))

    class Bridged(Bridge):
        VIEW = MinTokensLogitsProcessor

    with pytest.raises(RequestError) as e:
        Bridged.validate_params(request)
    assert e.value.field == "stop_token_ids" and e.value.index is None
    assert "field 'extra_args['logitsproc_rs']['stop_token_ids']'" in str(e.value)
    assert "5000 stop ids exceed the per-request cap of 128" in str(e.value)
    ours = ns(stop_token_ids=list(range(5000)))
    assert Routed(request, ours).all_stop_token_ids == set(range(5000))
    assert Routed(request, ns(stop_token_ids=[3])).all_stop_token_ids == {3}
    assert Routed(request, ns(stop_token_ids=[3], min_tokens=2)).all_stop_token_ids == {0, 3, 7}
    # In the worker (a request the front end did not see): the core refuses it too.
    cfg = EngineConfig(max_num_seqs=2, vocab_size=6000)
    pipe = Pipeline(cfg, "cpu", False, tables=["min_tokens"])
    with pytest.raises(RequestError) as e:
        pipe.step(BatchUpdate(1, [], [(0, Routed(request, ours), None, [])], []))
    assert (e.value.index, e.value.field, e.value.processor) == (0, "stop_token_ids", "min_tokens")
    request.extra_args["logitsproc_rs"]["stop_token_ids"] = list(range(128))
    Bridged.validate_params(request)  # at the cap


def test_a_refused_request_reads_neutral_everywhere() -> None:
    request = SamplingParams(
        max_tokens=None, min_p=0.5, logit_bias={3: 1.0}, extra_args={"col": 1}, temperature=0.7
    )
    r = _guard.Refused(request)
    assert r.min_p == 0.0 and r.logit_bias is None and r.extra_args is None
    assert r.all_stop_token_ids == frozenset() and r.temperature == 0.7


def test_forced_tokens_are_the_stop_tokens_inside_the_vocabulary() -> None:
    request = SimpleNamespace(all_stop_token_ids={9, 4, 900})
    assert _guard.forced_tokens(request, 32, eos=2) == [4, 9]
    assert _guard.forced_tokens(SimpleNamespace(all_stop_token_ids=set()), 32, eos=2) == [2]
    assert _guard.forced_tokens(SimpleNamespace(), 32, eos=99) == [0]
    config = SimpleNamespace(
        model_config=SimpleNamespace(hf_text_config=SimpleNamespace(eos_token_id=[7, 8]))
    )
    assert _guard.model_eos(config) == 7 and _guard.model_eos(EngineConfig()) == 0


def test_forced_rows_by_index_and_by_slot() -> None:
    forced = _guard.ForcedRows()
    forced.rows = {1: [2, 5], 7: [0]}  # 7 is past this batch (its removal comes later)
    x = torch.randn(3, 8)
    y = forced.apply_(x.clone())
    assert torch.equal(y[[0, 2]], x[[0, 2]])
    want = torch.full((8,), float("-inf"))
    want[[2, 5]] = 0.0
    assert torch.equal(y[1], want)
    forced.changed()
    z = forced.apply_(x.clone(), row_slots=[7, 3, 7])  # stable slots: rows of slot 7
    assert torch.equal(z[1], x[1]) and z[0].isfinite().sum() == 1 and z[2][0] == 0.0


def test_refused_index_names_only_a_request_of_the_step() -> None:
    e = RequestError("token id 99 outside [0, 32)", index=3, field="logit_bias")
    assert _guard.refused_index(e, [1, 3]) == 3
    assert _guard.refused_index(e, [1]) is None
    assert _guard.refused_index(ValueError("batch_size 9 exceeds the capacity"), [1]) is None
    # No message is parsed: an untyped error in the core's words names no request.
    words = ValueError("request at index 3: field 'logit_bias': token id 99 outside [0, 32)")
    assert _guard.refused_index(words, [1, 3]) is None


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (EngineConfig(vocab_size=32), "EngineConfig.reasoning_start_token_ids"),
        (
            SimpleNamespace(
                scheduler_config=SimpleNamespace(max_num_seqs=4),
                model_config=SimpleNamespace(get_vocab_size=lambda: 32),
                speculative_config=None,
                reasoning_config=SimpleNamespace(
                    reasoning_start_token_ids=None, reasoning_end_token_ids=None
                ),
            ),
            "vLLM's reasoning_config has no reasoning token ids",
        ),
        (
            SimpleNamespace(
                scheduler_config=SimpleNamespace(max_num_seqs=4),
                model_config=SimpleNamespace(get_vocab_size=lambda: 32),
                speculative_config=None,
                reasoning_config=None,
            ),
            "the engine has no reasoning_config",
        ),
    ],
)
def test_thinking_budget_without_reasoning_ids_names_the_config(config, words) -> None:
    with pytest.raises(ValueError, match="ThinkingBudgetLogitsProcessor needs reasoning") as e:
        Pipeline(config, "cpu", False, tables={"thinking"})
    assert words in str(e.value)


_INT_FIELDS = list(
    dict.fromkeys(f.attr for t in TABLES.values() for f in t.fields if f.kind in ("int", "opt_int"))
)


@pytest.mark.parametrize("value", [2**70, INT_FIELD_RANGE[1] + 1, INT_FIELD_RANGE[0] - 1])
@pytest.mark.parametrize("field", _INT_FIELDS)
def test_an_int_field_beyond_what_the_core_reads_is_refused_at_the_front_end(
    field: str, value: int
) -> None:
    """penalty_last_n and dry_allowed_length of 2**70 passed validate_params and the worker
    refused them (the request failed closed instead of being refused). The bound is the core's
    (``INT_FIELD_RANGE``), for every int field of the registry."""
    request = SimpleNamespace(extra_args={"logitsproc_rs": {field: value}})
    with pytest.raises(RequestError) as e:
        routed_params(None, request, "logitsproc_rs")
    assert e.value.field == field and e.value.index is None
    assert f"['{field}']" in str(e.value)

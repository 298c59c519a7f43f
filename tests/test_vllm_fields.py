"""Where the vLLM bridges read our fields (``logitsproc_rs.vllm._fields``), without vLLM: the
Python form (``extra_args["logitsproc_rs"] = {...}``) and the wire form that vLLM's HTTP
schema for ``vllm_xargs`` accepts (flat ``"logitsproc_rs.<field>"`` keys, JSON text for
nested values) read the same for every field, and a bad wire value is a ``RequestError``
naming the field as the request wrote it. The real server: ``tests/test_vllm_engine.py``."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

import pytest

from logitsproc_rs.errors import RequestError
from logitsproc_rs.registry import TABLES
from logitsproc_rs.vllm import _guard
from logitsproc_rs.vllm._fields import NAMESPACE_FIELDS, read_namespace, to_wire

NS = "logitsproc_rs"

# Every field a request may put in the namespace, with the values the registry declares for
# it (``FieldSpec::examples``: the first not neutral): a new field brings its own.
EXAMPLES: dict[str, tuple[Any, ...]] = {
    key: f.examples
    for t in TABLES.values()
    for f in t.fields
    for key in {f.name, f.attr}
    if key in NAMESPACE_FIELDS and f.examples
}
# A valid value, not the neutral one, for every field.
VALUES: dict[str, Any] = {name: examples[0] for name, examples in EXAMPLES.items()}


def read(extra: Any, namespace: str = NS):
    return read_namespace(3, SimpleNamespace(extra_args=extra), namespace)


def same(a: Any, b: Any) -> None:
    for name in NAMESPACE_FIELDS:
        assert getattr(a, name) == getattr(b, name), name


def test_every_field_has_a_value_here() -> None:
    """Every field declares examples in the registry, so that both forms are checked for it."""
    assert set(VALUES) == NAMESPACE_FIELDS


@pytest.mark.parametrize(
    ("name", "k"), [(name, k) for name in sorted(EXAMPLES) for k in range(len(EXAMPLES[name]))]
)
def test_each_field_reads_the_same_in_both_forms(name: str, k: int) -> None:
    fields = {name: EXAMPLES[name][k]}
    if name == "stop_token_ids":
        fields["min_tokens"] = 2
    python_form = read({NS: fields}).params
    wire_form = read(to_wire(fields)).params
    same(wire_form, python_form)
    if k == 0:
        assert getattr(wire_form, name) != getattr(read(None).params, name)  # it is set


def test_all_fields_together_and_beside_other_extra_args() -> None:
    python_form = read({NS: VALUES, "logit_margin": 1.5}).params
    wire_form = read({**to_wire(VALUES), "logit_margin": 1.5}).params
    same(wire_form, python_form)


def test_the_wire_form_fits_vllms_schema() -> None:
    """``dict[str, str | int | float]`` (vLLM 0.25.1's ``vllm_xargs``; 0.32 also takes flat
    lists): numbers as themselves, the rest (lists, bools, which vLLM's schema would turn into
    1) as JSON text."""
    wire = to_wire(VALUES)
    assert set(wire) == {f"{NS}.{k}" for k in VALUES}
    for key, value in wire.items():
        assert isinstance(value, (str, int, float)) and not isinstance(value, bool), key
    assert wire[f"{NS}.min_p"] == VALUES["min_p"]
    assert wire[f"{NS}.min_tokens"] == VALUES["min_tokens"]
    assert json.loads(wire[f"{NS}.allowed_token_ids"]) == VALUES["allowed_token_ids"]
    assert json.loads(wire[f"{NS}.dry_sequence_breakers"]) == VALUES["dry_sequence_breakers"]
    assert VALUES["no_repeat_ngram_output_only"] is True
    assert wire[f"{NS}.no_repeat_ngram_output_only"] == "true"


def test_a_flat_list_of_numbers_as_itself() -> None:
    """What vLLM 0.32's schema also carries: a flat list of ids as a JSON list."""
    ours = read({f"{NS}.allowed_token_ids": [2, 5], f"{NS}.no_repeat_ngram_whitelist": [1]})
    assert ours.params.allowed_token_ids == [2, 5]
    assert ours.params.no_repeat_ngram_whitelist == [1]


def test_the_wire_form_by_hand() -> None:
    """What the docs show a user writing in JSON: numbers as numbers, nested values and
    booleans as JSON text (token ids as object keys are strings there)."""
    ours = read(
        {
            f"{NS}.min_p": 0.1,
            f"{NS}.logit_bias": '{"42": -5.0}',
            f"{NS}.dry_multiplier": 0.8,
            f"{NS}.dry_sequence_breakers": "[[13]]",
            f"{NS}.no_repeat_ngram_size": "2",
            f"{NS}.no_repeat_ngram_output_only": "true",
            f"{NS}.penalty_last_n": "null",
        }
    ).params
    expected = read(
        {
            NS: {
                "min_p": 0.1,
                "logit_bias": {"42": -5.0},
                "dry_multiplier": 0.8,
                "dry_sequence_breakers": [[13]],
                "no_repeat_ngram_size": 2,
                "no_repeat_ngram_output_only": True,
            }
        }
    ).params
    same(ours, expected)


@pytest.mark.parametrize(("sent", "read_as"), [(True, True), (1, True), (0, False), ("true", True)])
def test_a_bool_as_vllms_schema_delivers_it(sent: Any, read_as: bool) -> None:
    """vLLM's ``vllm_xargs`` schema turns a JSON ``true`` into the int 1: a bool field of
    the wire form reads 0 and 1 as the bools they were (and nothing else)."""
    ours = read({f"{NS}.no_repeat_ngram_output_only": sent, f"{NS}.no_repeat_ngram_size": 2})
    assert ours.params.no_repeat_ngram_output_only is read_as


def test_another_namespace_reads_its_own_keys() -> None:
    extra = {"mine.min_p": 0.3, f"{NS}.min_p": 0.1, f"{NS}x.min_p": 0.2}
    assert read(extra, "mine").params.min_p == 0.3
    assert read(extra).params.min_p == 0.1


@pytest.mark.parametrize(
    ("extra", "label", "words"),
    [
        ({f"{NS}.logit_bias": "{42: -5}"}, f"extra_args['{NS}.logit_bias']", "is JSON text"),
        ({f"{NS}.min_p": "high"}, f"extra_args['{NS}.min_p']", "is JSON text"),
        ({f"{NS}.bad_words_token_ids": "[" * 100_000}, "bad_words_token_ids", "too deeply"),
        ({f"{NS}.min_p": 1.5}, f"extra_args['{NS}.min_p']", "min_p"),
        ({f"{NS}.min_p": "1.5"}, f"extra_args['{NS}.min_p']", "min_p"),
        ({f"{NS}.dry_sequence_breakers": "[[]]"}, f"{NS}.dry_sequence_breakers", "breaker"),
        ({f"{NS}.no_repeat_ngram_output_only": 2}, f"{NS}.no_repeat_ngram_output_only", "bool"),
        ({f"{NS}.no_repeat_ngram_output_only": 1.0}, f"{NS}.no_repeat_ngram_output_only", ""),
        ({f"{NS}.min_pp": 0.1}, f"extra_args['{NS}.min_pp']", "unknown field(s) ['min_pp']"),
        ({f"{NS}.": 0.1}, f"extra_args['{NS}.']", "unknown field(s) ['']"),
        ({NS: {"min_p": 0.1}, f"{NS}.top_n_sigma": 1.0}, f"extra_args['{NS}']", "not both"),
        ({NS: '{"min_p": 0.1}'}, f"extra_args['{NS}']", f"'{NS}.<field>' keys"),
    ],
)
def test_a_bad_wire_value_names_the_field(extra: Any, label: str, words: str) -> None:
    with pytest.raises(RequestError) as e:
        read(extra)
    assert str(e.value).startswith("request at index 3: field '"), e.value
    assert label in str(e.value) and words in str(e.value), e.value
    assert e.value.index == 3


def test_caps_name_the_field_as_the_request_wrote_it() -> None:
    request = SimpleNamespace(extra_args=to_wire({"logit_bias": {i: 1.0 for i in range(1025)}}))
    ours, label = read_namespace(None, request, NS)
    with pytest.raises(RequestError, match=r"field 'extra_args\['logitsproc_rs.logit_bias'\]'"):
        _guard.check_caps("request", ours, request, {"logit_bias"}, label)
    request = SimpleNamespace(extra_args={NS: {"logit_bias": {i: 1.0 for i in range(1025)}}})
    ours, label = read_namespace(None, request, NS)
    with pytest.raises(
        RequestError, match=r"field 'extra_args\['logitsproc_rs'\]\['logit_bias'\]'"
    ):
        _guard.check_caps("request", ours, request, {"logit_bias"}, label)


def test_the_docs_table_of_the_wire_form_reads() -> None:
    """``docs/vllm-v1.md`` gives the wire form of each field: one row per field, and every
    row's example reads through the bridges' reader and sets its field."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "vllm-v1.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| [^|]+ \| `(\"logitsproc_rs\.\w+\": .*)` \|$", page, re.M)
    assert sorted(name for name, _ in rows) == sorted(NAMESPACE_FIELDS)
    for name, example in rows:
        extra = json.loads("{" + example + "}")
        assert list(extra) == [f"{NS}.{name}"], example
        if name == "stop_token_ids":
            extra[f"{NS}.min_tokens"] = 2
        params = read(extra).params
        assert getattr(params, name) != getattr(read(None).params, name), example

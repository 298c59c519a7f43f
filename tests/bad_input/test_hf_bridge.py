"""Bad input to the HF bridge (``logitsproc_rs.hf.HFLogitsProcessor``): a refused call changes
nothing, so the corrected retry gives exactly what a processor that never saw the bad call
gives (every table of its pipeline, and the logits). The processor is called as
``generate()`` calls it (``input_ids`` one token longer each step); no model is needed."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _helpers import assert_unchanged

from logitsproc_rs import RequestError, SamplingParams
from logitsproc_rs.hf import HFLogitsProcessor
from logitsproc_rs.registry import TABLES

V = 16
PARAMS = [
    SamplingParams(repetition_penalty=1.5, logit_bias={3: 2.0}, min_tokens=2, stop_token_ids=[4]),
    SamplingParams(temperature=0.0, frequency_penalty=0.5, presence_penalty=0.3),
]
PROMPT = torch.tensor([[1, 2, 3], [4, 5, 6]])


def scores(step: int) -> torch.Tensor:
    return torch.randn(2, V, generator=torch.Generator().manual_seed(step)) * 3


def started() -> HFLogitsProcessor:
    """A generation two steps in."""
    p = HFLogitsProcessor(PARAMS)
    p(PROMPT, scores(0))
    p(torch.cat([PROMPT, torch.tensor([[7], [8]])], 1), scores(1))
    return p


IDS = torch.cat([PROMPT, torch.tensor([[7], [8]])], 1)
NEXT = torch.cat([IDS, torch.tensor([[9], [3]])], 1)


def state(p: HFLogitsProcessor) -> list[Any]:
    assert p.procs is not None and p.procs.pipeline is not None
    core = p.procs.pipeline.core
    bufs = [torch.from_dlpack(core.buffer(i)).clone() for i in range(len(core.sections()))]
    return [dict(core.active()), core.status(), list(p.procs.pipeline.status), p._len, bufs]


def check_refused_then_retry(input_ids: Any, s: Any, match: str) -> None:
    p, twin = started(), started()
    before = state(p)
    with pytest.raises(ValueError, match=match):
        p(input_ids, s)
    assert_unchanged(before, state(p))
    # The corrected call, then one more step: as if the bad call never happened.
    got = [p(NEXT, scores(2)), p(torch.cat([NEXT, torch.tensor([[5], [5]])], 1), scores(3))]
    want = [
        twin(NEXT, scores(2)),
        twin(torch.cat([NEXT, torch.tensor([[5], [5]])], 1), scores(3)),
    ]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert_unchanged(state(twin), state(p))


@pytest.mark.parametrize("token", [V, V + 3, 2**40, -5, -1, -(2**63)])
def test_a_refused_step_leaves_the_generation_so_the_retry_works(token: int) -> None:
    """The step fed the token after remembering it as the last one: the corrected retry was
    refused too ("the rows' earlier tokens changed")."""
    bad = torch.cat([IDS, torch.tensor([[9], [token]])], 1)
    check_refused_then_retry(bad, scores(2), r"row 1\b.*sampled_token_ids|token id")


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.bool, torch.complex64, torch.float16]
)
def test_input_ids_that_are_not_token_ids_are_refused(dtype: torch.dtype) -> None:
    """Float ids were truncated to ints (9.7 read as 9), bools read as 0 / 1."""
    bad = NEXT.to(dtype)
    if dtype.is_floating_point:
        bad = bad + 0.7
    check_refused_then_retry(bad, scores(2), "input_ids")


def test_meta_tensors_are_refused() -> None:
    """Meta input ids (no data) raised NotImplementedError; meta scores were taken."""
    check_refused_then_retry(NEXT.to("meta"), scores(2), "input_ids")
    check_refused_then_retry(NEXT, scores(2).to("meta"), "scores")
    p = HFLogitsProcessor(PARAMS)
    with pytest.raises(RequestError, match="input_ids") as e:
        p(PROMPT.to("meta"), scores(0))
    assert e.value.field == "input_ids"


@pytest.mark.parametrize("shape", [(5,), (1, 2, 5), ()])
def test_input_ids_of_the_wrong_rank_are_refused(shape: tuple[int, ...]) -> None:
    bad = torch.ones(shape, dtype=torch.int64)
    check_refused_then_retry(bad, scores(2), "input_ids")


@pytest.mark.parametrize(
    "bad_scores",
    [
        torch.zeros(2, V, dtype=torch.int64),
        torch.zeros(2, V, dtype=torch.bool),
        torch.zeros(2, V, dtype=torch.complex64),
        torch.zeros(V),
        torch.zeros(2, 1, V),
        torch.zeros(3, V),
        [[0.0] * V] * 2,
    ],
    ids=["int64", "bool", "complex", "1-d", "3-d", "rows", "list"],
)
def test_scores_that_are_not_logits_are_refused(bad_scores: Any) -> None:
    check_refused_then_retry(NEXT, bad_scores, "scores")


def test_a_refused_first_step_leaves_nothing_behind() -> None:
    p = HFLogitsProcessor(PARAMS)
    with pytest.raises(ValueError, match=r"row 0\b.*prompt|token id"):
        p(torch.tensor([[1, 2, V + 1], [4, 5, 6]]), scores(0))
    twin = HFLogitsProcessor(PARAMS)
    assert torch.equal(p(PROMPT, scores(0)), twin(PROMPT, scores(0)))
    assert torch.equal(p(IDS, scores(1)), twin(IDS, scores(1)))
    assert_unchanged(state(twin), state(p))


@pytest.mark.parametrize(
    "field",
    list(dict.fromkeys(f.attr for t in TABLES.values() for f in t.fields if f.kind == "float")),
)
def test_a_dict_params_float_field_too_large_for_a_float_names_the_row_and_field(
    field: str,
) -> None:
    """The new float fields raised OverflowError out of HF's dict params."""
    with pytest.raises(RequestError, match=rf"row 1: {field}\b") as e:
        HFLogitsProcessor([{}, {field: 10**400}])
    assert e.value.field == field

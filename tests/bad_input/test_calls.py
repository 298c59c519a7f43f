"""Calls out of protocol or range: logits for a batch the processor was never told of, a skipped
``update_state``, ``BatchUpdateBuilder.removed_append`` after the list was read, an index outside
``get_min_p_by_index``, and a custom processor that raises (named, and the next step works)."""

from __future__ import annotations

import re

import pytest
import torch

from logitsproc_rs import (
    BatchUpdate,
    BatchUpdateBuilder,
    EngineConfig,
    LogitBiasLogitsProcessor,
    LogitsProcessor,
    MinPLogitsProcessor,
    Sampler,
    SamplingMetadata,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.errors import LogitsprocError

from ._checks import SMALL_CFG as CFG
from ._checks import SMALL_V as V
from ._checks import TRIO as ALL
from ._checks import bias_update

# --- a skipped update_state ------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_logits_for_a_batch_the_processor_was_never_told_of_are_refused(cls) -> None:
    """The engine skipped the update that added the batch's first request: with nothing
    active a processor used to return the logits untouched (the new request's bias or penalty
    silently dropped). The rows are checked against the batch whether or not there is work."""
    p = cls(CFG, "cpu", False)
    p.update_state(None)
    x = torch.randn(1, V)
    x0 = x.clone()
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.apply: .*expected \[0, {V}\]"):
        p.apply(x)
    assert torch.equal(x, x0)


def test_skipped_update_with_a_new_request_is_refused_not_dropped() -> None:
    procs = build_logitsprocs(CFG, "cpu", False)
    procs.update_state(bias_update(1))
    # Step 2 adds a second request, but the engine forgets update_state.
    bias = next(p for p in procs.all if isinstance(p, LogitBiasLogitsProcessor))
    with pytest.raises(ValueError, match=r"expected \[1, 16\]"):
        bias.apply(torch.zeros(2, V))
    # Told, it applies both.
    procs.update_state(BatchUpdate(2, [], [(1, SamplingParams(logit_bias={3: 5.0}), [1], [])], []))
    y = bias.apply(torch.zeros(2, V))
    assert y[:, 3].tolist() == [5.0, 5.0]


class _Flaky(LogitsProcessor):
    """Adds 1 to token 0 of every row; raises once in update_state or apply on demand."""

    FAIL: str | None = None

    def __init__(self, vllm_config, device, is_pin_memory) -> None:
        self.rows = 0

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        if _Flaky.FAIL == "update_state":
            raise KeyError("lost a slot")
        if batch_update is not None:
            self.rows = batch_update.batch_size

    def apply(self, logits):
        if _Flaky.FAIL == "apply":
            raise ValueError("bad row")
        logits[:, 0] += 1.0
        return logits


@pytest.mark.parametrize(
    ("where", "exc", "message"),
    [
        ("update_state", RuntimeError, r"_Flaky\.update_state raised KeyError\('lost a slot'\)"),
        ("apply", ValueError, r"_Flaky\.apply: bad row"),
    ],
)
def test_a_raising_custom_processor_is_named_and_the_next_step_works(where, exc, message):
    procs = build_logitsprocs(CFG, "cpu", False, custom_logitsprocs=[_Flaky])
    plain = build_logitsprocs(CFG, "cpu", False)
    sampler, plain_sampler = Sampler(procs), Sampler(plain)
    greedy = [SamplingParams(temperature=0.0, logit_bias={5: 9.0}, min_tokens=2, eos_token_id=3)]
    outputs: list[list[int]] = [[]]
    update = BatchUpdate(1, [], [(0, greedy[0], [1], outputs[0])], [])
    md = SamplingMetadata.from_params(greedy, V)
    g = torch.Generator().manual_seed(0)
    for step in range(4):
        x = torch.randn(1, V, generator=g)
        _Flaky.FAIL = where if step == 1 else None
        try:
            if step == 1 and where == "update_state":
                with pytest.raises(exc, match=message):
                    procs.update_state(update)
                plain.update_state(update)
                continue
            procs.update_state(update)
            plain.update_state(update)
            if step == 1:
                with pytest.raises(exc, match=message):
                    sampler(x.clone(), md)
                continue
        finally:
            _Flaky.FAIL = None
        got = sampler(x.clone(), md).logits
        want = plain_sampler(x.clone(), md).logits
        want[:, 0] += 1.0  # _Flaky's own work, after the built-ins before it in vLLM's order
        assert torch.allclose(got, want), step
        outputs[0].append(7)
        update = None


# ---------------------------------------------------------------------------------------------
# BatchUpdateBuilder misuse


@pytest.mark.parametrize("read", ["removed", "peek_removed", "pop_removed"])
def test_removed_append_after_read_is_runtime_error(read: str) -> None:
    b = BatchUpdateBuilder()
    b.removed_append(3)
    b.removed_append(1)
    attr = getattr(b, read)
    if callable(attr):
        attr()
    with pytest.raises(RuntimeError, match=re.escape("after self.removed has been read")):
        b.removed_append(2)
    # Registration reopens with the next step.
    b.get_and_reset(4)
    b.removed_append(2)
    assert b.removed == [2]


def test_get_min_p_by_index_out_of_range_is_both_index_and_value_error() -> None:
    p = MinPLogitsProcessor(EngineConfig(max_num_seqs=2, vocab_size=8), "cpu", False)
    # 2**64 and beyond raised OverflowError (the core's index is a usize).
    for bad in (-1, 2, True, "0", 2**63, 2**64, -(2**64), 10**400):
        with pytest.raises(IndexError):
            p.get_min_p_by_index(bad)  # type: ignore[arg-type]
        with pytest.raises(LogitsprocError, match="index") as e:
            p.get_min_p_by_index(bad)  # type: ignore[arg-type]
        assert isinstance(e.value, ValueError) and e.value.field == "index"

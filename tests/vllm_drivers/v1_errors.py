"""A bridged processor that raises, inside vLLM 0.25.1's ``build_logitsprocs`` and loop.

- In ``update_state`` (a column reader raising, a bad namespaced field that vLLM's front end
  would have refused, a token id outside the vocabulary that it cannot): the request is failed
  closed (its row −inf but its stop tokens, an ERROR naming the request and the field), the
  other requests match the native path, and the engine's next step (the request admitted
  again, fixed) matches it too. A failure that is not about one request still raises, naming
  the processor, and no table changes.
- In ``apply`` (a transform raising): the exception names the processor; once the request is
  gone the next step works.
- ``validate_params`` (vLLM's front-end check) refuses the same bad fields up front.
"""

from __future__ import annotations

from typing import Any

import log_records
import torch
import v1_harness  # noqa: F401  (paths, threads)
from v1_harness import apply_all, import_vllm, result

from logitsproc_rs import (
    BatchUpdate,
    ColumnLogitsProcessor,
    EngineConfig,
    FloatColumn,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.vllm import v1

lp = import_vllm()
from vllm.sampling_params import SamplingParams as VllmSamplingParams  # noqa: E402

V = 32
cfg = EngineConfig(max_num_seqs=8, vocab_size=V)


def _boom(sp: Any) -> Any:
    extra = sp.extra_args or {}
    if extra.get("boom_update"):
        raise KeyError("boom_update")
    return extra.get("boom")


class ExplodingLogitsProcessor(ColumnLogitsProcessor):
    COLUMNS = (FloatColumn("boom", default=0.0, read=_boom),)

    def is_argmax_invariant(self) -> bool:
        return False

    def transform(self, logits: torch.Tensor, cols: Any, num_active: int) -> torch.Tensor:
        if num_active:
            raise RuntimeError("kaboom")
        return logits


Exploding = v1.bridge(ExplodingLogitsProcessor, name="Exploding")
theirs = lp.build_logitsprocs(
    cfg,
    torch.device("cpu"),
    False,
    False,
    [v1.MinPLogitsProcessor, v1.LogitBiasLogitsProcessor, v1.PenaltiesLogitsProcessor, Exploding],
)
native = build_logitsprocs(
    cfg, "cpu", False, sampler_transforms=True, custom_logitsprocs=[ExplodingLogitsProcessor]
)
bridges = [p for p in theirs.all if isinstance(p, v1._Bridge)]
assert len({id(p.pipeline) for p in bridges}) == 1


def pair(ns: dict | None = None, **extra: Any) -> tuple[Any, SamplingParams]:
    routed = dict(extra, **{v1.NAMESPACE: ns}) if ns is not None else extra
    theirs_p = VllmSamplingParams(temperature=1.0, extra_args=routed or None)
    ours_p = SamplingParams(max_tokens=None, extra_args=extra or None, **(ns or {}))
    return theirs_p, ours_p


outputs = [[] for _ in range(8)]
builder = lp.BatchUpdateBuilder()
gen = torch.Generator().manual_seed(3)
checked = 0


def step(adds: list, removed: tuple = (), size: int = 0) -> None:
    """One engine step through vLLM's builder and loop, and the native path."""
    for i in removed:
        builder.removed_append(i)
    native_added = []
    for i, (t, o) in adds:
        builder.added.append((i, t, [1, 2], outputs[i]))
        native_added.append((i, o, [1, 2], outputs[i]))
    update = builder.get_and_reset(size)
    native_update = BatchUpdate(size, list(removed), native_added, [])
    for p in theirs.all:
        p.update_state(update)
    native.update_state(native_update)


def compare(n: int) -> None:
    global checked
    logits = torch.randn(n, V, generator=gen)
    a = apply_all(theirs, logits.clone())
    b = apply_all(native, logits.clone())
    assert torch.equal(a, b), (a, b)
    assert not torch.equal(a, logits)  # the built-ins had work to do
    checked += 1


def expect(exc: type, call: Any, *words: str) -> str:
    try:
        call()
    except exc as e:
        msg = str(e)
        for w in words:
            assert w in msg, (w, msg)
        return msg
    raise AssertionError(f"no {exc.__name__}")


good = [
    pair({"min_p": 0.2, "logit_bias": {5: 3.0}}),
    pair({"repetition_penalty": 1.5}),
    pair({"logit_bias": {7: -2.0, 9: 4.0}, "presence_penalty": 1.0}),
    pair(),
]
for i in range(len(good)):
    outputs[i].extend([5, 9, i])
step(list(enumerate(good)), size=4)
compare(4)


records = log_records.capture()


def compare_forced(n: int, refused: set[int], token: int = 0) -> None:
    """The native path (given the refused requests as neutral) on every other row; a refused
    row is −inf but its stop token (here the config's fallback, 0: no EOS, no stop ids)."""
    global checked
    logits = torch.randn(n, V, generator=gen)
    a = apply_all(theirs, logits.clone())
    b = apply_all(native, logits.clone())
    keep = [r for r in range(n) if r not in refused]
    assert torch.equal(a[keep], b[keep]), (a, b)
    for r in refused:
        want = torch.full((V,), float("-inf"))
        want[token] = 0.0
        assert torch.equal(a[r], want), a[r]
    checked += 1


# 1. A column reader raises in update_state: failed closed, named in the log.
step([(4, (pair({"min_p": 0.1}, boom_update=True)[0], pair()[1]))], size=5)
compare_forced(5, {4})
msg = records.messages[-1]
for w in ("request at index 4", "'boom'", "failed closed"):
    assert w in msg, (w, msg)
step([(4, pair({"min_p": 0.1}))], size=5)  # the engine admits it again, fixed
compare(5)

# 2. A bad namespaced field (that vLLM's front end refuses) and a token id outside the
# vocabulary (that it cannot know): failed closed, named, the rest goes on.
nan_bias = VllmSamplingParams(extra_args={v1.NAMESPACE: {"logit_bias": {3: float("nan")}}})
far_bias = VllmSamplingParams(extra_args={v1.NAMESPACE: {"logit_bias": {V + 3: 1.0}}})
step([(5, (nan_bias, pair()[1])), (6, (far_bias, pair()[1]))], size=7)
compare_forced(7, {5, 6})
msg2 = "\n".join(records.messages[-2:])
for w in ("request at index 5", "request at index 6", "logit_bias", f"token id {V + 3}"):
    assert w in msg2, (w, msg2)
v1.LogitBiasLogitsProcessor.validate_params(far_bias)  # the front end cannot know the vocabulary
step([(5, pair({"logit_bias": {3: 1.0}}))], removed=(6,), size=6)
compare(6)

# 2b. A failure that is not one request's still raises, naming the processor; no table changed.
too_big = BatchUpdate(99, [], [], [])
msg3 = expect(
    ValueError, lambda: bridges[0].update_state(too_big), "update_state", "no table changed"
)
compare(6)

# 3. apply raises: named; after the request leaves, the next step works.
step([(6, pair(boom=1.5))], size=7)
expect(RuntimeError, lambda: apply_all(theirs, torch.randn(7, V)), "Exploding.apply", "kaboom")
step([], removed=(6,), size=6)
compare(6)

# 4. vLLM's front-end check refuses the same fields before they reach a batch.
bad = VllmSamplingParams(extra_args={v1.NAMESPACE: {"min_p": 2.0}})
expect(ValueError, lambda: v1.MinPLogitsProcessor.validate_params(bad), "min_p")
expect(
    ValueError,
    lambda: lp.validate_logits_processors_parameters([v1.MinPLogitsProcessor], bad),
    "min_p",
)
typo = VllmSamplingParams(extra_args={v1.NAMESPACE: {"min_pp": 0.1}})
expect(ValueError, lambda: v1.LogitBiasLogitsProcessor.validate_params(typo), "min_pp")
v1.MinPLogitsProcessor.validate_params(good[0][0])

result(checked=checked, update_error=msg, field_error=msg2, step_error=msg3)

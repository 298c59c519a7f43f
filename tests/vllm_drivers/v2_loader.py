"""vLLM 0.33.0's own MRV2 loader with our classes: what loads, what is refused, and which
processors share a pipeline. Prints one ``RESULT {json}`` line (run by tests/test_vllm_v2.py in
a subprocess)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import torch
import v2_harness as h
from vllm.v1.worker.gpu.sample.logits_processor import (
    LogitsProcessor,
    build_custom_logits_processors_params_validator,
)

from logitsproc_rs import EngineConfig, SamplingParams
from logitsproc_rs.vllm import v2

V2 = "logitsproc_rs.vllm.v2"


def expect(exc: type[Exception], fn, *args) -> str:
    try:
        fn(*args)
    except exc as e:
        return str(e)
    raise AssertionError(f"{fn.__name__}{args!r} did not raise {exc.__name__}")


def main() -> None:
    real = h.v1_package(real=True)
    cfg = EngineConfig(max_num_seqs=4, vocab_size=32)
    rs = h.RunnerState(4, 64, 32)
    names = [f"{V2}:{c.__name__}" for c in v2.ALL if c is not v2.ThinkingBudgetLogitsProcessor]
    procs = h.build(cfg, rs, names)
    out: dict[str, object] = {"loaded": [type(p).__name__ for p in procs]}
    assert all(isinstance(p, LogitsProcessor) for p in procs)
    # One loader call: one pipeline, with every member's tables.
    assert len({id(p.pipeline) for p in procs}) == 1
    out["tables"] = sorted(procs[0].pipeline.tables)
    # Another runner state: a pipeline of its own.
    other = h.build(cfg, h.RunnerState(4, 64, 32), [f"{V2}:MinPLogitsProcessor"])
    assert other[0].pipeline is not procs[0].pipeline
    assert other[0].pipeline.tables == {"min_p"}

    # What vLLM's loader refuses: a V1-interface class, a bad name, custom ones for pooling.
    out["v1_class"] = expect(ValueError, h.build, cfg, rs, ["logitsproc_rs:MinPLogitsProcessor"])
    out["bad_name"] = expect(ValueError, h.build, cfg, rs, ["logitsproc_rs.vllm.v2.MinP"])
    out["pooling"] = expect(
        ValueError, h.build_custom_logits_processors, cfg, rs, True, [f"{V2}:ALL"]
    )
    out["not_ours"] = expect(ValueError, v2.bridge, SamplingParams)

    # The front end's validator loads the same classes and runs their validate_params.
    validate = build_custom_logits_processors_params_validator(names)
    validate(h.namespaced(SamplingParams(min_p=0.5)))
    # The namespace's fields are checked at the front end: our ValueError, which vLLM's
    # validator re-raises as its own request-validation error.
    out["bad_namespace"] = expect(
        Exception, validate, SamplingParams(extra_args={"logitsproc_rs": {"min_p": 2.0}})
    )
    out["unknown_namespace"] = expect(
        Exception, validate, SamplingParams(extra_args={"logitsproc_rs": {"top_k": 2}})
    )

    # A field of a processor the engine did not load (DRY here): refused there too, naming
    # the class to load (vLLM's validator holds the loaded classes).
    out["unloaded"] = expect(
        Exception, validate, SamplingParams(extra_args={"logitsproc_rs": {"dry_multiplier": 0.8}})
    )

    # A column processor's own validate_params runs there too (as under V1), and the caps.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from logit_margin import LogitMarginLogitsProcessor

    with_margin = build_custom_logits_processors_params_validator(
        [*names, v2.bridge(LogitMarginLogitsProcessor, name="LogitMargin")]
    )
    with_margin(SamplingParams(extra_args={"logit_margin": 2.0}))
    out["column_validate"] = expect(
        Exception, with_margin, SamplingParams(extra_args={"logit_margin": -1.0})
    )
    out["cap"] = expect(
        Exception,
        validate,
        SamplingParams(extra_args={"logitsproc_rs": {"bad_words_token_ids": [[5]] * 200}}),
    )

    # A request acted on by some processors only: each says whether it acts.
    needs = np.zeros(4, dtype=bool)
    slot = rs.add_request([3, 4], [])
    # Namespace mode: the ordinary min_p is vLLM's business, none of ours acts on it.
    plain = SamplingParams(min_p=0.5, repetition_penalty=1.5)
    out["acts_on_plain_fields"] = sorted(
        type(p).__name__ for p in procs if p.add_request(slot, plain)
    )
    sp = h.namespaced(SamplingParams(min_p=0.5))
    acts = {type(p).__name__: bool(p.add_request(slot, sp)) for p in procs}
    out["acts_min_p_only"] = sorted(k for k, v in acts.items() if v)
    needs[slot] = any(acts.values())
    h.apply_staged_writes(procs)
    ctx = h.context(rs, [slot], [0])
    x = torch.tensor([[0.0, 5.0] + [4.0] * 30])
    y = h.sample_apply(procs, needs, x, ctx)
    out["min_p_kept"] = int(torch.isfinite(y).sum())

    # A token id outside the vocabulary (the front end cannot know it): failed closed, the
    # engine goes on. Its rows are −inf but its stop tokens; the other request is untouched.
    bad = rs.add_request([3, 4], [])
    refused = SamplingParams(
        eos_token_id=2, stop_token_ids=[9], extra_args={"logitsproc_rs": {"logit_bias": {99: 1.0}}}
    )
    validate(refused)
    needs[bad] = any([bool(p.add_request(bad, refused)) for p in procs])
    h.apply_staged_writes(procs)
    ctx = h.context(rs, [bad, slot], [1, 0])  # a draft row too: both rows of the slot
    x = torch.randn(3, 32)
    y = h.sample_apply(procs, needs, x.clone(), ctx)
    forced = torch.full((32,), float("-inf"))
    forced[[2, 9]] = 0.0
    assert torch.equal(y[0], forced) and torch.equal(y[1], forced), y[:2]
    assert torch.isfinite(y[2]).sum() >= 1
    out["failed_closed"] = True

    out["idle"] = idle_steps(cfg)

    out["real_v1_package"] = real
    if real:
        out["vllm_params"] = vllm_params(cfg, names)
    h.report(out)


def idle_steps(cfg: EngineConfig) -> dict:
    """Requests that set none of our fields (a column's reader gives nothing either): no
    processor says it acts on them, and a step of only them (MRV2 calls apply when its own
    states need it) reaches no core call and returns the logits as they came. A request with
    the column's field: that processor alone acts, and the step runs."""
    from logit_margin import LogitMarginLogitsProcessor

    rs = h.RunnerState(4, 64, 32)
    names = [
        *(f"{V2}:{c.__name__}" for c in v2.ALL if c is not v2.ThinkingBudgetLogitsProcessor),
        v2.bridge(LogitMarginLogitsProcessor, name="LogitMargin"),
    ]
    procs = h.build(cfg, rs, names)
    core = procs[0].pipeline.core
    slots = [rs.add_request([3, 4], [5]) for _ in range(2)]
    acts = [p.add_request(s, SamplingParams(temperature=0.7)) for s in slots for p in procs]
    for p in procs:
        p.apply_staged_writes()
    before = core.steps
    x = torch.randn(2, 32)
    y = x
    for p in procs:
        y = p.apply(y, h.context(rs, slots, [0, 0]))
    out = {"acts": any(acts), "same": y is x, "core_steps": core.steps - before}
    # An idle step still refuses a map whose slots are not slots.
    bad = dataclasses.replace(h.context(rs, slots, [0, 0]), idx_mapping_np=np.asarray([0, -1]))
    out["bad_map"] = expect(ValueError, procs[0].apply, x, bad)
    margin = rs.add_request([3, 4], [])
    sp = SamplingParams(temperature=0.7, extra_args={"logit_margin": 2.0})
    out["acting"] = [type(p).__name__ for p in procs if p.add_request(margin, sp)]
    for p in procs:
        p.apply_staged_writes()
    x = torch.randn(3, 32)
    y = x.clone()
    ctx = h.context(rs, [*slots, margin], [0, 0, 0])
    for p in procs:
        y = p.apply(y, ctx)
    out["busy_core_steps"] = core.steps - before
    out["busy_changed_rows"] = [i for i in range(3) if not torch.equal(x[i], y[i])]
    return out


def vllm_params(cfg: EngineConfig, names: list[str]) -> int:
    """After MRV2's sampler warm-up, vLLM 0.33.0's own ``SamplingParams`` give the same
    logits as ours with the same fields in the namespace (two recycled slots, one request
    each, the same logits row). Returns the entries they changed."""
    from vllm.sampling_params import SamplingParams as VllmParams

    fields = dict(
        min_p=0.2,
        logit_bias={3: 2.0, 9: -1.5},
        allowed_token_ids=[1, 2, 3, 4, 5, 7, 9, 11],
        min_tokens=4,
        stop_token_ids=[7],
        repetition_penalty=1.3,
        frequency_penalty=0.5,
        presence_penalty=-0.25,
    )
    rs = h.RunnerState(4, 64, 32)
    procs = h.build(cfg, rs, names)
    needs = np.zeros(4, dtype=bool)
    # MRV2's sampler warm-up first (_dummy_sampler_run): vLLM's warm-up params on every
    # slot of a runner that holds no request, one step.
    warmup = VllmParams.for_sampler_warmup()
    for slot in range(4):
        h.add_to_sampler(procs, needs, slot, warmup)
    h.apply_staged_writes(procs)
    h.sample_apply(procs, needs, torch.zeros(4, 32), h.context(rs, [0, 1, 2, 3], [0] * 4))
    slots = []
    for params in (
        VllmParams(extra_args={"logitsproc_rs": fields}),
        h.namespaced(SamplingParams(**fields)),
    ):
        slot = rs.add_request([2, 3, 3, 9], [5, 7])
        h.add_to_sampler(procs, needs, slot, params)
        slots.append(slot)
    h.apply_staged_writes(procs)
    rs.commit(slots[0], [5, 7, 11])
    rs.commit(slots[1], [5, 7, 11])
    x = torch.linspace(-2.0, 3.0, 32).repeat(2, 1)
    y = h.sample_apply(procs, needs, x, h.context(rs, slots, [0, 0]))
    assert torch.equal(y[0], y[1]), (y[0], y[1])
    return int((y[0] != x[0]).sum())


if __name__ == "__main__":
    main()

"""Bad input to our MRV2 processors (``logitsproc_rs.vllm.v2``), loaded by vLLM 0.33.0's own
loader: slots that are not slots in ``add_request`` and in a step's ``ctx``, request fields
holding bools or ints too large for a float, interrupts raised by the request's own
attributes. Prints one ``RESULT {json}`` line (run by tests/bad_input/test_v2_bridge.py in a
subprocess): for each case what was raised (class, ``field``, ``index``), whether every table
and the bridge's own per-slot state are exactly as in a twin that never saw the bad call, and
whether the next good steps give the twin's logits.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from typing import Any

import log_records
import numpy as np
import torch
import v2_harness as h

from logitsproc_rs import EngineConfig, SamplingParams
from logitsproc_rs.registry import TABLES
from logitsproc_rs.vllm import v2

V = 32
SLOTS = 4
NAMES = [
    f"logitsproc_rs.vllm.v2:{c.__name__}"
    for c in v2.ALL
    if c is not v2.ThinkingBudgetLogitsProcessor
]


class World:
    """A runner with two requests in flight (penalties, bias, min_p: histories are read) after
    two steps."""

    def __init__(self, names: list[str] = NAMES) -> None:
        self.rs = h.RunnerState(SLOTS, 64, V)
        self.procs = h.build(EngineConfig(max_num_seqs=SLOTS, vocab_size=V), self.rs, names)
        self.needs = np.zeros(SLOTS, dtype=bool)
        self.slots: list[int] = []
        self.step_no = 0
        for prompt, sp in (
            ([1, 2, 3], SamplingParams(repetition_penalty=2.0, logit_bias={5: 3.0})),
            ([4, 5], SamplingParams(presence_penalty=1.0, min_p=0.2, temperature=0.7)),
        ):
            slot = self.rs.add_request(prompt, [])
            h.add_to_sampler(self.procs, self.needs, slot, h.namespaced(sp))
            self.slots.append(slot)
        for _ in range(2):
            self.step()

    @property
    def group(self) -> Any:
        return self.procs[0]._group

    def ctx(self) -> Any:
        return h.context(self.rs, self.slots, [0] * len(self.slots))

    def logits(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(100 + self.step_no)
        return torch.randn(len(self.slots), V, generator=g) * 3

    def step(self, ctx: Any = None) -> torch.Tensor:
        """One engine step: staged writes, apply, commit each request's argmax."""
        h.apply_staged_writes(self.procs)
        out = h.sample_apply(self.procs, self.needs, self.logits(), ctx or self.ctx())
        self.step_no += 1
        for k, s in enumerate(self.slots):
            p = int(self.rs.prompt_len.np[s])
            n = int(self.rs.total_len.gpu[s])
            tok = int(out[k].argmax()) if torch.isfinite(out[k]).any() else 0
            self.rs.commit(s, [*self.rs.all_token_ids.gpu[s, p:n].tolist(), tok])
        return out

    def state(self) -> Any:
        """Every table (the core's host buffers and status) and the bridge's per-slot state."""
        g = self.group
        pipe = g.pipeline
        core = pipe.core
        bufs = [torch.from_dlpack(core.buffer(i)).clone() for i in range(len(core.sections()))]
        return (
            [dict(core.active()), core.status(), list(pipe.status)],
            bufs,
            [g.known.tolist(), g.temperature.tolist(), sorted(map(int, g.pending))],
            {int(k): v for k, v in g.forced.rows.items()},
        )


def same_state(a: Any, b: Any) -> bool:
    return (
        a[0] == b[0]
        and a[2] == b[2]
        and a[3] == b[3]
        and all(torch.equal(x, y) for x, y in zip(a[1], b[1], strict=True))
    )


def follow_up(world: World) -> list[torch.Tensor]:
    """The next good calls: a new request in the free slot, then two steps."""
    slot = world.rs.add_request([6, 7], [])
    sp = SamplingParams(frequency_penalty=0.5, logit_bias={9: 2.0}, min_p=0.1)
    h.add_to_sampler(world.procs, world.needs, slot, h.namespaced(sp))
    world.slots.append(slot)
    return [world.step(), world.step()]


def described(e: BaseException | None) -> dict[str, Any]:
    if e is None:
        return {"raised": None}
    return {
        "raised": type(e).__name__,
        "mro": [c.__name__ for c in type(e).__mro__],
        "field": getattr(e, "field", None),
        "index": getattr(e, "index", None),
        "message": str(e)[:300],
    }


def case(bad: Any) -> dict[str, Any]:
    """``bad(world)`` on one world; the other never sees it."""
    world, twin = World(), World()
    error = None
    try:
        bad(world)
    except BaseException as e:
        error = e
    out = described(error)
    out["forced"] = sorted(int(k) for k in world.group.forced.rows)
    out["same_state"] = same_state(world.state(), twin.state())
    got, want = follow_up(world), follow_up(twin)
    out["same_next"] = all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    out["same_after"] = same_state(world.state(), twin.state())
    return out


class Temperature:
    """Params whose ``temperature`` raises ``exc`` (an interrupt while the bridge reads it)."""

    def __init__(self, exc: type[BaseException]) -> None:
        self._sp = h.namespaced(SamplingParams(min_p=0.3))
        self._exc = exc

    def __getattr__(self, name: str) -> Any:
        if name == "temperature":
            raise self._exc
        return getattr(self._sp, name)


def slot_cases() -> dict[str, Any]:
    out: dict[str, Any] = {}
    good = h.namespaced(SamplingParams(min_p=0.4, logit_bias={1: 1.0}))
    free = [True, False, np.True_, -1, -4, SLOTS, 10**30, 2.0, "1", None, np.float64(1.0)]
    for slot in free:
        for k, proc in ((0, "first"), (-1, "last")):

            def bad(w: World, slot: Any = slot, k: int = k) -> None:
                w.procs[k].add_request(slot, good)

            out[f"add_request[{proc}]({slot!r})"] = case(bad)

    # A ctx whose slots are not slots: the step is refused before anything changes.
    def ctx_with(mapping: Any) -> Any:
        def bad(w: World) -> None:
            h.apply_staged_writes(w.procs)
            ctx = dataclasses.replace(w.ctx(), idx_mapping_np=mapping(w))
            w.procs[0].apply(w.logits(), ctx)

        return bad

    for name, mapping in {
        "negative": lambda w: np.asarray([w.slots[0], -1], dtype=np.int32),
        "beyond": lambda w: np.asarray([w.slots[0], SLOTS], dtype=np.int32),
        "bool": lambda w: np.asarray([True, False]),
        "float": lambda w: np.asarray([float(s) for s in w.slots]),
        "2-d": lambda w: np.asarray([w.slots], dtype=np.int32),
        "list_with_bool": lambda w: [w.slots[0], True],
        "str": lambda w: "12",
    }.items():
        out[f"ctx.idx_mapping_np[{name}]"] = case(ctx_with(mapping))

    # A draft step (one draft per request: four rows) whose layout is not one.
    def drafts_with(change: Any) -> Any:
        def bad(w: World) -> None:
            h.apply_staged_writes(w.procs)
            ctx = h.context(w.rs, w.slots, [1, 1], [[3], [4]])
            ctx = dataclasses.replace(ctx, **change(ctx))
            w.procs[0].apply(torch.zeros(4, V), ctx)

        return bad

    for name, change in {
        "float_pos": lambda c: {"expanded_local_pos": c.expanded_local_pos.float()},
        "short_input_ids": lambda c: {"input_ids": c.input_ids[:3]},
        "2-d_input_ids": lambda c: {"input_ids": c.input_ids[None]},
        "skipped_pos": lambda c: {"expanded_local_pos": torch.tensor([0, 2, 0, 1])},
        "second_run": lambda c: {"expanded_local_pos": torch.tensor([0, 0, 0, 1])},
        "draft_past_vocab": lambda c: {"input_ids": torch.tensor([1, V, 2, 4])},
        "negative_draft": lambda c: {"input_ids": torch.tensor([1, -1, 2, 4])},
    }.items():
        out[f"drafts[{name}]"] = case(drafts_with(change))
    return out


# The float fields of the core's registry that the namespace takes, in registry order.
REGISTRY_FLOATS = list(
    dict.fromkeys(f.attr for t in TABLES.values() for f in t.fields if f.kind == "float")
)


def params_cases() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field, value in (
        ("min_p", 10**400),
        ("min_p", True),
        ("presence_penalty", -(10**400)),
        ("frequency_penalty", 10**400),
        ("repetition_penalty", 10**400),
        ("logit_bias", {1: 10**400}),
        ("logit_bias", {1: True}),
        # Every float field of the core's registry (the new ones escaped as OverflowError).
        *((f, 10**400) for f in REGISTRY_FLOATS),
    ):
        sp = SamplingParams(extra_args={"logitsproc_rs": {field: value}})
        key = f"{field}={str(value)[:12]}"
        # The front end: a RequestError naming the field (vLLM then refuses the request).
        try:
            v2.MinPLogitsProcessor.validate_params(sp)
            out[f"validate_params[{key}]"] = {"raised": None}
        except BaseException as e:
            out[f"validate_params[{key}]"] = described(e)

        # The worker: failed closed (no raise), the other requests untouched.
        def bad(w: World, sp: Any = sp) -> None:
            slot = w.rs.add_request([1], [])
            h.add_to_sampler(w.procs, w.needs, slot, sp)
            w.rs.remove_request(slot)

        res = case(bad)
        out[f"add_request[{key}]"] = res
    for exc in (KeyboardInterrupt, SystemExit):

        def interrupted(w: World, exc: type[BaseException] = exc) -> None:
            # A slot whose request the engine has finished (processors are never told).
            w.procs[0].add_request(w.slots[0], Temperature(exc))

        out[f"interrupt[{exc.__name__}]"] = case(interrupted)
    return out


# Only the processors the World's requests use: the fields of the others are refused.
FEW = [
    f"logitsproc_rs.vllm.v2:{c.__name__}"
    for c in (v2.MinPLogitsProcessor, v2.LogitBiasLogitsProcessor, v2.PenaltiesLogitsProcessor)
]
UNBUILT = [
    ("no_repeat_ngram_size", 2),
    ("dry_multiplier", 0.8),
    ("xtc_probability", 0.5),
    ("min_tokens", 3),
    ("allowed_token_ids", [1, 2]),
]
TUNING_ONLY = [("dry_base", 2.0), ("xtc_threshold", 0.3)]


def unbuilt_cases() -> dict[str, Any]:
    """Namespaced fields of processors the runner did not load: failed closed and logged."""
    out: dict[str, Any] = {}
    for field, value in UNBUILT + TUNING_ONLY:
        sp = SamplingParams(extra_args={"logitsproc_rs": {field: value}})
        world = World(FEW)
        error = None
        with log_records.only_errors() as logged:
            try:
                slot = world.rs.add_request([1], [])
                h.add_to_sampler(world.procs, world.needs, slot, sp)
            except BaseException as e:
                error = e
        r = described(error)
        r["forced"] = sorted(int(k) for k in world.group.forced.rows)
        r["slot"] = slot
        r["logged"] = logged.messages
        out[f"unbuilt[{field}]"] = r
    return out


def main() -> None:
    logging.getLogger("logitsproc_rs").setLevel(logging.CRITICAL)  # failed-closed requests
    h.v1_package(real=False)
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    out: dict[str, Any] = {}
    if which in ("all", "slots"):
        out.update(slot_cases())
    if which in ("all", "params"):
        out.update(params_cases())
        out.update(unbuilt_cases())
    h.report(out)


if __name__ == "__main__":
    main()

"""The demo's timing: each processor's ``update_state`` and ``apply``, and each sampler call.

``update_state`` is timed around each call by the loop that makes it (``update_all``, vLLM's
per-processor loop). ``apply`` is called by the sampler, so each sampler is given its own
container of ``TimedProcessor`` wrappers: each forwards to one processor and records the time
of its ``apply`` calls. The processors, their classes and the samplers are left unchanged.

On CUDA the demo (not the library) synchronises before and after each timed region, so the
time covers the kernels it queued, not those of the work before or after it.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import torch

from ..interface import BatchUpdate, LogitsProcessor
from ..reference import ReferenceProcessor
from ..state import LogitsProcessors

#: A processor of either side: ours or the reference's (which has its own base class).
Processor = LogitsProcessor | ReferenceProcessor

T = TypeVar("T")


@dataclasses.dataclass
class Timings:
    """Per-step samples (ns) of one side (ours or the reference)."""

    update_ns: list[int] = dataclasses.field(default_factory=list)
    sample_ns: list[int] = dataclasses.field(default_factory=list)
    # host time of each processor's update_state, by class name (``Ref`` prefix removed)
    by_proc: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    # Per sampled step (aligned lists): the processors' apply calls inside the sampler, summed;
    # the rest of the sampler (temperature, top-k/top-p, the random draw, casts); the processor
    # layer (this step's update_state + apply); the whole step (update_state + sampler).
    apply_ns: list[int] = dataclasses.field(default_factory=list)
    sampling_ns: list[int] = dataclasses.field(default_factory=list)
    layer_ns: list[int] = dataclasses.field(default_factory=list)
    step_ns: list[int] = dataclasses.field(default_factory=list)
    # each processor's apply per sampled step in which it ran, by class name
    apply_by_proc: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    # apply calls timed during the current sampler call: (name, ns)
    pending: list[tuple[str, int]] = dataclasses.field(default_factory=list)

    def sampled(self, sample_ns: int) -> None:
        """Record a sampler call of ``sample_ns`` (after this step's update_state), and split
        it into the apply calls made during it and the rest."""
        self.sample_ns.append(sample_ns)
        per: dict[str, int] = {}
        for name, ns in self.pending:
            per[name] = per.get(name, 0) + ns
        self.pending.clear()
        for name, ns in per.items():
            self.apply_by_proc.setdefault(name, []).append(ns)
        upd = self.update_ns[-1]
        self.step_ns.append(upd + sample_ns)
        apply = sum(per.values())
        self.apply_ns.append(apply)
        self.sampling_ns.append(sample_ns - apply)
        self.layer_ns.append(upd + apply)


class TimedProcessor(LogitsProcessor):
    """One processor as a sampler sees it, with each ``apply`` call timed into a
    ``Timings``' pending list under ``name``. Everything else is forwarded."""

    def __init__(self, name: str, inner: Processor, timings: Timings, sync: bool) -> None:
        self.name, self.inner, self.timings, self.sync = name, inner, timings, sync

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        out = self.inner.apply(logits)
        if self.sync:
            torch.cuda.synchronize()
        self.timings.pending.append((self.name, time.perf_counter_ns() - t0))
        return out

    def is_argmax_invariant(self) -> bool:
        return self.inner.is_argmax_invariant()

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        self.inner.update_state(batch_update)


def timed_processors(
    named: Iterable[tuple[str, Processor]], timings: Timings, sync: bool
) -> LogitsProcessors:
    """A container for a sampler: the same processors, in the same order, each ``apply``
    timed (``update_state`` goes to the processors themselves, through ``update_all``)."""
    return LogitsProcessors(TimedProcessor(name, p, timings, sync) for name, p in named)


def update_all(
    named: Sequence[tuple[str, Processor]],
    update: BatchUpdate | None,
    timings: Timings,
    sync: bool,
) -> None:
    """Every processor's update_state, vLLM's loop, timed one by one (host time) and as a
    whole (with a device synchronisation before and after on CUDA)."""
    if sync:
        torch.cuda.synchronize()
    per_proc = []
    t0 = time.perf_counter_ns()
    for _, p in named:
        t1 = time.perf_counter_ns()
        p.update_state(update)
        per_proc.append(time.perf_counter_ns() - t1)
    if sync:
        torch.cuda.synchronize()
    timings.update_ns.append(time.perf_counter_ns() - t0)
    for (name, _), ns in zip(named, per_proc, strict=True):
        timings.by_proc.setdefault(name, []).append(ns)


def timed_call(sync: bool, fn: Callable[..., T], *args: Any) -> tuple[T, int]:
    """Run ``fn`` and return (result, ns), synchronised before and after on CUDA."""
    if sync:
        torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    out = fn(*args)
    if sync:
        torch.cuda.synchronize()
    return out, time.perf_counter_ns() - t0


def median_p90_us(ns: Sequence[int]) -> tuple[float, float]:
    """(median, p90) in µs; nan for no samples."""
    if not ns:
        return math.nan, math.nan
    us = sorted(x / 1000 for x in ns)
    p90 = us[min(len(us) - 1, math.ceil(0.9 * len(us)) - 1)]
    return statistics.median(us), p90

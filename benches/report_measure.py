"""The measuring behind ``benches/report.py``: each section's variants run side by side under
the same churn, every step, into per-step samples (``Samples``, ns) collected in one
``Measurements``.

Sections 1 and 2 (``bench_pipeline_update``, ``bench_unchanged``): the whole pipeline's
``update_state``, ours three ways (loop, one call, token feed) vs the reference, and an
unchanged step. Sections 3 and 4 (``bench_trio_update``, ``bench_trio_apply``): MinTokens +
LogitBias + MinP vs the reference, vLLM 0.25.1 transcribed (``bench_python.py``) and the
installed vLLM (``InstalledVllmTrio``). The variants run in a rotating order each step
(``rotated``); each call is timed with ``perf_counter_ns``, synchronised on CUDA (``Clock``).
A variant the installed library or vLLM cannot run gets a note instead of samples.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import bench_python
import torch

from logitsproc_rs import EngineConfig, LogitsProcessors, build_logitsprocs
from logitsproc_rs.demo.workload import (
    THINK_END,
    THINK_START,
    make_params_factory,
    processor_features,
)
from logitsproc_rs.reference import build_reference_logitsprocs
from logitsproc_rs.simulate import ChurnSimulator, Request

NA = "n/a"


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def median_us(ns: Sequence[int] | None) -> float:
    """Median in µs (nan when there is nothing)."""
    return statistics.median(ns) / 1000 if ns else math.nan


def p90_us(ns: Sequence[int] | None) -> float:
    """90th percentile in µs (nan when there is nothing)."""
    if not ns:
        return math.nan
    us = sorted(x / 1000 for x in ns)
    return us[min(len(us) - 1, math.ceil(0.9 * len(us)) - 1)]


class Clock:
    """``perf_counter_ns`` around a call; on CUDA synchronised before and after."""

    def __init__(self, device: torch.device) -> None:
        self.sync = torch.cuda.synchronize if device.type == "cuda" else None

    def __call__(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> int:
        if self.sync:
            self.sync()
        t0 = time.perf_counter_ns()
        fn(*args, **kw)
        if self.sync:
            self.sync()
        return time.perf_counter_ns() - t0


def rotated(tasks: list[Any], step: int) -> list[Any]:
    """The variants in a different order each step, so none is always the first to run after
    the simulator (cold caches) or the last."""
    k = step % len(tasks)
    return tasks[k:] + tasks[:k]


def loop_update(procs: LogitsProcessors, update: Any) -> None:
    """vLLM's way: every processor's ``update_state``, one by one."""
    for p in procs.all:
        p.update_state(update)


def uploaded(procs: LogitsProcessors | None) -> int | None:
    if procs is None:
        return None
    v = getattr(procs, "bytes_uploaded_last_step", None)
    return int(v) if isinstance(v, int | float) else None


def last_tokens(before: Sequence[Request], lens: Sequence[int]) -> torch.Tensor:
    """What the sampler returned last step, by the rows of that step (before this step's
    update), on the host: the token each of those requests got, -1 for none."""
    toks = [
        r.output_token_ids[n] if len(r.output_token_ids) > n else -1
        for r, n in zip(before, lens, strict=True)
    ]
    return torch.tensor(toks, dtype=torch.int64)


# --- vLLM, installed ----------------------------------------------------------------------------


VLLM_V1_DIR = Path(
    os.environ.get("LOGITSPROC_VLLM_V1_DIR", Path.home() / ".cache/logitsproc_rs/vllm-0.25.1")
)


def import_vllm() -> tuple[Any, str]:
    """(the modules we need, a line for the report); (None, why) when not importable. Where
    vLLM itself is not installed, the copy ``make extras`` puts in its own folder is used (it
    is vLLM 0.25.1's wheel, without its dependencies: its logits-processor modules import)."""
    if importlib.util.find_spec("vllm") is None and VLLM_V1_DIR.is_dir():
        sys.path.append(str(VLLM_V1_DIR))
    try:
        import vllm  # noqa: F401
        from vllm.v1.sample.logits_processor import builtin, interface
    except Exception as e:  # anything: a broken install must not stop the bench
        return None, f"not importable ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    version = getattr(sys.modules["vllm"], "__version__", "?")
    if not torch.cuda.is_available():
        # vLLM's CUDA wheel without a GPU takes pinned memory as available (an unspecified
        # platform says so) and its built-ins' host-to-device helper fails; turn it off, as
        # vLLM's own CPU platform does.
        with contextlib.suppress(Exception):
            import vllm.utils.torch_utils as torch_utils

            torch_utils.PIN_MEMORY = False
    return SimpleNamespace(builtin=builtin, interface=interface), f"vllm {version} importable"


class InstalledVllmTrio:
    """vLLM's own MinTokens, LogitBias, MinP (from the installed package), fed vLLM's own
    ``BatchUpdate`` (converted from ours outside the timed region: vLLM compares move
    directions with its own enum)."""

    def __init__(self, mods: Any, max_num_seqs: int, device: torch.device) -> None:
        b = mods.builtin
        cfg = SimpleNamespace(
            scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
            speculative_config=None,
        )
        pin = device.type == "cuda"
        self.iface = mods.interface
        self.min_p = b.MinPLogitsProcessor(cfg, device, pin)
        self.procs = [
            b.MinTokensLogitsProcessor(cfg, device, pin),
            b.LogitBiasLogitsProcessor(cfg, device, pin),
            self.min_p,
        ]

    def convert(self, update: Any) -> Any:
        if update is None:
            return None
        md = self.iface.MoveDirectionality
        return self.iface.BatchUpdate(
            batch_size=update.batch_size,
            removed=list(update.removed),
            added=list(update.added),
            moved=[(a, b, md[d.name]) for a, b, d in update.moved],
        )

    def update_state(self, vllm_update: Any) -> None:
        for p in (self.min_p, *self.procs[:2]):  # argmax-invariant first, as vLLM
            p.update_state(vllm_update)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for p in self.procs:
            logits = p.apply(logits)
        return logits


# --- results ------------------------------------------------------------------------------------


@dataclass
class Samples:
    """Per-step samples (ns) of one variant at one batch size; ``note`` when it could not run."""

    ns: list[int] = field(default_factory=list)
    note: str | None = None

    def add(self, ns: int, measured: bool) -> None:
        if measured:
            self.ns.append(ns)


@dataclass
class Measurements:
    """Everything the report's sections measured, by section and batch size, and the reasons
    cells say n/a (numbered in the report)."""

    pipe: dict[int, dict[str, Samples]] = field(default_factory=dict)
    pipe_agree: dict[int, str] = field(default_factory=dict)
    pipe_bytes: dict[int, str] = field(default_factory=dict)
    unchanged: dict[str, Samples] = field(default_factory=dict)
    unchanged_bytes: dict[str, str] = field(default_factory=dict)
    unchanged_b: int = 0
    trio_up: dict[int, dict[str, Samples]] = field(default_factory=dict)
    trio_apply: dict[int, dict[str, Samples]] = field(default_factory=dict)
    trio_apply_rows: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def na(self, reason: str) -> str:
        """An ``n/a [k]`` cell whose reason is listed under the targets."""
        if reason not in self.notes:
            self.notes.append(reason)
        return f"{NA} [{self.notes.index(reason) + 1}]"


# --- 1 and 2: the whole pipeline ----------------------------------------------------------------

PIPE_KEYS = ("loop", "call", "feed", "ref")


def pipeline_cfg(b: int, vocab: int) -> EngineConfig:
    return EngineConfig(
        max_num_seqs=b,
        vocab_size=vocab,
        reasoning_start_token_ids=THINK_START,
        reasoning_end_token_ids=THINK_END,
    )


def build_token_feed(
    res: Measurements, cfg: EngineConfig, dev: torch.device
) -> tuple[Any, str | None]:
    try:
        return build_logitsprocs(cfg, dev, dev.type == "cuda", token_feed=True), None
    except TypeError as e:
        return None, res.na(f"`build_logitsprocs(..., token_feed=True)` raised TypeError: {e}")


def bench_pipeline_update(
    res: Measurements,
    bs: Sequence[int],
    vocab: int,
    warm: int,
    steps: int,
    unchanged_b: int,
    unchanged_reps: int,
    dev: torch.device,
) -> None:
    clock = Clock(dev)
    pin = dev.type == "cuda"
    for b in bs:
        progress(f"  whole pipeline update_state, B={b}")
        cfg = pipeline_cfg(b, vocab)
        p_loop = build_logitsprocs(cfg, dev, pin)
        p_call = build_logitsprocs(cfg, dev, pin)
        call = p_call.update_state
        p_feed, feed_note = build_token_feed(res, cfg, dev)
        feed = p_feed.update_state if p_feed is not None else None
        ref = build_reference_logitsprocs(cfg, dev)
        features = processor_features(p_loop) & processor_features(ref)
        sim = ChurnSimulator(
            b,
            vocab,
            11,
            make_params_factory(vocab, features),
            finish_prob=bench_python.FINISH_PROB,
            max_tokens=bench_python.NEVER,
        )
        runs = {k: Samples() for k in PIPE_KEYS}
        runs["feed"].note = feed_note
        step_bytes: list[int] = []
        for step in range(warm + steps):
            before = sim.batch.rows()
            lens = [len(r.output_token_ids) for r in before]
            update = sim.step()
            rows = sim.batch.rows()
            m = step >= warm
            tasks: list[tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = [
                ("loop", loop_update, (p_loop, update), {}),
                ("call", call, (update,), {}),
            ]
            if feed is not None:
                toks = last_tokens(before, lens)
                tasks.append(("feed", feed, (update,), {"sampled_token_ids": toks}))
            tasks.append(("ref", loop_update, (ref, update), {}))
            for key, fn, a, kw in rotated(tasks, step):
                try:
                    runs[key].add(clock(fn, *a, **kw), m)
                except TypeError as e:
                    if key != "feed":
                        raise
                    runs["feed"].note = res.na(
                        f"`procs.update_state(update, sampled_token_ids=...)` raised TypeError: {e}"
                    )
                    feed = None
                if key == "call" and m and (nb := uploaded(p_call)) is not None:
                    step_bytes.append(nb)
        res.pipe[b] = runs
        res.pipe_bytes[b] = f"{statistics.median(step_bytes):,.0f}" if step_bytes else NA
        res.pipe_agree[b] = pipeline_agreement(
            p_loop, p_call, p_feed if feed else None, ref, len(rows), vocab, dev
        )
        if b == unchanged_b:
            progress(f"  unchanged step, B={b}")
            bench_unchanged(
                res,
                p_loop,
                p_call,
                p_feed if feed else None,
                ref,
                rows,
                dev,
                unchanged_reps,
            )
            res.unchanged_b = b
            for k, r in res.unchanged.items():
                if k in ("call", "feed") and runs[k].note and not r.ns:
                    r.note = runs[k].note


def pipeline_agreement(
    p_loop: LogitsProcessors,
    p_call: LogitsProcessors | None,
    p_feed: LogitsProcessors | None,
    ref: LogitsProcessors,
    b: int,
    vocab: int,
    dev: torch.device,
) -> str:
    """Apply every processor of each pipeline to the same ``b`` x ``vocab`` logits (``b`` =
    the live rows, after the last step): whether the one-call and token-feed pipelines give
    exactly the loop's logits, and how far the loop agrees with the reference (MinP's
    logit-space test differs from the reference's softmax test only at float ties)."""
    g = torch.Generator(device=dev).manual_seed(b)
    x = torch.randn(b, vocab, generator=g, device=dev).mul_(3.0)
    base = bench_python.apply_all(p_loop, x.clone())
    out = []
    for name, p in (("one call", p_call), ("token feed", p_feed)):
        if p is None:
            continue
        same = torch.equal(base, bench_python.apply_all(p, x.clone()))
        out.append(f"{name} {'=' if same else '≠'} loop")
    ref_out = bench_python.apply_all(ref, x.clone())
    agree = (base == ref_out) | (base.isnan() & ref_out.isnan())
    frac = agree.double().mean().item()
    out.append("loop = reference" if frac == 1.0 else f"loop ≈ reference ({frac:.4%})")
    return "; ".join(out)


def bench_unchanged(
    res: Measurements,
    p_loop: LogitsProcessors,
    p_call: LogitsProcessors | None,
    p_feed: LogitsProcessors | None,
    ref: LogitsProcessors,
    rows: Sequence[Request],
    dev: torch.device,
    reps: int,
) -> None:
    """The same batch again: update None, no list grows, the token feed all -1."""
    clock = Clock(dev)
    runs = {k: Samples() for k in PIPE_KEYS}
    call = p_call.update_state if p_call is not None else None
    feed = p_feed.update_state if p_feed is not None else None
    none_tokens = torch.full((len(rows),), -1, dtype=torch.int64)  # host, as the API wants
    for i in range(reps + 20):
        m = i >= 20
        runs["loop"].add(clock(loop_update, p_loop, None), m)
        if call is not None:
            runs["call"].add(clock(call, None), m)
        if feed is not None:
            runs["feed"].add(clock(feed, None, sampled_token_ids=none_tokens), m)
        runs["ref"].add(clock(loop_update, ref, None), m)
    res.unchanged = runs
    for k, p in (("call", p_call), ("feed", p_feed)):
        nb = uploaded(p)
        res.unchanged_bytes[k] = f"{nb:,}" if nb is not None else NA


# --- 3 and 4: the trio ---------------------------------------------------------------------------

TRIO_KEYS = ("loop", "call", "ref", "vllm", "vllm_pkg")


def bench_trio_update(
    res: Measurements,
    bs: Sequence[int],
    vocab: int,
    warm: int,
    steps: int,
    dev: torch.device,
    vllm_mods: Any,
) -> None:
    clock = Clock(dev)
    for b in bs:
        progress(f"  trio update_state, B={b}")
        cfg = EngineConfig(max_num_seqs=b, vocab_size=vocab)
        ours, ref = bench_python.trio(cfg, dev)
        # One call is one pipeline for the three: what build_logitsprocs gives vLLM's list.
        ours2 = build_logitsprocs(cfg, dev, dev.type == "cuda", sampler_transforms=False)
        vllm = bench_python.VllmTrio(b, dev)
        runs = {k: Samples() for k in TRIO_KEYS}
        pkg = None
        if vllm_mods is None:
            runs["vllm_pkg"].note = "not importable"
        else:
            try:
                pkg = InstalledVllmTrio(vllm_mods, b, dev)
            except Exception as e:
                runs["vllm_pkg"].note = res.na(f"vLLM's built-ins failed: {type(e).__name__}: {e}")
        sim = bench_python.churn(b, vocab, 1, bench_python.trio_params(vocab))
        for step in range(warm + steps):
            update = sim.step()
            m = step >= warm
            tasks: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = [
                ("loop", loop_update, (ours, update)),
                ("ref", loop_update, (ref, update)),
                ("vllm", vllm.update_state, (update,)),
                ("call", ours2.update_state, (update,)),
            ]
            if pkg is not None:
                tasks.append(("vllm_pkg", pkg.update_state, (pkg.convert(update),)))
            for key, fn, a in rotated(tasks, step):
                try:
                    runs[key].add(clock(fn, *a), m)
                except Exception as e:
                    if key != "vllm_pkg":
                        raise
                    runs[key].note = res.na(f"vLLM's built-ins failed: {type(e).__name__}: {e}")
                    pkg = None
        res.trio_up[b] = runs


def bench_trio_apply(
    res: Measurements,
    bs: Sequence[int],
    vocab: int,
    warm: int,
    steps_at_256: int,
    dev: torch.device,
    vllm_mods: Any,
) -> None:
    clock = Clock(dev)
    for b in bs:
        steps = max(4, steps_at_256 * 256 // b) if dev.type == "cpu" else steps_at_256
        progress(f"  trio apply, B={b}, V={vocab}, {steps} steps")
        cfg = EngineConfig(max_num_seqs=b, vocab_size=vocab)
        ours, ref = bench_python.trio(cfg, dev)
        vllm = bench_python.VllmTrio(b, dev)
        pkg = None
        runs = {k: Samples() for k in ("ours", "ref", "vllm", "vllm_pkg")}
        if vllm_mods is None:
            runs["vllm_pkg"].note = "not importable"
        else:
            try:
                pkg = InstalledVllmTrio(vllm_mods, b, dev)
            except Exception as e:
                runs["vllm_pkg"].note = res.na(f"vLLM's built-ins failed: {type(e).__name__}: {e}")
        sim = bench_python.churn(b, vocab, 2, bench_python.trio_params(vocab))
        g = torch.Generator(device=dev).manual_seed(2)
        min_p_rows = []
        for step in range(warm + steps):
            update = sim.step()
            updaters: list[Any] = [*ours.all, *ref.all, vllm]
            for p in updaters:
                p.update_state(update)
            if pkg is not None:
                pkg.update_state(pkg.convert(update))
            n = sim.batch.num_reqs
            if step < warm - 1 or n == 0:  # the last warm-up step runs the applies once
                continue
            m = step >= warm
            x = torch.randn(n, vocab, generator=g, device=dev).mul_(3.0)
            tasks: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = [
                ("ours", bench_python.apply_all, (ours,)),
                ("ref", bench_python.apply_all, (ref,)),
                ("vllm", vllm.apply, ()),
            ]
            if pkg is not None:
                tasks.append(("vllm_pkg", pkg.apply, ()))
            for key, fn, a in rotated(tasks, step):
                y = x.clone()
                try:
                    runs[key].add(clock(fn, *a, y), m)
                except Exception as e:
                    if key != "vllm_pkg":
                        raise
                    runs[key].note = res.na(f"vLLM's built-ins failed: {type(e).__name__}: {e}")
                    pkg = None
            if m:
                min_p_rows.append(vllm.min_p.min_p_count)
        res.trio_apply[b] = runs
        res.trio_apply_rows[b] = f"{statistics.median(min_p_rows):.0f}" if min_p_rows else NA


def run_appendix(dev: torch.device) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        bench_python.bench_penalties(256, (32000,), (16, 256, 1024, 4096), 3, 6, dev)
        bench_python.bench_pipeline(256, (32000,), 20, 3, dev)
    return buf.getvalue()

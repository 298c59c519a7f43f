"""``make bench-python``: per-step cost of ``update_state`` and ``apply`` against batch size,
ours vs the plain reference and vLLM 0.25.1's built-ins, written to ``bench-report.md`` and
``bench-report.png`` at the repository root.

Sections of the report (all times per engine step, µs, median (p90) over the measured steps;
every ratio is a ratio of medians from the same run):

1. the whole pipeline's ``update_state`` (every processor ``build_logitsprocs`` builds, the
   demo's parameter mix), B = 32 … 1,024: ours three ways (vLLM's per-processor loop, the
   container's single ``procs.update_state(update)`` call, and the token feed: the container call
   given the last sampled token of every row instead of reading the output lists) vs the
   reference;
2. an unchanged step (``update`` None, no new tokens) and ``procs.bytes_uploaded_last_step``;
3. MinTokens + LogitBias + MinP ``update_state`` vs the reference and vLLM 0.25.1 (its built-ins
   transcribed in ``bench_python.py``; also the installed ``vllm`` package when importable);
4. the apply of that trio at V = 32,000;

then the targets, a plot of 1, 3 and 4, and (unless ``--no-appendix``) the text of
``bench_python.py --quick`` sections (c) penalties and (d) full sampler.

The container call and the token feed are new API; where the installed library lacks them the
report says "n/a" instead of failing.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import io
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_python as bp
import floor

from logitsproc_rs import EngineConfig, LogitsProcessors, build_logitsprocs
from logitsproc_rs.__main__ import (
    THINK_END,
    THINK_START,
    make_params_factory,
    processor_features,
)
from logitsproc_rs.reference import build_reference_logitsprocs
from logitsproc_rs.simulate import ChurnSimulator, Request

ROOT = Path(__file__).resolve().parents[1]
NA = "n/a"
NOTES: list[str] = []  # why a cell says n/a, numbered in the report


def na(reason: str) -> str:
    """An ``n/a [k]`` cell whose reason is listed under the targets."""
    if reason not in NOTES:
        NOTES.append(reason)
    return f"{NA} [{NOTES.index(reason) + 1}]"


# Targets (host time per step).
T_PIPE_LIST_256 = 10.0  # µs, whole pipeline update_state at B=256, list feed
T_PIPE_FEED_256 = 8.0  # µs, the same with the token feed
T_SCALE_1024 = 4.0  # B=1024 figure <= 4x the B=256 figure
T_TRIO_VS_VLLM = 40.0  # trio update_state: vLLM's three / ours >= 40x
T_UNCHANGED = 1.0  # µs, unchanged step


# --- small helpers ----------------------------------------------------------------------------


def med(ns: Sequence[int] | None) -> float:
    """Median in µs (nan when there is nothing)."""
    return statistics.median(ns) / 1000 if ns else math.nan


def p90(ns: Sequence[int] | None) -> float:
    if not ns:
        return math.nan
    us = sorted(x / 1000 for x in ns)
    return us[min(len(us) - 1, math.ceil(0.9 * len(us)) - 1)]


def fus(us: float) -> str:
    if math.isnan(us):
        return NA
    if us >= 1000:
        return f"{us:,.0f}"
    return f"{us:.1f}" if us >= 10 else f"{us:.2f}"


def cell(ns: Sequence[int] | None) -> str:
    """``median (p90)`` in µs, or n/a."""
    if not ns:
        return NA
    return f"{fus(med(ns))} ({fus(p90(ns))})"


def rat(base: Sequence[int] | None, ours: Sequence[int] | None) -> str:
    if not base or not ours or med(ours) <= 0:
        return NA
    return f"{med(base) / med(ours):,.1f}×"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    align = ["---", *("---:" for _ in header[1:])]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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


def env_line(device: torch.device) -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    dev = str(device)
    if device.type == "cuda":
        dev += f" ({torch.cuda.get_device_name(device)})"
    commit = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        if dirty:
            commit += " + uncommitted changes"
    return (
        f"device {dev}; torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s); "
        f"{os.cpu_count()} cores ({cpu}); Python {platform.python_version()}; commit {commit}"
    )


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
class Run:
    """Per-step samples (ns) of one variant at one batch size; ``note`` when it could not run."""

    ns: list[int] = field(default_factory=list)
    note: str | None = None

    def add(self, ns: int, measured: bool) -> None:
        if measured:
            self.ns.append(ns)

    def cell(self) -> str:
        return cell(self.ns) if self.ns else (self.note or NA)


@dataclass
class Results:
    pipe: dict[int, dict[str, Run]] = field(default_factory=dict)
    pipe_agree: dict[int, str] = field(default_factory=dict)
    pipe_bytes: dict[int, str] = field(default_factory=dict)
    unchanged: dict[str, Run] = field(default_factory=dict)
    unchanged_bytes: dict[str, str] = field(default_factory=dict)
    unchanged_b: int = 0
    trio_up: dict[int, dict[str, Run]] = field(default_factory=dict)
    trio_apply: dict[int, dict[str, Run]] = field(default_factory=dict)
    trio_apply_rows: dict[int, str] = field(default_factory=dict)


# --- 1 and 2: the whole pipeline ----------------------------------------------------------------

PIPE_KEYS = ("loop", "call", "feed", "ref")


def pipeline_cfg(b: int, vocab: int) -> EngineConfig:
    return EngineConfig(
        max_num_seqs=b,
        vocab_size=vocab,
        reasoning_start_token_ids=THINK_START,
        reasoning_end_token_ids=THINK_END,
    )


def build_token_feed(cfg: EngineConfig, dev: torch.device) -> tuple[Any, str | None]:
    try:
        return build_logitsprocs(cfg, dev, dev.type == "cuda", token_feed=True), None
    except TypeError as e:
        return None, na(f"`build_logitsprocs(..., token_feed=True)` raised TypeError: {e}")


def bench_pipeline_update(
    res: Results,
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
        p_feed, feed_note = build_token_feed(cfg, dev)
        feed = p_feed.update_state if p_feed is not None else None
        ref = build_reference_logitsprocs(cfg, dev)
        features = processor_features(p_loop) & processor_features(ref)
        sim = ChurnSimulator(
            b,
            vocab,
            11,
            make_params_factory(vocab, features),
            finish_prob=bp.FINISH_PROB,
            max_tokens=bp.NEVER,
        )
        runs = {k: Run() for k in PIPE_KEYS}
        runs["feed"].note = feed_note
        step_bytes: list[int] = []
        for step in range(warm + steps):
            before = sim.batch.rows()
            lens = [len(r.output_token_ids) for r in before]
            update = sim.step()
            rows = sim.batch.rows()
            m = step >= warm
            tasks: list[tuple[str, Callable[..., Any], tuple, dict]] = [
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
                    runs["feed"].note = na(
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
    base = bp.apply_all(p_loop, x.clone())
    out = []
    for name, p in (("one call", p_call), ("token feed", p_feed)):
        if p is None:
            continue
        same = torch.equal(base, bp.apply_all(p, x.clone()))
        out.append(f"{name} {'=' if same else '≠'} loop")
    ref_out = bp.apply_all(ref, x.clone())
    agree = (base == ref_out) | (base.isnan() & ref_out.isnan())
    frac = agree.double().mean().item()
    out.append("loop = reference" if frac == 1.0 else f"loop ≈ reference ({frac:.4%})")
    return "; ".join(out)


def bench_unchanged(
    res: Results,
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
    runs = {k: Run() for k in PIPE_KEYS}
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
    res: Results,
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
        ours, ref = bp.trio(cfg, dev)
        ours2, _ = bp.trio(cfg, dev)
        vllm = bp.VllmTrio(b, dev)
        runs = {k: Run() for k in TRIO_KEYS}
        pkg = None
        if vllm_mods is None:
            runs["vllm_pkg"].note = "not importable"
        else:
            try:
                pkg = InstalledVllmTrio(vllm_mods, b, dev)
            except Exception as e:
                runs["vllm_pkg"].note = na(f"vLLM's built-ins failed: {type(e).__name__}: {e}")
        sim = bp.churn(b, vocab, 1, bp.trio_params(vocab))
        for step in range(warm + steps):
            update = sim.step()
            m = step >= warm
            tasks: list[tuple[str, Callable[..., Any], tuple]] = [
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
                    runs[key].note = na(f"vLLM's built-ins failed: {type(e).__name__}: {e}")
                    pkg = None
        res.trio_up[b] = runs


def bench_trio_apply(
    res: Results,
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
        ours, ref = bp.trio(cfg, dev)
        vllm = bp.VllmTrio(b, dev)
        pkg = None
        runs = {k: Run() for k in ("ours", "ref", "vllm", "vllm_pkg")}
        if vllm_mods is None:
            runs["vllm_pkg"].note = "not importable"
        else:
            try:
                pkg = InstalledVllmTrio(vllm_mods, b, dev)
            except Exception as e:
                runs["vllm_pkg"].note = na(f"vLLM's built-ins failed: {type(e).__name__}: {e}")
        sim = bp.churn(b, vocab, 2, bp.trio_params(vocab))
        g = torch.Generator(device=dev).manual_seed(2)
        min_p_rows = []
        for step in range(warm + steps):
            update = sim.step()
            for p in (*ours.all, *ref.all, vllm):
                p.update_state(update)
            if pkg is not None:
                pkg.update_state(pkg.convert(update))
            n = sim.batch.num_reqs
            if step < warm - 1 or n == 0:  # the last warm-up step runs the applies once
                continue
            m = step >= warm
            x = torch.randn(n, vocab, generator=g, device=dev).mul_(3.0)
            tasks: list[tuple[str, Callable[..., Any], tuple]] = [
                ("ours", bp.apply_all, (ours,)),
                ("ref", bp.apply_all, (ref,)),
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
                    runs[key].note = na(f"vLLM's built-ins failed: {type(e).__name__}: {e}")
                    pkg = None
            if m:
                min_p_rows.append(vllm.min_p.min_p_count)
        res.trio_apply[b] = runs
        res.trio_apply_rows[b] = f"{statistics.median(min_p_rows):.0f}" if min_p_rows else NA


# --- the report ----------------------------------------------------------------------------------


def best_ours(runs: dict[str, Run]) -> tuple[str, Run]:
    """The container call when the library has it, else the loop (list feed)."""
    if runs["call"].ns:
        return "one call", runs["call"]
    return "loop", runs["loop"]


def status(ok: bool | None) -> str:
    return NA if ok is None else ("met" if ok else "**not met**")


def targets(res: Results) -> list[list[str]]:
    rows: list[list[str]] = []
    p256, p1024 = res.pipe.get(256), res.pipe.get(1024)
    if p256:
        label, r = best_ours(p256)
        v = med(r.ns)
        rows.append(
            [
                f"whole pipeline update_state, B=256, list feed ({label})",
                f"≤ {T_PIPE_LIST_256:g} µs",
                fus(v),
                status(v <= T_PIPE_LIST_256 if r.ns else None),
            ]
        )
        f = p256["feed"]
        v = med(f.ns)
        rows.append(
            [
                "whole pipeline update_state, B=256, token feed",
                f"≤ {T_PIPE_FEED_256:g} µs",
                fus(v) if f.ns else (f.note or NA),
                status(v <= T_PIPE_FEED_256 if f.ns else None),
            ]
        )
        if p1024:
            for key, label in (("loop", "loop"), ("call", "one call"), ("feed", "token feed")):
                a, c = p256[key].ns, p1024[key].ns
                if not (a and c) and key == "loop" and p256["call"].ns:
                    continue
                x = med(c) / med(a) if a and c else math.nan
                rows.append(
                    [
                        f"B=1024 vs B=256, whole pipeline, {label}",
                        f"≤ {T_SCALE_1024:g}×",
                        f"{x:.2f}× ({fus(med(c))} / {fus(med(a))} µs)"
                        if a and c
                        else (p256[key].note or NA),
                        status(x <= T_SCALE_1024 if a and c else None),
                    ]
                )
    t256 = res.trio_up.get(256)
    if t256:
        label, r = best_ours(t256)
        for key, name in (("vllm", "transcribed"), ("vllm_pkg", "installed")):
            base = t256[key]
            x = med(base.ns) / med(r.ns) if base.ns and r.ns else math.nan
            rows.append(
                [
                    f"trio update_state, B=256: vLLM 0.25.1 ({name}) / ours ({label})",
                    f"≥ {T_TRIO_VS_VLLM:g}×",
                    f"{x:,.1f}×" if base.ns and r.ns else (base.note or NA),
                    status(x >= T_TRIO_VS_VLLM if base.ns and r.ns else None),
                ]
            )
    if res.unchanged:
        for key, label in (("loop", "loop"), ("call", "one call"), ("feed", "token feed")):
            r = res.unchanged[key]
            v = med(r.ns)
            rows.append(
                [
                    f"unchanged step, B={res.unchanged_b}, {label}",
                    f"≤ {T_UNCHANGED:g} µs",
                    fus(v) if r.ns else (r.note or NA),
                    status(v <= T_UNCHANGED if r.ns else None),
                ]
            )
    return rows


def write_report(
    res: Results,
    args: argparse.Namespace,
    dev: torch.device,
    vllm_line: str,
    plot_line: str,
    appendix: str | None,
    elapsed: float,
    cfg: dict[str, Any],
) -> str:
    md: list[str] = []
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    md.append("# logitsproc_rs benchmark report\n")
    md.append(
        f"Generated by `make bench-python` (`benches/report.py{' --quick' if args.quick else ''}`)"
        f" on {now} in {elapsed:.0f} s. {env_line(dev)}.\n"
    )
    md.append(
        "All figures are host wall time per engine step in µs, **median (p90)** over the "
        "measured steps after a warm-up; every ratio is a ratio of medians measured in this run. "
        "Churn: `ChurnSimulator`, about 1 in 64 requests finishing per step "
        "(finish_prob = 1/64, max_tokens never reached), arrivals refilling toward the full "
        "batch, a few SWAPs, every live request's output list growing by one token per step. "
        + (
            "On CUDA every timed region is bracketed by `torch.cuda.synchronize()`."
            if dev.type == "cuda"
            else "On CPU there is no device copy: `apply` times are `[B, V]` passes on one "
            "core, far slower than on a GPU, and say little about GPU behaviour."
        )
        + "\n"
    )
    md.append(
        f"vLLM: {vllm_line}. The **vLLM 0.25.1 (transcribed)** columns are its built-ins "
        "(`vllm/v1/sample/logits_processor/builtin.py`) transcribed into "
        "`benches/bench_python.py` (dicts, plus index tensors rebuilt on every change, which is "
        "what vLLM pays); the **vLLM (installed)** columns run the installed package when it "
        "imports.\n"
    )
    md.append("## Targets\n")
    md.append(table(["target", "bound", "measured", "status"], targets(res)))
    if NOTES:
        md.append("")
        md.extend(f"[{i}] {n}  " for i, n in enumerate(NOTES, 1))
    md.append(
        "\n_The ≤ µs targets are GPU-machine host-time goals; on a noisy 2-core box the same "
        "code measures slower, so read a miss here together with the device._\n"
    )
    md.append(
        f"![per-step update_state and apply against batch size](bench-report.png)\n\n{plot_line}\n"
    )

    # 1
    md.append("## 1. Whole pipeline `update_state` per step\n")
    md.append(
        f"Every processor `build_logitsprocs` builds (allowed ids, bad words, MinTokens, "
        f"LogitBias, MinP, penalties, thinking budget), the demo's parameter mix, "
        f"V = {cfg['vocab']:,}, {cfg['pipe_steps']} steps after {cfg['pipe_warm']} warm-up. "
        "**loop**: `for p in procs.all: p.update_state(update)` (vLLM's way); **one call**: "
        "`procs.update_state(update)`; **token feed**: `build_logitsprocs(..., "
        "token_feed=True)` and `procs.update_state(update, sampled_token_ids=...)` with each "
        "row's token sampled last step, by the rows of that step (-1 for none); **reference**: "
        "`logitsproc_rs.reference`, loop. The agreement column applies every processor of each "
        "pipeline to the same logits after the last step.\n"
    )
    rows = []
    for b, r in res.pipe.items():
        _, best = best_ours(r)
        rows.append(
            [
                str(b),
                r["loop"].cell(),
                r["call"].cell(),
                r["feed"].cell(),
                r["ref"].cell(),
                rat(r["ref"].ns, best.ns),
                rat(r["loop"].ns, r["call"].ns),
                res.pipe_bytes.get(b, NA),
                res.pipe_agree.get(b, NA),
            ]
        )
    md.append(
        table(
            [
                "B",
                "ours, loop",
                "ours, one call",
                "ours, token feed",
                "reference",
                "reference / ours",
                "loop / one call",
                "bytes uploaded / step",
                "agreement",
            ],
            rows,
        )
    )
    md.append(
        "\n_reference / ours uses the one call when the library has it, else the loop. "
        "bytes uploaded = median of `procs.bytes_uploaded_last_step` (one-call pipeline) "
        "after each step._\n"
    )

    # 2
    if res.unchanged:
        u = res.unchanged
        md.append("## 2. Unchanged step\n")
        md.append(
            f"B = {res.unchanged_b}, the batch left by section 1: `update_state(None)` with no "
            f"output list grown (token feed: every row -1), {cfg['unchanged_reps']} repetitions.\n"
        )
        md.append(
            table(
                ["variant", "µs per step", "bytes_uploaded_last_step"],
                [
                    ["ours, loop", u["loop"].cell(), NA],
                    ["ours, one call", u["call"].cell(), res.unchanged_bytes.get("call", NA)],
                    ["ours, token feed", u["feed"].cell(), res.unchanged_bytes.get("feed", NA)],
                    ["reference", u["ref"].cell(), NA],
                ],
            )
        )
        md.append("")

    # 3
    md.append("## 3. MinTokens + LogitBias + MinP `update_state` per step\n")
    md.append(
        f"vLLM's three built-ins and ordinary traffic for them (`trio_params`), "
        f"{cfg['trio_steps']} steps after {cfg['trio_warm']} warm-up.\n"
    )
    rows = []
    for b, r in res.trio_up.items():
        _, best = best_ours(r)
        rows.append(
            [
                str(b),
                r["loop"].cell(),
                r["call"].cell(),
                r["ref"].cell(),
                r["vllm"].cell(),
                r["vllm_pkg"].cell(),
                rat(r["ref"].ns, best.ns),
                rat(r["vllm"].ns, best.ns),
                rat(r["vllm_pkg"].ns, best.ns),
            ]
        )
    md.append(
        table(
            [
                "B",
                "ours, loop",
                "ours, one call",
                "reference",
                "vLLM 0.25.1 (transcribed)",
                "vLLM (installed)",
                "reference / ours",
                "vLLM transcribed / ours",
                "vLLM installed / ours",
            ],
            rows,
        )
    )
    md.append("")

    # 4
    md.append("## 4. MinTokens + LogitBias + MinP `apply` per step\n")
    md.append(
        f"V = {cfg['vocab']:,}, fresh Gaussian logits each step (each side gets its own copy; "
        f"the copy is not timed), {cfg['apply_steps']} steps at B=256 (on CPU proportionally "
        "fewer above, more below). Ours: logit-space MinP; reference: per-row softmax MinP; vLLM: "
        "softmax → amax → mul → masked_fill over the batch.\n"
    )
    rows = []
    for b, r in res.trio_apply.items():
        rows.append(
            [
                str(b),
                res.trio_apply_rows.get(b, NA),
                r["ours"].cell(),
                r["ref"].cell(),
                r["vllm"].cell(),
                r["vllm_pkg"].cell(),
                rat(r["ref"].ns, r["ours"].ns),
                rat(r["vllm"].ns, r["ours"].ns),
                rat(r["vllm_pkg"].ns, r["ours"].ns),
            ]
        )
    md.append(
        table(
            [
                "B",
                "rows with min_p",
                "ours",
                "reference",
                "vLLM 0.25.1 (transcribed)",
                "vLLM (installed)",
                "reference / ours",
                "vLLM transcribed / ours",
                "vLLM installed / ours",
            ],
            rows,
        )
    )
    md.append("")
    if appendix is not None:
        md.append("## Appendix: `bench_python.py --quick --sections cd`\n")
        md.append(
            "Penalties (ours, incremental counts, vs vLLM 0.25.1's rebuild-from-history path) "
            "and the full `Sampler` vs `ReferenceSampler`, as printed by "
            "`benches/bench_python.py`:\n"
        )
        md.append("```text\n" + appendix.strip("\n") + "\n```\n")
    return "\n".join(md) + "\n"


def plot(res: Results, path: Path, dev: torch.device) -> str:
    """The PNG; returns a line for the report."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except Exception as e:
        return f"_(no plot: matplotlib not importable: {type(e).__name__}: {e})_"

    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))

    colors = {
        "ours, loop": "tab:blue",
        "ours": "tab:blue",
        "ours, one call": "tab:orange",
        "ours, token feed": "tab:green",
        "reference": "tab:red",
        "vLLM 0.25.1 (transcribed)": "tab:purple",
        "vLLM (installed)": "tab:brown",
    }

    ticks: dict[Any, list[int]] = {}

    def series(ax: Any, data: dict[int, dict[str, Run]], key: str, label: str, **kw: Any) -> None:
        xs = [b for b, r in data.items() if r[key].ns]
        if xs:
            ys = [med(data[b][key].ns) for b in xs]
            ax.plot(xs, ys, marker="o", label=label, color=colors.get(label), **kw)
            ticks[ax] = sorted(set(ticks.get(ax, [])) | set(xs))

    ax = axes[0]
    series(ax, res.pipe, "loop", "ours, loop")
    series(ax, res.pipe, "call", "ours, one call")
    series(ax, res.pipe, "feed", "ours, token feed")
    series(ax, res.pipe, "ref", "reference", linestyle="--")
    ax.axhline(T_PIPE_LIST_256, color="grey", linewidth=0.8, linestyle=":")
    ax.set_title("whole pipeline: update_state per step")
    ax = axes[1]
    series(ax, res.trio_up, "loop", "ours, loop")
    series(ax, res.trio_up, "call", "ours, one call")
    series(ax, res.trio_up, "ref", "reference", linestyle="--")
    series(ax, res.trio_up, "vllm", "vLLM 0.25.1 (transcribed)", linestyle="-.")
    series(ax, res.trio_up, "vllm_pkg", "vLLM (installed)", linestyle="-.")
    ax.set_title("MinTokens + LogitBias + MinP: update_state per step")
    ax = axes[2]
    series(ax, res.trio_apply, "ours", "ours")
    series(ax, res.trio_apply, "ref", "reference", linestyle="--")
    series(ax, res.trio_apply, "vllm", "vLLM 0.25.1 (transcribed)", linestyle="-.")
    series(ax, res.trio_apply, "vllm_pkg", "vLLM (installed)", linestyle="-.")
    ax.set_title("MinTokens + LogitBias + MinP: apply per step, V=32,000")
    for ax in axes:
        ax.set_xscale("log", base=2)
        if ax in ticks:
            ax.set_xticks(ticks[ax], [str(b) for b in ticks[ax]])
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_yscale("log")
        ax.set_xlabel("batch size B")
        ax.set_ylabel("µs per step (median)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"logitsproc_rs, {dev}, {torch.get_num_threads()} torch thread(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"_Medians, log-log; the dotted line is the {T_PIPE_LIST_256:g} µs target._"


def run_appendix(dev: torch.device) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        bp.bench_penalties(256, (32000,), (16, 256, 1024, 4096), 3, 6, dev)
        bp.bench_pipeline(256, (32000,), 20, 3, dev)
    return buf.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer steps and batch sizes")
    ap.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="torch device (default: cuda if available, else cpu)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default 1 on CPU, torch's default on CUDA)",
    )
    ap.add_argument("--out", default=str(ROOT / "bench-report.md"), help="the markdown report")
    ap.add_argument("--no-appendix", action="store_true", help="skip bench_python.py (c), (d)")
    ap.add_argument("--no-floor", action="store_true", help="skip section 5 (benches/floor.py)")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    elif dev.type == "cpu":
        torch.set_num_threads(1)
    out = Path(args.out)
    png = out.with_suffix(".png")
    out.parent.mkdir(parents=True, exist_ok=True)
    quick = args.quick
    vocab = 32000
    bs = (32, 256, 1024) if quick else (32, 64, 128, 256, 512, 1024)
    apply_bs = (32, 256) if quick else (32, 64, 128, 256, 512, 1024)
    cfg = {
        "vocab": vocab,
        "pipe_warm": 30 if quick else 50,
        "pipe_steps": 100 if quick else 500,
        "trio_warm": 30 if quick else 50,
        "trio_steps": 100 if quick else 1000,
        "apply_steps": 6 if quick else 32,
        "unchanged_reps": 500,
    }
    t0 = time.perf_counter()
    vllm_mods, vllm_line = import_vllm()
    res = Results()
    progress(f"bench report -> {out} ({'quick' if quick else 'full'} run, {dev})")
    bench_pipeline_update(
        res, bs, vocab, cfg["pipe_warm"], cfg["pipe_steps"], 256, cfg["unchanged_reps"], dev
    )
    bench_trio_update(res, bs, vocab, cfg["trio_warm"], cfg["trio_steps"], dev, vllm_mods)
    bench_trio_apply(res, apply_bs, vocab, 3, cfg["apply_steps"], dev, vllm_mods)
    appendix = None
    if not args.no_appendix:
        progress("  appendix: bench_python.py sections (c), (d), quick")
        appendix = run_appendix(dev)
    floor_md = None
    if not args.no_floor:
        progress("  every processor on every row vs the bandwidth floor (benches/floor.py)")
        floor_md = floor.section(dev, quick)
    plot_line = plot(res, png, dev)
    text = write_report(
        res, args, dev, vllm_line, plot_line, appendix, time.perf_counter() - t0, cfg
    )
    if floor_md is not None:
        text += "\n" + floor_md
    out.write_text(text)
    print(text)
    progress(f"wrote {out} and {png} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The demo's printing: the header, a progress bar, and the closing report (churn, per-step
costs of each side, costs by processor, agreement)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence

from .agreement import Agreement
from .timing import Timings, median_p90_us
from .workload import ChurnCounts


def fmt_us(x: float) -> str:
    if math.isnan(x):
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def median_us(ns: Sequence[int]) -> str:
    return fmt_us(median_p90_us(ns)[0])


class Progress:
    """A one-line progress bar on stderr (``\\r``-redrawn; every 10% when not a terminal)."""

    def __init__(self, total: int, width: int = 28) -> None:
        self.total, self.width = total, width
        self.tty = sys.stderr.isatty()
        self.last_draw = 0.0
        self.t0 = time.perf_counter()

    def update(self, done: int, note: str) -> None:
        now = time.perf_counter()
        final = done == self.total
        if self.tty:
            if not final and now - self.last_draw < 0.1:
                return
        elif not final and done % max(1, self.total // 10):
            return
        self.last_draw = now
        filled = self.width * done // max(1, self.total)
        bar = "#" * filled + "." * (self.width - filled)
        sys.stdout.flush()  # keep the order when both streams go to one file
        line = f"[{bar}] {done}/{self.total} steps {now - self.t0:5.1f}s  {note}"
        sys.stderr.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")
        if final and self.tty:
            sys.stderr.write("\n")
        sys.stderr.flush()


def step_note(batch: int, ours: Timings, ref: Timings) -> str:
    """The progress bar's note after a sampled step: the median sampler call of each side."""
    note = f"B={batch:<4} ours {median_us(ours.sample_ns)} µs"
    if ref.sample_ns:
        note += f"  ref {median_us(ref.sample_ns)} µs  (median sampler/step)"
    return note


def print_header(
    header: str, features: set[str], skipped: Sequence[str], use_reference: bool
) -> None:
    """What runs: the shape, the request parameters in the mix, what is left out."""
    print(header)
    print(
        "parameters: greedy and random (seeded and unseeded), temperature, top_k, top_p, "
        + ", ".join(sorted(features))
    )
    if skipped:
        print(
            f"not used: {', '.join(skipped)} (the reference has no processor for them; "
            "--no-reference to include them)"
        )
    if not use_reference:
        print("reference: off (--no-reference): timings of this library only, no agreement check")


# (label, the ``Timings`` list it summarises), in the order of the per-step table
STEP_ROWS = (
    ("update_state (all processors)", "update_ns"),
    ("apply (all processors)", "apply_ns"),
    ("= processor layer", "layer_ns"),
    ("sampling (temp/top-k/top-p/draw)", "sampling_ns"),
    ("sampler (apply + sampling)", "sample_ns"),
    ("step (update_state + sampler)", "step_ns"),
)


def print_report(
    c: ChurnCounts,
    ours: Timings,
    ref: Timings | None,
    agreement: Agreement | None,
    on_cuda: bool,
    check_every: int,
) -> None:
    """The closing report; ``ref`` and ``agreement`` are None without the reference."""
    print()
    print(
        f"churn: {c.steps} steps ({c.none_steps} without a batch change), "
        f"{c.added} requests arrived, {c.finished} finished ({c.stop_finished} on a stop "
        f"token or EOS), {c.uni_moves} condense moves, {c.swaps} swaps, "
        f"batch up to {c.max_batch}; {c.rows_sampled:,} rows sampled "
        f"({c.random_rows:,} random)"
    )
    print()
    print_step_costs(ours, ref)
    print()
    print_processor_costs(ours, ref)
    print()
    if agreement is not None:
        a = agreement
        every = "every step" if check_every == 1 else f"every {check_every} steps"
        print(
            f"agreement (checked {every}): {a.checked_steps} steps, {a.checked_rows:,} rows; "
            f"identical {a.rows_equal:,}, MinP float ties {a.tie_rows} "
            f"({a.tie_token_diffs} with a different token, allowed), mismatches {a.mismatches}"
        )
    print(f"min_tokens: {c.min_tokens_violations} stop tokens sampled before min_tokens")
    if on_cuda:
        print(
            "timings: the demo calls torch.cuda.synchronize() around each timed region; "
            "the library itself never synchronises"
        )


def print_step_costs(ours: Timings, ref: Timings | None) -> None:
    """Per step, each side's median and p90 of update_state, apply, sampling and their sums."""
    print("per step, µs                            ours                 reference        speedup")
    print("                                   median      p90      median        p90     (median)")
    for label, attr in STEP_ROWS:
        om, op = median_p90_us(getattr(ours, attr))
        if ref is not None:
            rm, rp = median_p90_us(getattr(ref, attr))
            ratio = f"{rm / om:8.1f}x" if om > 0 and not math.isnan(om + rm) else "-"
        else:
            rm = rp = math.nan
            ratio = "-"
        print(
            f"{label:<32} {fmt_us(om):>8} {fmt_us(op):>8}   {fmt_us(rm):>9} "
            f"{fmt_us(rp):>10}   {ratio:>9}"
        )
    print(
        "  update_state: every step; the rest: steps with rows to sample. processor layer =\n"
        "  update_state + the processors' apply calls inside the sampler; sampling = the rest of\n"
        "  the sampler (casts, temperature, top-k/top-p, the random draw)"
    )
    for side, t in (("ours", ours), ("reference", ref)):
        if t is None or not t.step_ns:
            continue
        layer, sampling, total = sum(t.layer_ns), sum(t.sampling_ns), sum(t.step_ns)
        if total > 0:
            print(
                f"  {side}: the processor layer is {100 * layer / total:.0f}% of a sampled "
                f"step's time (totals over the run), sampling {100 * sampling / total:.0f}%"
            )


def print_processor_costs(ours: Timings, ref: Timings | None) -> None:
    """Each processor's median update_state and apply, both sides."""
    print("by processor, median µs (host time; apply: over the steps in which it ran)")
    print(f"  {'':<22} {'update_state':>14} {'':>11}   {'apply':>10}")
    print(f"  {'':<22} {'ours':>9} {'reference':>11}   {'ours':>9} {'reference':>11}")
    names = list(dict.fromkeys([*ours.by_proc, *(ref.by_proc if ref is not None else {})]))
    for name in names:
        line = f"  {name.removesuffix('LogitsProcessor'):<22} "
        line += f"{median_us(ours.by_proc.get(name, [])):>9}"
        line += f" {median_us(ref.by_proc.get(name, [])) if ref is not None else '-':>11}"
        line += f"   {median_us(ours.apply_by_proc.get(name, [])):>9}"
        line += f" {median_us(ref.apply_by_proc.get(name, [])) if ref is not None else '-':>11}"
        print(line)

"""DRY's worst case (issue 28), section 7a of ``bench-report.md``, written by
``benches/beyond_vllm.py`` (``--worst``: this section only): B requests arrive whose window
is one token repeated, the input that made admission quadratic in the window before (every
position is an earlier occurrence of the newest token). Timed: the admission step (ours:
``update_state`` with the batch added; the plain reference: its first ``apply``, llama.cpp's
whole-window computation per row), then ours' decode steps on the same token. Ordinary text
(i.i.d. Zipf, as section 7) beside it, for the ratio a hostile request costs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from report_measure import Clock, Samples, median_us, progress
from report_tables import env_line, fmt_us, markdown_table, median_p90_cell

from logitsproc_rs import BatchUpdateBuilder, EngineConfig, SamplingParams, build_logitsprocs
from logitsproc_rs.builtin import DryLogitsProcessor
from logitsproc_rs.reference import RefDryLogitsProcessor

HEADING = "## 7a. Beyond vLLM: DRY's worst case (one repeated token)"
VOCAB = 32000
TOKEN = 7  # the repeated token
WINDOWS = (8192, 32768)  # the default cap, and the cap raised to 32,768
BATCHES = (1, 64)


@dataclass
class WorstCell:
    admit: Samples = field(default_factory=Samples)  # ours, one repeated token
    admit_text: Samples = field(default_factory=Samples)  # ours, ordinary text
    step: Samples = field(default_factory=Samples)  # ours, a decode step on the token
    ref: Samples = field(default_factory=Samples)  # the reference's first apply
    agree: str = "–"


def admit_once(
    cfg: EngineConfig, prompts: list[list[int]], clock: Clock, steps: int, cell: WorstCell | None
) -> tuple[int, object, list[list[int]]]:
    """A fresh pipeline: the batch's admission (timed), then ``steps`` decode steps on the
    repeated token, recorded in ``cell`` when given. Returns the admission's ns, the processor
    and the output lists."""
    params = SamplingParams(temperature=1.0, dry_multiplier=0.8, dry_penalty_last_n=-1)
    procs = build_logitsprocs(
        cfg, torch.device("cpu"), False, custom_logitsprocs=[DryLogitsProcessor], token_feed=True
    )
    outs: list[list[int]] = [[] for _ in prompts]
    builder = BatchUpdateBuilder()
    for i, prompt in enumerate(prompts):
        builder.added.append((i, params, prompt, outs[i]))
    ns = clock(procs.update_state, builder.get_and_reset(batch_size=len(prompts)))
    ours = next(p for p in procs.all if isinstance(p, DryLogitsProcessor))
    for _ in range(steps):
        for o in outs:
            o.append(TOKEN)
        new = torch.full((len(prompts),), TOKEN, dtype=torch.int64)
        step_ns = clock(procs.update_state, None, sampled_token_ids=new)
        if cell is not None:
            cell.step.add(step_ns, True)
    return ns, ours, outs


def measure_worst(text: torch.Tensor, repeats: int, steps: int) -> dict[tuple[int, int], WorstCell]:
    """``text``: ``[max(BATCHES), max(WINDOWS)]`` ordinary tokens."""
    clock = Clock(torch.device("cpu"))
    cells = {}
    for window in WINDOWS:
        for b in BATCHES:
            t0 = time.perf_counter()
            cfg = EngineConfig(max_num_seqs=b, vocab_size=VOCAB, max_dry_penalty_last_n=window)
            worst = [[TOKEN] * window for _ in range(b)]
            ordinary = text[:b, :window].tolist()
            cell = WorstCell()
            for _ in range(repeats):
                cell.admit_text.add(admit_once(cfg, ordinary, clock, 0, None)[0], True)
                ns, ours, _ = admit_once(cfg, worst, clock, steps, cell)
                cell.admit.add(ns, True)
            # The reference once (seconds at B = 64): its first apply recomputes every window.
            ref = RefDryLogitsProcessor(cfg, torch.device("cpu"), False)
            _, ours, outs = admit_once(cfg, worst, clock, 0, None)
            builder = BatchUpdateBuilder()
            params = SamplingParams(temperature=1.0, dry_multiplier=0.8, dry_penalty_last_n=-1)
            for i, prompt in enumerate(worst):
                builder.added.append((i, params, prompt, outs[i]))
            ref.update_state(builder.get_and_reset(batch_size=b))
            x = torch.randn(b, VOCAB, generator=torch.Generator().manual_seed(window + b))
            y_ref = x.clone()
            cell.ref.add(clock(ref.apply, y_ref), True)
            y_ours = ours.apply(x.clone())
            cell.agree = "= reference" if torch.equal(y_ours, y_ref) else "≠ reference"
            cells[window, b] = cell
            progress(
                f"  DRY worst case, window {window}, B={b}: admission "
                f"{fmt_us(median_us(cell.admit.ns))} µs ({time.perf_counter() - t0:.1f} s)"
            )
    return cells


def ratio_x(num: Samples, den: Samples) -> str:
    if not num.ns or not den.ns:
        return "n/a"
    return f"{median_us(num.ns) / median_us(den.ns):,.1f}×"


def worst_section(
    cells: dict[tuple[int, int], WorstCell], repeats: int, steps: int, seconds: float, quick: bool
) -> str:
    md = [HEADING + "\n"]
    md.append(
        f"Written by `make bench-beyond` (`benches/beyond_vllm.py{' --quick' if quick else ''}`"
        f", this section alone with `--worst`) on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in {seconds:.0f} s. "
        f"{env_line(torch.device('cpu'))}. **A shared 2-core box**: read the figures as ratios "
        "from one run.\n"
    )
    md.append(
        "B requests arrive at once, each with a prompt of W copies of one token and "
        "`dry_multiplier = 0.8` over its whole window (`max_dry_penalty_last_n` = W): every "
        "position is an earlier occurrence of the newest token, the input that made admission "
        "quadratic in W before issue 28 (0.10–0.16 s for one request at W = 8,192, 2.3 s at "
        "32,768). **ours: admission** = `update_state` with the batch added (indexing every "
        "window), **ordinary text** the same with i.i.d. Zipf prompts; **reference** = "
        "`RefDryLogitsProcessor`'s first `apply`, llama.cpp's whole-window computation "
        "(`ref_dry_penalties`) per row; **ours: a step after** = one more copy of the token "
        f"fed to every row (`update_state(None, sampled_token_ids=...)`). Time in µs, "
        f"**median (p90)** of {repeats} fresh pipeline(s) (steps: {repeats} × {steps}); the "
        "reference once. After admission ours' and the reference's logits are compared.\n"
    )
    header = [
        "W",
        "B",
        "ours: admission",
        "ordinary text",
        "worst / ordinary",
        "reference",
        "ref / ours",
        "ours: a step after",
        "agreement",
    ]
    rows = []
    for (window, b), c in cells.items():
        rows.append(
            [
                f"{window:,}",
                str(b),
                median_p90_cell(c.admit.ns),
                median_p90_cell(c.admit_text.ns),
                ratio_x(c.admit, c.admit_text),
                median_p90_cell(c.ref.ns),
                ratio_x(c.ref, c.admit),
                median_p90_cell(c.step.ns),
                c.agree,
            ]
        )
    md.append(markdown_table(header, rows) + "\n")
    return "\n".join(md) + "\n"


def run_worst(text: torch.Tensor, quick: bool) -> str:
    repeats, steps = (1, 3) if quick else (3, 5)
    t0 = time.perf_counter()
    progress(f"DRY worst case: W {WINDOWS}, B {BATCHES}, {repeats} repeat(s)")
    cells = measure_worst(text, repeats, steps)
    return worst_section(cells, repeats, steps, time.perf_counter() - t0, quick)

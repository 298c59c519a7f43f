"""``make bench-beyond``: per-step cost of each processor beyond vLLM (issue 15) in a steady
decode loop, ours next to HF transformers' implementation of the same processor on the same
inputs and the plain reference, written as section 7 of ``bench-report.md``.

For each processor, B requests (B = 64, 256) arrive with a prompt of L tokens (L = 256, 2,048,
8,192) and an empty output; then every step each row gets one new token and the step is timed:

* **ours**: the token feed, ``procs.update_state(None, sampled_token_ids=...)`` (one core call
  for the whole pipeline, built with ``token_feed=True`` and the processor), plus the
  processor's ``apply`` on ``[B, V]`` float32 logits (V = 32,000);
* **HF**: transformers' processor called as ``generate()`` calls it,
  ``proc(input_ids[B, L + t], scores)`` (no-repeat-ngram, typical-p, epsilon, eta: HF has no
  DRY, top-n-sigma, XTC or penalty window);
* **reference**: ``logitsproc_rs.reference`` (per row, from the whole sequence), where cheap.

The logits of a step are one fixed Gaussian ``[B, V]`` tensor cloned for each variant (the copy
is not timed). The tokens are i.i.d. Zipf (s = 1) over the vocabulary, a text-like frequency
profile, fixed per (B, L). Each cell is run ``--repeats`` times with a fresh pipeline; a cell is
the median (p90) over every measured step of every repeat. After the last step the outputs are
compared (ours vs HF and vs the reference: equal or not). Ratios are of medians from this run.
Targets (issue 15): DRY and no-repeat-ngram flat in length (ours at 8,192 / ours at 256 <=
``FLAT``), and ours >= 50x HF's no-repeat-ngram at B = 64, L = 2,048.

Section 7a (``worst_case.py``; ``--worst`` writes it alone): DRY's admission of a window of one
repeated token, ours vs the plain reference (issue 28).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report_measure import Clock, Samples, median_us, progress, rotated
from report_tables import (
    ROOT,
    env_line,
    fmt_us,
    markdown_table,
    median_p90_cell,
    status,
    write_section,
)
from worst_case import HEADING as WORST_HEADING
from worst_case import run_worst

from logitsproc_rs import BatchUpdateBuilder, EngineConfig, SamplingParams, build_logitsprocs
from logitsproc_rs.builtin import (
    DryLogitsProcessor,
    EpsilonCutoffLogitsProcessor,
    EtaCutoffLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    PenaltiesLogitsProcessor,
    TopNSigmaLogitsProcessor,
    TypicalPLogitsProcessor,
    XTCLogitsProcessor,
)
from logitsproc_rs.reference import reference_of

HEADING = "## 7. Beyond vLLM: the new processors"
VOCAB = 32000
FLAT = 1.25  # "flat in length": ours at 8,192 tokens <= 1.25x ours at 256 (noise margin)
HF_NGRAM_TARGET = 50.0  # ours >= 50x HF's no-repeat-ngram at B = 64, L = 2,048
# The n-gram map's engine cap, above every sequence here, so the bans are exactly HF's (the
# default, 2,048, would forget the n-grams of a longer sequence that HF still bans).
NGRAM_WINDOW = 16384


@dataclass(frozen=True)
class Case:
    """One processor: its class (None for the built-in penalties), the request's fields, HF's
    processor (a factory) if HF has one, and whether the reference is too slow at B = 256 and
    L = 8,192 (rebuilt from the whole sequence in Python per row and step)."""

    name: str
    cls: type
    opt_in: bool
    params: dict[str, Any]
    hf: Callable[[], Any] | None = None
    hf_dict: Callable[[], Any] | None = None  # HF 4.x's dict rebuild (no-repeat-ngram only)
    ref_slow: bool = False
    target_flat: bool = False
    xtc: bool = False
    dense: bool = False  # its apply is whole-row passes over [B, V]: fewer steps on the CPU


def hf_factories() -> tuple[dict[str, Callable[[], Any]], str]:
    """HF transformers' processors (``{}`` and why, when not importable)."""
    try:
        import transformers
        from transformers.generation import logits_process as lp
    except Exception as e:  # any failure: the bench runs without HF's columns
        return {}, f"transformers not importable ({type(e).__name__}: {e})"
    return {
        "ngram": lambda: lp.NoRepeatNGramLogitsProcessor(3),
        "ngram_dict": lambda: DictRebuildNoRepeatNGram(lp, 3),
        "typical": lambda: lp.TypicalLogitsWarper(0.9),
        "epsilon": lambda: lp.EpsilonLogitsWarper(3e-4),
        "eta": lambda: lp.EtaLogitsWarper(3e-4),
    }, f"transformers {transformers.__version__}"


class DictRebuildNoRepeatNGram:
    """HF's no-repeat-ngram as transformers 4.x had it, before the vectorised one installed
    here: per row a Python dict of every n-gram of the whole sequence, rebuilt every step. Its
    ``__call__`` and ``_calc_banned_ngram_tokens`` transcribed; ``_get_ngrams`` and
    ``_get_generated_ngrams`` are the installed module's own (unchanged since 4.x)."""

    def __init__(self, lp: Any, ngram_size: int) -> None:
        self.lp = lp
        self.n = ngram_size

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        num_hypos = scores.shape[0]
        cur_len = input_ids.shape[-1]
        out = scores.clone()
        if cur_len + 1 < self.n:
            return out
        ngrams = self.lp._get_ngrams(self.n, input_ids, num_hypos)
        for i in range(num_hypos):
            banned = self.lp._get_generated_ngrams(ngrams[i], input_ids[i], self.n, cur_len)
            out[i, banned] = -float("inf")
        return out


def cases(hf: dict[str, Callable[[], Any]]) -> list[Case]:
    ranks = zipf_ids()
    breakers = [[int(ranks[20])], [int(ranks[40]), int(ranks[41])]]
    return [
        Case(
            "DRY",
            DryLogitsProcessor,
            True,
            {"dry_multiplier": 0.8, "dry_sequence_breakers": breakers},
            ref_slow=True,
            target_flat=True,
        ),
        Case(
            "no-repeat-ngram (n = 3)",
            NoRepeatNGramLogitsProcessor,
            True,
            {"no_repeat_ngram_size": 3},
            hf.get("ngram"),
            hf.get("ngram_dict"),
            ref_slow=True,
            target_flat=True,
        ),
        Case(
            "no-repeat-ngram, DeepSeek-OCR (n = 30, w = 90)",
            NoRepeatNGramLogitsProcessor,
            True,
            {
                "no_repeat_ngram_size": 30,
                "no_repeat_ngram_window": 90,
                "no_repeat_ngram_output_only": True,
                "no_repeat_ngram_whitelist": [int(ranks[0]), int(ranks[1])],
            },
        ),
        Case(
            "penalty_last_n = 64",
            PenaltiesLogitsProcessor,
            False,
            {
                "repetition_penalty": 1.1,
                "frequency_penalty": 0.1,
                "presence_penalty": 0.1,
                "penalty_last_n": 64,
            },
        ),
        Case("top-n-sigma (1.0)", TopNSigmaLogitsProcessor, True, {"top_n_sigma": 1.0}, dense=True),
        Case(
            "typical-p (0.9)",
            TypicalPLogitsProcessor,
            True,
            {"typical_p": 0.9},
            hf.get("typical"),
            dense=True,
        ),
        Case(
            "epsilon (3e-4)",
            EpsilonCutoffLogitsProcessor,
            True,
            {"epsilon_cutoff": 3e-4},
            hf.get("epsilon"),
            dense=True,
        ),
        Case(
            "eta (3e-4)",
            EtaCutoffLogitsProcessor,
            True,
            {"eta_cutoff": 3e-4},
            hf.get("eta"),
            dense=True,
        ),
        Case(
            "XTC (p 0.5, t 0.1)",
            XTCLogitsProcessor,
            True,
            {"xtc_probability": 0.5, "xtc_threshold": 0.1},
            xtc=True,
            dense=True,
        ),
    ]


def zipf_ids(vocab: int = VOCAB) -> np.ndarray:
    """Token ids by frequency rank (a fixed permutation of the vocabulary)."""
    return np.random.default_rng(0).permutation(vocab)


def token_streams(b: int, length: int, seed: int) -> torch.Tensor:
    """``[b, length]`` i.i.d. Zipf (s = 1) tokens, rank r drawn with probability ~ 1 / r."""
    p = 1.0 / np.arange(1, VOCAB + 1)
    p /= p.sum()
    rng = np.random.default_rng(seed)
    ranks = rng.choice(VOCAB, size=(b, length), p=p)
    return torch.from_numpy(zipf_ids()[ranks]).to(torch.int64)


Task = tuple[
    str, Callable[..., Any], tuple[Any, ...]
]  # a variant: key, call, args before the logits


@dataclass
class Cell:
    """One (processor, B, L): per-step samples (ns) and the agreement found after the run."""

    ours: Samples = field(default_factory=Samples)
    update: Samples = field(default_factory=Samples)
    apply: Samples = field(default_factory=Samples)
    hf: Samples = field(default_factory=Samples)
    hf_dict: Samples = field(default_factory=Samples)
    ref: Samples = field(default_factory=Samples)
    agree: list[str] = field(default_factory=list)


def keep(results: dict[str, torch.Tensor], key: str, fn: Callable[..., Any], *a: Any) -> None:
    """Call ``fn`` and keep what it returns (the processed logits) for the agreement check."""
    results[key] = fn(*a)


def find(procs: Any, cls: type) -> Any:
    return next(p for p in procs.all if isinstance(p, cls))


def run_cell(
    case: Case,
    b: int,
    length: int,
    tokens: torch.Tensor,
    warm: int,
    steps: int,
    base_steps: int,
    repeats: int,
    with_ref: bool,
    dev: torch.device,
) -> Cell:
    """``repeats`` fresh pipelines over the same tokens: ``warm + steps`` steps each, the
    baselines (HF, reference) timed on the first ``base_steps`` measured steps only."""
    clock = Clock(dev)
    cfg = EngineConfig(max_num_seqs=b, vocab_size=VOCAB, max_no_repeat_ngram_window=NGRAM_WINDOW)
    params = SamplingParams(temperature=1.0, **case.params)
    g = torch.Generator().manual_seed(b * 7 + length)
    x = torch.randn(b, VOCAB, generator=g, device=dev).mul_(3.0)
    cell = Cell()
    prompts = tokens[:, :length].tolist()
    for rep in range(repeats):
        procs = build_logitsprocs(
            cfg, dev, False, custom_logitsprocs=[case.cls] if case.opt_in else (), token_feed=True
        )
        ours = find(procs, case.cls)
        hf = case.hf() if case.hf is not None and rep == 0 else None
        hf_dict = case.hf_dict() if case.hf_dict is not None and rep == 0 else None
        ref = reference_of(case.cls)(cfg, dev, False) if with_ref and rep == 0 else None
        outs: list[list[int]] = [[] for _ in range(b)]
        builder = BatchUpdateBuilder()
        for i in range(b):
            builder.added.append((i, params, prompts[i], outs[i]))
        update = builder.get_and_reset(batch_size=b)
        procs.update_state(update)  # the requests arrive (not timed)
        if ref is not None:
            ref.update_state(update)
        results: dict[str, torch.Tensor] = {}
        for step in range(warm + steps):
            m = step >= warm
            base = m and step < warm + base_steps
            new = tokens[:, length + step]
            for i, t in enumerate(new.tolist()):  # the engine's lists (the reference reads them)
                outs[i].append(t)
            ns_up = clock(procs.update_state, None, sampled_token_ids=new)
            tasks: list[Task] = [("ours", ours.apply, ())]
            ids = tokens[:, : length + step + 1]
            if hf is not None and (base or step == warm + steps - 1):
                tasks.append(("hf", hf, (ids,)))
            if hf_dict is not None and (base or step == warm + steps - 1):
                tasks.append(("hf_dict", hf_dict, (ids,)))
            if ref is not None and (base or step == warm + steps - 1):
                tasks.append(("ref", ref.apply, ()))
            for key, fn, a in rotated(tasks, step):
                y = x.clone()
                if case.xtc:
                    torch.manual_seed(step)  # the same draws for ours and the reference
                # HF's warpers return a new tensor; ours and the reference write in place.
                ns = clock(keep, results, key, fn, *a, y)
                if key == "ours":
                    cell.update.add(ns_up, m)
                    cell.apply.add(ns, m)
                    cell.ours.add(ns_up + ns, m)
                elif base:
                    getattr(cell, key).add(ns, True)
        if rep == 0:
            for key, name in (("hf", "HF"), ("hf_dict", "HF 4.x"), ("ref", "reference")):
                if key in results:
                    same = torch.equal(results["ours"], results[key])
                    cell.agree.append(f"{'=' if same else '≠'} {name}")
    return cell


@dataclass
class Run:
    bs: tuple[int, ...]
    lengths: tuple[int, ...]
    warm: int
    steps: int
    base_steps: int
    repeats: int
    dense_steps: int
    dense_repeats: int
    hf_line: str
    cells: dict[tuple[str, int, int], Cell] = field(default_factory=dict)
    skipped_ref: list[str] = field(default_factory=list)
    seconds: float = 0.0


def measure(run: Run, only: Sequence[str], dev: torch.device) -> list[Case]:
    hf, run.hf_line = hf_factories()
    chosen = [c for c in cases(hf) if not only or any(o.lower() in c.name.lower() for o in only)]
    for b in run.bs:
        for length in run.lengths:
            tokens = token_streams(b, length + run.warm + run.steps, seed=b + length)
            for case in chosen:
                with_ref = not (case.ref_slow and b >= 256 and length >= 8192)
                if not with_ref:
                    run.skipped_ref.append(f"{case.name} at B = {b}, L = {length:,}")
                t0 = time.perf_counter()
                if case.dense:
                    warm, steps, repeats = 1, run.dense_steps, run.dense_repeats
                else:
                    warm, steps, repeats = run.warm, run.steps, run.repeats
                base_steps = min(run.base_steps, steps)
                cell = run_cell(
                    case, b, length, tokens, warm, steps, base_steps, repeats, with_ref, dev
                )
                run.cells[case.name, b, length] = cell
                progress(
                    f"  {case.name}, B={b}, L={length}: ours {fmt_us(median_us(cell.ours.ns))} µs"
                    f" ({time.perf_counter() - t0:.1f} s)"
                )
    return chosen


def ratio(base: Samples, ours: Samples) -> float:
    if not base.ns or not ours.ns:
        return math.nan
    return median_us(base.ns) / median_us(ours.ns)


def x_cell(r: float) -> str:
    return "n/a" if math.isnan(r) else f"{r:,.1f}×"


def section(run: Run, chosen: Sequence[Case], dev: torch.device, quick: bool) -> str:
    lo, hi = min(run.lengths), max(run.lengths)
    md = [HEADING + "\n"]
    md.append(
        f"Written by `make bench-beyond` (`benches/beyond_vllm.py{' --quick' if quick else ''}`)"
        f" on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in {run.seconds:.0f} s. "
        f"{env_line(dev)}. **A shared 2-core box**: other jobs ran beside it, so read the "
        "figures as ratios from one run.\n"
    )
    md.append(
        f"Per-step host time in µs, **median (p90)**, of a steady decode loop on the CPU: B "
        f"requests arrive with a prompt of L tokens, then each step every row gets one new "
        f"token. **ours** = the token feed (`procs.update_state(None, sampled_token_ids=...)`, "
        f"one core call for the pipeline) + the processor's `apply` on `[B, {VOCAB:,}]` float32 "
        f"logits; **HF** = transformers' processor as `generate()` calls it, "
        f"`proc(input_ids[B, L + t], scores)` ({run.hf_line}; HF's no-repeat-ngram reads the "
        f"whole sequence every step; HF has no DRY, top-n-sigma, XTC or penalty "
        f"window); **reference** = `logitsproc_rs.reference` (per row, from the whole sequence). "
        f"Tokens: i.i.d. Zipf (s = 1) over the vocabulary, fixed per (B, L). Ours: "
        f"{run.repeats} run(s) (a fresh pipeline each) × {run.steps} measured steps after "
        f"{run.warm} warm-up; the truncations and XTC (whole-row passes over `[B, V]`, tens of "
        f"ms per step on one core, and independent of L): {run.dense_repeats} × "
        f"{run.dense_steps} after 1; HF and the reference: the first "
        f"{min(run.base_steps, run.steps)} measured steps (truncations, XTC: "
        f"{min(run.base_steps, run.dense_steps)}) of the first run. The no-repeat-ngram "
        f"map's cap `max_no_repeat_ngram_window` is set to "
        f"{NGRAM_WINDOW:,} (above every sequence here), so its bans are exactly HF's; DRY's "
        f"window is its default cap (8,192). After the last step each variant's logits are "
        f"compared with ours (= equal, ≠ not).\n"
    )
    header = [
        "processor",
        "B",
        "L",
        "ours: update",
        "ours: apply",
        "ours: step",
        "HF",
        "HF / ours",
        "reference",
        "ref / ours",
        "agreement",
    ]
    rows = []
    for case in chosen:
        for b in run.bs:
            for length in run.lengths:
                c = run.cells[case.name, b, length]
                rows.append(
                    [
                        case.name,
                        str(b),
                        f"{length:,}",
                        median_p90_cell(c.update.ns),
                        median_p90_cell(c.apply.ns),
                        median_p90_cell(c.ours.ns),
                        median_p90_cell(c.hf.ns) if case.hf else "no HF",
                        x_cell(ratio(c.hf, c.ours)),
                        median_p90_cell(c.ref.ns) if c.ref.ns else "skipped",
                        x_cell(ratio(c.ref, c.ours)),
                        "; ".join(c.agree) or "–",
                    ]
                )
    md.append(markdown_table(header, rows) + "\n")
    if run.skipped_ref:
        md.append(
            "_Reference skipped (rebuilt in Python from the whole sequence, seconds per step): "
            + "; ".join(run.skipped_ref)
            + "._\n"
        )
    for case in chosen:
        if case.hf_dict is None:
            continue
        md.append(
            f"{case.name} against both of HF's: the installed transformers' processor is "
            "vectorised (it matches the last n − 1 tokens against every window of the whole "
            "sequence with `unfold`, then builds a `[B, V + 1]` mask: still a pass over the whole "
            "sequence every step, but in torch ops); **HF 4.x** is the per-row Python dict of "
            "every n-gram of the sequence, rebuilt every step, that transformers had before "
            "(`DictRebuildNoRepeatNGram`: its `__call__` and `_calc_banned_ngram_tokens` "
            "transcribed, the installed module's own `_get_ngrams` / `_get_generated_ngrams`).\n"
        )
        dict_rows = []
        for b in run.bs:
            for length in run.lengths:
                c = run.cells[case.name, b, length]
                dict_rows.append(
                    [
                        str(b),
                        f"{length:,}",
                        median_p90_cell(c.ours.ns),
                        median_p90_cell(c.hf.ns),
                        x_cell(ratio(c.hf, c.ours)),
                        median_p90_cell(c.hf_dict.ns),
                        x_cell(ratio(c.hf_dict, c.ours)),
                    ]
                )
        header2 = ["B", "L", "ours", "HF (installed)", "HF / ours", "HF 4.x", "HF 4.x / ours"]
        md.append(markdown_table(header2, dict_rows) + "\n")
    md.append(f"Length scaling, ours' step at L = {hi:,} / at L = {lo:,}:\n")
    flat_rows = []
    for case in chosen:
        cells = []
        for b in run.bs:
            r = ratio(run.cells[case.name, b, hi].ours, run.cells[case.name, b, lo].ours)
            cells.append(x_cell(r))
        flat_rows.append([case.name, *cells])
    md.append(markdown_table(["processor", *(f"B = {b}" for b in run.bs)], flat_rows) + "\n")
    md.append("Targets (issue 15):\n")
    md.append(markdown_table(["target", "bound", "measured", "status"], targets(run, chosen)))
    md.append("")
    return "\n".join(md) + "\n"


def targets(run: Run, chosen: Sequence[Case]) -> list[list[str]]:
    lo, hi = min(run.lengths), max(run.lengths)
    out = []
    for case in chosen:
        if not case.target_flat:
            continue
        for b in run.bs:
            a, z = run.cells[case.name, b, lo].ours, run.cells[case.name, b, hi].ours
            r = ratio(z, a)
            out.append(
                [
                    f"{case.name} flat in length, B = {b}: ours at L = {hi:,} / at L = {lo:,}",
                    f"≤ {FLAT}×",
                    f"{x_cell(r)} ({fmt_us(median_us(z.ns))} / {fmt_us(median_us(a.ns))} µs)",
                    status(None if math.isnan(r) else r <= FLAT),
                ]
            )
    ngram = next((c for c in chosen if c.hf is not None and c.target_flat), None)
    key = (ngram.name, 64, 2048) if ngram else None
    if key in run.cells:
        c = run.cells[key]
        for label, base in (("HF (installed)", c.hf), ("HF 4.x, dict rebuild", c.hf_dict)):
            r = ratio(base, c.ours)
            measured = f"{fmt_us(median_us(base.ns))} / {fmt_us(median_us(c.ours.ns))} µs"
            out.append(
                [
                    f"no-repeat-ngram, B = 64, L = 2,048: {label} / ours",
                    f"≥ {HF_NGRAM_TARGET:.0f}×",
                    f"{x_cell(r)} ({measured})",
                    status(None if math.isnan(r) else r >= HF_NGRAM_TARGET),
                ]
            )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer steps and repeats (< 60 s)")
    ap.add_argument("--steps", type=int, default=None, help="measured steps per repeat")
    ap.add_argument("--repeats", type=int, default=None, help="fresh pipelines per cell")
    ap.add_argument("--bs", type=int, nargs="+", default=None, help="batch sizes (64 256)")
    ap.add_argument("--lengths", type=int, nargs="+", default=None, help="L (256 2048 8192)")
    ap.add_argument("--only", nargs="*", default=[], help="processors whose name contains these")
    ap.add_argument("--report", type=Path, default=ROOT / "bench-report.md")
    ap.add_argument("--no-write", action="store_true", help="print the section only")
    ap.add_argument("--worst", action="store_true", help="only DRY's worst case (section 7a)")
    args = ap.parse_args(argv)
    dev = torch.device("cpu")
    torch.set_num_threads(1)  # as report.py on CPU: a shared box's busy cores would be measured
    worst_text = token_streams(64, 32768, seed=28)
    if args.worst:
        return write_worst(args, worst_text)
    run = Run(
        bs=tuple(args.bs or ((64,) if args.quick else (64, 256))),
        lengths=tuple(args.lengths or ((256, 2048) if args.quick else (256, 2048, 8192))),
        warm=2 if args.quick else 3,
        steps=args.steps or (4 if args.quick else 20),
        base_steps=2 if args.quick else 4,
        repeats=args.repeats or (1 if args.quick else 3),
        dense_steps=args.steps or (2 if args.quick else 4),
        dense_repeats=args.repeats or (1 if args.quick else 2),
        hf_line="",
    )
    t0 = time.perf_counter()
    progress(f"beyond vLLM: B {run.bs}, L {run.lengths}, {run.repeats} x {run.steps} steps")
    chosen = measure(run, args.only, dev)
    run.seconds = time.perf_counter() - t0
    text = section(run, chosen, dev, args.quick)
    print(text)
    if not args.no_write:
        write_section(args.report, HEADING, text)
        progress(f"wrote section 7 of {args.report} ({run.seconds:.0f} s)")
    return write_worst(args, worst_text)


def write_worst(args: argparse.Namespace, text: torch.Tensor) -> int:
    """Section 7a, after section 7 in the report."""
    md = run_worst(text, args.quick)
    print(md)
    if not args.no_write:
        if WORST_HEADING not in args.report.read_text():
            # First written: placed after section 7 (write_section appends at the end).
            old = args.report.read_text()
            at = old.find("\n## 8.")
            if at >= 0:
                args.report.write_text(old[:at] + "\n" + md.rstrip("\n") + "\n" + old[at:])
        write_section(args.report, WORST_HEADING, md)
        progress(f"wrote section 7a of {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

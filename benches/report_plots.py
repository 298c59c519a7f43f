"""The plot of ``bench-report.png``: sections 1, 3 and 4 of the report (update_state of the whole
pipeline, update_state and apply of MinTokens + LogitBias + MinP), median per step against batch
size, each variant one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from report_measure import Measurements, Samples, median_us
from report_tables import T_PIPE_LIST_256


def write_plot(res: Measurements, path: Path, dev: torch.device) -> str:
    """Write the PNG to ``path``: sections 1, 3 and 4, medians against batch size, log-log.
    Returns the line under it in the report (or why there is no plot)."""
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

    def series(
        ax: Any, data: dict[int, dict[str, Samples]], key: str, label: str, **kw: Any
    ) -> None:
        xs = [b for b, r in data.items() if r[key].ns]
        if xs:
            ys = [median_us(data[b][key].ns) for b in xs]
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

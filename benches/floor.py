"""The processor pipeline against the bandwidth floor (issue 9), ``make bench`` section 5.

Every processor active on every row (MinP, logit bias, MinTokens, penalties, bad words, allowed
ids, thinking budget), B = 256, V = 151,936 (``--quick`` on the CPU: B = 32). The floor is
one read and one write of the logits at the device's measured copy bandwidth
(``dst.copy_(src)`` of the logits' size: bytes read + written over the median time). Reported:
the apply of every processor (no sampling) per kernel path, its ratio to the floor, the Triton
path's speed-up over the torch ops, and the host time of ``update_state`` per step.

Run alone: ``python benches/floor.py [--device cuda] [--quick]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from bench_python import apply_all

from logitsproc_rs import BatchUpdate, EngineConfig, SamplingParams, build_logitsprocs
from logitsproc_rs import kernels as _kernels

VOCAB = 151_936
THINK_START, THINK_END = [151_648], [151_649]


def _timer(dev: torch.device) -> Callable[[Callable[[], Any]], float]:
    """Seconds one call takes, synchronised on CUDA (events around it)."""

    def run(fn: Callable[[], Any]) -> float:
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(dev)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1e3
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    return run


def copy_bandwidth(dev: torch.device, nbytes: int, reps: int) -> float:
    """Bytes per second of a device-to-device copy (read + write counted)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=dev).uniform_()
    dst = torch.empty_like(src)
    timer = _timer(dev)
    dst.copy_(src)
    return 2 * nbytes / statistics.median(timer(lambda: dst.copy_(src)) for _ in range(reps))


def every_processor(i: int, vocab: int) -> SamplingParams:
    """Row ``i``: every processor has work (the allowed set keeps a quarter of the vocab)."""
    return SamplingParams(
        temperature=1.0,
        min_p=0.05,
        logit_bias={(97 * i + k * 131) % vocab: 0.5 - k * 0.1 for k in range(8)},
        min_tokens=1_000_000,
        max_tokens=2_000_000,
        stop_token_ids=[(13 * i + k) % vocab for k in range(4)],
        eos_token_id=2,
        presence_penalty=0.3,
        frequency_penalty=0.2,
        repetition_penalty=1.1,
        bad_words_token_ids=[[5 + i % 7], [11, 12 + i % 5]],
        allowed_token_ids=list(range(i % 4, vocab, 4)),
        thinking_token_budget=1_000_000,
    )


def build(dev: torch.device, b: int, vocab: int, kernels: str) -> tuple[Any, list[list[int]]]:
    cfg = EngineConfig(
        max_num_seqs=b,
        vocab_size=vocab,
        max_allowed_token_ids=vocab,
        reasoning_start_token_ids=THINK_START,
        reasoning_end_token_ids=THINK_END,
    )
    procs = build_logitsprocs(cfg, dev, dev.type == "cuda", kernels=kernels)
    outputs: list[list[int]] = [[THINK_START[0], 7 + i % 50] for i in range(b)]
    added = [(i, every_processor(i, vocab), [1, 2, 3, i % vocab], outputs[i]) for i in range(b)]
    procs.update_state(BatchUpdate(b, [], added, []))
    return procs, outputs


def measure(dev: torch.device, b: int, vocab: int, reps: int) -> dict[str, Any]:
    timer = _timer(dev)
    logits = torch.randn(b, vocab, device=dev)
    work = torch.empty_like(logits)
    out: dict[str, Any] = {"b": b, "vocab": vocab}
    out["bw"] = copy_bandwidth(dev, logits.numel() * 4, max(reps, 5))
    out["floor"] = 2 * logits.numel() * 4 / out["bw"]
    backends = ["torch"]
    if dev.type == "cuda" and _kernels.ops() is not None:
        backends.append("triton")
    results: dict[str, Any] = {}
    for backend in backends:
        procs, outputs = build(dev, b, vocab, backend)

        def one(procs: Any = procs) -> None:
            work.copy_(logits)
            apply_all(procs, work)

        one()  # warm-up (Triton compiles here)
        copy_only = statistics.median(timer(lambda: work.copy_(logits)) for _ in range(reps))
        times, host = [], []
        for step in range(reps):
            for o in outputs:
                o.append(20 + (step * 7919) % (vocab - 20))
            t = time.perf_counter()
            procs.update_state(None)
            host.append(time.perf_counter() - t)
            times.append(timer(one) - copy_only)
        results[backend] = {"apply": statistics.median(times), "host": statistics.median(host)}
    out["results"] = results
    return out


def section(dev: torch.device, quick: bool) -> str:
    b = 32 if quick and dev.type == "cpu" else 256
    reps = 3 if dev.type == "cpu" else (10 if quick else 30)
    m = measure(dev, b, VOCAB, reps)
    lines = [
        "## 5. Every processor on every row vs the bandwidth floor\n",
        f"B = {m['b']}, V = {m['vocab']:,}, float32 logits on `{dev}`; medians of {reps} "
        f"steps. Copy bandwidth {m['bw'] / 1e9:,.1f} GB/s (read + write), so the floor, one "
        f"read and one write of the logits, is **{m['floor'] * 1e6:,.0f} µs**. The apply is "
        "every processor's `apply` (no sampling) with the logits' refill copy subtracted; "
        "host time is `update_state` with one new token per row.\n",
        "| kernels | apply | × floor | host update_state |",
        "|---|---|---|---|",
    ]
    res = m["results"]
    for backend, r in res.items():
        lines.append(
            f"| {backend} | {r['apply'] * 1e6:,.0f} µs | {r['apply'] / m['floor']:.1f}× | "
            f"{r['host'] * 1e6:,.0f} µs |"
        )
    if "triton" in res:
        speedup = res["torch"]["apply"] / res["triton"]["apply"]
        lines.append(
            f"\nTriton over the torch ops: **{speedup:.1f}×** (target ≥ 3×); Triton within "
            f"{res['triton']['apply'] / m['floor']:.1f}× of the floor (target ≤ 3×)."
        )
    else:
        lines.append(
            "\nNo Triton path on this device (the kernels run on CUDA); the torch ops only."
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(section(torch.device(args.device), args.quick))


if __name__ == "__main__":
    main()

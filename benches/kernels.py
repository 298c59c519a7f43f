"""Micro-benchmark: the Triton kernels (``logitsproc_rs.kernels``) against the torch-op path.

    PYTHONPATH=python python benches/kernels.py [--rows 256] [--vocab 151936] [--iters 50]

Each transform runs on the same inputs both ways; every iteration starts from a fresh copy of
the logits (the copy is not timed). On CUDA the time is the device time between two events
around the one call (median over iterations); on the CPU, wall time, and only the torch path
runs (Triton needs a GPU; its CPU interpreter is a correctness tool, not a fast path). The
last column is the ratio torch / Triton. The results are also checked to be bit-identical.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from logitsproc_rs import kernels
from logitsproc_rs.bitmask import apply_token_bitmask_
from logitsproc_rs.builtin.allowed_token_ids import keep_only_
from logitsproc_rs.builtin.min_p import min_p_mask_
from logitsproc_rs.builtin.penalties import apply_penalties_

PROMPT_FLAG = 1 << 30


def timed(fn: Callable[[torch.Tensor], object], base: torch.Tensor, iters: int) -> float:
    """Median µs of ``fn(copy of base)``."""
    work = base.clone()
    cuda = base.device.type == "cuda"
    times = []
    for i in range(iters + 3):
        work.copy_(base)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(work)
            end.record()
            end.synchronize()
            t = start.elapsed_time(end) * 1e3
        else:
            t0 = time.perf_counter()
            fn(work)
            t = (time.perf_counter() - t0) * 1e6
        if i >= 3:  # warm-up: compilation, caches
            times.append(t)
    return statistics.median(times)


def cases(rows: int, vocab: int, dev: torch.device):
    g = torch.Generator(device=dev).manual_seed(0)
    words = (vocab + 31) // 32
    lmp = torch.full((rows,), 0.1, device=dev).log()
    # Penalties: every row penalised, ~300 distinct seen tokens a row (counts 1-3, some prompt).
    cells = torch.zeros(rows + 1, vocab, dtype=torch.int32, device=dev)
    seen = torch.randint(vocab, (rows, 300), device=dev, generator=g)
    cells[:rows].scatter_(1, seen, torch.randint(1, 4, (rows, 300), device=dev, generator=g).int())
    cells[:rows, :64] |= PROMPT_FLAG
    rep = torch.full((rows,), 1.2, device=dev)
    freq = torch.full((rows,), 0.5, device=dev)
    pres = torch.full((rows,), 0.3, device=dev)

    def triples(per_row: int, value: float, pad: float):
        """``per_row`` triples a row, padded to a power of two as the core pads them."""
        n = rows * per_row
        r = torch.arange(rows, device=dev).repeat_interleave(per_row).int()
        # Distinct tokens within a row, as the core's tables hold them.
        start = torch.randint(vocab, (rows, 1), device=dev, generator=g)
        c = ((start + 7919 * torch.arange(per_row, device=dev)) % vocab).flatten().int()
        v = torch.full((n,), value, device=dev)
        m = 1 << (n - 1).bit_length()
        return (
            torch.cat([r, r[:1].repeat(m - n)]),
            torch.cat([c, c[:1].repeat(m - n)]),
            torch.cat([v, torch.full((m - n,), pad, device=dev)]),
        )

    bias = triples(20, 0.5, -0.0)
    stops = triples(3, float("-inf"), float("-inf"))
    # Allowed ids: 8 restricted rows of 1,000 ids.
    ar = torch.arange(8, device=dev).repeat_interleave(1000)
    ac = torch.randperm(vocab, device=dev, generator=g)[:1000].repeat(8)
    restricted = torch.arange(8, device=dev)
    scratch = torch.zeros(rows, words, dtype=torch.int32, device=dev)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (rows, words), device=dev, generator=g).int()
    ops = kernels.ops() if dev.type == "cuda" else None
    k = kernels.ops
    return [
        (
            "MinP (every row)",
            lambda x: min_p_mask_(x, lmp.unsqueeze(1)),
            ops and (lambda x: k().min_p_(x, lmp, None)),
        ),
        (
            "penalties (every row)",
            lambda x: apply_penalties_(
                x, cells[:rows], rep[:, None], freq[:, None], pres[:, None], PROMPT_FLAG
            ),
            ops and (lambda x: k().penalties_(x, cells, rep, freq, pres, PROMPT_FLAG, None, True)),
        ),
        (
            "logit bias (20 a row)",
            lambda x: x.index_put_(bias[:2], bias[2], accumulate=True),
            ops and (lambda x: k().sparse_(x, *bias, add=True)),
        ),
        (
            "min tokens (3 a row)",
            lambda x: x.index_put_(stops[:2], stops[2]),
            ops and (lambda x: k().sparse_(x, *stops, add=False)),
        ),
        (
            "allowed ids (8 rows)",
            lambda x: keep_only_(x, ar, ac, restricted),
            ops and (lambda x: k().keep_only_(x, ar, ac, restricted, scratch)),
        ),
        (
            "grammar bitmask (every row)",
            lambda x: _torch_bitmask(x, bitmask),
            ops and (lambda x: k().token_bitmask_(x, bitmask, None, vocab)),
        ),
    ]


def _torch_bitmask(x: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    kernels.set_default_backend("torch")
    try:
        return apply_token_bitmask_(x, bitmask)
    finally:
        kernels.set_default_backend(None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    ap.add_argument("--rows", type=int, default=256 if cuda else 64)
    ap.add_argument("--vocab", type=int, default=151936 if cuda else 32000)
    ap.add_argument("--iters", type=int, default=50 if cuda else 10)
    args = ap.parse_args()
    dev = torch.device("cuda" if cuda else "cpu")
    if cuda and kernels.ops() is None:
        raise SystemExit("triton does not import")
    base = torch.randn(args.rows, args.vocab, device=dev) * 4
    mb = base.numel() * 4 / 1e6
    print(f"{dev.type}: [{args.rows}, {args.vocab}] float32 logits ({mb:.1f} MB), medians (µs)")
    print(f"{'transform':<30}{'torch':>12}{'triton':>12}{'ratio':>8}")
    for name, torch_fn, triton_fn in cases(args.rows, args.vocab, dev):
        t_torch = timed(torch_fn, base, args.iters)
        if triton_fn is None:
            print(f"{name:<30}{t_torch:>12.1f}{'-':>12}{'-':>8}")
            continue
        want, got = base.clone(), base.clone()
        torch_fn(want)
        triton_fn(got)
        same = torch.equal(want.view(torch.int32), got.view(torch.int32))
        t_triton = timed(triton_fn, base, args.iters)
        flag = "" if same else "  RESULTS DIFFER"
        print(f"{name:<30}{t_torch:>12.1f}{t_triton:>12.1f}{t_torch / t_triton:>7.1f}x{flag}")


if __name__ == "__main__":
    main()

"""vLLM's own CPU sampler step at real vocabularies, top-k / top-p through vLLM's fields or
through ours (issue 27): run in an engine environment's python (``engine_cost.py`` does, for
section 6 of ``bench-report.md``), ``PYTHONPATH=<repo>/python``; prints one JSON line.

Both ways on the same logits, 16 rows (a quarter each top-k 50, top-p 0.9, both (20, 0.95),
neither), every row seeded (vLLM 0.25.1's CPU sampler then draws each row from its own
generator): vLLM's ``TopKTopPSampler.forward_cpu`` given the rows' k and p (its top-k / top-p,
then the exponential race), against ``logitsproc_rs.sampler.mask_top_k_top_p_`` (what
``TopKTopPLogitsProcessor`` applies) followed by the same ``forward_cpu`` given none. One
thread; median µs over repeats; the tokens of both are compared.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

# Not this folder: its ``kernels.py`` would shadow the ``kernels`` package transformers (vLLM)
# imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import torch  # noqa: E402


def median_us(f, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        f()
        times.append(time.perf_counter_ns() - t)
    return round(statistics.median(times) / 1e3, 1)


def measure(sampler, vocab: int, rows: int, repeats: int) -> dict:
    """Both ways at one vocabulary (see the module docs)."""
    from logitsproc_rs import _tail as tail

    kp = [(50, 1.0), (0, 0.9), (20, 0.95), (0, 1.0)] * (rows // 4)
    k = torch.tensor([kk or vocab for kk, _ in kp], dtype=torch.int32)  # as vLLM's InputBatch
    p = torch.tensor([pp for _, pp in kp], dtype=torch.float32)
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(vocab)) * 3

    def gens() -> dict:
        return {i: torch.Generator().manual_seed(i) for i in range(rows)}

    def own() -> torch.Tensor:
        return sampler.forward_cpu(x.clone(), gens(), k, p)[0]

    def mask() -> torch.Tensor:
        return tail.mask_top_k_top_p_(x.clone(), k.to(torch.int64), p.clone())

    def ours() -> torch.Tensor:
        return sampler.forward_cpu(mask(), gens(), None, None)[0]

    def neither() -> torch.Tensor:
        return sampler.forward_cpu(x.clone(), gens(), None, None)[0]

    torch.manual_seed(0)
    a = own()
    torch.manual_seed(0)
    b = ours()
    return {
        "own_us": median_us(own, repeats),
        "ours_us": median_us(ours, repeats),
        "ours_mask_us": median_us(mask, repeats),
        "neither_us": median_us(neither, repeats),
        "same_tokens": bool(torch.equal(a, b)),
    }


def main() -> None:
    from vllm import __version__
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    torch.set_num_threads(1)
    sampler = TopKTopPSampler()
    rows = 16
    out: dict = {"vllm": __version__, "rows": rows, "by_vocab": {}}
    for vocab, repeats in ((32000, 20), (128256, 8)):
        out["by_vocab"][str(vocab)] = measure(sampler, vocab, rows, repeats)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

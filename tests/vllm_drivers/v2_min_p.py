"""Our MinP under Model Runner V2 selects what vLLM's own min_p selects.

MRV2 runs custom processors before temperature and its own min_p after it, so our
namespaced MinP compares on ``logits / temperature``. Checked here against vLLM 0.33.0's own
MRV2 kernels (``gumbel.apply_temperature`` then ``min_p.apply_min_p``), run by Triton's
interpreter on the CPU (``TRITON_INTERPRET=1``: vLLM's ``triton_utils`` sees no GPU driver and
would hand out placeholders, so it is replaced by the real ``triton`` modules): for random
rows with temperatures 0, 1 and others, draft rows included, the tokens we mask are exactly
the tokens vLLM's min_p masks, and every other logit is left as it was.
"""

from __future__ import annotations

import os
import random
import sys
import types

os.environ["TRITON_INTERPRET"] = "1"
import triton
import triton.language as tl
import triton.language.extra.libdevice as tldevice
import vllm  # noqa: F401

_shim = types.ModuleType("vllm.triton_utils")
_shim.triton, _shim.tl, _shim.tldevice = triton, tl, tldevice  # type: ignore[attr-defined]
sys.modules["vllm.triton_utils"] = _shim

import numpy as np  # noqa: E402
import torch  # noqa: E402
import v2_harness as h  # noqa: E402
from vllm.v1.worker.gpu.sample.gumbel import apply_temperature  # noqa: E402
from vllm.v1.worker.gpu.sample.min_p import apply_min_p  # noqa: E402

from logitsproc_rs import EngineConfig, SamplingParams  # noqa: E402


def main(seed: int, steps: int) -> None:
    h.v1_package(real=False)
    slots_n, vocab = 16, 300
    rs = h.RunnerState(slots_n, 256, vocab)
    cfg = EngineConfig(max_num_seqs=slots_n, vocab_size=vocab, num_speculative_tokens=2)
    procs = h.build(cfg, rs, ["logitsproc_rs.vllm.v2:MinPLogitsProcessor"])
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    needs = np.zeros(slots_n, dtype=bool)
    temperature = torch.zeros(slots_n, dtype=torch.float32)
    min_p = torch.zeros(slots_n, dtype=torch.float32)
    live: list[int] = []
    compared = tempered = masked = 0
    for _ in range(steps):
        while len(live) < slots_n and rng.random() < 0.7:
            slot = rs.add_request([1, 2, 3], [])
            t = rng.choice((0.0, 1.0, 0.3, 0.7, 0.8, 1.3, 2.0, rng.uniform(0.05, 3.0)))
            p = rng.choice((0.0, 0.05, 0.1, 0.3, rng.uniform(0.0, 0.9)))
            sp = SamplingParams(
                temperature=t, max_tokens=None, extra_args={"logitsproc_rs": {"min_p": p}}
            )
            h.add_to_sampler(procs, needs, slot, sp)
            temperature[slot], min_p[slot] = t, p
            live.append(slot)
        h.apply_staged_writes(procs)
        if not live:
            continue
        order = rng.sample(live, len(live))
        drafts = [rng.randint(0, 2) for _ in order]
        ctx = h.context(rs, order, drafts)
        rows = int(ctx.expanded_idx_mapping.shape[0])
        logits = torch.randn(rows, vocab, generator=g) * rng.choice((1.0, 4.0))
        ours = h.sample_apply(procs, needs, logits.clone(), ctx)
        theirs = logits.clone()
        apply_temperature(theirs, ctx.expanded_idx_mapping, temperature)
        apply_min_p(theirs, ctx.expanded_idx_mapping, min_p)
        want_masked = theirs.isneginf() & ~logits.isneginf()
        got_masked = ours.isneginf() & ~logits.isneginf()
        assert torch.equal(got_masked, want_masked), "MinP masks other tokens than vLLM's min_p"
        assert torch.equal(ours[~got_masked], logits[~got_masked]), "kept logits changed"
        t_rows = temperature[ctx.expanded_idx_mapping.long()]
        tempered += int(((t_rows != 0) & (t_rows != 1)).sum())
        masked += int(got_masked.sum())
        compared += rows
        for slot in list(live):
            if rng.random() < 0.2:
                live.remove(slot)
                rs.remove_request(slot)
    h.report({"rows": compared, "tempered_rows": tempered, "masked": masked})


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))

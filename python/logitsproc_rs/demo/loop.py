"""The demo's engine loop: every step, the workload's churn, every processor's
``update_state`` on both sides, then each side's sampler on the same logits, compared."""

from __future__ import annotations

import dataclasses
import os
import random
import sys

import torch

from ..loader import build_logitsprocs
from ..params import EngineConfig
from ..reference import ReferenceSampler, build_reference_logitsprocs
from ..sampler import Sampler
from .agreement import Agreement
from .report import Progress, print_header, print_report, step_note
from .timing import Timings, timed_call, timed_processors, update_all
from .workload import THINK_END, THINK_START, EngineWorkload, processor_features, processor_name


@dataclasses.dataclass
class DemoOptions:
    """What ``python -m logitsproc_rs demo`` was asked for (None: the device's default)."""

    steps: int | None = None
    batch: int | None = None
    vocab: int = 32000
    device: str = "cpu"
    seed: int = 0
    threads: int | None = None
    check_every: int = 1
    no_reference: bool = False
    sampling: str = "exact"


def run_demo(opts: DemoOptions) -> int:
    """Run the loop and print the report; 0 on agreement, 1 on a mismatch (or a stop token
    sampled before ``min_tokens``), 2 on a bad option."""
    device = torch.device(opts.device)
    on_cuda = device.type == "cuda"
    batch = opts.batch if opts.batch is not None else (256 if on_cuda else 32)
    steps = opts.steps if opts.steps is not None else (300 if on_cuda else 250)
    vocab = opts.vocab
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    elif not on_cuda:
        torch.set_num_threads(1)
    use_ref = not opts.no_reference
    check_every = max(1, opts.check_every)
    if vocab < 256:
        print("--vocab must be at least 256", file=sys.stderr)
        return 2
    if opts.sampling == "batch_invariant" and use_ref:
        print("--sampling batch_invariant draws other tokens than the reference: add "
              "--no-reference", file=sys.stderr)  # fmt: skip
        return 2
    # Our sampling tail's Rust threads as many as torch's (one on CPU by default), so the
    # two sides are timed on the same cores.
    os.environ.setdefault("LOGITSPROC_SAMPLING_THREADS", str(torch.get_num_threads()))

    cfg = EngineConfig(
        max_num_seqs=batch,
        vocab_size=vocab,
        reasoning_start_token_ids=THINK_START,
        reasoning_end_token_ids=THINK_END,
    )
    ours = build_logitsprocs(cfg, device, is_pin_memory=on_cuda)
    ours_features = processor_features(ours)
    ref = build_reference_logitsprocs(cfg, device) if use_ref else None
    features = ours_features & processor_features(ref) if ref is not None else ours_features
    skipped = sorted(ours_features - features)
    ours_named = [(processor_name(p), p) for p in ours.all]
    ref_named = [(processor_name(p), p) for p in ref.all] if ref is not None else []
    t_ours, t_ref = Timings(), Timings()
    sampler = Sampler(timed_processors(ours_named, t_ours, on_cuda), sampling=opts.sampling)
    ref_sampler = ReferenceSampler(timed_processors(ref_named, t_ref, on_cuda))
    agreement = Agreement() if ref is not None else None

    rng = random.Random(opts.seed)  # unseeded random rows: one global seed per step
    work = EngineWorkload(batch, vocab, opts.seed, features, device)
    print_header(
        f"logitsproc_rs demo: {steps} steps, batch up to {batch}, vocab {vocab}, "
        f"device {device} ({torch.get_num_threads()} CPU threads), seed {opts.seed}, "
        f"sampling {opts.sampling}",
        features,
        skipped,
        use_ref,
    )
    progress = Progress(steps)

    for step in range(steps):
        update, rows = work.step()
        n = len(rows)
        check = agreement is not None and step % check_every == 0

        # update_state: every processor, every step (None too), both sides.
        update_all(ours_named, update, t_ours, on_cuda)
        if ref is not None:
            update_all(ref_named, update, t_ref, on_cuda)
        if n == 0:
            progress.update(step + 1, "empty batch")
            continue

        md_ours, md_ref = work.metadata(rows, changed=update is not None)
        if opts.sampling == "batch_invariant":  # keys: the request ids; positions: its tokens
            md_ours.seeds = [r.req_id for r in rows]
            md_ours.positions = [len(r.output_token_ids) for r in rows]
        logits = work.logits(n)
        ref_logits = logits.clone() if check else None
        if check and check_every > 1:  # the reference skipped steps: bring its generators level
            for i, gen in md_ours.generators.items():
                md_ref.generators[i].set_state(gen.get_state())
        rng_seed = rng.randrange(2**62)  # unseeded random rows: the same global stream each side
        torch.manual_seed(rng_seed)
        out, ns = timed_call(on_cuda, sampler, logits, md_ours)
        t_ours.sampled(ns)

        if check:
            assert agreement is not None and ref_logits is not None
            torch.manual_seed(rng_seed)
            out_ref, ns = timed_call(on_cuda, ref_sampler, ref_logits, md_ref)
            t_ref.sampled(ns)
            bad = agreement.compare(step, rows, out, out_ref)
            if bad:
                progress.update(step + 1, "MISMATCH")
                print(bad, file=sys.stderr)
                return 1

        work.feed_back(rows, out.sampled_token_ids.tolist())
        progress.update(step + 1, step_note(n, t_ours, t_ref))

    counts = work.finish()
    print_report(
        counts, t_ours, t_ref if ref is not None else None, agreement, on_cuda, check_every
    )
    if counts.min_tokens_violations:
        print(
            f"ERROR: {counts.min_tokens_violations} stop tokens sampled before min_tokens",
            file=sys.stderr,
        )
        return 1
    return 0

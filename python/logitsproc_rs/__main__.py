"""``python -m logitsproc_rs demo``: the command line of the demo (``logitsproc_rs.demo``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

from ._tail import SAMPLING_MODES
from .demo import DemoOptions, run_demo


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m logitsproc_rs")
    sub = ap.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="the main job: a simulated engine loop, ours vs the reference, per-step costs",
        description=(
            "An engine loop in miniature: requests with mixed sampling parameters arrive and "
            "finish, the batch condenses and reorders, output lists grow with the sampled "
            "tokens, and every step runs update_state + the Sampler through this library and "
            "through the plain reference on the same logits. Checks that they agree and "
            "reports per-step costs. Exits 1 on a mismatch."
        ),
    )
    demo.add_argument(
        "--steps", type=int, default=None, help="engine steps (default 300 on CUDA, 250 on CPU)"
    )
    demo.add_argument(
        "--batch",
        type=int,
        default=None,
        help=(
            "max_num_seqs, the batch the churn refills toward (default 256 on CUDA, 32 on "
            "CPU, where both samplers' top-p sorts of 32,000-logit rows take milliseconds per "
            "row: the CPU defaults finish in about 75 s on 2 cores)"
        ),
    )
    demo.add_argument(
        "--vocab", type=int, default=32000, help="vocabulary size (default 32000; e.g. 151936)"
    )
    demo.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="torch device (default: cuda if available, else cpu)",
    )
    demo.add_argument("--seed", type=int, default=0, help="seed of the churn and the logits")
    demo.add_argument(
        "--threads",
        type=int,
        default=None,
        help=(
            "torch CPU threads (default 1 on CPU: on a small shared machine torch's "
            "multi-threaded ops wait for busy cores and time the scheduler, not the work; "
            "torch's default on CUDA)"
        ),
    )
    demo.add_argument(
        "--check-every",
        type=int,
        default=1,
        metavar="N",
        help="run the reference sampler and compare every N steps (default 1)",
    )
    demo.add_argument(
        "--no-reference",
        action="store_true",
        help="run this library alone (all its processors' parameters, no agreement check)",
    )
    demo.add_argument(
        "--sampling",
        choices=SAMPLING_MODES,
        default="exact",
        help="our Sampler's tail (default exact: the reference's tokens without its sort; "
        "batch_invariant samples other tokens, so it needs --no-reference)",
    )
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "demo":
        return run_demo(
            DemoOptions(
                steps=args.steps,
                batch=args.batch,
                vocab=args.vocab,
                device=args.device,
                seed=args.seed,
                threads=args.threads,
                check_every=args.check_every,
                no_reference=args.no_reference,
                sampling=args.sampling,
            )
        )
    return 2  # pragma: no cover - argparse requires a command


if __name__ == "__main__":
    sys.exit(main())

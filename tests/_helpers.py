"""Small helpers the unit tests share: updates, stepping and applying, exact comparison, and
the Rust core's view of vLLM's three built-ins."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from logitsproc_rs import BatchUpdate


def upd(batch_size: int, *, removed=(), added=(), moved=()) -> BatchUpdate:
    return BatchUpdate(
        batch_size=batch_size, removed=list(removed), added=list(added), moved=list(moved)
    )


def step(procs, update) -> None:
    for p in procs:
        p.update_state(update)


def applied(proc, logits: torch.Tensor) -> torch.Tensor:
    return proc.apply(logits.clone())


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert torch.equal(a, b), f"\n{a}\n!=\n{b}"


TABLE = {
    "MinPLogitsProcessor": "min_p",
    "LogitBiasLogitsProcessor": "logit_bias",
    "MinTokensLogitsProcessor": "min_tokens",
}


def active(proc: Any) -> int:
    """Requests the processor's table tracks in the Rust core (MinP: slots with min_p != 0)."""
    return dict(proc.pipeline.core.active())[TABLE[type(proc).__name__]]


def _vparams(min_p=0.0, logit_bias=None, min_tokens=0, stop=()):
    return SimpleNamespace(
        min_p=min_p, logit_bias=logit_bias, min_tokens=min_tokens, all_stop_token_ids=set(stop)
    )

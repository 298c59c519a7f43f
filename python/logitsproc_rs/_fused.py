"""Which argmax-invariant processors the fused tails run in their one Rust pass (issue 41), and
their per-row values: ``batch_invariant``'s (``rust/src/sampling/fused.rs``) and ``exact``'s
(``rust/src/sampling/exact.rs``: min-p only, ``EXACT``).

The fused pass does temperature, min-p, top-n-sigma, epsilon, eta, top-k / top-p and the
draw per row, the row read from memory once. It stands in for the processors' own ``apply``
only where it gives their logits: every argmax-invariant processor is a built-in view, the
active ones are among those four, in the pass's order. Anything else (a custom processor, an
active typical-p, XTC or kept top-k / top-p) makes ``fused_plan`` return ``None`` and the
``Sampler`` runs the processors one by one, as before. The processors stay the reference,
and the path of engines that call them one by one (vLLM's own loop).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import torch

from .builtin import BUILTINS
from .builtin._combined import CombinedView
from .builtin.epsilon_cutoff import EpsilonCutoffLogitsProcessor
from .builtin.eta_cutoff import EtaCutoffLogitsProcessor
from .builtin.min_p import MinPLogitsProcessor
from .builtin.top_n_sigma import TopNSigmaLogitsProcessor
from .state import LogitsProcessors

#: Fused view → (keyword of ``unsafe_fused_gumbel``, buffer of its per-row value).
FUSED: dict[type, tuple[str, str]] = {
    MinPLogitsProcessor: ("log_min_p", "min_p.log_min_p"),
    TopNSigmaLogitsProcessor: ("top_n_sigma", "top_n_sigma.value"),
    EpsilonCutoffLogitsProcessor: ("epsilon", "epsilon_cutoff.value"),
    EtaCutoffLogitsProcessor: ("eta", "eta_cutoff.value"),
}
# Their order is the sampler's (``BUILTINS``), which ``fused.rs`` applies them in.
_ORDER = [c for c in BUILTINS if c in FUSED]


def _views(procs: Iterable[Any], logits: torch.Tensor) -> list[Any] | None:
    """The built-in views in apply order (combined ones opened), each one's logits check and
    ``before_apply`` done as its ``apply`` would; ``None`` at the first processor that is
    not a built-in view."""
    out: list[Any] = []
    for p in procs:
        if isinstance(p, CombinedView):
            parts: list[Any] = list(p.parts)
        elif type(p) in BUILTINS:
            parts = [p]
        else:
            return None
        p._pipe.check_logits(p, logits, False)
        p._pipe.before_apply()
        out.extend(parts)
    return out


#: The steps the fused ``exact`` pass (``exact.rs``) runs: min-p alone, whose fused form is
#: bitwise the processor's; the truncations' float64 statistics are not torch's float32 ones.
EXACT = frozenset({MinPLogitsProcessor})


def fused_plan(
    procs: LogitsProcessors, logits: torch.Tensor, only: Collection[type] | None = None
) -> dict[str, torch.Tensor] | None:
    """The fused steps' per-row values (keyword → float32 ``[B]`` on the logits' device, read
    from the tables' device views: no sync) for ``logits``, or ``None`` where the fused pass
    cannot stand in for the argmax-invariant processors (``only``: the fused steps allowed,
    e.g. ``EXACT``; every one of ``FUSED`` when ``None``)."""
    views = _views(procs.argmax_invariant, logits)
    if views is None:
        return None
    rows = logits.shape[0]
    plan: dict[str, torch.Tensor] = {}
    last = -1
    for v in views:
        pipe = v._pipe
        if not any(pipe.count(t) for t in v.TABLES):
            continue  # idle: its apply would do nothing
        spec = FUSED.get(type(v)) if only is None or type(v) in only else None
        at = _ORDER.index(type(v)) if spec is not None else -1
        if spec is None or at <= last:
            return None
        last = at
        key, buffer = spec
        plan[key] = pipe.dense(buffer, rows, False).view(-1)
    return plan

"""Which argmax-invariant processors the fused tails run in their one pass (issue 41), and their
per-row values: ``batch_invariant``'s (Rust on the CPU, ``rust/src/sampling/fused.rs``; Triton
on CUDA) and ``exact``'s (Rust on the CPU, ``rust/src/sampling/exact.rs``, which hands back to
the processors' torch steps (``truncate_rows_``) the rows it cannot be certain of).

The fused pass does temperature, min-p, top-n-sigma, typical-p, epsilon, eta, XTC, top-k /
top-p and the draw per row, the row read from memory once. It stands in for the processors'
own ``apply`` only where it gives their logits: every argmax-invariant processor is a built-in
view, the active ones are among those of ``FUSED``, in the pass's order. Anything else (a
custom processor, the kept top-k / top-p) makes ``fused_plan`` return ``None`` and the
``Sampler`` runs the processors one by one. XTC's draws are the XTC view's own
(``XTCLogitsProcessor.uniforms``), taken once the plan stands, so its generators advance as
on the separate path. The processors stay the reference, and the path of engines that call
them one by one (vLLM's own loop).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from .builtin import BUILTINS
from .builtin._combined import CombinedView
from .builtin._truncation import TruncationView
from .builtin.epsilon_cutoff import EpsilonCutoffLogitsProcessor
from .builtin.eta_cutoff import EtaCutoffLogitsProcessor
from .builtin.min_p import MinPLogitsProcessor
from .builtin.top_n_sigma import TopNSigmaLogitsProcessor
from .builtin.typical_p import TypicalPLogitsProcessor
from .builtin.xtc import XTCLogitsProcessor, xtc_mask_
from .state import LogitsProcessors

#: Fused view → its (step keyword of the fused passes' bindings, buffer of the per-row value)
#: pairs.
FUSED: dict[type, tuple[tuple[str, str], ...]] = {
    MinPLogitsProcessor: (("log_min_p", "min_p.log_min_p"),),
    TopNSigmaLogitsProcessor: (("top_n_sigma", "top_n_sigma.value"),),
    TypicalPLogitsProcessor: (("typical_p", "typical_p.value"),),
    EpsilonCutoffLogitsProcessor: (("epsilon", "epsilon_cutoff.value"),),
    EtaCutoffLogitsProcessor: (("eta", "eta_cutoff.value"),),
    XTCLogitsProcessor: (
        ("xtc_probability", "xtc.probability"),
        ("xtc_threshold", "xtc.threshold"),
    ),
}
#: The keyword of XTC's per-row draw ``u``.
XTC_U = "xtc_u"
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


def fused_plan(procs: LogitsProcessors, logits: torch.Tensor) -> dict[str, torch.Tensor] | None:
    """The fused steps' per-row values (keyword → float32 ``[B]`` on the logits' device, read
    from the tables' device views: no sync) for ``logits``, or ``None`` where the fused pass
    cannot stand in for the argmax-invariant processors. With XTC active, a plan holds the
    step's ``u``, drawn here as XTC's ``apply`` would draw it: one plan per step, run."""
    views = _views(procs.argmax_invariant, logits)
    if views is None:
        return None
    rows = logits.shape[0]
    plan: dict[str, torch.Tensor] = {}
    last = -1
    xtc: XTCLogitsProcessor | None = None
    for v in views:
        pipe = v._pipe
        if not any(pipe.count(t) for t in v.TABLES):
            continue  # idle: its apply would do nothing
        spec = FUSED.get(type(v))
        at = _ORDER.index(type(v)) if spec is not None else -1
        if spec is None or at <= last:
            return None
        last = at
        for key, buffer in spec:
            plan[key] = pipe.dense(buffer, rows, False).view(-1)
        if isinstance(v, XTCLogitsProcessor):
            xtc = v
    if xtc is not None:  # drawn only now: a plan given up draws nothing
        plan[XTC_U] = xtc.uniforms(logits, False)
    return plan


def truncate_rows_(logits: torch.Tensor, rows: list[int], plan: dict[str, torch.Tensor]) -> None:
    """The plan's steps after min-p (the truncations, XTC) on ``rows`` of ``logits``, in place,
    by the processors' own torch steps, each row as their batched ``apply`` masks it: what the
    fused ``exact`` pass leaves to torch where it cannot be certain (``exact.rs``)."""
    idx = torch.tensor(rows, dtype=torch.long, device=logits.device)
    sub = logits.index_select(0, idx)

    def column(key: str) -> torch.Tensor:
        return plan[key].index_select(0, idx).unsqueeze(1)

    for cls in _ORDER:
        key = FUSED[cls][0][0]
        if cls is MinPLogitsProcessor or key not in plan:
            continue
        if cls is XTCLogitsProcessor:
            xtc_mask_(sub, column(key), column(FUSED[cls][1][0]), column(XTC_U))
        elif issubclass(cls, TruncationView):
            cls.mask_(sub, column(key))
    logits.index_copy_(0, idx, sub)

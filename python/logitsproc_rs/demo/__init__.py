"""``python -m logitsproc_rs demo``: the main job, an engine loop in miniature.

Requests with mixed sampling parameters arrive and finish over many steps; every step the
persistent batch condenses and reorders, each live request's output list grows by the token
*our* sampler picked for it last step, and the full pipeline (``update_state`` of every
processor, then the ``Sampler``) runs on synthetic logits through this library and through the
plain reference (``logitsproc_rs.reference``) side by side, on the same device and the same
logits, with identically seeded per-request generators. The demo checks that both pick the
same tokens (MinP float ties aside) and reports the per-step cost of each side.

- ``workload``: the simulated engine (churn, parameter mix, sampled tokens fed back, logits);
- ``agreement``: ours vs the reference, row by row, exact but for MinP float ties;
- ``timing``: per-step and per-processor costs, without touching the processors or samplers;
- ``report``: the printing;
- ``loop``: the engine loop that ties them together (``run_demo``).
"""

from __future__ import annotations

from .loop import DemoOptions, run_demo

__all__ = ["DemoOptions", "run_demo"]

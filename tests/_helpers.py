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


def built(cls: type, cfg: Any) -> Any:
    """A processor class built as vLLM builds it, on the CPU, not pinned."""
    return cls(cfg, torch.device("cpu"), False)


def step(procs, update) -> None:
    for p in procs:
        p.update_state(update)


def applied(proc, logits: torch.Tensor) -> torch.Tensor:
    return proc.apply(logits.clone())


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert torch.equal(a, b), f"\n{a}\n!=\n{b}"


def assert_unchanged(before: Any, after: Any, where: str = "state") -> None:
    """Two snapshots of the same state are equal, exactly: dicts key by key, lists and tuples
    item by item, tensors by ``torch.equal``, the rest by ``==``; the message names the path of
    the first difference (``state['buffers'][2] changed``)."""
    if isinstance(before, torch.Tensor):
        assert isinstance(after, torch.Tensor) and torch.equal(before, after), f"{where} changed"
    elif isinstance(before, dict):
        assert isinstance(after, dict), f"{where}: {type(after).__name__}, not a dict"
        assert before.keys() == after.keys(), f"{where}: keys {sorted(before)} -> {sorted(after)}"
        for k in before:
            assert_unchanged(before[k], after[k], f"{where}[{k!r}]")
    elif isinstance(before, (list, tuple)):
        assert type(after) is type(before), f"{where}: {type(after).__name__}"
        assert len(before) == len(after), f"{where}: length {len(before)} -> {len(after)}"
        for i, (x, y) in enumerate(zip(before, after, strict=True)):
            assert_unchanged(x, y, f"{where}[{i}]")
    else:
        assert before == after, f"{where}: {before!r} -> {after!r}"


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


def routes_match_reference(
    view: Any,
    ref: Any,
    sim: Any,
    cap: int,
    vocab: int,
    logits_of: Any,
    steps: int = 120,
    before_apply: Any = None,
) -> int:
    """Drives ``sim`` (a seeded ``ChurnSimulator``) through ``view`` (an opt-in built-in view
    class) on every route and its reference ``ref``, requiring identical logits each step: one
    call (``procs.update_state``), vLLM's loop, the device path (``emulate_device``), the token
    feed, stable slots (a request keeps its slot; rows map to slots), and the view built alone.
    ``logits_of(step, rows)`` gives the step's logits. ``before_apply(step)``, when given, runs
    before every apply (the reference's and each route's): a processor that draws from torch's
    global generator (XTC) gets the same state on each. Returns how many logits the reference
    masked (so a caller can check the churn did something)."""
    from logitsproc_rs import EngineConfig, build_logitsprocs

    cfg = EngineConfig(max_num_seqs=cap, vocab_size=vocab)
    extra = [view]
    one = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=extra)
    loop = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=extra)
    emu = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=extra, emulate_device=True)
    fed = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=extra, token_feed=True)
    slots = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=extra, stable_slots=True)
    alone = view(cfg, "cpu", False)

    def ours(procs: Any) -> Any:
        return next(p for p in procs.all if isinstance(p, view))

    reference = ref(cfg, torch.device("cpu"), False)
    pipe = ours(slots).pipeline
    slot_of: dict[int, int] = {}
    prev_rows: list[Any] = []
    masked = 0
    for k in range(steps):
        update = sim.step()
        rows = sim.batch.rows()
        one.update_state(update)
        emu.update_state(update)
        for p in loop.all:
            p.update_state(update)
        alone.update_state(update)
        sampled = [r.output_token_ids[-1] for r in prev_rows]
        fed.update_state(update, sampled_token_ids=sampled if prev_rows else None)
        live = {r.req_id for r in rows}
        for rid in [rid for rid in slot_of if rid not in live]:
            pipe.remove_request(slot_of.pop(rid))
        for r in rows:
            if r.req_id not in slot_of:
                slot_of[r.req_id] = min(set(range(cap)) - set(slot_of.values()))
                pipe.add_request(
                    slot_of[r.req_id], r.params, r.prompt_token_ids, r.output_token_ids
                )
        reference.update_state(update)
        logits = logits_of(k, len(rows))

        def fresh(k: int = k, logits: torch.Tensor = logits) -> torch.Tensor:
            if before_apply is not None:
                before_apply(k)
            return logits.clone()

        want = reference.apply(fresh())
        for name, procs in (("one call", one), ("loop", loop), ("emulated", emu), ("fed", fed)):
            got = ours(procs).apply(fresh())
            assert torch.equal(got, want), f"{name}, step {k}\n{got}\n{want}"
        assert torch.equal(alone.apply(fresh()), want), f"alone, step {k}"
        row_to_slot = [slot_of[r.req_id] for r in rows]
        got = pipe.apply(fresh(), row_to_slot, processors=[ours(slots)])
        assert torch.equal(got, want), f"stable slots, step {k}\n{got}\n{want}"
        masked += int((torch.isinf(want) & ~torch.isinf(logits)).sum())
        prev_rows = list(rows)
    return masked

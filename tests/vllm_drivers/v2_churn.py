"""Our processors inside vLLM 0.33.0's Model Runner V2 interface, against our V1 path.

Usage: ``v2_churn.py SEED MAX_NUM_SEQS VOCAB STEPS DRAFTS FAULTS`` (run by
tests/test_vllm_v2.py in a subprocess). The same seeded churn (arrivals, finishes, growing
outputs, thinking markers) drives:

* the V1 path: ``build_logitsprocs`` + ``LogitsProcessors.update_state`` with the batch
  updates of a persistent batch (list feed), both phases applied in V1 row order;
* MRV2: the classes of ``logitsproc_rs.vllm.v2`` loaded by vLLM's own loader from
  ``module:Class`` names, a runner state whose free list recycles slots (the processors are
  never told of a finish), committed tokens only in ``all_token_ids``/``total_len``, rows
  shuffled every step, with ``DRAFTS`` > 0 up to that many drafts per request (its run of
  rows at draft positions 0 .. k, the drafts in ``ctx.input_ids``; the V1 side applies the
  same drafts per position, ``LogitsProcessors.apply_drafts``), and now and then a request
  preempted and resumed with its output so far.

With ``FAULTS`` = 1 both also run ``Boost``, a custom column processor (bridged with
``logitsproc_rs.vllm.v2.bridge`` and passed to vLLM's loader as a class), and MRV2 alone gets
faults: requests whose params make Boost's column reader raise or carry an out-of-vocabulary
logit-bias key (each must be a ``ValueError`` naming the processor, the slot and the field;
the engine then drops the request), and steps where Boost's transform raises (a
``RuntimeError`` naming Boost; that step's logits are lost). Every other step must still match.

Every row of every step must equal the V1 row of its request, exactly. Prints one
``RESULT {json}`` line with counts of what was exercised.
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys
from typing import Any

import log_records
import numpy as np
import torch
import v2_harness as h
from test_differential import random_logits
from test_pipeline import config, make_sim, phases

from logitsproc_rs import (
    ColumnLogitsProcessor,
    EngineConfig,
    FloatColumn,
    SamplingParams,
    build_logitsprocs,
    builtin,
)
from logitsproc_rs.vllm.v2 import bridge


def read_boost(sp: Any) -> Any:
    extra = sp.extra_args or {}
    if extra.get("boom"):
        raise KeyError("boom")
    return extra.get("boost")


class Boost(ColumnLogitsProcessor):
    """Adds ``extra_args["boost"]`` to token 0; ``FAIL`` makes the transform raise."""

    COLUMNS = (FloatColumn("boost", default=0.0, read=read_boost),)
    FAIL = False

    def is_argmax_invariant(self) -> bool:
        return False

    def transform(self, logits: torch.Tensor, cols: Any, num_active: int) -> torch.Tensor:
        if Boost.FAIL:
            raise KeyError("transform failed on purpose")
        if num_active:
            logits[:, :1] += cols["boost"]
        return logits


def main(seed: int, max_num_seqs: int, vocab: int, steps: int, max_drafts: int, faults: int):
    h.v1_package(real=False)  # 3.5 s saved per run; v2_loader.py imports vLLM's own
    cfg = config(max_num_seqs, vocab)
    # With drafts, the V1 side applies them per position too (LogitsProcessors.apply_drafts).
    v1_cfg = dataclasses.replace(cfg, num_speculative_tokens=max_drafts or None)
    v1 = build_logitsprocs(v1_cfg, "cpu", False, custom_logitsprocs=[Boost] if faults else ())
    order = [type(p).__name__ for p in (*v1.non_argmax_invariant, *v1.argmax_invariant)]
    fields = {k: getattr(cfg, k) for k in EngineConfig.__dataclass_fields__}
    v2_cfg = EngineConfig(**{**fields, "num_speculative_tokens": max_drafts or None})
    rs = h.RunnerState(max_num_seqs, 4096, vocab)
    if os.environ.get("LOGITSPROC_V2_LOAD") == "every_field":
        # The recommended form: every field in two classes (in V1's order: the combined
        # classes' parts run in it).
        assert not faults and h.FIELDS != "plain"
        names = [
            "logitsproc_rs.vllm.v2:EveryFieldLogitsProcessor",
            "logitsproc_rs.vllm.v2:EveryFieldSamplingLogitsProcessor",
        ]
        order = [n.rsplit(":", 1)[1] for n in names]
    elif h.FIELDS != "plain":  # the module's classes, as a user loads them by name
        names = [bridge(Boost) if n == "Boost" else f"logitsproc_rs.vllm.v2:{n}" for n in order]
    else:  # bridges reading the ordinary fields
        names = [
            bridge(Boost if n == "Boost" else getattr(builtin, n), namespace=None) for n in order
        ]
    procs = h.build(v2_cfg, rs, names)
    assert [type(p).__name__ for p in procs] == order
    pipes = {id(p.pipeline) for p in procs}
    needs = np.zeros(max_num_seqs, dtype=bool)

    sim = make_sim(seed, max_num_seqs, vocab, placeholders=False)
    rng = random.Random(seed + 1)
    # Requests that set none of our fields: a few throughout, and nearly all arrivals in the
    # middle of the run, so that whole batches go by that none of ours acts on.
    plain_rng, make_full = random.Random(seed + 3), sim.make_params

    def sometimes_plain(r: random.Random) -> Any:
        sp = make_full(r)
        middle = steps // 5 <= sim.steps < steps * 4 // 5
        return SamplingParams() if plain_rng.random() < (0.95 if middle else 0.2) else sp

    sim.make_params = sometimes_plain
    if faults:
        make_params = sim.make_params

        def boosted(r: random.Random) -> Any:
            sp = make_params(r)
            if rng.random() < 0.5:
                sp.extra_args = {**(sp.extra_args or {}), "boost": rng.choice((-3.0, 0.5, 40.0))}
            return sp

        sim.make_params = boosted
    g = torch.Generator().manual_seed(seed)
    own_rng = random.Random(seed + 2)  # when vLLM's own states need processing
    slot_of: dict[int, int] = {}
    stats = dict.fromkeys(
        (
            "rows",
            "draft_rows",
            "recycled",
            "resumed",
            "skipped",
            "applied_idle",
            "fed",
            "bad_params",
            "failed",
        ),
        0,
    )
    used: set[int] = set()
    preempted: list[int] = []
    refresh = sim.batch.refresh

    def refresh_preempting() -> Any:
        """Now and then a request is preempted and resumed with its output so far, within the
        step's update: V1 sees it added again at its index (its processors start again from
        the output list); MRV2 frees its slot and adds it again with prefill = prompt +
        output (the free list hands back the same slot: an overwrite). Only a request that
        no move of this step touches, so the add's index is its index after the moves."""
        b = sim.batch.builder
        touched = {i for m in b.moved for i in m[:2]} | {a[0] for a in b.added}
        free = [i for i in range(sim.batch.num_reqs) if i not in touched]
        if free and rng.random() < 0.1:
            req = sim.batch.slots[rng.choice(free)]
            b.added.append(
                (sim.batch.slots.index(req), req.params, req.prompt_token_ids, req.output_token_ids)
            )
            preempted.append(req.req_id)
        return refresh()

    sim.batch.refresh = refresh_preempting
    for _ in range(steps):
        preempted.clear()
        update = sim.step()
        rows = sim.batch.rows()
        v1.update_state(update)
        # Each request's drafts (none without DRAFTS): its rows in V1 order are positions
        # 0 .. k, in MRV2's the same run of rows, the runs shuffled.
        drafts = [[rng.randrange(vocab) for _ in range(rng.randint(0, max_drafts))] for _ in rows]
        starts = np.cumsum([0] + [1 + len(d) for d in drafts]).tolist()
        logits = random_logits(rng, g, starts[-1], vocab)
        temps = [r.params.temperature for r, d in zip(rows, drafts, strict=True) for _ in [0, *d]]
        want = tempered_phases(v1, logits, temps, drafts if max_drafts else None)

        # MRV2: finished requests free their slots (no processor call), the last step's
        # tokens are committed, new (and resumed) requests are added, staged writes flushed.
        live = {r.req_id: r for r in rows}
        for rid in [rid for rid in slot_of if rid not in live or rid in preempted]:
            rs.remove_request(slot_of.pop(rid))
        stats["resumed"] += sum(bool(live[rid].output_token_ids) for rid in preempted)
        for rid, slot in slot_of.items():
            rs.commit(slot, live[rid].output_token_ids)
        for r in rows:
            if r.req_id not in slot_of:
                slot = rs.add_request(list(r.prompt_token_ids or ()), list(r.output_token_ids))
                stats["recycled"] += slot in used
                used.add(slot)
                slot_of[r.req_id] = slot
                h.add_to_sampler(procs, needs, slot, h.v2_params(r.params))
        if faults and rs.free_indices and rng.random() < 0.15:
            bad_request(rs, procs, needs, vocab, rng)
            stats["bad_params"] += 1
        h.apply_staged_writes(procs)

        perm = list(range(len(rows)))
        rng.shuffle(perm)
        slots = [slot_of[rows[i].req_id] for i in perm]
        ctx = h.context(rs, slots, [len(drafts[i]) for i in perm], [drafts[i] for i in perm])
        v1_rows = [starts[i] + j for i in perm for j in range(1 + len(drafts[i]))]
        if faults and rng.random() < 0.08:
            Boost.FAIL = True
            try:
                h.sample_apply(procs, needs, logits[v1_rows], ctx)
                raise AssertionError("Boost's transform raised, apply did not")
            except RuntimeError as e:
                assert "Boost.apply" in str(e) and "on purpose" in str(e), e
            finally:
                Boost.FAIL = False
            stats["failed"] += 1
            continue
        # Now and then vLLM's own sampling states need the batch processed (a temperature,
        # its own fields): MRV2 then calls every processor's apply, also ours when none of
        # ours acts on any request of it (those must leave it as it is).
        ours = bool(np.any(needs[ctx.idx_mapping_np]))
        theirs = own_rng.random() < 0.3
        got = h.sample_apply(procs, needs | theirs, logits[v1_rows], ctx)
        if not ours:
            stats["applied_idle" if theirs else "skipped"] += 1
        assert torch.equal(got, want[v1_rows]), f"step {sim.steps}: V2 differs from V1"
        stats["rows"] += len(rows)
        stats["draft_rows"] += len(v1_rows) - len(rows)
    stats["fed"] = int(sum(len(r.output_token_ids) for r in sim.batch.rows()))
    stats["pipelines"] = len(pipes)
    h.report(stats)


def tempered_phases(
    v1: Any, logits: torch.Tensor, temps: list[float], drafts: list[list[int]] | None = None
) -> torch.Tensor:
    """What MRV2 should see from the processors: V1's phases, but MinP selects on the logits
    after temperature (MRV2 divides after the custom processors; V1, and vLLM's own min_p,
    select after it), masking the raw logits. With ``drafts``, each request's rows at draft
    positions ``0 .. k`` (``apply_drafts``)."""
    if drafts is None:
        x = phases(v1, logits)[0]
        apply = lambda p, y: p.apply(y)  # noqa: E731
    else:
        x = v1.apply_drafts(v1.non_argmax_invariant, logits.clone(), drafts)
        apply = lambda p, y: p.apply_rows(y)  # noqa: E731  (the rows mapped just above)
    t = torch.tensor(temps, dtype=torch.float32)[:, None]
    for p in v1.argmax_invariant:
        if type(p).__name__ != "MinPLogitsProcessor":
            x = apply(p, x)
            continue
        scaled = torch.where((t == 0.0) | (t == 1.0), x, x / t)
        kept = apply(p, scaled.clone())
        x = x.masked_fill(kept.isneginf() & ~scaled.isneginf(), float("-inf"))
    return x


RECORDS = log_records.capture()


def bad_request(rs: Any, procs: list[Any], needs: Any, vocab: int, rng: random.Random) -> None:
    """MRV2 only: a request refused in add_request is failed closed (raising would stop the
    engine): named in an ERROR, it acts (its row is forced to its stop tokens), and no table
    holds its fields. The engine frees its slot again (a later add overwrites it)."""
    if rng.random() < 0.5:
        sp, owner, field = SamplingParams(extra_args={"boom": True}), "Boost", "'boost'"
        sp.min_p, sp.repetition_penalty = 0.2, 1.5  # fields of tables that must stay unset
    else:
        sp = SamplingParams(logit_bias={vocab + 3: 1.0}, min_tokens=2)
        owner, field = "LogitBiasLogitsProcessor", "'logit_bias'"
    slot = rs.add_request([1, 2, 3], [])
    before = len(RECORDS.messages)
    h.add_to_sampler(procs, needs, slot, h.v2_params(sp))
    assert needs[slot], "a failed-closed request must be applied (its row is forced)"
    assert len(RECORDS.messages) == before + 1, RECORDS.messages[before:]
    msg = RECORDS.messages[-1]
    assert msg.startswith(f"{owner}.add_request(req_idx={slot}) failed closed"), msg
    assert f"request at index {slot}" in msg and field in msg, msg
    assert procs[0]._group.forced.rows[slot] == [sp.eos_token_id or 0]
    needs[slot] = False
    rs.remove_request(slot)


def sabotage(mode: str) -> None:
    """Tests of this test: a bridge that drops the token feed, or that never installs a
    request's prompt and output so far, must be caught. (``no_prefetch`` and
    ``half_prefetch`` are the other routes: the committed tokens read in apply, for every
    request or for those the prefetch of apply_staged_writes lacks.)"""
    from logitsproc_rs.vllm import v2

    if mode == "no_feed":
        v2._Group.committed = lambda self, slots: (None, None, None)
    elif mode == "no_install":
        v2._Group.install_pending = lambda self: self.pending.clear()
    elif mode == "no_prefetch":  # not a sabotage: every step reads in apply instead
        v2._Group.prefetch = lambda self: None
    elif mode == "half_prefetch":  # nor this: half from the prefetch, half read in apply
        prefetch = v2._Group.prefetch

        def half(self: Any) -> None:
            last = self.last_slots
            self.last_slots = last[::2]
            prefetch(self)
            self.last_slots = last

        v2._Group.prefetch = half
    else:
        raise SystemExit(f"unknown sabotage {mode!r}")


if __name__ == "__main__":
    if len(sys.argv) > 7:
        sabotage(sys.argv[7])
    main(*map(int, sys.argv[1:7]))

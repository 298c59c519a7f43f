"""The pipeline core: every route into it gives the same logits, rejections are atomic across the
whole pipeline, and uploads carry exactly what changed.

Routes compared over long seeded churn (all processors active, thinking markers, prompt/output
overlap), each against the container's one call on the list feed, exactly:

* vLLM's loop: each processor's ``update_state`` in turn;
* the token feed: the sampled ids per step instead of the engine's lists;
* the device path emulated on the CPU: a separate arena filled only by the per-step uploads;
* stable slots: requests in slots of their own, ``apply(logits, row_to_slot)`` with the rows in
  V1's order through a row map, plus extra rows that repeat a slot (draft rows).
"""

from __future__ import annotations

import random
import re
import textwrap
from typing import Any

import pytest
import torch
from _forkserver import run_python
from test_differential import (
    HOT_IDS,
    full_next_token,
    full_params_factory,
    make_prompt_ids,
    random_logits,
)

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    MoveDirectionality,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.simulate import ChurnSimulator

SWAP = MoveDirectionality.SWAP


def config(max_num_seqs: int, vocab: int) -> EngineConfig:
    # Small caps (above what the churn generates), so the cap checks are reachable in tests.
    return EngineConfig(
        max_num_seqs=max_num_seqs,
        vocab_size=vocab,
        reasoning_start_token_ids=[HOT_IDS[0]],
        reasoning_end_token_ids=[HOT_IDS[1], HOT_IDS[2]],
        max_logit_bias_entries=8,
        max_stop_token_ids=8,
        max_bad_words=6,
        max_bad_word_len=6,
        max_allowed_token_ids=16,
    )


def phases(procs: Any, logits: torch.Tensor, rows: bool = False) -> tuple[torch.Tensor, ...]:
    """Both phases of the processor layer: the non-invariant ones, then MinP on that (with
    ``rows``, through the stable-slot row map)."""
    a = logits.clone()
    for p in procs.non_argmax_invariant:
        a = p.apply_rows(a) if rows else p.apply(a)
    b = a.clone()
    for p in procs.argmax_invariant:
        b = p.apply_rows(b) if rows else p.apply(b)
    return a, b


def make_sim(seed: int, max_num_seqs: int, vocab: int, placeholders: bool) -> ChurnSimulator:
    next_token = full_next_token(vocab)
    if not placeholders:
        inner = next_token

        def next_token(rng: random.Random, req: Any) -> int:
            t = inner(rng, req)
            return t if t >= 0 else rng.randrange(vocab)

    sim = ChurnSimulator(
        max_num_seqs,
        vocab,
        seed,
        full_params_factory(vocab),
        finish_prob=1 / 30,
        max_tokens=(4, 90),
        next_token=next_token,
        prompt_len=(1, 20),
    )
    make_prompt_ids(sim)
    return sim


def run_routes(seed: int, max_num_seqs: int, vocab: int, steps: int) -> dict[str, int]:
    cfg = config(max_num_seqs, vocab)
    base = build_logitsprocs(cfg, "cpu", False)
    loop = build_logitsprocs(cfg, "cpu", False)
    fed = build_logitsprocs(cfg, "cpu", False, token_feed=True)
    dev = build_logitsprocs(cfg, "cpu", False, emulate_device=True)
    slots = build_logitsprocs(cfg, "cpu", False, stable_slots=True, max_rows=2 * max_num_seqs)
    pipe = slots.pipeline
    sim = make_sim(seed, max_num_seqs, vocab, placeholders=False)
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    slot_of: dict[int, int] = {}
    free = list(range(max_num_seqs))
    rng.shuffle(free)
    stats = {"steps": 0, "rows": 0, "draft_rows": 0, "uploads": 0}
    for _ in range(steps):
        before = sim.batch.rows()
        lens = [len(r.output_token_ids) for r in before]
        update = sim.step()
        # What the sampler returned last step, by the rows of that step (-1: none).
        sampled = [
            r.output_token_ids[n] if len(r.output_token_ids) > n else -1
            for r, n in zip(before, lens, strict=True)
        ]
        rows = sim.batch.rows()
        base.update_state(update)
        for p in loop.all:
            p.update_state(update)
        fed.update_state(update, sampled_token_ids=torch.tensor(sampled, dtype=torch.int64))
        dev.update_state(update)
        stats["uploads"] += dev.bytes_uploaded_last_step
        # Stable slots: the same requests, each in a slot of its own.
        live = {r.req_id for r in rows}
        for rid in [rid for rid in slot_of if rid not in live]:
            pipe.remove_request(slot_of[rid])
            free.append(slot_of.pop(rid))
        for r in rows:
            if r.req_id not in slot_of:
                slot_of[r.req_id] = free.pop(rng.randrange(len(free)))
                pipe.add_request(
                    slot_of[r.req_id], r.params, r.prompt_token_ids, r.output_token_ids
                )
        row_to_slot = [slot_of[r.req_id] for r in rows]
        extra = [rng.randrange(len(rows)) for _ in range(rng.randint(0, 3))] if rows else []
        logits = random_logits(rng, g, len(rows), vocab)
        want = phases(base, logits)
        for name, procs in (("loop", loop), ("token feed", fed), ("device", dev)):
            got = phases(procs, logits)
            for k in range(2):
                assert torch.equal(got[k], want[k]), f"{name}: phase {k + 1} differs"
        # Stable slots, rows through a map, and extra rows repeating a slot.
        x = torch.cat([logits, logits[extra]]) if extra else logits
        pipe.step_slots(row_to_slot + [row_to_slot[i] for i in extra])
        a, b = phases(slots, x, rows=True)
        n = len(rows)
        assert torch.equal(a[:n], want[0]) and torch.equal(b[:n], want[1]), "stable slots differ"
        for j, i in enumerate(extra):
            assert torch.equal(a[n + j], want[0][i]) and torch.equal(b[n + j], want[1][i])
        stats["steps"] += 1
        stats["rows"] += n
        stats["draft_rows"] += len(extra)
    return stats


@pytest.mark.parametrize(
    ("seed", "max_num_seqs", "vocab", "steps"),
    [(0, 8, 64, 600), (1, 32, 128, 400), (2, 96, 256, 150)],
)
def test_every_route_gives_the_same_logits(seed, max_num_seqs, vocab, steps) -> None:
    stats = run_routes(seed, max_num_seqs, vocab, steps)
    assert stats["rows"] > steps and stats["draft_rows"] > steps / 2 and stats["uploads"] > 0


def test_placeholders_on_the_device_path_and_the_vllm_loop() -> None:
    """Async placeholders (a -1 filled in before apply) through the emulated device path and
    through vLLM's per-processor loop, against the container call."""
    vocab, cap = 64, 8
    cfg = config(cap, vocab)
    base = build_logitsprocs(cfg, "cpu", False)
    others = [
        build_logitsprocs(cfg, "cpu", False, emulate_device=True),
        build_logitsprocs(cfg, "cpu", False),
    ]
    sim = make_sim(3, cap, vocab, placeholders=True)
    rng = random.Random(3)
    g = torch.Generator().manual_seed(3)
    filled = 0
    for _ in range(300):
        update = sim.step()
        rows = sim.batch.rows()
        base.update_state(update)
        others[0].update_state(update)
        for p in others[1].all:
            p.update_state(update)
        for r in rows:  # the engine fills placeholders in before sampling
            out = r.output_token_ids
            if out and out[-1] == -1:
                out[-1] = rng.choice(HOT_IDS)
                filled += 1
        logits = random_logits(rng, g, len(rows), vocab)
        want = phases(base, logits)
        for procs in others:
            got = phases(procs, logits)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert filled > 20


# ---------------------------------------------------------------------------------------------
# Uploads


def test_unchanged_steps_upload_nothing_and_changes_upload_little() -> None:
    cfg = EngineConfig(max_num_seqs=64, vocab_size=1000)
    procs = build_logitsprocs(cfg, "cpu", False, emulate_device=True, token_feed=True)
    adds = [(i, SamplingParams(min_p=0.1, logit_bias={i: 1.0}), None, []) for i in range(8)]
    procs.update_state(BatchUpdate(8, [], adds, []))
    first = procs.bytes_uploaded_last_step
    assert first > 0
    for _ in range(3):
        procs.update_state(None)
        assert procs.bytes_uploaded_last_step == 0
    procs.update_state(None, sampled_token_ids=[-1] * 8)
    assert procs.bytes_uploaded_last_step == 0
    # One more request: a few hundred bytes, not the arena.
    procs.update_state(BatchUpdate(9, [], [(8, SamplingParams(min_p=0.2), None, [])], []))
    assert 0 < procs.bytes_uploaded_last_step <= 4096 < procs.pipeline.core.arena_bytes


# ---------------------------------------------------------------------------------------------
# Rejections are atomic across the pipeline, on every route

BAD_FIELDS = [
    ("min_p", dict(min_p=0.5), "min_p", 1.5),
    ("logit_bias", dict(logit_bias={1: 1.0}), "logit_bias", {99: 1.0}),
    ("logit_bias", dict(logit_bias={1: 1.0}), "logit_bias", {1: 1e39}),
    ("min_tokens", dict(min_tokens=2, stop_token_ids=[3]), "min_tokens", -1),
    ("stop_token_ids", dict(min_tokens=2), "_all_stop_token_ids", {99}),
    ("repetition_penalty", dict(repetition_penalty=1.2), "repetition_penalty", 0.0),
    ("frequency_penalty", dict(frequency_penalty=0.5), "frequency_penalty", 3.0),
    ("presence_penalty", dict(presence_penalty=0.5), "presence_penalty", float("nan")),
    ("bad_words", dict(bad_words_token_ids=[[2]]), "bad_words_token_ids", [[99]]),
    ("bad_words", dict(bad_words_token_ids=[[2]]), "bad_words_token_ids", [[]]),
    ("allowed_token_ids", dict(allowed_token_ids=[1]), "allowed_token_ids", []),
    ("allowed_token_ids", dict(allowed_token_ids=[1]), "allowed_token_ids", [99]),
    ("thinking_token_budget", dict(thinking_token_budget=3), "thinking_token_budget", -5),
    ("thinking_token_budget", dict(thinking_token_budget=3), "thinking_token_budget", 2.5),
    ("min_tokens", dict(min_tokens=2, stop_token_ids=[3]), "min_tokens", True),
    # Per-request caps (config above).
    ("logit_bias", dict(logit_bias={1: 1.0}), "logit_bias", {i: 1.0 for i in range(9)}),
    ("stop_token_ids", dict(min_tokens=2), "_all_stop_token_ids", set(range(9))),
    ("bad_words", dict(bad_words_token_ids=[[2]]), "bad_words_token_ids", [[1]] * 7),
    ("bad_words", dict(bad_words_token_ids=[[2]]), "bad_words_token_ids", [list(range(7))]),
    ("allowed_token_ids", dict(allowed_token_ids=[1]), "allowed_token_ids", list(range(17))),
]


def _full_state(procs: Any, rows: int, seed: int) -> dict[str, Any]:
    """Everything observable: every host buffer, counts, status, and the next logits."""
    pipe = procs.pipeline
    core = pipe.core
    out = {
        "buffers": [v.clone() for v in pipe.arena.views],
        "active": core.active(),
        "status": list(pipe.status),
        "counted": [core.penalties_counted(i) for i in range(pipe.capacity)],
        "forced": core.thinking_forced(),
    }
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, pipe.vocab_size, generator=g)
    out["logits"] = phases(procs, x, rows=pipe.stable_slots)
    return out


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        all(torch.equal(x, y) for x, y in zip(a["buffers"], b["buffers"], strict=True))
        and a["active"] == b["active"]
        and a["status"] == b["status"]
        and a["counted"] == b["counted"]
        and a["forced"] == b["forced"]
        and all(torch.equal(x, y) for x, y in zip(a["logits"], b["logits"], strict=True))
    )


def _seeded(cfg: EngineConfig, **kw: Any) -> tuple[Any, list[list[int]]]:
    procs = build_logitsprocs(cfg, "cpu", False, **kw)
    outs = [[HOT_IDS[0], 4], [2]]
    good = SamplingParams(
        min_p=0.1,
        logit_bias={2: 1.0},
        min_tokens=5,
        stop_token_ids=[3],
        repetition_penalty=1.3,
        bad_words_token_ids=[[2, 4]],
        allowed_token_ids=[1, 2, 3, 4, 5],
        thinking_token_budget=1,
    )
    if kw.get("stable_slots"):
        procs.pipeline.add_request(0, good, [1, 2], outs[0])
        procs.pipeline.add_request(1, SamplingParams(presence_penalty=0.5), [3], outs[1])
        procs.pipeline.step_slots([0, 1])
    else:
        procs.update_state(
            BatchUpdate(
                2,
                [],
                [
                    (0, good, [1, 2], outs[0]),
                    (1, SamplingParams(presence_penalty=0.5), [3], outs[1]),
                ],
                [],
            )
        )
    return procs, outs


@pytest.mark.parametrize(("field", "good", "attr", "bad"), BAD_FIELDS)
@pytest.mark.parametrize("route", ["container", "loop", "stable_slots"])
def test_one_bad_request_changes_nothing_anywhere(field, good, attr, bad, route) -> None:
    cfg = config(8, 32)
    procs, _outs = _seeded(cfg, stable_slots=route == "stable_slots")
    rows = 2
    before = _full_state(procs, rows, 1)
    params = SamplingParams(**good)
    object.__setattr__(params, attr, bad)  # bypass SamplingParams' own checks
    neighbours = [
        (i, SamplingParams(min_p=0.3, logit_bias={7: 2.0}, repetition_penalty=2.0), [5], [6])
        for i in (2, 4)
    ]
    pattern = re.compile(rf"request at index 3: field '{field}'")
    if route == "stable_slots":
        pipe = procs.pipeline
        pipe.add_request(5, neighbours[0][1], [5], [6])  # a good change, pending
        with pytest.raises(ValueError, match=pattern):
            pipe.add_request(3, params, [1], [])
        pipe.remove_request(5)  # cancels the pending add (the last change of a slot wins)
        pipe.step_slots([0, 1])
        assert _same(before, _full_state(procs, rows, 1))
        return
    update = BatchUpdate(
        5, [], [neighbours[0], (3, params, [1], []), neighbours[1]], [(0, 1, SWAP)]
    )
    if route == "container":
        with pytest.raises(ValueError, match=pattern):
            procs.update_state(update)
    else:
        for p in procs.all:
            with pytest.raises(ValueError, match=pattern):
                p.update_state(update)
    after = _full_state(procs, rows, 1)
    assert _same(before, after)
    # The next step works and sees the old state.
    procs.update_state(None)
    assert procs.pipeline.count("batch_size") == 2


def test_bad_token_feed_changes_nothing() -> None:
    cfg = config(8, 32)
    procs, _ = _seeded(cfg, token_feed=True)
    before = _full_state(procs, 2, 2)
    update = BatchUpdate(3, [], [(2, SamplingParams(min_p=0.2), None, [])], [])
    for bad in ([1, 99], [1, -2], [1, 2, 3, 4, 5, 6, 7, 8, 9]):
        with pytest.raises(ValueError, match="sampled_token_ids"):
            procs.update_state(update, sampled_token_ids=bad)
    assert _same(before, _full_state(procs, 2, 2))
    with pytest.raises(ValueError, match="token_feed=True"):
        build_logitsprocs(cfg, "cpu", False).update_state(None, sampled_token_ids=[1])


# ---------------------------------------------------------------------------------------------
# Building costs no memory until used


def test_a_big_capacity_costs_no_memory_until_used() -> None:
    """max_num_seqs=65536 with every table: the buffers are zeroed lazily (fresh pages), so
    building does not write gigabytes (4.25 GB of RSS, and 25 s, when every page was written up
    front). Memory is what is checked; the time follows from it."""
    script = textwrap.dedent(
        """
        import resource
        import torch
        from logitsproc_rs import EngineConfig, build_logitsprocs
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        procs = build_logitsprocs(EngineConfig(max_num_seqs=65536, vocab_size=32000), "cpu", False)
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
        print(grew // 1024)
        """
    )
    # A child of the fork server: a fresh process's RSS (with PYTHONPATH=python and
    # OMP_NUM_THREADS=1), without importing torch again.
    out = run_python(script, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) < 400, f"building grew the RSS by {out.stdout.strip()} MiB"

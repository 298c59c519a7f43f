"""Ours inside vLLM V1: ``logitsproc_rs.vllm.v1`` loaded by vLLM 0.25.1's own
``build_logitsprocs``, driven by its own ``BatchUpdateBuilder`` (adds, removals, condense moves
and swaps, recorded with vLLM's ``MoveDirectionality``, as its persistent batch does) and its
own ``SamplingParams``, updated by vLLM's per-processor loop. Every step the logits must equal
our native path's (``logitsproc_rs.build_logitsprocs`` + one ``update_state`` call, our own
update types and params) exactly.

Two modes: the bridges as exported (built-in fields in ``extra_args["logitsproc_rs"]``, vLLM's
built-ins see neutral fields), and bridges that read vLLM's ordinary fields (without LogitBias
and MinP, which vLLM's built-ins would apply a second time; vLLM's MinTokens runs beside ours
there, on the same fields).
"""

from __future__ import annotations

import random
import sys

import log_records
import torch
import v1_harness  # noqa: F401  (paths, threads)
from logit_margin import LogitMarginLogitsProcessor
from v1_harness import apply_all, import_vllm, result

import logitsproc_rs.simulate as simulate
from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    MoveDirectionality,
    SamplingParams,
    build_logitsprocs,
    builtin,
)
from logitsproc_rs.vllm import v1

lp = import_vllm()
from vllm.sampling_params import SamplingParams as VllmSamplingParams  # noqa: E402

V, MAX, START, END = 64, 16, [3], [4, 5]
cfg = EngineConfig(
    max_num_seqs=MAX, vocab_size=V, reasoning_start_token_ids=START, reasoning_end_token_ids=END
)
LogitMargin = v1.bridge(LogitMarginLogitsProcessor, name="LogitMargin")
# Listed in our native order: the non-invariant ones then apply as ours do.
EXPORTED = [
    v1.AllowedTokenIdsLogitsProcessor,
    v1.BadWordsLogitsProcessor,
    "logitsproc_rs.vllm.v1:MinTokensLogitsProcessor",
    v1.LogitBiasLogitsProcessor,
    v1.MinPLogitsProcessor,
    LogitMargin,
    "logitsproc_rs.vllm.v1:PenaltiesLogitsProcessor",
    v1.ThinkingBudgetLogitsProcessor,
]
# The recommended form: every field in two classes, with our processors beyond vLLM's on the
# native side too, and fields for some of them.
EVERY_FIELD = [
    "logitsproc_rs.vllm.v1:EveryFieldLogitsProcessor",
    v1.EveryFieldSamplingLogitsProcessor,
    LogitMargin,
]
BEYOND = {
    "no_repeat_ngram_size": (2, 3),
    "top_n_sigma": (1.0, 2.0),
    "typical_p": (0.5, 0.9),
    "kept_top_k": (3, 20),
    "dry_multiplier": (0.8,),
}
PLAIN_TABLES = [
    builtin
    for builtin in (
        "AllowedTokenIdsLogitsProcessor",
        "BadWordsLogitsProcessor",
        "MinTokensLogitsProcessor",
        "PenaltiesLogitsProcessor",
        "ThinkingBudgetLogitsProcessor",
    )
]
PLAIN = [
    v1.bridge(getattr(__import__("logitsproc_rs.builtin").builtin, n), namespace=None)
    for n in PLAIN_TABLES
]


def fields(rng: random.Random, plain: bool, beyond: bool = False) -> dict:
    f: dict = {}
    for name, values in BEYOND.items() if beyond else ():
        if rng.random() < 0.25:
            f[name] = rng.choice(values)
    if not plain and rng.random() < 0.4:
        f["min_p"] = rng.choice((0.05, 0.3))
    if not plain and rng.random() < 0.4:
        f["logit_bias"] = {rng.randrange(V): rng.choice((-4.0, 3.0)) for _ in range(3)}
    if rng.random() < 0.4:
        f["min_tokens"] = rng.choice((2, 8))
    if rng.random() < 0.5:
        f["repetition_penalty"] = rng.choice((0.8, 1.3))
        f["frequency_penalty"] = rng.choice((0.0, 0.5))
        f["presence_penalty"] = rng.choice((-0.5, 0.0, 1.0))
    if rng.random() < 0.3:
        f["bad_words_token_ids"] = [[rng.randrange(6, V)], [rng.randrange(6, V), 7]]
    if rng.random() < 0.2:
        f["allowed_token_ids"] = rng.sample(range(V), 20)
    if rng.random() < 0.4:
        f["thinking_token_budget"] = rng.choice((0, 2, 6))
    return f


def make_pair(rng: random.Random, plain: bool, beyond: bool) -> tuple[object, SamplingParams]:
    f = fields(rng, plain, beyond)
    stops = rng.sample(range(6, V), rng.randint(0, 2))
    extra: dict = {}
    if not plain and rng.random() < 0.5:
        extra["logit_margin"] = rng.choice((0.5, 2.0))
    ns_stops = rng.sample(range(6, V), 1) if not plain and rng.random() < 0.3 else []
    if plain:
        theirs = VllmSamplingParams(
            temperature=1.0,
            stop_token_ids=stops,
            **{k: v for k, v in f.items() if k != "bad_words_token_ids"},
        )
        # vLLM fills this from the tokenizer; the field its property reads.
        theirs._bad_words_token_ids = f.get("bad_words_token_ids")
    else:
        ns = dict(f, stop_token_ids=ns_stops) if ns_stops else f
        routed = dict(extra, **{v1.NAMESPACE: ns}) if ns else extra
        theirs = VllmSamplingParams(
            temperature=1.0, stop_token_ids=stops, extra_args=routed or None
        )
    ours = SamplingParams(
        temperature=1.0,
        max_tokens=None,
        stop_token_ids=stops + ns_stops,
        extra_args=extra or None,
        **f,
    )
    return theirs, ours


def run(seed: int, plain: bool, steps: int, every_field: bool = False) -> dict:
    twins: dict[int, tuple[object, SamplingParams]] = {}

    def make_params(rng: random.Random) -> object:
        theirs, ours = make_pair(rng, plain, every_field)
        twins[id(theirs)] = (theirs, ours)  # holds theirs: the id stays unique
        return theirs

    def next_token(rng: random.Random, req: object) -> int:
        r = rng.random()
        if r < 0.15:
            return rng.choice(START + END)
        return rng.randrange(V) if r > 0.25 else rng.randrange(6, 12)

    # The persistent batch in miniature, recording vLLM's own moves in vLLM's own builder.
    simulate.MoveDirectionality = lp.MoveDirectionality
    sim = simulate.ChurnSimulator(
        MAX, V, seed, make_params, target_batch=12, finish_prob=0.12, swap_prob=0.25,
        max_tokens=(2, 30), next_token=next_token, prompt_len=(1, 6),
    )  # fmt: skip
    sim.batch.builder = lp.BatchUpdateBuilder()
    loaded = EVERY_FIELD if every_field else PLAIN if plain else EXPORTED
    theirs = lp.build_logitsprocs(cfg, torch.device("cpu"), False, False, loaded)
    custom: list = [] if plain else [LogitMarginLogitsProcessor]
    if every_field:
        # In the combined classes' order (theirs: EveryField..., then LogitMargin last).
        opt_in = [c for c in builtin.OPT_IN_PROCESSORS if c is not builtin.XTCLogitsProcessor]
        custom = [*opt_in, *custom]
    native = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=custom)
    bridges = [p for p in theirs.all if isinstance(p, v1._Bridge)]
    assert len(bridges) == len(loaded), bridges
    assert len({id(p.pipeline) for p in bridges}) == 1, "the bridges do not share one pipeline"

    def to_native(u: object) -> BatchUpdate | None:
        if u is None:
            return None
        assert all(type(d) is lp.MoveDirectionality for _, _, d in u.moved)
        return BatchUpdate(
            batch_size=u.batch_size,
            removed=list(u.removed),
            added=[(i, twins[id(p)][1], pr, out) for i, p, pr, out in u.added],
            moved=[(a, b, MoveDirectionality[d.name]) for a, b, d in u.moved],
        )

    gen = torch.Generator().manual_seed(seed)
    counts = {"steps": 0, "moves": 0, "swaps": 0, "rows_changed": 0}
    for _ in range(steps):
        update = sim.step()
        assert update is None or isinstance(update, lp.BatchUpdate)
        for p in theirs.all:  # vLLM's loop (InputBatch.refresh_metadata)
            p.update_state(update)
        native.update_state(to_native(update))
        if update is not None:
            counts["moves"] += len(update.moved)
            counts["swaps"] += sum(d.name == "SWAP" for _, _, d in update.moved)
        n = sim.batch.num_reqs
        if not n:
            continue
        logits = torch.randn(n, V, generator=gen)
        a = apply_all(theirs, logits.clone())
        b = apply_all(native, logits.clone())
        if not torch.equal(a, b):
            bad = [i for i in range(n) if not torch.equal(a[i], b[i])]
            raise AssertionError(f"plain={plain} step {sim.steps}: rows {bad} differ")
        counts["steps"] += 1
        counts["rows_changed"] += sum(not torch.equal(b[i], logits[i]) for i in range(n))
    return counts


steps = int(sys.argv[1]) if len(sys.argv) > 1 else 120


def without_reasoning() -> dict:
    """The every-field classes in an engine without a reasoning config: built without the
    thinking budget, and a request that sets it is failed closed, the log naming the field
    and what the engine lacks."""
    bare = EngineConfig(max_num_seqs=MAX, vocab_size=V)
    procs = lp.build_logitsprocs(bare, torch.device("cpu"), False, False, EVERY_FIELD[:2])
    ours = [p for p in procs.all if isinstance(p, v1._Bridge)]
    sp = VllmSamplingParams(extra_args={v1.NAMESPACE: {"thinking_token_budget": 4}})
    builder = lp.BatchUpdateBuilder()
    builder.added.append((0, sp, [1, 2], []))
    update = builder.get_and_reset(1)
    records = log_records.capture()
    for p in procs.all:
        p.update_state(update)
    row = apply_all(procs, torch.zeros(1, V))
    return {
        "tables": sorted(ours[0].pipeline.tables),
        "logged": [m for m in records.messages if "thinking_token_budget" in m],
        "finite": int(torch.isfinite(row).sum()),
    }


routed = run(5, plain=False, steps=steps)
plain = run(6, plain=True, steps=steps // 2)
every_field = run(7, plain=False, steps=steps, every_field=True)
for c in (routed, plain, every_field):
    assert c["swaps"] > 0 and c["rows_changed"] > 0, c
result(routed=routed, plain=plain, every_field=every_field, without_reasoning=without_reasoning())

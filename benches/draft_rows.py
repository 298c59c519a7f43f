"""``make bench-drafts``: per-step host cost of the stable-slot step with speculative draft rows
(vLLM Model Runner V2's layout), written as section 8 of ``bench-report.md``.

B requests (B = 256) each own a run of K + 1 rows (K = 4 drafts: 1,280 rows) over a vocabulary
of 32,000, with a history of ~512 tokens (a 512-token prompt, then each step every request
commits 1 .. K + 1 tokens: the accepted drafts and one more). Every processor that reads
histories is on: penalties, bad words, MinTokens (with stop ids), the thinking budget (the
config has reasoning ids; half the requests think), DRY and no-repeat-ngram (opt-in), with the
history-free ones built alongside (allowed ids, logit bias, MinP: built, unused by these
requests). Each step is timed three ways, on pipelines fed the same tokens:

* **(a) drafts**: ``pipe.step_slots(row_to_slot, tokens, slots, local_pos=..., input_ids=...)``
  (the row at draft position j sees the committed history + d_0 .. d_{j-1}), then every
  processor's ``apply_rows`` on ``[1280, 32000]`` float32 logits;
* **(b) committed**: the same row map without the draft layout (every row of a slot sees the
  committed history), then the same ``apply_rows``;
* **(c) reference per position**: ``logitsproc_rs.reference``'s processors applied per row
  as ``tests/test_draft_rows.py``'s reference does (for each draft position j, a copy of the
  reference stepped through j drafts, one slot-space batch): slow, a few steps only.

The logits of a step are one fixed Gaussian tensor cloned for each variant (the copy is not
timed). The variants run in a rotating order each step. After the last step where (c) ran,
each processor's ``apply_rows`` under (a) is compared with its reference on the same input (=
equal, ≠ not; the penalties do not read the drafts on this branch yet). Ratios are of medians
from this run.
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report_measure import Clock, Samples, median_us, progress, rotated
from report_tables import ROOT, env_line, fmt_us, markdown_table, median_p90_cell, write_section

from logitsproc_rs import BatchUpdate, EngineConfig, SamplingParams, build_logitsprocs
from logitsproc_rs.builtin import (
    DryLogitsProcessor,
    MinPLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
)
from logitsproc_rs.reference import reference_of

HEADING = "## 8. Draft rows (speculative decoding, k = 4)"
VOCAB = 32000
THINK_START, THINK_END = VOCAB - 2, VOCAB - 1
STOP = (3, 4, 5)


def zipf_ids() -> np.ndarray:
    """Token ids by frequency rank (a fixed permutation of the vocabulary, minus the markers)."""
    return np.random.default_rng(0).permutation(VOCAB - 2)


def zipf(rng: np.random.Generator, shape: Any) -> np.ndarray:
    """i.i.d. Zipf (s = 1) token ids."""
    p = 1.0 / np.arange(1, VOCAB - 1)
    p /= p.sum()
    return zipf_ids()[rng.choice(VOCAB - 2, size=shape, p=p)]


FEATURES = {
    "penalties": ("repetition_penalty", "frequency_penalty", "presence_penalty"),
    "bad words": ("bad_words_token_ids",),
    "min_tokens": ("min_tokens", "stop_token_ids"),
    "thinking": ("thinking_token_budget",),
    "DRY": ("dry_multiplier", "dry_sequence_breakers"),
    "no-repeat-ngram": ("no_repeat_ngram_size",),
}


def requests(
    b: int, prompt_len: int, seed: int, without: Sequence[str] = ()
) -> list[tuple[SamplingParams, list[int]]]:
    """B requests with every history-reading processor on (half of them thinking), but the
    ``FEATURES`` named in ``without``."""
    rng = random.Random(seed)
    ranks = zipf_ids()
    hot = [int(t) for t in ranks[:16]]
    prompts = zipf(np.random.default_rng(seed), (b, prompt_len)).tolist()
    out = []
    for i in range(b):
        kw: dict[str, Any] = dict(
            temperature=1.0,
            max_tokens=None,
            repetition_penalty=1.1,
            frequency_penalty=0.1,
            presence_penalty=0.1,
            bad_words_token_ids=[
                [rng.choice(hot) for _ in range(rng.randint(1, 3))] for _ in range(3)
            ],
            min_tokens=rng.choice((8, 32, 128)),
            stop_token_ids=list(STOP),
            dry_multiplier=0.8,
            dry_sequence_breakers=[[int(ranks[20])], [int(ranks[40]), int(ranks[41])]],
            no_repeat_ngram_size=3,
        )
        prompt = prompts[i]
        if i % 2:
            kw["thinking_token_budget"] = rng.choice((16, 64, 256))
            prompt = [*prompt[:-1], THINK_START]
        for f in without:
            for name in FEATURES[f]:
                kw.pop(name, None)
        out.append((SamplingParams(**kw), prompt))
    return out


@dataclass
class Run:
    b: int
    k: int
    prompt_len: int
    warm: int
    steps: int
    ref_steps: int
    cells: dict[str, Samples] = field(default_factory=dict)
    agree: list[str] = field(default_factory=list)
    accepted: float = 0.0
    history: tuple[int, int] = (0, 0)
    seconds: float = 0.0
    breakdown: list[tuple[str, Samples, Samples]] = field(default_factory=list)


class Reference:
    """The plain reference per position (``tests/test_draft_rows.py``'s ``Churn.reference``):
    one reference per processor, slot-space, fed the committed tokens as the pipeline is."""

    def __init__(self, cfg: EngineConfig, procs: list[Any], reqs: list[Any]) -> None:
        self.b, self.v = cfg.max_num_seqs, cfg.vocab_size
        self.refs = [reference_of(type(p))(cfg, torch.device("cpu"), False) for p in procs]
        self.outputs: dict[int, list[int]] = {s: [] for s in range(len(reqs))}
        added = [(s, p, prompt, self.outputs[s]) for s, (p, prompt) in enumerate(reqs)]
        for r in self.refs:
            r.update_state(BatchUpdate(self.b, [], added, []))

    def commit(self, feed: list[tuple[int, int]]) -> None:
        for s, t in feed:
            self.outputs[s].append(t)
        for r in self.refs:
            r.update_state(None)

    def one(self, k: int, x: torch.Tensor, row_map: list[int], pos: list[int], ids: list[int]):
        out = x.clone()
        ref, outputs = self.refs[k], self.outputs
        for j in range(max(pos) + 1):
            if j:
                memo: dict[int, Any] = {}
                ref = copy.deepcopy(ref, memo)
                outputs = {s: memo.get(id(o), list(o)) for s, o in outputs.items()}
                for r, s in enumerate(row_map):
                    if pos[r] == j:
                        outputs[s].append(ids[r])
                ref.update_state(None)
            rows = [r for r in range(len(row_map)) if pos[r] == j]
            batch = torch.zeros(self.b, self.v)
            batch[[row_map[r] for r in rows]] = x[rows]
            batch = ref.apply(batch)
            out[rows] = batch[[row_map[r] for r in rows]]
        return out

    def step(self, feed, x: torch.Tensor, row_map: list[int], pos: list[int], ids: list[int]):
        """The whole step: the committed tokens, then every processor per position."""
        self.commit(feed)
        for k in range(len(self.refs)):
            x = self.one(k, x, row_map, pos, ids)
        return x


def build(cfg: EngineConfig, reqs: list[Any], rows: int) -> tuple[Any, list[Any]]:
    procs = build_logitsprocs(
        cfg, "cpu", False, custom_logitsprocs=[DryLogitsProcessor, NoRepeatNGramLogitsProcessor],
        stable_slots=True, token_feed=True, max_rows=rows,
    )  # fmt: skip
    pipe = procs.pipeline
    for s, (p, prompt) in enumerate(reqs):
        pipe.add_request(s, p, prompt, [])
    views = [p for p in pipe._views if not isinstance(p, MinPLogitsProcessor)]
    return pipe, views


def apply_all(views: list[Any], x: torch.Tensor) -> torch.Tensor:
    for p in views:
        x = p.apply_rows(x)
    return x


def measure(run: Run) -> None:
    b, k = run.b, run.k
    rows = b * (k + 1)
    cfg = EngineConfig(
        max_num_seqs=b,
        vocab_size=VOCAB,
        reasoning_start_token_ids=[THINK_START],
        reasoning_end_token_ids=[THINK_END],
    )
    reqs = requests(b, run.prompt_len, seed=1)
    pipe_a, views_a = build(cfg, reqs, rows)
    pipe_b, views_b = build(cfg, reqs, rows)
    ref = Reference(cfg, views_a, reqs) if run.ref_steps else None
    clock = Clock(torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, VOCAB, generator=g).mul_(3.0)
    rng = np.random.default_rng(2)
    row_map = [s for s in range(b) for _ in range(k + 1)]
    pos = list(range(k + 1)) * b
    for key in ("a_step", "a_apply", "a", "b_step", "b_apply", "b", "c"):
        run.cells[key] = Samples()
    last = [prompt[-1] for _, prompt in reqs]
    feed: list[tuple[int, int]] = []
    committed = 0
    for step in range(run.warm + run.steps):
        m = step >= run.warm
        with_ref = ref is not None and m and step < run.warm + run.ref_steps
        drafts = zipf(rng, (b, k)).tolist()
        ids = [t for s in range(b) for t in (last[s], *drafts[s])]
        tokens = [t for _, t in feed] or None
        slots = [s for s, _ in feed] or None

        drafted = dict(local_pos=pos, input_ids=ids)
        tasks: list[tuple[str, Any, tuple[Any, ...], dict[str, Any], Any]] = [
            ("a", pipe_a.step_slots, (row_map, tokens, slots), drafted, views_a),
            ("b", pipe_b.step_slots, (row_map, tokens, slots), {}, views_b),
        ]
        if with_ref:
            assert ref is not None
            tasks.append(("c", ref.step, (feed, x.clone(), row_map, pos, ids), {}, None))
        elif ref is not None and step < run.warm:
            ref.commit(feed)  # warm-up: the reference follows, untimed
        for key, fn, args, kw, views in rotated(tasks, step):
            ns = clock(fn, *args, **kw)
            if views is None:
                run.cells[key].add(ns, True)
                continue
            y = x.clone()
            ns_apply = clock(apply_all, views, y)
            run.cells[f"{key}_step"].add(ns, m)
            run.cells[f"{key}_apply"].add(ns_apply, m)
            run.cells[key].add(ns + ns_apply, m)
        if with_ref and step == run.warm + run.ref_steps - 1:
            run.agree = agreement(views_a, ref, x, row_map, pos, ids)
        # What each slot commits: n accepted drafts (0 .. K) and one more token.
        feed = []
        for s in range(b):
            n = int(rng.integers(0, k + 1))
            extra = int(zipf(rng, 1)[0])
            for t in (*drafts[s][:n], extra):
                feed.append((s, t))
            last[s] = extra
            committed += n + 1
    run.accepted = committed / (b * (run.warm + run.steps)) - 1
    run.history = (run.prompt_len, run.prompt_len + committed // b)


def step_only(
    b: int, k: int, prompt_len: int, steps: int, without: Sequence[str] = ()
) -> tuple[Samples, Samples]:
    """``step_slots`` alone, with the draft layout and then (the same step again, a re-step)
    without it, over ``steps`` steps after one warm-up."""
    cfg = EngineConfig(
        max_num_seqs=b,
        vocab_size=VOCAB,
        reasoning_start_token_ids=[THINK_START],
        reasoning_end_token_ids=[THINK_END],
    )
    reqs = requests(b, prompt_len, seed=1, without=without)
    pipe, _ = build(cfg, reqs, b * (k + 1))
    clock = Clock(torch.device("cpu"))
    rng = np.random.default_rng(2)
    row_map = [s for s in range(b) for _ in range(k + 1)]
    pos = list(range(k + 1)) * b
    last = [prompt[-1] for _, prompt in reqs]
    feed: list[tuple[int, int]] = []
    drafted, plain = Samples(), Samples()
    for step in range(1 + steps):
        drafts = zipf(rng, (b, k)).tolist()
        ids = [t for s in range(b) for t in (last[s], *drafts[s])]
        tokens = [t for _, t in feed] or None
        slots = [s for s, _ in feed] or None
        ns = clock(pipe.step_slots, row_map, tokens, slots, local_pos=pos, input_ids=ids)
        drafted.add(ns, step > 0)
        plain.add(clock(pipe.step_slots, row_map), step > 0)
        feed = []
        for s in range(b):
            n = int(rng.integers(0, k + 1))
            extra = int(zipf(rng, 1)[0])
            feed += [(s, t) for t in (*drafts[s][:n], extra)]
            last[s] = extra
    return drafted, plain


def breakdown(run: Run, steps: int) -> None:
    """Where the draft step's time goes: one feature off at a time, then the history."""
    cases: list[tuple[str, int, int, tuple[str, ...]]] = [("all on", run.k, run.prompt_len, ())]
    cases += [(f"without {f}", run.k, run.prompt_len, (f,)) for f in FEATURES]
    cases += [("all on, k = 1", 1, run.prompt_len, ())]
    cases += [(f"all on, prompt {n:,}", run.k, n, ()) for n in (64, 2048)]
    for label, k, n, without in cases:
        a, b = step_only(run.b, k, n, steps, without)
        run.breakdown.append((label, a, b))
        progress(f"  breakdown {label}: {fmt_us(median_us(a.ns))} µs")


def agreement(views: list[Any], ref: Reference, x, row_map, pos, ids) -> list[str]:
    """Each processor's ``apply_rows`` (draft layout) vs its reference per position."""
    out, y = [], x
    for k, p in enumerate(views):
        mine = p.apply_rows(y.clone())
        theirs = ref.one(k, y, row_map, pos, ids)
        same = torch.equal(mine.nan_to_num(), theirs.nan_to_num())
        out.append(f"{'=' if same else '≠'} {type(p).__name__.removesuffix('LogitsProcessor')}")
        y = theirs
    return out


def ratio(num: Samples, den: Samples) -> str:
    if not num.ns or not den.ns:
        return "n/a"
    return f"{median_us(num.ns) / median_us(den.ns):,.2f}×"


def section(run: Run, quick: bool) -> str:
    c = run.cells
    rows = run.b * (run.k + 1)
    md = [HEADING + "\n"]
    md.append(
        f"Written by `make bench-drafts` (`benches/draft_rows.py{' --quick' if quick else ''}`)"
        f" on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in {run.seconds:.0f} s. "
        f"{env_line(torch.device('cpu'))}. **A shared 2-core box**: other jobs ran beside it, "
        "so read the figures as ratios from one run.\n"
    )
    md.append(
        f"Per-step host time in µs, **median (p90)**, of the stable-slot front-end with "
        f"speculative draft rows (vLLM Model Runner V2's layout): B = {run.b} requests, each "
        f"owning a run of k + 1 = {run.k + 1} rows ({rows:,} rows), vocabulary {VOCAB:,}, "
        f"history {run.history[0]:,} → {run.history[1]:,} tokens over the run (a "
        f"{run.prompt_len}-token Zipf prompt, then every step each request commits its "
        f"accepted drafts, uniform in 0 .. {run.k}, and one more token: "
        f"{run.accepted:.1f} accepted on average). Every request has penalties (1.1, 0.1, "
        "0.1), three bad words, min_tokens (8, 32 or 128) with three stop ids, DRY "
        "(0.8) and no-repeat-ngram (n = 3); half of them think (a budget of 16, 64 or 256; the "
        "config has reasoning ids). **step** = `pipe.step_slots(row_to_slot, tokens, slots, "
        "...)` (the committed tokens, the per-step work, the row map and its draft layout, one "
        "upload); **apply** = every processor's `apply_rows` on the `[rows, V]` float32 logits "
        "(MinP, built, left out as in `tests/test_draft_rows.py`). **(a) drafts**: with "
        "`local_pos` / `input_ids` (row j sees the committed history + d_0 .. d_{j-1}); **(b) "
        "committed**: the same row map without them (every row sees the committed history: "
        "not what speculative decoding needs, the floor); **(c) reference per position**: "
        "`logitsproc_rs.reference` per row, for each draft position a copy of the reference "
        "stepped through the drafts (`tests/test_draft_rows.py`'s reference), feed included. "
        f"{run.steps} measured steps after {run.warm} warm-up for (a) and (b), in a rotating "
        f"order; (c) on the first {run.ref_steps} measured steps only.\n"
    )
    header = ["variant", "step", "apply", "step + apply"]
    table = [
        ["(a) drafts", median_p90_cell(c["a_step"].ns), median_p90_cell(c["a_apply"].ns),
         median_p90_cell(c["a"].ns)],
        ["(b) committed", median_p90_cell(c["b_step"].ns), median_p90_cell(c["b_apply"].ns),
         median_p90_cell(c["b"].ns)],
        ["(c) reference per position", "–", "–", median_p90_cell(c["c"].ns)],
    ]  # fmt: skip
    md.append(markdown_table(header, table) + "\n")
    ratios = [
        ["(a) / (b), step: what the draft layout costs", ratio(c["a_step"], c["b_step"])],
        ["(a) / (b), step + apply", ratio(c["a"], c["b"])],
        ["(c) / (a), step + apply: the reference per position / ours", ratio(c["c"], c["a"])],
    ]
    md.append(markdown_table(["ratio of medians", "value"], ratios) + "\n")
    if run.breakdown:
        md.append(
            "Where the draft step goes: `step_slots` alone on a fresh pipeline per line (B = "
            f"{run.b}), with the draft layout, then the same step again without it (a re-step, "
            "no feed), one feature turned off at a time, then fewer drafts and other prompt "
            "lengths:\n"
        )
        rows_b = [
            [label, median_p90_cell(a.ns), median_p90_cell(b.ns), ratio(a, b)]
            for label, a, b in run.breakdown
        ]
        header_b = ["requests", "step, drafts", "re-step, no drafts", "ratio"]
        md.append(markdown_table(header_b, rows_b) + "\n")
        md.append(
            "What the draft step does (`rust/src/pipeline/draft_replay.rs`): the history-"
            "reading tables step once per draft position (k steps' work on the drafted "
            "slots, each table's per-row output recomputed for every row), then return to "
            "the committed state: DRY and no-repeat-ngram by an undo journal of the pushed "
            "tokens (O(k) per drafted slot), MinTokens and the thinking budget from saved "
            "entries, bad words by one more step. The step without drafts is only the row "
            "map. What still grows with the history is the per-step work itself (DRY's "
            "candidates, the n-gram bans), paid k + 1 times.\n"
        )
    if run.agree:
        md.append(
            "Each processor's `apply_rows` under (a) against its reference per position on the "
            "same input, at the last step (c) ran: " + "; ".join(run.agree) + ".\n"
        )
    md.append("")
    return "\n".join(md) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer steps (< 60 s)")
    ap.add_argument("--steps", type=int, default=None, help="measured steps")
    ap.add_argument("--ref-steps", type=int, default=None, help="steps with the reference")
    ap.add_argument("--b", type=int, default=256, help="requests")
    ap.add_argument("--k", type=int, default=4, help="drafts per request")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    ap.add_argument("--no-breakdown", action="store_true", help="skip the step's breakdown")
    ap.add_argument("--report", type=Path, default=ROOT / "bench-report.md")
    ap.add_argument("--no-write", action="store_true", help="print the section only")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # as report.py on CPU: a shared box's busy cores would be measured
    run = Run(
        b=args.b,
        k=args.k,
        prompt_len=args.prompt,
        warm=1 if args.quick else 3,
        steps=args.steps or (4 if args.quick else 20),
        ref_steps=args.ref_steps if args.ref_steps is not None else (1 if args.quick else 3),
    )
    t0 = time.perf_counter()
    progress(f"draft rows: B {run.b}, k {run.k}, {run.steps} steps ({run.ref_steps} with ref)")
    measure(run)
    if not args.no_breakdown:
        breakdown(run, 3 if args.quick else 7)
    run.seconds = time.perf_counter() - t0
    for key in ("a_step", "b_step", "a", "b", "c"):
        progress(f"  {key}: {fmt_us(median_us(run.cells[key].ns))} µs")
    text = section(run, args.quick)
    print(text)
    if not args.no_write:
        write_section(args.report, HEADING, text)
        progress(f"wrote section 8 of {args.report} ({run.seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

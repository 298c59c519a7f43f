"""``python -m logitsproc_rs demo``: the main job, an engine loop in miniature.

Requests with mixed sampling parameters arrive and finish over many steps (``ChurnSimulator``);
every step the persistent batch condenses and reorders, each live request's output list grows
by the token *our* sampler picked for it last step, and the full pipeline (``update_state`` of
every processor, then the ``Sampler``) runs on synthetic logits through this library and
through the plain reference (``logitsproc_rs.reference``) side by side, on the same device and
the same logits, with identically seeded per-request generators. The demo checks that both
pick the same tokens (MinP float ties aside: see ``TIE_TOL``) and reports the per-step cost of
each side.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .interface import LogitsProcessor
from .loader import build_logitsprocs
from .params import EngineConfig, SamplingParams, SamplingType
from .reference import ReferenceSampler, build_reference_logitsprocs
from .sampler import Sampler, SamplerOutput, SamplingMetadata
from .simulate import ChurnSimulator, Request
from .state import LogitsProcessors

# --- the synthetic workload -------------------------------------------------------------------

EOS = 2
STOP_POOL = (3, 4, 5, 6, 7)  # per-request stop_token_ids are drawn from these
HOT_TOKENS = tuple(range(100, 116))  # boosted in the logits: repeats (penalties), bad words
LOGIT_SCALE = 2.0  # logits = randn * LOGIT_SCALE, then the boosts below
HOT_BOOST = 6.0
STOP_BOOST = 5.5  # EOS and the stop pool: requests do end on them (after min_tokens)

# Our MinP keeps a token iff logit >= max + ln(min_p) (no softmax); the reference keeps it iff
# softmax p >= min_p * p_max. They differ only for tokens within float rounding of that
# threshold: a row whose processed logits differ only by one side masking a value the other
# kept, with at least one such value within TIE_TOL * max(1, |max|) of max + ln(min_p), is a
# documented tie (the same tolerance as tests/test_differential.py). Other differences in such a
# row are knock-on effects of the tie through top-k / top-p.
TIE_TOL = 1e-5

# Processor class name (``Ref`` prefix removed) → the request parameter it serves.
FEATURES = {
    "MinTokensLogitsProcessor": "min_tokens",
    "LogitBiasLogitsProcessor": "logit_bias",
    "MinPLogitsProcessor": "min_p",
    "PenaltiesLogitsProcessor": "penalties",
    "BadWordsLogitsProcessor": "bad_words",
    "AllowedTokenIdsLogitsProcessor": "allowed_token_ids",
    "ThinkingBudgetLogitsProcessor": "thinking_token_budget",
}
# Reasoning markers among the hot tokens, so thinking sections open and budgets run out.
THINK_START = [HOT_TOKENS[-1]]
THINK_END = [HOT_TOKENS[-2], HOT_TOKENS[-3]]


def processor_name(p: Any) -> str:
    """A processor's class name with a reference's ``Ref`` prefix removed."""
    return re.sub(r"^(Reference|Ref)", "", type(p).__name__)


def processor_features(procs: LogitsProcessors) -> set[str]:
    """The request parameters ``procs`` can serve, from the processor class names."""
    out = set()
    for p in procs.all:
        name = processor_name(p)
        if name in FEATURES:
            out.add(FEATURES[name])
    return out


def make_params_factory(
    vocab: int, features: set[str]
) -> Callable[[random.Random], SamplingParams]:
    """Mixed sampling parameters; only the features in ``features`` are ever set."""

    def make_params(rng: random.Random) -> SamplingParams:
        kw: dict[str, Any] = {"max_tokens": None, "eos_token_id": EOS}
        if rng.random() < 0.3:
            kw["temperature"] = 0.0  # greedy
        else:
            kw["temperature"] = rng.choice((0.5, 0.7, 1.0, 1.0, 1.3))
            if rng.random() < 0.7:
                kw["seed"] = rng.randrange(2**31)
            kw["top_k"] = rng.choice((0, 0, 0, 20, 50))
            kw["top_p"] = rng.choice((1.0, 1.0, 1.0, 0.9, 0.95))
            if "min_p" in features and rng.random() < 0.4:
                kw["min_p"] = rng.choice((0.02, 0.05, 0.1, 0.2))
        if "logit_bias" in features and rng.random() < 0.3:
            kw["logit_bias"] = {
                (rng.choice(HOT_TOKENS) if rng.random() < 0.5 else rng.randrange(vocab)): (
                    rng.choice((-100.0, -5.0, -1.5, 0.5, 2.0, 5.0))
                )
                for _ in range(rng.randint(1, 10))
            }
        if "min_tokens" in features and rng.random() < 0.4:
            kw["min_tokens"] = rng.choice((2, 5, 10, 30))
            kw["stop_token_ids"] = rng.sample(STOP_POOL, rng.randint(0, 3))
            kw["ignore_eos"] = rng.random() < 0.05
        if "penalties" in features and rng.random() < 0.3:
            kw["repetition_penalty"] = rng.choice((1.0, 1.1, 1.3))
            kw["frequency_penalty"] = rng.choice((0.0, 0.2, 0.5, -0.3))
            kw["presence_penalty"] = rng.choice((0.0, 0.5, 1.0))
        if "bad_words" in features and rng.random() < 0.15:
            kw["bad_words_token_ids"] = [
                [rng.choice(HOT_TOKENS) for _ in range(rng.randint(1, 3))]
                for _ in range(rng.randint(1, 3))
            ]
        if "thinking_token_budget" in features and rng.random() < 0.3:
            kw["thinking_token_budget"] = rng.choice((0, 4, 16, 64))
        if "allowed_token_ids" in features and rng.random() < 0.05:
            allowed = set(rng.sample(range(vocab), 100)) | set(HOT_TOKENS[:4]) | {EOS}
            kw["allowed_token_ids"] = sorted(allowed)
        return SamplingParams(**kw)

    return make_params


def logit_boosts(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, boosts) for ``make_logits``: the hot tokens and the stop tokens."""
    boost = {t: HOT_BOOST for t in HOT_TOKENS} | {t: STOP_BOOST for t in (EOS, *STOP_POOL)}
    ids = torch.tensor(list(boost), dtype=torch.int64, device=device)
    return ids, torch.tensor(list(boost.values()), dtype=torch.float32, device=device)


def make_logits(
    g: torch.Generator,
    rows: int,
    vocab: int,
    device: torch.device,
    boost_ids: torch.Tensor,
    boost_vals: torch.Tensor,
) -> torch.Tensor:
    """Seeded Gaussian logits, generated on the device, with a few boosted columns."""
    x = torch.randn(rows, vocab, generator=g, device=device).mul_(LOGIT_SCALE)
    x[:, boost_ids] += boost_vals
    return x


# --- agreement ----------------------------------------------------------------------------------


def is_min_p_tie(a: torch.Tensor, b: torch.Tensor, min_p: float) -> bool:
    """Whether rows ``a`` (ours) and ``b`` (reference) differ only through a MinP float tie
    (see ``TIE_TOL``). Both are processed (post-temperature, masked) logits of one row."""
    if min_p <= 0.0:
        return False
    a, b = a.double().cpu(), b.double().cpu()
    diff = (a != b) & ~(a.isnan() & b.isnan())
    av, bv = a[diff], b[diff]
    if av.numel() == 0:
        return False
    neg_inf = -math.inf
    one_sided = ((av == neg_inf) & bv.isfinite()) | ((bv == neg_inf) & av.isfinite())
    if not bool(one_sided.all()):
        return False
    kept = torch.where(av.isfinite(), av, bv)
    row_max = float(torch.maximum(a.max(), b.max()))  # the top token survives on both sides
    threshold = row_max + math.log(float(torch.tensor(min_p, dtype=torch.float32)))
    near = (kept - threshold).abs() <= TIE_TOL * max(1.0, abs(row_max))
    return bool(near.any())


# --- the loop -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Timings:
    update_ns: list[int] = dataclasses.field(default_factory=list)
    sample_ns: list[int] = dataclasses.field(default_factory=list)
    # host time of each processor's update_state, by class name (``Ref`` prefix removed)
    by_proc: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    # Per sampled step (aligned lists): the processors' apply calls inside the sampler, summed;
    # the rest of the sampler (temperature, top-k/top-p, the random draw, casts); the processor
    # layer (this step's update_state + apply); the whole step (update_state + sampler).
    apply_ns: list[int] = dataclasses.field(default_factory=list)
    sampling_ns: list[int] = dataclasses.field(default_factory=list)
    layer_ns: list[int] = dataclasses.field(default_factory=list)
    step_ns: list[int] = dataclasses.field(default_factory=list)
    # each processor's apply per sampled step in which it ran, by class name
    apply_by_proc: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    # apply calls timed during the current sampler call: (name, ns)
    pending: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    split: bool = True  # False when a processor's apply could not be instrumented

    def sampled(self, sample_ns: int) -> None:
        """Record a sampler call of ``sample_ns`` (after this step's update_state)."""
        self.sample_ns.append(sample_ns)
        per: dict[str, int] = {}
        for name, ns in self.pending:
            per[name] = per.get(name, 0) + ns
        self.pending.clear()
        for name, ns in per.items():
            self.apply_by_proc.setdefault(name, []).append(ns)
        upd = self.update_ns[-1]
        self.step_ns.append(upd + sample_ns)
        if self.split:
            apply = sum(per.values())
            self.apply_ns.append(apply)
            self.sampling_ns.append(sample_ns - apply)
            self.layer_ns.append(upd + apply)


def _instrument_apply(procs: list[tuple[str, LogitsProcessor]], t: Timings, sync: bool) -> None:
    """Time every processor's ``apply`` when the sampler calls it, by shadowing the bound method
    with a timed one on the instance (the sampler is unchanged). On CUDA each call is bracketed
    by a synchronisation so its kernels count toward it, not toward the sampling after it."""
    for name, p in procs:
        inner = p.apply

        def timed(logits: torch.Tensor, _inner: Any = inner, _name: str = name) -> torch.Tensor:
            if sync:
                torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            out = _inner(logits)
            if sync:
                torch.cuda.synchronize()
            t.pending.append((_name, time.perf_counter_ns() - t0))
            return out

        try:
            p.apply = timed  # type: ignore[method-assign]
        except (AttributeError, TypeError):  # a class with __slots__ or a read-only apply
            t.split = False


def _update_all(
    procs: list[tuple[str, LogitsProcessor]], update: Any, t: Timings, sync: bool
) -> None:
    """Every processor's update_state, timed one by one (host time) and as a whole (with a
    device synchronisation before and after on CUDA)."""
    if sync:
        torch.cuda.synchronize()
    per_proc = []
    t0 = time.perf_counter_ns()
    for _, p in procs:
        t1 = time.perf_counter_ns()
        p.update_state(update)
        per_proc.append(time.perf_counter_ns() - t1)
    if sync:
        torch.cuda.synchronize()
    t.update_ns.append(time.perf_counter_ns() - t0)
    for (name, _), ns in zip(procs, per_proc, strict=True):
        t.by_proc.setdefault(name, []).append(ns)


@dataclasses.dataclass
class Counts:
    steps: int = 0
    none_steps: int = 0
    added: int = 0
    finished: int = 0
    stop_finished: int = 0
    uni_moves: int = 0
    swaps: int = 0
    max_batch: int = 0
    rows_sampled: int = 0
    random_rows: int = 0
    checked_steps: int = 0
    checked_rows: int = 0
    rows_equal: int = 0
    tie_rows: int = 0
    tie_token_diffs: int = 0
    min_tokens_violations: int = 0


class Progress:
    """A one-line progress bar on stderr (``\\r``-redrawn; every 10% when not a terminal)."""

    def __init__(self, total: int, width: int = 28) -> None:
        self.total, self.width = total, width
        self.tty = sys.stderr.isatty()
        self.last_draw = 0.0
        self.t0 = time.perf_counter()

    def update(self, done: int, note: str) -> None:
        now = time.perf_counter()
        final = done == self.total
        if self.tty:
            if not final and now - self.last_draw < 0.1:
                return
        elif not final and done % max(1, self.total // 10):
            return
        self.last_draw = now
        filled = self.width * done // max(1, self.total)
        bar = "#" * filled + "." * (self.width - filled)
        sys.stdout.flush()  # keep the order when both streams go to one file
        line = f"[{bar}] {done}/{self.total} steps {now - self.t0:5.1f}s  {note}"
        sys.stderr.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")
        if final and self.tty:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _timed(sync: bool, fn: Callable[..., Any], *args: Any) -> tuple[Any, int]:
    """Run ``fn`` and return (result, ns). On CUDA the demo (not the library) synchronises
    before and after, so the time covers the queued kernels too."""
    if sync:
        torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    out = fn(*args)
    if sync:
        torch.cuda.synchronize()
    return out, time.perf_counter_ns() - t0


def _stats_us(ns: Sequence[int]) -> tuple[float, float]:
    if not ns:
        return math.nan, math.nan
    us = sorted(x / 1000 for x in ns)
    p90 = us[min(len(us) - 1, math.ceil(0.9 * len(us)) - 1)]
    return statistics.median(us), p90


def _fmt_us(x: float) -> str:
    if math.isnan(x):
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def run_demo(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    batch = args.batch if args.batch is not None else (256 if on_cuda else 32)
    steps = args.steps if args.steps is not None else (300 if on_cuda else 250)
    vocab = args.vocab
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    elif not on_cuda:
        torch.set_num_threads(1)
    use_ref = not args.no_reference
    check_every = max(1, args.check_every)
    if vocab < 256:
        print("--vocab must be at least 256", file=sys.stderr)
        return 2

    cfg = EngineConfig(
        max_num_seqs=batch,
        vocab_size=vocab,
        reasoning_start_token_ids=THINK_START,
        reasoning_end_token_ids=THINK_END,
    )
    ours = build_logitsprocs(cfg, device, is_pin_memory=on_cuda)
    ours_features = processor_features(ours)
    ref = build_reference_logitsprocs(cfg, device) if use_ref else None
    features = ours_features & processor_features(ref) if ref is not None else ours_features
    skipped = sorted(ours_features - features)
    ours_named = [(processor_name(p), p) for p in ours.all]
    ref_named = [(processor_name(p), p) for p in ref.all] if ref is not None else []
    sampler = Sampler(ours)
    ref_sampler = ReferenceSampler(ref) if ref is not None else None

    rng = random.Random(args.seed)
    pending: dict[int, int] = {}  # req_id -> the token our sampler picked for it last step
    counts = Counts()

    def next_token(_rng: random.Random, req: Request) -> int:
        """Feed back the real sample; a stop token (or EOS without ignore_eos) past
        min_tokens ends the request this step, as an engine's stop check would."""
        tok = pending.pop(req.req_id)
        n = len(req.output_token_ids)  # tokens generated before this one
        p = req.params
        if tok in p.all_stop_token_ids and n < p.min_tokens:
            counts.min_tokens_violations += 1
        is_stop = tok in (p.stop_token_ids or ()) or (tok == p.eos_token_id and not p.ignore_eos)
        if is_stop and n + 1 >= p.min_tokens:
            req.max_tokens = n + 1  # finishes in this step's finish check
            counts.stop_finished += 1
        return tok

    sim = ChurnSimulator(
        batch,
        vocab,
        args.seed,
        make_params_factory(vocab, features),
        finish_prob=1 / 128,
        max_tokens=(16, 512),
        next_token=next_token,
    )
    g = torch.Generator(device=device).manual_seed(args.seed + 1)
    boost_ids, boost_vals = logit_boosts(device)

    gens: dict[int, tuple[torch.Generator, torch.Generator]] = {}  # req_id -> (ours, ref)
    md_ours = md_ref = None
    t_ours, t_ref = Timings(), Timings()
    _instrument_apply(ours_named, t_ours, on_cuda)
    _instrument_apply(ref_named, t_ref, on_cuda)
    header = (
        f"logitsproc_rs demo: {steps} steps, batch up to {batch}, vocab {vocab}, "
        f"device {device} ({torch.get_num_threads()} CPU threads), seed {args.seed}"
    )
    print(header)
    print(
        "parameters: greedy and random (seeded and unseeded), temperature, top_k, top_p, "
        + ", ".join(sorted(features))
    )
    if skipped:
        print(
            f"not used: {', '.join(skipped)} (the reference has no processor for them; "
            "--no-reference to include them)"
        )
    if not use_ref:
        print("reference: off (--no-reference): timings of this library only, no agreement check")
    progress = Progress(steps)

    for step in range(steps):
        update = sim.step()
        rows = sim.batch.rows()
        n = len(rows)
        counts.steps += 1
        counts.max_batch = max(counts.max_batch, n)
        if update is None:
            counts.none_steps += 1
        else:
            counts.added += len(update.added)
            for _, _, d in update.moved:
                counts.uni_moves += d.name == "UNIDIRECTIONAL"
                counts.swaps += d.name == "SWAP"
        check = ref is not None and step % check_every == 0

        # update_state: every processor, every step (None too), both sides.
        _update_all(ours_named, update, t_ours, on_cuda)
        if ref is not None:
            _update_all(ref_named, update, t_ref, on_cuda)
        if n == 0:
            progress.update(step + 1, "empty batch")
            continue

        # The engine's metadata, rebuilt only when the batch changed.
        if md_ours is None or update is not None:
            live = {r.req_id for r in rows}
            for rid in [rid for rid in gens if rid not in live]:
                del gens[rid]
            gen_ours, gen_ref = {}, {}
            for i, r in enumerate(rows):
                if r.params.sampling_type != SamplingType.RANDOM_SEED:
                    continue
                if r.req_id not in gens:
                    seed = r.params.seed
                    assert seed is not None  # RANDOM_SEED means a seed
                    gens[r.req_id] = (
                        torch.Generator(device=device).manual_seed(seed),
                        torch.Generator(device=device).manual_seed(seed),
                    )
                gen_ours[i], gen_ref[i] = gens[r.req_id]
            md_ours = SamplingMetadata.from_params(
                [r.params for r in rows], vocab, device, generators=gen_ours
            )
            md_ref = dataclasses.replace(md_ours, generators=gen_ref)
        assert md_ours is not None and md_ref is not None
        counts.rows_sampled += n
        counts.random_rows += sum(r.params.sampling_type != SamplingType.GREEDY for r in rows)

        logits = make_logits(g, n, vocab, device, boost_ids, boost_vals)
        ref_logits = logits.clone() if check else None
        if check and check_every > 1:  # the reference skipped steps: bring its generators level
            for i, gen in md_ours.generators.items():
                md_ref.generators[i].set_state(gen.get_state())
        rng_seed = rng.randrange(2**62)  # unseeded random rows: the same global stream each side
        torch.manual_seed(rng_seed)
        out, ns = _timed(on_cuda, sampler, logits, md_ours)
        t_ours.sampled(ns)
        tokens = out.sampled_token_ids.tolist()

        if check:
            assert ref_sampler is not None and ref_logits is not None
            torch.manual_seed(rng_seed)
            out_ref, ns = _timed(on_cuda, ref_sampler, ref_logits, md_ref)
            t_ref.sampled(ns)
            bad = compare(step, rows, out, out_ref, tokens, counts)
            if bad:
                progress.update(step + 1, "MISMATCH")
                print(bad, file=sys.stderr)
                return 1

        for r, tok in zip(rows, tokens, strict=True):
            pending[r.req_id] = tok
        note = f"B={n:<4} ours {_fmt_us(_stats_us(t_ours.sample_ns)[0])} µs"
        if t_ref.sample_ns:
            note += f"  ref {_fmt_us(_stats_us(t_ref.sample_ns)[0])} µs  (median sampler/step)"
        progress.update(step + 1, note)

    counts.finished = counts.added - sim.batch.num_reqs
    report(counts, t_ours, t_ref if ref is not None else None, on_cuda, check_every)
    if counts.min_tokens_violations:
        print(
            f"ERROR: {counts.min_tokens_violations} stop tokens sampled before min_tokens",
            file=sys.stderr,
        )
        return 1
    return 0


def compare(
    step: int,
    rows: list[Request],
    out: SamplerOutput,
    out_ref: SamplerOutput,
    tokens: list[int],
    counts: Counts,
) -> str | None:
    """Count agreement; return a message on a real mismatch (None when all rows agree or
    differ only through documented MinP ties)."""
    a, b = out.logits, out_ref.logits
    ref_tokens = out_ref.sampled_token_ids.tolist()
    counts.checked_steps += 1
    counts.checked_rows += len(rows)
    same = (a == b) | (a.isnan() & b.isnan())
    row_ok = same.all(dim=-1).tolist()
    for i, r in enumerate(rows):
        if row_ok[i] and tokens[i] == ref_tokens[i]:
            counts.rows_equal += 1
            continue
        p = r.params
        if p.sampling_type != SamplingType.GREEDY and is_min_p_tie(a[i], b[i], p.min_p):
            counts.tie_rows += 1
            counts.tie_token_diffs += tokens[i] != ref_tokens[i]
            continue
        ndiff = int((~same[i]).sum())
        return (
            f"MISMATCH at step {step}, row {i} (request {r.req_id}): ours sampled {tokens[i]}, "
            f"the reference {ref_tokens[i]}; processed logits differ at {ndiff} positions\n"
            f"  params: {p}\n  output so far ({len(r.output_token_ids)} tokens): "
            f"{r.output_token_ids[-16:]}"
        )
    return None


def report(c: Counts, ours: Timings, ref: Timings | None, on_cuda: bool, check_every: int) -> None:
    print()
    print(
        f"churn: {c.steps} steps ({c.none_steps} without a batch change), "
        f"{c.added} requests arrived, {c.finished} finished ({c.stop_finished} on a stop "
        f"token or EOS), {c.uni_moves} condense moves, {c.swaps} swaps, "
        f"batch up to {c.max_batch}; {c.rows_sampled:,} rows sampled "
        f"({c.random_rows:,} random)"
    )
    print()
    print("per step, µs                            ours                 reference        speedup")
    print("                                   median      p90      median        p90     (median)")
    rows = [
        ("update_state (all processors)", "update_ns"),
        ("apply (all processors)", "apply_ns"),
        ("= processor layer", "layer_ns"),
        ("sampling (temp/top-k/top-p/draw)", "sampling_ns"),
        ("sampler (apply + sampling)", "sample_ns"),
        ("step (update_state + sampler)", "step_ns"),
    ]
    for label, attr in rows:
        om, op = _stats_us(getattr(ours, attr))
        if ref is not None:
            rm, rp = _stats_us(getattr(ref, attr))
            ratio = f"{rm / om:8.1f}x" if om > 0 and not math.isnan(om + rm) else "-"
        else:
            rm = rp = math.nan
            ratio = "-"
        print(
            f"{label:<32} {_fmt_us(om):>8} {_fmt_us(op):>8}   {_fmt_us(rm):>9} "
            f"{_fmt_us(rp):>10}   {ratio:>9}"
        )
    print(
        "  update_state: every step; the rest: steps with rows to sample. processor layer =\n"
        "  update_state + the processors' apply calls inside the sampler; sampling = the rest of\n"
        "  the sampler (casts, temperature, top-k/top-p, the random draw)"
    )
    for side, t in (("ours", ours), ("reference", ref)):
        if t is None or not t.split or not t.step_ns:
            continue
        layer, sampling, total = sum(t.layer_ns), sum(t.sampling_ns), sum(t.step_ns)
        if total > 0:
            print(
                f"  {side}: the processor layer is {100 * layer / total:.0f}% of a sampled "
                f"step's time (totals over the run), sampling {100 * sampling / total:.0f}%"
            )
    print()
    print("by processor, median µs (host time; apply: over the steps in which it ran)")
    print(f"  {'':<22} {'update_state':>14} {'':>11}   {'apply':>10}")
    print(f"  {'':<22} {'ours':>9} {'reference':>11}   {'ours':>9} {'reference':>11}")
    names = list(dict.fromkeys([*ours.by_proc, *(ref.by_proc if ref is not None else {})]))
    for name in names:

        def med(d: dict[str, list[int]], name: str = name) -> str:
            return _fmt_us(_stats_us(d.get(name, []))[0])

        line = f"  {name.removesuffix('LogitsProcessor'):<22} {med(ours.by_proc):>9}"
        line += f" {med(ref.by_proc) if ref is not None else '-':>11}"
        line += f"   {med(ours.apply_by_proc):>9}"
        line += f" {med(ref.apply_by_proc) if ref is not None else '-':>11}"
        print(line)
    print()
    if ref is not None:
        every = "every step" if check_every == 1 else f"every {check_every} steps"
        mism = c.checked_rows - c.rows_equal - c.tie_rows
        print(
            f"agreement (checked {every}): {c.checked_steps} steps, {c.checked_rows:,} rows; "
            f"identical {c.rows_equal:,}, MinP float ties {c.tie_rows} "
            f"({c.tie_token_diffs} with a different token, allowed), mismatches {mism}"
        )
    print(f"min_tokens: {c.min_tokens_violations} stop tokens sampled before min_tokens")
    if on_cuda:
        print(
            "timings: the demo calls torch.cuda.synchronize() around each timed region; "
            "the library itself never synchronises"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m logitsproc_rs")
    sub = parser.add_subparsers(dest="command", required=True)
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
        "--steps",
        type=int,
        default=None,
        help="engine steps (default 300 on CUDA, 250 on CPU)",
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
    args = parser.parse_args(argv)
    if args.command == "demo":
        return run_demo(args)
    return 2  # pragma: no cover - argparse requires a command


if __name__ == "__main__":
    sys.exit(main())

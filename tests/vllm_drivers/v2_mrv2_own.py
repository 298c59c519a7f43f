"""Ours against vLLM 0.33.0's OWN Model Runner V2 processors, under speculative decoding.

Usage: ``v2_mrv2_own.py SEED MAX_NUM_SEQS VOCAB STEPS MAX_DRAFTS [MODE]`` (run by
tests/test_vllm_v2_drafts.py in a subprocess, with ``TRITON_INTERPRET=1``: MRV2's Triton kernels
run on the CPU in Triton's interpreter; ``vllm.triton_utils`` is replaced by the real ``triton``
modules as in v2_min_p.py, and vLLM's own CPU patches for MRV2, ``vllm/v1/worker/cpu/shm.py``,
are imported).

MRV2's own states (``PenaltiesState``, ``BadWordsState``, ``LogitBiasState`` -- logit bias,
allowed ids, min-tokens -- and ``ThinkingBudgetState``) and ours (the bridged built-ins of
``logitsproc_rs.vllm.v2``, namespaced fields) see the same requests in the same slots of one
simulated runner state (``v2_harness.RunnerState``), the same ``LogitsContext`` (MRV2's row
layout: a request's ``1 + d`` rows are consecutive, ``input_ids`` at local pos 0 is its last
committed token, at local pos ``j >= 1`` its draft ``d_{j-1}``) and the same logits. Five
comparisons per step, each on its own pipeline of ours (a runner-state alias per set, so each
set forms its own group):

* ``logit_bias``: ``LogitBiasState`` vs our AllowedTokenIds + LogitBias + MinTokens;
* ``penalties``, ``bad_words``, ``thinking``: one state vs one processor;
* ``all``: MRV2's sampler order (logit bias, penalties, bad words, then thinking forcing) vs
  ours loaded in that order.

Churn: requests arrive (some resumed: prefill = prompt + output so far), finish (the slot is
only freed, as MRV2 does), slots are recycled; each request gets 0..MAX_DRAFTS drafts per step;
the sampled tokens follow MRV2's processed row as a sampler would (a forced thinking token is
taken, -inf tokens are never taken, drafts are accepted left to right with some probability)
and are committed with vLLM's own ``post_update`` (``input_batch.py``), which also updates
``PenaltiesState.output_bin_counts`` (what ``model_runner.postprocess_sampled`` passes it).

Checked exactly: every row at local pos 0, except the thinking rows where vLLM 0.25.1's
semantics (ours) and MRV2's differ by design (``thinking_comparable``; counted). Rows at local
pos >= 1 are compared too and their mismatches reported per set (``draft_mismatch``); with MODE
``strict`` they must match as well (ours needs per-position drafts for that). MODE ``rare``: each
feature on few requests, so that whole batches skip a processor. MODE ``nodrafts``
runs the same churn with no drafts (every row strict). MODE ``selfcheck``: ours is run with the
draft tokens hidden (``input_ids`` zeroed) and the draft rows of ``penalties``/``bad_words`` must
differ from MRV2's (prints ``SELFCHECK caught N draft rows``), proving the comparison can fail
there whether or not ours reads drafts; MODE ``no_feed`` (a bridge that never feeds the
committed tokens) must fail the strict local-pos-0 check (``ours differs from MRV2's own``).

Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys
import time
import types
from types import SimpleNamespace
from typing import Any

os.environ["TRITON_INTERPRET"] = "1"
import triton
import triton.language as tl
import triton.language.extra.libdevice as tldevice
import vllm

_shim = types.ModuleType("vllm.triton_utils")
_shim.triton, _shim.tl, _shim.tldevice = triton, tl, tldevice  # type: ignore[attr-defined]
_shim.HAS_TRITON = True  # type: ignore[attr-defined]  (vllm.config, via vllm.sampling_params)
sys.modules["vllm.triton_utils"] = _shim

import numpy as np  # noqa: E402
import torch  # noqa: E402
import v2_harness as h  # noqa: E402

# Triton's interpreter without two of its costs (the kernels compute the same; a third of the
# time here): tests/vllm_engine/interpreter_speed.py, shared with the real MRV2 engine tests.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vllm_engine"))
import interpreter_speed  # noqa: E402, F401

# vLLM's own CPU patches for MRV2 (what its CPU model runner imports): host "UVA" buffers,
# a CPU async_tensor_h2d, no pinned memory, PENALTIES_BLOCK_SIZE = 1024.
import vllm.v1.worker.cpu.shm  # noqa: E402, F401
from test_differential import HOT_IDS, random_logits  # noqa: E402
from vllm.v1.worker.gpu.sample.bad_words import BadWordsState  # noqa: E402
from vllm.v1.worker.gpu.sample.logit_bias import LogitBiasState  # noqa: E402
from vllm.v1.worker.gpu.sample.penalties import PenaltiesState  # noqa: E402
from vllm.v1.worker.gpu.sample.thinking_budget import ThinkingBudgetState  # noqa: E402

from logitsproc_rs import EngineConfig, SamplingParams  # noqa: E402

try:  # MRV2's own commit kernel (model_runner.postprocess_sampled -> post_update)
    from vllm.v1.worker.gpu.input_batch import post_update
except ImportError:  # pragma: no cover - replicated exactly below
    post_update = None

START = [HOT_IDS[0]]
END = [HOT_IDS[1], HOT_IDS[2]]
V2 = "logitsproc_rs.vllm.v2:"
SETS: dict[str, list[str]] = {
    "logit_bias": [
        "AllowedTokenIdsLogitsProcessor",
        "LogitBiasLogitsProcessor",
        "MinTokensLogitsProcessor",
    ],
    "penalties": ["PenaltiesLogitsProcessor"],
    "bad_words": ["BadWordsLogitsProcessor"],
    "thinking": ["ThinkingBudgetLogitsProcessor"],
    "all": [
        "AllowedTokenIdsLogitsProcessor",
        "LogitBiasLogitsProcessor",
        "MinTokensLogitsProcessor",
        "PenaltiesLogitsProcessor",
        "BadWordsLogitsProcessor",
        "ThinkingBudgetLogitsProcessor",
    ],
}
# The MRV2 states of each set, in MRV2's sampler order (thinking forcing last).
MRV2_SETS = {
    "logit_bias": ["lb"],
    "penalties": ["pen"],
    "bad_words": ["bw"],
    "thinking": ["tb"],
    "all": ["lb", "pen", "bw", "tb"],
}


class _Alias:
    """Another handle on the runner's token buffer: our bridges group by it, so each set of
    ours gets a pipeline of its own over the same runner state."""

    def __init__(self, dev: Any) -> None:
        self._dev = dev

    @property
    def gpu(self) -> torch.Tensor:
        return self._dev.gpu


class _StateView:
    def __init__(self, rs: h.RunnerState) -> None:
        self._rs = rs
        self.all_token_ids = _Alias(rs.all_token_ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rs, name)


def make_params(rng: random.Random, vocab: int, rare: float = 1.0) -> SamplingParams:
    """A request using a random subset of what the compared processors read; token ids from
    the hot ids (thinking markers, bad words) half the time. ``rare`` scales the odds of each
    feature (MODE ``rare``: MRV2's sampler then often skips a group's apply)."""

    def tok() -> int:
        return rng.choice(HOT_IDS) if rng.random() < 0.5 else rng.randrange(vocab)

    kw: dict[str, Any] = dict(
        max_tokens=None, eos_token_id=rng.choice((None, 1, 2)), ignore_eos=rng.random() < 0.1
    )
    if rng.random() < 0.5 * rare:
        kw["repetition_penalty"] = rng.choice((0.5, 0.75, 1.0, 1.25, 1.5, 2.0))
        kw["frequency_penalty"] = rng.choice((-1.0, 0.0, 0.25, 0.5, 1.0))
        kw["presence_penalty"] = rng.choice((-0.5, 0.0, 0.5, 2.0))
    if rng.random() < 0.5 * rare:
        kw["bad_words_token_ids"] = [
            [tok() for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 4))
        ]
    if rng.random() < 0.4 * rare:
        kw["logit_bias"] = {tok(): rng.choice((-100.0, -2.5, 0.5, 3.0)) for _ in range(4)}
    if rng.random() < 0.2 * rare:
        kw["allowed_token_ids"] = sorted({tok() for _ in range(rng.randint(1, 12))})
    if rng.random() < 0.4 * rare:
        kw["min_tokens"] = rng.randint(1, 8)
        kw["stop_token_ids"] = [tok() for _ in range(rng.randint(0, 3))]
    if rng.random() < 0.5 * rare:
        kw["thinking_token_budget"] = rng.choice((0, 1, 2, 4, 8))
    return SamplingParams(**kw)


def token(rng: random.Random, vocab: int, hot: float) -> int:
    """A hot id with probability ``hot`` (the start marker only a tenth of those: a history
    with one thinking section is the comparable case), else any token."""
    if rng.random() < hot:
        return START[0] if rng.random() < 0.1 else rng.choice(HOT_IDS[1:])
    return rng.randrange(vocab)


def mrv2_params(sp: SamplingParams) -> Any:
    """What MRV2's states read of vLLM's SamplingParams (vLLM's names and meanings)."""
    return SimpleNamespace(
        repetition_penalty=sp.repetition_penalty,
        frequency_penalty=sp.frequency_penalty,
        presence_penalty=sp.presence_penalty,
        bad_words_token_ids=sp.bad_words_token_ids,
        allowed_token_ids=sp.allowed_token_ids,
        logit_bias=sp.logit_bias,
        min_tokens=sp.min_tokens,
        all_stop_token_ids=sp.all_stop_token_ids,
        structured_outputs=None,
        thinking_token_budget=sp.thinking_token_budget,
    )


def occurrences(seq: list[int], pat: list[int]) -> list[int]:
    k = len(pat)
    return [i for i in range(len(seq) - k + 1) if seq[i : i + k] == pat]


def thinking_comparable(
    history: list[int], prompt_len: int, budget: int | None, multi: bool, forced: set[int]
) -> bool:
    """Whether vLLM 0.25.1's thinking state machine (ours) and MRV2's stateless scan must agree
    on the row after ``history`` (prompt + committed output) -- see docs/vllm-v2.md:

    * MRV2 scans prompt + output for the LAST start and LAST natural end marker and counts from
      that start; 0.25.1 records the first start it finds and never searches again until a
      forced end completes, force-closes any start after a forced end at once, and gives no
      budget to a thinking section opened after a natural end. So only a history with at most
      one start marker is comparable;
    * 0.25.1 walks a forced end one token per step whatever was emitted (several tokens
      committed in one step -- accepted drafts -- or a forced token not taken desynchronise
      it); MRV2 re-derives the next end token from the tail. A history whose start marker is
      followed by an end-sequence token (other than one complete natural/forced end, or the
      forced walk's own tokens: ``forced`` holds the history positions taken from a forced
      row) is not comparable;
    * ``multi``: a step committed several tokens (accepted drafts) once the history held a start
      marker: 0.25.1's (non-speculative) walk counts engine steps, not tokens;
    * ``thinking_token_budget = -1``: MRV2 treats it as untracked (as 0.25.1 does).
    """
    if budget is None or budget < 0:
        return True
    if multi:
        return False
    starts = occurrences(history, START)
    if len(starts) > 1:
        return False
    if not starts:
        return True  # never inside thinking, in both
    if occurrences(history[prompt_len : starts[0]], END):
        return False  # 0.25.1 records an end seen before the start and misses a later one
    first = starts[0] + len(START)
    ends = [first + e for e in occurrences(history[first:], END)]
    if ends:
        # after the first complete end: outside thinking in both, if 0.25.1 saw that end --
        # all of it in the output, and all forced or all the model's own (a walk the model
        # left, or an end begun in the prompt, is an end to MRV2 and not to 0.25.1)
        at = range(ends[0], ends[0] + len(END))
        n_forced = sum(i in forced for i in at)
        return ends[0] >= prompt_len and n_forced in (0, len(END))
    # inside thinking: MRV2 forces the end token after the longest end prefix that ends the
    # history, 0.25.1 walks from the first: the same only if that prefix is the walk's own
    k = max((n for n in range(1, len(END)) if history[-n:] == END[:n]), default=0)
    return all(i in forced for i in range(len(history) - k, len(history)))


def main(seed: int, max_num_seqs: int, vocab: int, steps: int, max_drafts: int, mode: str):
    t0 = time.time()
    h.v1_package(real=False)
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    rs = h.RunnerState(max_num_seqs, 512, vocab)
    # MRV2's RequestState pieces that post_update writes.
    num_computed = torch.zeros(max_num_seqs, dtype=torch.int32)
    last_sampled = torch.zeros(max_num_seqs, dtype=torch.int32)
    reasoning = SimpleNamespace(
        reasoning_start_token_ids=START,
        reasoning_end_token_ids=END,
        natural_reasoning_end_token_ids=END,
    )
    vcfg = SimpleNamespace(reasoning_config=reasoning)
    lp = h.lp_state(rs)
    mrv2 = {
        "lb": LogitBiasState(vcfg, lp),
        "pen": PenaltiesState(vcfg, lp),
        "bw": BadWordsState(vcfg, lp),
        "tb": ThinkingBudgetState(rs, reasoning),
    }
    assert mrv2["tb"].enabled
    mrv2_acts = {k: np.zeros(max_num_seqs, dtype=bool) for k in mrv2}
    cfg = EngineConfig(
        max_num_seqs=max_num_seqs,
        vocab_size=vocab,
        reasoning_start_token_ids=START,
        reasoning_end_token_ids=END,
        num_speculative_tokens=max_drafts or None,
    )
    ours = {
        name: h.build(cfg, _StateView(rs), [V2 + n for n in procs]) for name, procs in SETS.items()
    }
    ours_needs = {name: np.zeros(max_num_seqs, dtype=bool) for name in SETS}

    live: dict[int, dict[str, Any]] = {}  # slot -> request
    used: set[int] = set()
    stats: dict[str, Any] = dict.fromkeys(
        (
            "steps",
            "rows",
            "draft_rows",
            "recycled",
            "resumed",
            "accepted",
            "forced",
            "thinking_masked",
            "thinking_masked_differs",
        ),
        0,
    )
    strict_checked = dict.fromkeys(SETS, 0)
    changed = dict.fromkeys(SETS, 0)
    draft_mismatch = dict.fromkeys(SETS, 0)
    draft_compared = dict.fromkeys(SETS, 0)
    first_bad: dict[str, str] = {}
    skipped = dict.fromkeys(SETS, 0)  # consecutive steps whose apply MRV2's sampler skipped
    use_drafts = mode != "nodrafts" and max_drafts > 0

    def add(prompt: list[int], output: list[int], sp: SamplingParams) -> None:
        slot = rs.add_request(prompt, output)
        stats["recycled"] += slot in used
        used.add(slot)
        live[slot] = {
            "prompt": prompt,
            "output": list(output),
            "sp": sp,
            "multi": False,
            "forced": set(),
        }
        mp = mrv2_params(sp)
        for k, st in mrv2.items():
            mrv2_acts[k][slot] = bool(st.add_request(slot, mp))
        for name, procs in ours.items():
            # Each set's runner loaded only its processors: it gets only their fields, as
            # MRV2's own state of that set reads only its own.
            tables = {t for p in procs for t in type(p).VIEW.TABLES}
            h.add_to_sampler(procs, ours_needs[name], slot, h.namespaced(sp, tables))

    for step in range(steps):
        # Churn: finishes free the slot only (MRV2 never tells a processor); a preempted
        # request comes back with its output so far; arrivals fill free slots.
        for slot in list(live):
            if rng.random() < 1 / 25 or len(live[slot]["output"]) > 60:
                req = live.pop(slot)
                rs.remove_request(slot)
                if rng.random() < 0.3 and req["output"]:
                    add(req["prompt"], req["output"], req["sp"])
                    stats["resumed"] += 1
        while rs.free_indices and rng.random() < 0.6:
            prompt = [token(rng, vocab, 0.3) for _ in range(rng.randint(1, 12))]
            add(prompt, [], make_params(rng, vocab, 0.15 if mode == "rare" else 1.0))
        for st in mrv2.values():
            st.apply_staged_writes()
        for procs in ours.values():
            h.apply_staged_writes(procs)
        if not live:
            continue

        slots = list(live)
        rng.shuffle(slots)
        drafts = {
            s: [
                token(rng, vocab, 0.6)
                for _ in range(rng.randint(0, max_drafts) if use_drafts else 0)
            ]
            for s in slots
        }
        ctx = h.context(rs, slots, [len(drafts[s]) for s in slots], [drafts[s] for s in slots])
        rows = int(ctx.expanded_idx_mapping.shape[0])
        logits = random_logits(rng, g, rows, vocab)
        local = ctx.expanded_local_pos.tolist()
        row_slot = ctx.expanded_idx_mapping.tolist()

        mrv2_out = {}
        for name, keys in MRV2_SETS.items():
            mrv2_out[name] = mrv2_apply(mrv2, mrv2_acts, keys, logits, ctx)
        ours_ctx = hide_drafts(ctx) if mode == "selfcheck" else ctx
        ours_out = {}
        for name, procs in ours.items():
            try:
                ours_out[name] = h.sample_apply(procs, ours_needs[name], logits, ours_ctx)
            except Exception as e:
                raise RuntimeError(
                    f"ours ({name}) raised at step {step}: {len(slots)} requests, {rows} rows, "
                    f"skipped steps {skipped[name]}; known "
                    f"{procs[0]._group.known[slots].tolist()}, total_len "
                    f"{rs.total_len.gpu[slots].tolist()}"
                ) from e
            skipped[name] = 0 if np.any(ours_needs[name][ctx.idx_mapping_np]) else skipped[name] + 1

        # Which rows are strictly compared: local pos 0, minus the thinking rows outside the
        # cases where 0.25.1's and MRV2's semantics agree.
        # A draft row is judged on the history it sees (+ the preceding drafts), as if those
        # drafts had been committed in one step.
        comparable = []
        for r in range(rows):
            req, j = live[row_slot[r]], local[r]
            hist = req["prompt"] + req["output"] + drafts[row_slot[r]][:j]
            multi = req["multi"] or (j > 0 and START[0] in hist)
            budget = req["sp"].thinking_token_budget
            comparable.append(
                thinking_comparable(hist, len(req["prompt"]), budget, multi, req["forced"])
            )
        for name in SETS:
            a, b = mrv2_out[name], ours_out[name]
            thinking = name in ("thinking", "all")
            for r in range(rows):
                if thinking and not comparable[r]:
                    if name == "thinking" and local[r] == 0:
                        stats["thinking_masked"] += 1
                        stats["thinking_masked_differs"] += not torch.equal(a[r], b[r])
                    continue
                same = torch.equal(a[r], b[r])
                changed[name] += not torch.equal(a[r], logits[r])
                if local[r] == 0:
                    strict_checked[name] += 1
                    if not same:
                        first_bad.setdefault(name, f"step {step} row {r} slot {row_slot[r]}")
                else:
                    draft_compared[name] += 1
                    if not same:
                        draft_mismatch[name] += 1
                        if mode == "strict":
                            first_bad.setdefault(name, f"step {step} draft row {r}")
        if first_bad and mode != "selfcheck":
            name, where = next(iter(first_bad.items()))
            req = live[int(where.split("slot ")[-1])] if "slot" in where else None
            raise AssertionError(
                f"ours differs from MRV2's own {name} at {where}: "
                f"{req and (req['prompt'], req['output'], req['sp'])}"
            )

        # Sampling (as a sampler of MRV2's processed rows would) and MRV2's commit.
        processed = mrv2_out["all"]
        sampled = torch.zeros(len(slots), max_drafts + 1, dtype=torch.int32)
        num_sampled = torch.zeros(len(slots), dtype=torch.int32)
        r0 = 0
        for k, s in enumerate(slots):
            d = drafts[s]
            taken: list[int] = []
            for j in range(len(d) + 1):
                row = processed[r0 + j]
                t = pick(rng, row, vocab, d[j] if j < len(d) else None)
                if row.max() >= 1e9:
                    stats["forced"] += 1
                    req = live[s]
                    req["forced"].add(len(req["prompt"]) + len(req["output"]) + len(taken))
                taken.append(t)
                if j < len(d) and t == d[j]:
                    stats["accepted"] += 1
                    continue
                break
            sampled[k, : len(taken)] = torch.tensor(taken, dtype=torch.int32)
            num_sampled[k] = len(taken)
            live[s]["output"].extend(taken)
            if len(taken) > 1 and START[0] in live[s]["prompt"] + live[s]["output"]:
                live[s]["multi"] = True
            r0 += 1 + len(d)
        commit(
            rs,
            ctx.idx_mapping,
            num_computed,
            last_sampled,
            mrv2["pen"].output_bin_counts,
            sampled,
            num_sampled,
        )
        stats["steps"] += 1
        stats["rows"] += len(slots)
        stats["draft_rows"] += rows - len(slots)

    if mode == "selfcheck":
        caught = draft_mismatch["penalties"] + draft_mismatch["bad_words"]
        assert caught > 0, "the self-check found no difference: the comparison cannot fail"
        print(f"SELFCHECK caught {caught} draft rows")
    stats.update(
        strict_checked=strict_checked,
        changed=changed,
        draft_compared=draft_compared,
        draft_mismatch=draft_mismatch,
        post_update="vllm" if post_update is not None else "replica",
        seconds=round(time.time() - t0, 1),
    )
    h.report(stats)


def hide_drafts(ctx: Any) -> Any:
    """The self-check's broken input: the draft tokens replaced by zeros."""
    ids = ctx.input_ids.clone()
    ids[ctx.expanded_local_pos > 0] = 0
    return dataclasses.replace(ctx, input_ids=ids)


def mrv2_apply(mrv2: dict, acts: dict, keys: list[str], logits: torch.Tensor, ctx: Any):
    """``Sampler.apply_sampling_params``' processor part for these states: skipped when none
    acts on a request of the batch, else each in order on a float32 copy (thinking in place,
    last)."""
    if not any(np.any(acts[k][ctx.idx_mapping_np]) for k in keys):
        return logits
    x = torch.empty_like(logits, dtype=torch.float32).copy_(logits)
    for k in keys:
        if k == "tb":
            mrv2[k].apply(x, ctx)
        else:
            x = mrv2[k].apply(x, ctx)
    return x


def pick(rng: random.Random, row: torch.Tensor, vocab: int, draft: int | None) -> int:
    """A sampled token for a processed row: the forced one if forced; the draft, accepted with
    probability 0.6 if it is not masked; else a hot or random token that is not masked."""
    if float(row.max()) >= 1e9:
        return int(row.argmax())
    finite = torch.isfinite(row)
    if draft is not None and bool(finite[draft]) and rng.random() < 0.6:
        return draft
    for _ in range(4):
        t = token(rng, vocab, 0.5)
        if bool(finite[t]):
            return t
    ok = torch.nonzero(finite).flatten().tolist()
    return rng.choice(ok) if ok else rng.randrange(vocab)


def commit(rs, idx_mapping, num_computed, last_sampled, bin_counts, sampled, num_sampled):
    """MRV2's postprocess_sampled: vLLM's own post_update (tokens into all_token_ids, total_len
    advanced, output_bin_counts incremented), or its exact replica when not importable."""
    if post_update is not None:
        post_update(
            idx_mapping,
            num_computed,
            last_sampled,
            bin_counts,
            sampled,
            num_sampled,
            torch.zeros_like(num_sampled),
            None,
            rs.all_token_ids.gpu,
            rs.total_len.gpu,
        )
        return
    for k, s in enumerate(idx_mapping.tolist()):  # pragma: no cover
        n = int(num_sampled[k])
        total = int(rs.total_len.gpu[s])
        for i in range(n):
            t = int(sampled[k, i])
            rs.all_token_ids.gpu[s, total + i] = t
            bin_counts[s, t] += 1
        rs.total_len.gpu[s] = total + n


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "batch":
        # Several runs in one process (the imports once): each "SEED,N,VOCAB,STEPS,K,MODE"
        # prints "RUN <its spec>" and then its own RESULT line (no_feed not allowed here).
        for spec in args[1:]:
            *ints, run_mode = spec.split(",")
            assert run_mode != "no_feed", "no_feed patches the bridge: a run of its own"
            print(f"RUN {spec}", flush=True)
            main(*map(int, ints), run_mode)
        sys.exit(0)
    mode = args[5] if len(args) > 5 else "default"
    if mode == "no_feed":  # a bridge that drops the committed tokens: row 0 must differ
        from logitsproc_rs.vllm import v2

        v2._Group.committed = lambda self, slots: (None, None, None)
    main(*map(int, args[:5]), mode)

"""Per-step cost of update_state and apply: logitsproc_rs vs the plain reference and vLLM-style
baselines, under ordinary churn. ``make bench-python`` (``ARGS=--quick`` for a short run).

Sections (each prints its own table, medians and p90 over the measured steps, ratios = baseline
median / ours median):

(a) MinTokens + LogitBias + MinP ``update_state`` per step, B = 64, 256, 1024.
(b) apply of that trio at B = 256, V = 32,000: ours (logit-space MinP) vs the reference
    (per-row softmax MinP) and vs vLLM 0.25.1's vectorised apply code (softmax MinP).
(c) penalties, ``update_state`` + ``apply`` per step at 16 … 4,096 generated tokens per request:
    ours (incremental counts) vs ``vllm_style_penalties`` (pad the lists, bincount, apply: every
    step from scratch, as vLLM 0.25.1).
(d) the full pipeline (every processor's update_state + the Sampler) ours vs the reference.

Churn: ``ChurnSimulator`` with finish_prob = 1/64, max_tokens so large that only the random
finishes end requests, refills toward the full batch, and a few SWAPs (swap_prob 0.05). Times are
``time.perf_counter_ns``; on CUDA the bench synchronises before and after each timed region.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from logitsproc_rs import (
    EngineConfig,
    LogitBiasLogitsProcessor,
    LogitsProcessors,
    MinPLogitsProcessor,
    MinTokensLogitsProcessor,
    PenaltiesLogitsProcessor,
    Sampler,
    SamplingMetadata,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.demo.workload import (
    logit_boosts,
    make_logits,
    make_params_factory,
    processor_features,
)
from logitsproc_rs.reference import (
    ReferenceSampler,
    build_reference_logitsprocs,
    process_dict_updates,
)
from logitsproc_rs.simulate import ChurnSimulator, Request

FINISH_PROB = 1 / 64
NEVER = (10**9, 10**9)  # max_tokens: only the random finishes end requests
TRIO = ("MinTokensLogitsProcessor", "LogitBiasLogitsProcessor", "MinPLogitsProcessor")


# --- timing ---------------------------------------------------------------------------------


class Timer:
    def __init__(self, device: torch.device) -> None:
        self.sync = device.type == "cuda"

    def __call__(self, fn: Callable[[], Any]) -> tuple[Any, int]:
        if self.sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        out = fn()
        if self.sync:
            torch.cuda.synchronize()
        return out, time.perf_counter_ns() - t0


def med_p90(ns: Sequence[int]) -> tuple[float, float]:
    """(median, p90) in µs."""
    us = sorted(x / 1000 for x in ns)
    return statistics.median(us), us[min(len(us) - 1, math.ceil(0.9 * len(us)) - 1)]


def fmt(us: float) -> str:
    if us >= 10_000:
        return f"{us:,.0f}"
    return f"{us:,.1f}" if us >= 10 else f"{us:.2f}"


def cell(ns: Sequence[int]) -> str:
    m, p = med_p90(ns)
    return f"{fmt(m):>9} / {fmt(p):>9}"


def ratio(base: Sequence[int], ours: Sequence[int]) -> str:
    return f"{med_p90(base)[0] / med_p90(ours)[0]:7.1f}x"


def section(title: str) -> None:
    print()
    print(title)
    sys.stdout.flush()


# --- workloads ------------------------------------------------------------------------------


def trio_params(vocab: int) -> Callable[[random.Random], SamplingParams]:
    """Ordinary traffic for the three built-ins."""

    def make(rng: random.Random) -> SamplingParams:
        kw: dict[str, Any] = {"max_tokens": None, "eos_token_id": 2}
        kw["temperature"] = rng.choice((0.0, 0.7, 1.0))
        if kw["temperature"] and rng.random() < 0.5:
            kw["min_p"] = rng.choice((0.05, 0.1, 0.2))
        if rng.random() < 0.3:
            kw["logit_bias"] = {
                rng.randrange(vocab): rng.choice((-5.0, 1.0, 3.0))
                for _ in range(rng.randint(1, 10))
            }
        if rng.random() < 0.3:
            kw["min_tokens"] = rng.choice((4, 16, 64))
            kw["stop_token_ids"] = rng.sample(range(3, 12), rng.randint(0, 3))
        return SamplingParams(**kw)

    return make


def only(procs: LogitsProcessors, names: Sequence[str]) -> LogitsProcessors:
    """The processors of ``procs`` whose class name (``Ref`` prefix removed) is in ``names``,
    in their order."""
    return LogitsProcessors(p for p in procs.all if type(p).__name__.removeprefix("Ref") in names)


def trio(cfg: EngineConfig, device: torch.device) -> tuple[LogitsProcessors, LogitsProcessors]:
    pin = device.type == "cuda"
    ours = LogitsProcessors(
        cls(cfg, device, pin)
        for cls in (MinTokensLogitsProcessor, LogitBiasLogitsProcessor, MinPLogitsProcessor)
    )
    return ours, only(build_reference_logitsprocs(cfg, device), TRIO)


def churn(
    batch: int,
    vocab: int,
    seed: int,
    make_params: Callable[[random.Random], SamplingParams],
    cls: type[ChurnSimulator] = ChurnSimulator,
) -> ChurnSimulator:
    return cls(batch, vocab, seed, make_params, finish_prob=FINISH_PROB, max_tokens=NEVER)


def apply_all(procs: LogitsProcessors, logits: torch.Tensor) -> torch.Tensor:
    for p in procs.non_argmax_invariant:
        logits = p.apply(logits)
    for p in procs.argmax_invariant:
        logits = p.apply(logits)
    return logits


# --- (a) trio update_state ------------------------------------------------------------------


def bench_trio_update(
    bs: Sequence[int], vs: Sequence[int], warm: int, steps: int, dev: torch.device
) -> None:
    section(
        f"(a) MinTokens + LogitBias + MinP: update_state per step, µs (median / p90), "
        f"{steps} steps after {warm} warm-up, {dev}; target: ours <= 15 µs at B=256\n"
        f"    reference = reference.py (dicts only); vLLM 0.25.1 = its built-ins transcribed "
        f"(dicts + index tensors rebuilt on change)"
    )
    print(
        f"{'B':>6} {'V':>7}   {'ours':^21}   {'reference':^21}   {'vLLM 0.25.1':^21}   "
        f"{'ref/ours':>8}  {'vLLM/ours':>9}"
    )
    timer = Timer(dev)
    for vocab in vs:
        for b in bs:
            cfg = EngineConfig(max_num_seqs=b, vocab_size=vocab)
            ours, ref = trio(cfg, dev)
            vllm = VllmTrio(b, dev)
            sim = churn(b, vocab, 1, trio_params(vocab))
            t: tuple[list[int], list[int], list[int]] = ([], [], [])
            for step in range(warm + steps):
                update = sim.step()
                _, a = timer(lambda: [p.update_state(update) for p in ours.all])  # noqa: B023
                _, r = timer(lambda: [p.update_state(update) for p in ref.all])  # noqa: B023
                _, v = timer(lambda: vllm.update_state(update))  # noqa: B023
                if step >= warm:
                    for lst, val in zip(t, (a, r, v), strict=True):
                        lst.append(val)
            print(
                f"{b:>6} {vocab:>7}   {cell(t[0])}   {cell(t[1])}   {cell(t[2])}   "
                f"{ratio(t[1], t[0])}  {ratio(t[2], t[0]):>9}"
            )


# --- (b) trio apply -------------------------------------------------------------------------


def _h2d(data: list, dtype: torch.dtype, device: torch.device, pin: bool) -> torch.Tensor:
    """vLLM's ``async_tensor_h2d`` (``utils/torch_utils.py:607-620``)."""
    t = torch.tensor(data, dtype=dtype, pin_memory=pin, device="cpu")
    return t.to(device=device, non_blocking=True)


class VllmMinP:
    """vLLM 0.25.1 ``MinPLogitsProcessor`` (builtin.py:23-116), transcribed."""

    def __init__(self, max_num_reqs: int, device: torch.device, pin: bool) -> None:
        self.min_p_count = 0
        self.min_p_cpu_tensor = torch.zeros((max_num_reqs,), dtype=torch.float32, pin_memory=pin)
        self.min_p_cpu = self.min_p_cpu_tensor.numpy()
        self.use_double_tensor = device.type != "cpu"
        if self.use_double_tensor:
            self.min_p_device = torch.empty((max_num_reqs,), dtype=torch.float32, device=device)
        else:
            self.min_p_device = self.min_p_cpu_tensor
        self.min_p = self.min_p_device[:0]

    def update_state(self, batch_update: Any) -> None:
        if not batch_update:
            return
        needs_update = False
        for index, params, _, _ in batch_update.added:
            min_p = params.min_p
            min_p_before = self.min_p_cpu[index]
            if min_p_before != min_p:
                needs_update = True
                self.min_p_cpu[index] = min_p
                if min_p and not min_p_before:
                    self.min_p_count += 1
                elif not min_p and min_p_before:
                    self.min_p_count -= 1
        if self.min_p_count:
            if batch_update.removed:
                needs_update = True
                for index in batch_update.removed:
                    if self.min_p_cpu[index]:
                        self.min_p_cpu[index] = 0
                        self.min_p_count -= 1
            for adx, bdx, direct in batch_update.moved:
                min_p_a, min_p_b = self.min_p_cpu[adx], self.min_p_cpu[bdx]
                if min_p_a != min_p_b:
                    needs_update = True
                    self.min_p_cpu[bdx] = min_p_a
                    if direct.name == "SWAP":
                        self.min_p_cpu[adx] = min_p_b
                if direct.name == "UNIDIRECTIONAL":
                    if min_p_a:
                        self.min_p_cpu[adx] = 0
                    if min_p_b:
                        self.min_p_count -= 1
        size = batch_update.batch_size
        if self.min_p_count and (needs_update or self.min_p.shape[0] != size):
            self.min_p = self.min_p_device[:size]
            if self.use_double_tensor:
                self.min_p.copy_(self.min_p_cpu_tensor[:size], non_blocking=True)
            self.min_p.unsqueeze_(1)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.min_p_count:
            return logits
        return vllm_min_p(logits, self.min_p)


class VllmLogitBias:
    """vLLM 0.25.1 ``LogitBiasLogitsProcessor`` (builtin.py:119-162), transcribed."""

    def __init__(self, device: torch.device, pin: bool) -> None:
        self.device, self.pin = device, pin
        self.biases: dict[int, dict[int, float]] = {}
        self.bias_tensor = torch.tensor(())
        self.logits_slice: tuple[torch.Tensor, torch.Tensor] = (torch.tensor(()),) * 2

    def update_state(self, batch_update: Any) -> None:
        needs_update = process_dict_updates(
            self.biases, batch_update, lambda params, _, __: params.logit_bias or None
        )
        if needs_update:
            reqs: list[int] = []
            tok_ids: list[int] = []
            biases: list[float] = []
            for req, lb in self.biases.items():
                reqs.extend([req] * len(lb))
                tok_ids.extend(lb.keys())
                biases.extend(lb.values())
            self.bias_tensor = _h2d(biases, torch.float32, self.device, self.pin)
            self.logits_slice = (
                _h2d(reqs, torch.int32, self.device, self.pin),
                _h2d(tok_ids, torch.int32, self.device, self.pin),
            )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.biases:
            logits[self.logits_slice] += self.bias_tensor
        return logits


class VllmMinTokens:
    """vLLM 0.25.1 ``MinTokensLogitsProcessor`` (builtin.py:165-233), transcribed."""

    def __init__(self, device: torch.device, pin: bool) -> None:
        self.device, self.pin = device, pin
        self.min_toks: dict[int, tuple[int, list[int], set[int]]] = {}
        self.logits_slice: tuple[torch.Tensor, torch.Tensor] = (torch.tensor(()),) * 2
        self.neg_inf_tensor = torch.tensor(-math.inf, dtype=torch.float32, device=device)

    @staticmethod
    def add_request(params: Any, _: Any, output_tok_ids: list[int]) -> Any:
        min_tokens = params.min_tokens
        if not min_tokens or len(output_tok_ids) >= min_tokens:
            return None
        return min_tokens, output_tok_ids, params.all_stop_token_ids

    def update_state(self, batch_update: Any) -> None:
        needs_update = process_dict_updates(self.min_toks, batch_update, self.add_request)
        if self.min_toks:
            to_remove = tuple(
                k for k, (min_toks, out, _) in self.min_toks.items() if len(out) >= min_toks
            )
            if to_remove:
                needs_update = True
                for index in to_remove:
                    del self.min_toks[index]
        if needs_update:
            reqs: list[int] = []
            tok_ids: list[int] = []
            for req, (_, _, stop_tok_ids) in self.min_toks.items():
                reqs.extend([req] * len(stop_tok_ids))
                tok_ids.extend(stop_tok_ids)
            self.logits_slice = (
                _h2d(reqs, torch.int32, self.device, self.pin),
                _h2d(tok_ids, torch.int32, self.device, self.pin),
            )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.min_toks:
            logits.index_put_(self.logits_slice, self.neg_inf_tensor)
        return logits


class VllmTrio:
    """vLLM 0.25.1's three built-ins, in its order (MinTokens, LogitBias; then MinP)."""

    def __init__(self, max_num_reqs: int, device: torch.device) -> None:
        pin = device.type == "cuda"
        self.min_p = VllmMinP(max_num_reqs, device, pin)
        self.procs = [VllmMinTokens(device, pin), VllmLogitBias(device, pin), self.min_p]

    def update_state(self, batch_update: Any) -> None:
        for p in (self.min_p, *self.procs[:2]):  # argmax-invariant first, as vLLM
            p.update_state(batch_update)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for p in self.procs:
            logits = p.apply(logits)
        return logits


def vllm_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """``MinPLogitsProcessor.apply`` of vLLM 0.25.1 (builtin.py:102-116), verbatim."""
    probability_values = torch.nn.functional.softmax(logits, dim=-1)
    max_probabilities = torch.amax(probability_values, dim=-1, keepdim=True)
    adjusted_min_p = max_probabilities.mul_(min_p)
    invalid_token_mask = probability_values < adjusted_min_p
    logits.masked_fill_(invalid_token_mask, -float("inf"))
    return logits


def bench_trio_apply(b: int, vocab: int, warm: int, steps: int, dev: torch.device) -> None:
    section(
        f"(b) MinTokens + LogitBias + MinP: apply per step, µs (median / p90), B={b}, V={vocab}, "
        f"{steps} steps, {dev}; target: ours >= 3x the reference"
    )
    timer = Timer(dev)
    cfg = EngineConfig(max_num_seqs=b, vocab_size=vocab)
    ours, ref = trio(cfg, dev)
    vllm = VllmTrio(b, dev)
    sim = churn(b, vocab, 2, trio_params(vocab))
    g = torch.Generator(device=dev).manual_seed(2)
    t: dict[str, list[int]] = {k: [] for k in ("ours", "ref", "vllm", "ours_mp", "vllm_mp")}
    our_mp = ours.argmax_invariant[0]
    min_p_rows = []
    for step in range(warm + steps):
        update = sim.step()
        for p in (*ours.all, *ref.all, vllm):
            p.update_state(update)
        n = sim.batch.num_reqs
        if step < warm - 1 or n == 0:  # the last warm-up step runs (and discards) the applies
            continue
        x = torch.randn(n, vocab, generator=g, device=dev).mul_(3.0)
        xs = [x.clone() for _ in range(5)]
        res = {}
        res["ours"], a = timer(lambda: apply_all(ours, xs[0]))  # noqa: B023
        res["ref"], r = timer(lambda: apply_all(ref, xs[1]))  # noqa: B023
        res["vllm"], v = timer(lambda: vllm.apply(xs[2]))  # noqa: B023
        _, amp = timer(lambda: our_mp.apply(xs[3]))  # noqa: B023
        _, vmp = timer(lambda: vllm.min_p.apply(xs[4]))  # noqa: B023
        if step < warm:
            continue
        if step == warm:  # the same result (MinP float ties aside)
            for k in ("ref", "vllm"):
                agree = (res["ours"] == res[k]).double().mean().item()
                if agree < 0.9999:
                    print(f"  warning: ours and {k} agree on only {agree:.4%} of positions")
        for k, val in zip(t, (a, r, v, amp, vmp), strict=True):
            t[k].append(val)
        min_p_rows.append(vllm.min_p.min_p_count)
    print(f"  trio, ours (logit-space MinP)           {cell(t['ours'])}")
    print(
        f"  trio, reference (per-row softmax MinP)  {cell(t['ref'])}   "
        f"ref/ours {ratio(t['ref'], t['ours'])}"
    )
    print(
        f"  trio, vLLM 0.25.1 vectorised apply      {cell(t['vllm'])}   "
        f"vLLM/ours {ratio(t['vllm'], t['ours'])}"
    )
    print(
        f"  MinP alone: ours {cell(t['ours_mp'])}  vs vLLM softmax MinP {cell(t['vllm_mp'])}  "
        f"{ratio(t['vllm_mp'], t['ours_mp'])}   (~{statistics.median(min_p_rows):.0f} of {b} "
        f"rows with min_p)"
    )


# --- (c) penalties --------------------------------------------------------------------------


def make_ndarray_with_pad(x: list[list[int]], pad: int, dtype: Any, max_len: int) -> np.ndarray:
    """vLLM's ``make_ndarray_with_pad`` (``utils/torch_utils.py:628-650``)."""
    padded_x = np.full((len(x), max_len), pad, dtype=dtype)
    for ind, blocktb in enumerate(x):
        assert len(blocktb) <= max_len
        padded_x[ind, : len(blocktb)] = blocktb
    return padded_x


def to_padded_tensor(
    lists: list[list[int]], vocab: int, device: torch.device, pin: bool
) -> torch.Tensor:
    """``make_tensor_with_pad(..., pad=vocab, dtype=int64, pin_memory)`` then ``.to(device,
    non_blocking=True)``, as ``penalties._convert_to_tensors``."""
    max_len = max((len(x) for x in lists), default=0)
    arr = make_ndarray_with_pad(lists, vocab, np.int64, max_len)
    t = torch.from_numpy(arr)
    if pin:
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def bin_counts_and_mask(
    tokens: torch.Tensor, vocab_size: int, num_seqs: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``get_token_bin_counts_and_mask`` (``model_executor/layers/utils.py:34-48``)."""
    bin_counts = torch.zeros((num_seqs, vocab_size + 1), dtype=torch.long, device=tokens.device)
    bin_counts.scatter_add_(1, tokens, torch.ones_like(tokens))
    bin_counts = bin_counts[:, :vocab_size]
    mask = bin_counts > 0
    return bin_counts, mask


def vllm_style_penalties(
    logits: torch.Tensor,
    prompt_tokens_t: torch.Tensor,
    output_token_ids: list[list[int]],
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
    pin: bool,
) -> torch.Tensor:
    """vLLM 0.25.1's penalty path, rebuilt from the full history every step:
    ``apply_all_penalties`` (``ops/penalties.py``) → ``apply_penalties`` (``layers/utils.py``).
    ``prompt_tokens_t`` is the padded prompt tensor vLLM rebuilds when the batch changes."""
    hist = vllm_penalty_history(logits, prompt_tokens_t, output_token_ids, pin)
    return vllm_penalty_math(logits, *hist, presence, frequency, repetition)


def vllm_penalty_history(
    logits: torch.Tensor,
    prompt_tokens_t: torch.Tensor,
    output_token_ids: list[list[int]],
    pin: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The history part: pad the output lists into a tensor, copy it over, bincount it (and the
    prompt) with ``scatter_add_``. Returns (prompt_mask, output_bin_counts, output_mask)."""
    num_seqs, vocab_size = logits.shape
    output_tokens_t = to_padded_tensor(output_token_ids, vocab_size, logits.device, pin)
    output_tokens_t.masked_fill_(output_tokens_t == -1, vocab_size)
    _, prompt_mask = bin_counts_and_mask(prompt_tokens_t, vocab_size, num_seqs)
    output_bin_counts, output_mask = bin_counts_and_mask(output_tokens_t, vocab_size, num_seqs)
    return prompt_mask, output_bin_counts, output_mask


def vllm_penalty_math(
    logits: torch.Tensor,
    prompt_mask: torch.Tensor,
    output_bin_counts: torch.Tensor,
    output_mask: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    """The dense part, in place. Repetition divides positive logits on CUDA (vLLM's kernel)
    and multiplies them by the float32 reciprocal elsewhere (vLLM's torch fallback), as ours."""
    rep = repetition.unsqueeze(1)
    up = logits / rep if logits.device.type == "cuda" else logits * (1.0 / rep)
    penalized = torch.where(logits > 0, up, logits * rep)
    logits = torch.where(prompt_mask | output_mask, penalized, logits, out=logits)
    logits -= frequency.unsqueeze(dim=1) * output_bin_counts
    logits -= presence.unsqueeze(dim=1) * output_mask
    return logits


def prefilled_churn(gen_tokens: int) -> type[ChurnSimulator]:
    """A ChurnSimulator whose requests arrive with ``gen_tokens`` tokens already generated
    (resumed requests), so every request sits at that output length."""

    class Prefilled(ChurnSimulator):
        def _new_request(self) -> Request:
            req = super()._new_request()
            req.output_token_ids.extend(self.rng.choices(range(self.vocab_size), k=gen_tokens))
            return req

    return Prefilled


PENALTY_FIELDS = ("presence_penalty", "frequency_penalty", "repetition_penalty")


def penalty_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(
        max_tokens=None,
        temperature=0.8,
        repetition_penalty=rng.choice((1.05, 1.2)),
        frequency_penalty=rng.choice((0.1, 0.5)),
        presence_penalty=rng.choice((0.0, 0.3)),
    )


def bench_penalties(
    b: int, vs: Sequence[int], lengths: Sequence[int], warm: int, steps: int, dev: torch.device
) -> None:
    section(
        f"(c) penalties: update_state + apply per step, µs (median / p90), B={b}, every request "
        f"penalised, {steps} steps, {dev}; target: ours >= 5x vllm_style_penalties at 1,024\n"
        f"    requests arrive with `tokens` outputs already generated; split = medians of "
        f"ours: update_state | apply, vLLM: history (pad + bincount) | dense math"
    )
    print(
        f"{'V':>7} {'tokens':>6}   {'ours':^21}  {'split':^17}   "
        f"{'vllm_style_penalties':^21}  {'split':^17}   {'ratio':>7}"
    )
    timer = Timer(dev)
    pin = dev.type == "cuda"
    for vocab in vs:
        for length in lengths:
            cfg = EngineConfig(max_num_seqs=b, vocab_size=vocab)
            ours = PenaltiesLogitsProcessor(cfg, dev, pin)
            sim = churn(b, vocab, 3, penalty_params, cls=prefilled_churn(length))
            sim.prompt_len = (64, 512)
            g = torch.Generator(device=dev).manual_seed(3)
            t: dict[str, list[int]] = {k: [] for k in ("ou", "oa", "vh", "vm")}
            prompt_t = pres = freq = rep = None
            for step in range(warm + steps):
                update = sim.step()
                rows = sim.batch.rows()
                x = torch.randn(len(rows), vocab, generator=g, device=dev).mul_(3.0)
                y = x.clone()
                _, ou = timer(lambda: ours.update_state(update))  # noqa: B023
                a_out, oa = timer(lambda: ours.apply(x))  # noqa: B023

                def history(update=update, y=y, rows=rows, vocab=vocab):
                    nonlocal prompt_t, pres, freq, rep
                    if update is not None or prompt_t is None:  # _make_sampling_metadata
                        prompts = [r.prompt_token_ids or [] for r in rows]
                        prompt_t = to_padded_tensor(prompts, vocab, dev, pin)
                        pres, freq, rep = (
                            _h2d([getattr(r.params, a) for r in rows], torch.float32, dev, pin)
                            for a in PENALTY_FIELDS
                        )
                    outs = [r.output_token_ids for r in rows]
                    return vllm_penalty_history(y, prompt_t, outs, pin)

                hist, vh = timer(history)
                v_out, vm = timer(
                    lambda: vllm_penalty_math(y, *hist, pres, freq, rep)  # noqa: B023
                )
                if step == warm and not torch.equal(a_out, v_out):
                    bad = int((a_out != v_out).sum())
                    print(f"  warning: ours and vllm_style_penalties differ at {bad} positions")
                if step >= warm:
                    for k, val in zip(t, (ou, oa, vh, vm), strict=True):
                        t[k].append(val)
            ours_tot = [a + c for a, c in zip(t["ou"], t["oa"], strict=True)]
            vllm_tot = [a + c for a, c in zip(t["vh"], t["vm"], strict=True)]

            def split(k1: str, k2: str, t=t) -> str:
                return f"{fmt(med_p90(t[k1])[0]):>7} | {fmt(med_p90(t[k2])[0]):>7}"

            print(
                f"{vocab:>7} {length:>6}   {cell(ours_tot)}  {split('ou', 'oa')}   "
                f"{cell(vllm_tot)}  {split('vh', 'vm')}   {ratio(vllm_tot, ours_tot)}"
            )


# --- (d) full pipeline ----------------------------------------------------------------------


def bench_pipeline(b: int, vs: Sequence[int], warm: int, steps: int, dev: torch.device) -> None:
    section(
        f"(d) full pipeline: every processor's update_state + Sampler per step, µs (median / "
        f"p90), B={b}, the demo's parameter mix, {steps} steps, {dev}"
    )
    timer = Timer(dev)
    pin = dev.type == "cuda"
    for vocab in vs:
        if dev.type == "cpu" and vocab > 32000:
            print(
                f"  V={vocab}: skipped on CPU: the reference samples row by row (a top-p sort "
                f"of {vocab} logits per row), several seconds per step for each side here"
            )
            continue
        cfg = EngineConfig(max_num_seqs=b, vocab_size=vocab)
        ours = build_logitsprocs(cfg, dev, pin)
        ref = build_reference_logitsprocs(cfg, dev)
        features = processor_features(ours) & processor_features(ref)
        sampler, ref_sampler = Sampler(ours), ReferenceSampler(ref)
        sim = churn(b, vocab, 4, make_params_factory(vocab, features))
        g = torch.Generator(device=dev).manual_seed(4)
        boost_ids, boost_vals = logit_boosts(dev)
        t = {k: [] for k in ("ou", "ru", "os", "rs")}
        for step in range(warm + steps):
            update = sim.step()
            _, ou = timer(lambda: [p.update_state(update) for p in ours.all])  # noqa: B023
            _, ru = timer(lambda: [p.update_state(update) for p in ref.all])  # noqa: B023
            rows = sim.batch.rows()
            if step < warm - 1 or not rows:  # warm-up: churn only, then one sampled step
                continue
            params = [r.params for r in rows]
            gens = {
                i: torch.Generator(device=dev).manual_seed(p.seed)
                for i, p in enumerate(params)
                if p.seed is not None and p.temperature > 0
            }
            md = SamplingMetadata.from_params(params, vocab, dev, generators=gens)
            x = make_logits(g, len(rows), vocab, dev, boost_ids, boost_vals)
            y = x.clone()
            _, os_ = timer(lambda: sampler(x, md))  # noqa: B023
            _, rs = timer(lambda: ref_sampler(y, md))  # noqa: B023
            if step >= warm:
                for k, val in zip(t, (ou, ru, os_, rs), strict=True):
                    t[k].append(val)
        tot_o = [a + c for a, c in zip(t["ou"], t["os"], strict=True)]
        tot_r = [a + c for a, c in zip(t["ru"], t["rs"], strict=True)]
        print(f"  V={vocab}: parameters {', '.join(sorted(features))}")
        print(f"  {'':<14}   {'ours':^21}   {'reference':^21}   {'ratio':>8}")
        for label, o, r in (
            ("update_state", t["ou"], t["ru"]),
            ("sampler", t["os"], t["rs"]),
            ("total", tot_o, tot_r),
        ):
            print(f"  {label:<14}   {cell(o)}   {cell(r)}   {ratio(r, o)}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer steps, V = 32,000 only")
    ap.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="torch device (default: cuda if available, else cpu)",
    )
    ap.add_argument(
        "--sections", default="abcd", help="which sections to run, e.g. 'ac' (default abcd)"
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default 1 on CPU: on a small shared machine multi-threaded "
        "ops wait for busy cores; torch's default on CUDA)",
    )
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    elif dev.type == "cpu":
        torch.set_num_threads(1)
    quick = args.quick
    vs = (32000,) if quick else (32000, 151936)
    t0 = time.perf_counter()
    print(
        f"logitsproc_rs bench: device {dev}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} CPU threads, {'quick' if quick else 'full'} run; "
        f"churn finish_prob 1/64, max_tokens never reached, a few SWAPs"
    )
    if "a" in args.sections:
        bench_trio_update((64, 256, 1024), vs, 100, 300 if quick else 1000, dev)
    if "b" in args.sections:
        bench_trio_apply(256, 32000, 20, 30 if quick else 100, dev)
    if "c" in args.sections:
        bench_penalties(256, vs, (16, 256, 1024, 4096), 3, 6 if quick else 20, dev)
    if "d" in args.sections:
        bench_pipeline(256, vs, 20, 3 if quick else 10, dev)
    print(f"\n(total {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

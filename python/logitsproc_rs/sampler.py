"""The two-phase ``Sampler``: vLLM 0.25.1's order of transforms around the processors.

grammar bitmask → (raw logprobs when asked) → fp32 cast → non-argmax-invariant processors
(built by ``build_logitsprocs`` in vLLM's order: allowed ids, bad words, MinTokens, LogitBias,
custom ones, penalties, thinking budget) → (all-greedy batch: argmax, stop) → greedy snapshot →
temperature (greedy rows ÷ 1) → argmax-invariant processors (MinP, custom: the opt-in
truncations top-n-sigma → typical-p → epsilon → eta, then XTC; docs/semantics.md) → top-k → top-p →
exponential-race sampling with per-request generators → greedy/random merge → logprobs.

``sampling`` picks how top-k / top-p and the draw run (``_tail.py``): ``exact`` (the default:
vLLM 0.25.1's tokens without its sort), ``batch_invariant`` (counter-based noise: a request's
tokens do not depend on its batch) or ``sort`` (vLLM's torch code as it is).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import torch

from ._fused import fused_plan, truncate_rows_
from ._logits_check import check_sampler_logits

# The tail's public names come from here (``_tail`` is internal): the sampling modes, the
# counts of rows through each path, and the kept-set mask of vLLM's top-k / top-p.
from ._tail import SAMPLING_MODES as SAMPLING_MODES
from ._tail import TAIL_STATS as TAIL_STATS
from ._tail import TailStats as TailStats
from ._tail import (  # apply_top_k_top_p: also imported from here (vLLM's sampler has it)
    _host_f32,
    apply_top_k_top_p,
    check_mode,
    check_torch_stream,
    fused_exponential_,
    fused_gumbel_,
    gumbel_race,
    mask_top_k_top_p_,
    random_sample_exact,
)
from .bitmask import GRAMMAR_KERNELS, apply_token_bitmask_
from .errors import InputError
from .params import _SAMPLING_EPS, SamplingParams, SamplingType
from .state import LogitsProcessors


@dataclass
class SamplingMetadata:
    """Per-step sampling inputs, one entry per batch row (vLLM's field names).

    ``top_k`` holds ``vocab_size`` for rows without top-k; ``max_top_k`` is its host-side max,
    so top-k needs no device sync. ``seeds`` and ``positions`` (host ints, one per row) key the
    ``batch_invariant`` draw's noise: a row's request seed (or, unseeded, a key the engine
    drew for the request once), and a counter that advances by one per token sampled for it.
    """

    temperature: torch.Tensor | None
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None = None
    top_k: torch.Tensor | None = None
    max_top_k: int | None = None
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    max_num_logprobs: int | None = None
    seeds: list[int | None] | None = None
    positions: list[int] | None = None

    def check(self, logits: torch.Tensor) -> None:
        """One entry per logits row, on the logits' device: a shorter tensor would broadcast
        (or index past the end) silently. ``ValueError`` naming the field otherwise."""
        rows = logits.shape[0]
        for name in ("temperature", "top_p", "top_k"):
            t = getattr(self, name)
            if t is None:
                continue
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] != rows:
                shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise InputError(
                    f"SamplingMetadata.{name}: expected one entry per logits row ([{rows}]), "
                    f"got {shape}"
                )
            if t.device != logits.device:
                raise InputError(
                    f"SamplingMetadata.{name}: on {t.device}, the logits on {logits.device}"
                )
        if self.all_greedy and self.all_random and rows:
            raise InputError("SamplingMetadata: all_greedy and all_random are both set")
        if not self.all_greedy and self.temperature is None:
            raise InputError("SamplingMetadata.temperature: needed unless all_greedy")
        bad = [i for i in self.generators if not (0 <= i < rows)]
        if bad:
            raise InputError(
                f"SamplingMetadata.generators: rows {bad[:8]} outside the {rows} logits rows"
            )

    @classmethod
    def from_params(
        cls,
        params: Sequence[SamplingParams | None],
        vocab_size: int,
        device: torch.device | str = "cpu",
        generators: dict[int, torch.Generator] | None = None,
        positions: Sequence[int] | None = None,
        keys: Sequence[int | None] | None = None,
    ) -> SamplingMetadata:
        """Build from the batch's per-row params (``None`` rows are treated as greedy).
        ``positions`` and ``keys`` (the key of an unseeded row's request) feed the
        ``batch_invariant`` draw: a row's seed is its ``params.seed``, else its key."""
        temps, top_ps, top_ks = [], [], []
        logprobs = None
        for p in params:
            greedy = p is None or p.sampling_type == SamplingType.GREEDY
            temps.append(0.0 if greedy or p is None else float(p.temperature))
            top_ps.append(1.0 if p is None else float(p.top_p))
            k = 0 if p is None else p.top_k
            top_ks.append(k if 0 < k < vocab_size else vocab_size)
            if p is not None and p.logprobs is not None:
                logprobs = max(logprobs or 0, p.logprobs)
        n_greedy = sum(t == 0.0 for t in temps)
        all_greedy = n_greedy == len(temps)
        all_random = n_greedy == 0
        use_top_p = any(p < 1.0 for p in top_ps)
        use_top_k = any(k < vocab_size for k in top_ks)
        dev = torch.device(device)
        return cls(
            temperature=None
            if all_greedy
            else torch.tensor(temps, dtype=torch.float32, device=dev),
            all_greedy=all_greedy,
            all_random=all_random,
            top_p=torch.tensor(top_ps, dtype=torch.float32, device=dev) if use_top_p else None,
            top_k=torch.tensor(top_ks, dtype=torch.int64, device=dev) if use_top_k else None,
            max_top_k=max(top_ks) if use_top_k else None,
            generators=dict(generators or {}),
            max_num_logprobs=logprobs,
            seeds=None
            if positions is None
            else [
                p.seed if p is not None and p.seed is not None else (keys[i] if keys else None)
                for i, p in enumerate(params)
            ],
            positions=None if positions is None else list(positions),
        )


LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")


@dataclass
class LogprobsTensors:
    """Per row: the sampled token first, then the top-n (vLLM's ``gather_logprobs`` layout)."""

    logprob_token_ids: torch.Tensor  # [B, n + 1] int32
    logprobs: torch.Tensor  # [B, n + 1] float32
    selected_token_ranks: torch.Tensor  # [B] int64: 1 + number of tokens ranked above


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [B] int64
    logits: torch.Tensor  # the processed logits the random rows were sampled from
    logprobs_tensors: LogprobsTensors | None = None


def gather_logprobs(
    logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
) -> LogprobsTensors:
    """Top-``num_logprobs`` plus the sampled token's value and rank (rank counts values ``>=``
    the sampled one, as vLLM ``ops/logprobs.py``)."""
    top_vals, top_ids = torch.topk(logprobs, num_logprobs, dim=-1)
    token_ids = token_ids.long().unsqueeze(-1)
    token_vals = logprobs.gather(-1, token_ids)
    ranks = (logprobs >= token_vals).sum(-1)
    return LogprobsTensors(
        torch.cat((token_ids, top_ids), dim=1).to(torch.int32),
        torch.cat((token_vals, top_vals), dim=1),
        ranks,
    )


def apply_temperature(logits: torch.Tensor, temp: torch.Tensor, all_random: bool) -> torch.Tensor:
    """In place ``logits /= T`` per row; greedy rows (T < 1e-5) are divided by 1."""
    if not all_random:
        temp = torch.where(temp < _SAMPLING_EPS, 1.0, temp)
    return logits.div_(temp.unsqueeze(1))


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Exponential race (Gumbel-max): ``argmax(probs / q)`` with ``q ~ Exp(1)``; rows with a
    seeded generator draw their ``q`` from it."""
    q = torch.empty_like(probs)
    if len(generators) != probs.shape[0]:
        q.exponential_()
    for i, g in generators.items():
        q[i].exponential_(generator=g)
    return probs.div_(q).argmax(dim=-1).view(-1)


class Sampler:
    """Runs the processors in two phases and samples one token per row."""

    def __init__(
        self,
        logitsprocs: LogitsProcessors,
        logprobs_mode: str = "raw_logprobs",
        grammar_kernel: str = "builtin",
        sampling: str = "exact",
    ) -> None:
        """``grammar_kernel``: who applies the grammar bitmask, ``"builtin"`` (ours, no
        dependency) or ``"xgrammar"`` (xgrammar's kernel, as vLLM's runner; needs xgrammar).
        ``sampling``: ``"exact"``, ``"batch_invariant"`` or ``"sort"`` (module docs)."""
        if logprobs_mode not in LOGPROBS_MODES:
            raise InputError(
                f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}"
            )
        if grammar_kernel not in GRAMMAR_KERNELS:
            raise InputError(
                f"grammar_kernel must be one of {GRAMMAR_KERNELS}, got {grammar_kernel!r}"
            )
        check_mode(sampling)
        if sampling == "exact":
            check_torch_stream()
        self.logitsprocs = logitsprocs
        self.logprobs_mode = logprobs_mode
        self.grammar_kernel = grammar_kernel
        self.sampling = sampling

    def apply_logits_processors(self, logits: torch.Tensor) -> torch.Tensor:
        """Phase 1: the processors that may change the argmax, on every row."""
        procs = self.logitsprocs
        return procs.apply_each(procs.non_argmax_invariant, logits)

    def __call__(
        self,
        logits: torch.Tensor,
        metadata: SamplingMetadata,
        grammar_bitmask: torch.Tensor | None = None,
        bitmask_indices: torch.Tensor | list[int] | None = None,
    ) -> SamplerOutput:
        """Sample one token per row. ``grammar_bitmask`` (xgrammar layout, see ``bitmask.py``)
        is applied first, in place on the raw logits, as vLLM's runner does."""
        check_sampler_logits(logits)
        metadata.check(logits)
        if grammar_bitmask is not None:
            apply_token_bitmask_(logits, grammar_bitmask, bitmask_indices, self.grammar_kernel)
        n_logprobs = metadata.max_num_logprobs
        raw = None
        if n_logprobs is not None and self.logprobs_mode.startswith("raw"):
            if self.logprobs_mode == "raw_logprobs":
                raw = logits.log_softmax(dim=-1, dtype=torch.float32)
            else:
                raw = logits.to(torch.float32, copy=True)
        logits = logits.to(torch.float32)
        logits = self.apply_logits_processors(logits)
        out = self.sample(logits, metadata)
        if n_logprobs is not None:
            if raw is None:
                raw = out.logits
                if self.logprobs_mode == "processed_logprobs":
                    raw = raw.log_softmax(dim=-1, dtype=torch.float32)
            out.logprobs_tensors = gather_logprobs(raw, n_logprobs, out.sampled_token_ids)
        return out

    def random_logits(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """What random rows are sampled from, after phase 1: temperature (greedy rows ÷ 1),
        the argmax-invariant processors, top-k/top-p. In place where the steps allow."""
        assert md.temperature is not None
        logits = apply_temperature(logits, md.temperature, md.all_random)
        logits = self.logitsprocs.apply_each(self.logitsprocs.argmax_invariant, logits)
        if self.sampling == "sort":
            return apply_top_k_top_p(logits, md.top_k, md.top_p, md.max_top_k)
        if self.sampling == "batch_invariant" and logits.device.type == "cuda":
            return logits  # the Triton kernel masks and draws in one launch (``draw``)
        strict = self.sampling == "exact"
        return mask_top_k_top_p_(logits, md.top_k, md.top_p, strict)

    def sample(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        """Phase 2: greedy snapshot, temperature, argmax-invariant processors, top-k/top-p,
        random sampling, merge."""
        assert not (md.all_greedy and md.all_random)
        greedy = None
        if not md.all_random:
            greedy = logits.argmax(dim=-1).view(-1)
            if md.all_greedy:
                return SamplerOutput(greedy, logits)
        if self.sampling == "batch_invariant":
            self._check_invariant_inputs(logits, md)
            if _host_f32(logits) or logits.device.type == "cuda":
                plan = fused_plan(self.logitsprocs, logits)
                if plan is not None:
                    return self._sample_fused(logits, md, plan, greedy)
        elif self.sampling == "exact" and _host_f32(logits):
            plan = fused_plan(self.logitsprocs, logits)
            if plan is not None:
                return self._sample_fused_exact(logits, md, plan, greedy)
        logits = self.random_logits(logits, md)
        sampled = self.draw(logits, md)
        if greedy is not None:
            assert md.temperature is not None  # random rows exist: not all greedy
            sampled = torch.where(md.temperature < _SAMPLING_EPS, greedy, sampled)
        return SamplerOutput(sampled, logits)

    def _sample_fused(
        self,
        logits: torch.Tensor,
        md: SamplingMetadata,
        plan: dict[str, torch.Tensor],
        greedy: torch.Tensor | None,
    ) -> SamplerOutput:
        """``batch_invariant`` in one pass per row, on the CPU in Rust (``_tail.fused_gumbel_``)
        and on CUDA in Triton (``fused_gumbel_triton_``, one launch; checked here under
        Triton's interpreter only: no GPU has run it): the logits and tokens of
        ``random_logits`` then ``draw``, the row read once."""
        assert md.temperature is not None and md.seeds is not None and md.positions is not None
        temp = md.temperature
        if not md.all_random:
            temp = torch.where(temp < _SAMPLING_EPS, 1.0, temp)
        rows = logits.shape[0]
        seeds = [0 if s is None else s for s in md.seeds]
        if logits.device.type == "cuda":  # the Triton kernel, one launch
            from .kernels._triton_sampling import fused_gumbel_triton_

            sampled = fused_gumbel_triton_(
                logits, temp, plan, md.top_k, md.top_p, seeds, md.positions
            )
        else:
            sampled = fused_gumbel_(
                logits,
                temp.tolist(),
                plan,
                md.top_k,
                md.top_p,
                seeds,
                md.positions,
                self._random_rows(md, rows),
            )
        if greedy is not None:
            sampled = torch.where(md.temperature < _SAMPLING_EPS, greedy, sampled)
        return SamplerOutput(sampled, logits)

    def _sample_fused_exact(
        self,
        logits: torch.Tensor,
        md: SamplingMetadata,
        plan: dict[str, torch.Tensor],
        greedy: torch.Tensor | None,
    ) -> SamplerOutput:
        """``exact`` in one Rust pass per row on float32 CPU logits (``_tail.
        fused_exponential_``): the processed logits, tokens and generator states of
        ``random_logits`` then ``draw``; torch (the processors' own steps, the sort, the
        softmax) only for what the pass cannot be certain of."""
        assert md.temperature is not None
        temp = md.temperature
        if not md.all_random:
            temp = torch.where(temp < _SAMPLING_EPS, 1.0, temp)
        rows = logits.shape[0]
        sampled = fused_exponential_(
            logits,
            temp.tolist(),
            plan,
            md.top_k,
            md.top_p,
            md.generators,
            self._random_rows(md, rows),
            partial(truncate_rows_, plan=plan),
        )
        if greedy is not None:
            sampled = torch.where(md.temperature < _SAMPLING_EPS, greedy, sampled)
        return SamplerOutput(sampled, logits)

    def _check_invariant_inputs(self, logits: torch.Tensor, md: SamplingMetadata) -> None:
        if logits.device.type == "cuda":
            try:
                from .kernels import _triton_sampling  # noqa: F401
            except ImportError as e:
                raise InputError(
                    f"sampling='batch_invariant' on CUDA needs Triton, which does not import: {e}"
                ) from e
        elif logits.device.type != "cpu":
            raise InputError(
                f"sampling='batch_invariant' runs on CPU (Rust) or CUDA (Triton) logits, got "
                f"{logits.device}"
            )
        rows = logits.shape[0]
        if md.positions is None or md.seeds is None:
            raise InputError(
                "sampling='batch_invariant': SamplingMetadata.positions and seeds are needed "
                "(SamplingMetadata.from_params(..., positions=, keys=))"
            )
        if len(md.positions) != rows or len(md.seeds) != rows:
            raise InputError(
                f"SamplingMetadata.positions / seeds: expected {rows} entries, got "
                f"{len(md.positions)} / {len(md.seeds)}"
            )
        random = self._random_rows(md, rows)
        missing = [i for i in range(rows) if random[i] and md.seeds[i] is None]
        if missing:
            raise InputError(
                f"sampling='batch_invariant': rows {missing[:8]} sample randomly with neither "
                "a seed nor a request key (SamplingMetadata.from_params(..., keys=))"
            )

    @staticmethod
    def _random_rows(md: SamplingMetadata, rows: int) -> list[bool]:
        if md.all_random:
            return [True] * rows
        assert md.temperature is not None
        return (md.temperature >= _SAMPLING_EPS).tolist()

    def draw(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """The random rows' tokens from their processed (masked) logits."""
        rows = logits.shape[0]
        if self.sampling == "batch_invariant":
            assert md.seeds is not None and md.positions is not None
            seeds = [0 if s is None else s for s in md.seeds]
            if logits.device.type == "cuda":
                from .kernels._triton_sampling import sample_batch_invariant_triton

                dev = logits.device
                return sample_batch_invariant_triton(
                    logits,
                    md.top_k,
                    md.top_p,
                    torch.tensor(seeds, dtype=torch.int64, device=dev),
                    torch.tensor(md.positions, dtype=torch.int64, device=dev),
                )
            return gumbel_race(logits, seeds, md.positions, self._random_rows(md, rows))
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        if self.sampling == "exact" and probs.device.type == "cpu":
            return random_sample_exact(probs, md.generators, self._random_rows(md, rows))
        return random_sample(probs, md.generators)

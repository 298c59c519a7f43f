"""The reference: vLLM 0.25.1's semantics in plain, per-request Python/torch.

Written to be obviously right, not fast: state lives in dicts keyed by batch slot, ``apply``
loops over rows, the sampler handles one row at a time. Tests compare the fast path against it
and benchmarks report ratios to it. Line numbers are vLLM 0.25.1's
(``vllm/v1/sample/logits_processor/builtin.py`` unless another file is named).

Parameters are read as attributes only (``min_p``, ``logit_bias``, ``min_tokens``,
``all_stop_token_ids``), so vLLM's own ``SamplingParams`` and ``BatchUpdate`` work too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

from .interface import BatchUpdate, LogitsProcessor
from .params import _SAMPLING_EPS
from .sampler import SamplerOutput, SamplingMetadata
from .state import LogitsProcessors

T = TypeVar("T")

__all__ = [
    "REFERENCE_LOGITS_PROCESSORS",
    "RefLogitBiasLogitsProcessor",
    "RefMinPLogitsProcessor",
    "RefMinTokensLogitsProcessor",
    "ReferenceSampler",
    "build_reference_logitsprocs",
    "process_dict_updates",
]


def _is_swap(direction: Any) -> bool:
    """True for SWAP, False for UNIDIRECTIONAL: any enum with that name (or value 2 / 1)."""
    name = getattr(direction, "name", None)
    if name is None and isinstance(direction, int) and not isinstance(direction, bool):
        name = {1: "UNIDIRECTIONAL", 2: "SWAP"}.get(direction)
    if name not in ("SWAP", "UNIDIRECTIONAL"):
        raise ValueError(f"move direction must be SWAP or UNIDIRECTIONAL, got {direction!r}")
    return name == "SWAP"


def process_dict_updates(
    req_entries: dict[int, T],
    batch_update: BatchUpdate | None,
    new_state: Callable[[Any, list[int] | None, list[int]], T | None],
) -> bool:
    """Apply one ``BatchUpdate`` to a slot → state dict; mirrors ``process_dict_updates``
    (builtin.py:289-327). Order: added, removed, moved. An added request whose ``new_state``
    is ``None`` clears its slot; a UNIDIRECTIONAL move discards the destination's old state
    and empties the source; a SWAP exchanges, also when one side is empty. Returns whether
    anything changed."""
    if batch_update is None:
        return False
    updated = False
    for index, params, prompt_tok_ids, output_tok_ids in batch_update.added:
        state = new_state(params, prompt_tok_ids, output_tok_ids)
        if state is not None:
            req_entries[index] = state
            updated = True
        elif req_entries.pop(index, None) is not None:
            updated = True
    for index in batch_update.removed:
        if req_entries.pop(index, None) is not None:
            updated = True
    for a_index, b_index, direction in batch_update.moved:
        swap = _is_swap(direction)
        a_entry = req_entries.pop(a_index, None)
        b_entry = req_entries.pop(b_index, None)
        if a_entry is not None:
            req_entries[b_index] = a_entry
            updated = True
        if b_entry is not None:
            updated = True
            if swap:
                req_entries[a_index] = b_entry
    return updated


class RefMinTokensLogitsProcessor(LogitsProcessor):
    """Masks stop tokens (``all_stop_token_ids``: stop ids ∪ EOS) until ``min_tokens`` were
    generated; mirrors ``MinTokensLogitsProcessor`` (builtin.py:165-233). Not argmax-invariant.

    State: slot → (min_tokens, live output list, stop set). An entry is never created when the
    output is already long enough, and is dropped on every ``update_state`` (``None`` too) once
    ``len(output) >= min_tokens`` (197-224)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.min_toks: dict[int, tuple[int, list[int], set[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    @staticmethod
    def new_state(
        params: Any, _prompt: list[int] | None, output: list[int]
    ) -> tuple[int, list[int], set[int]] | None:
        """``add_request`` (188-195)."""
        min_tokens = params.min_tokens
        if not min_tokens or len(output) >= min_tokens:
            return None
        return (min_tokens, output, set(params.all_stop_token_ids))

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.min_toks, batch_update, self.new_state)
        for index, (min_tokens, output, _) in list(self.min_toks.items()):
            if len(output) >= min_tokens:
                del self.min_toks[index]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits[row, stop] = -inf`` for every remaining entry (229-233)."""
        for index, (_, _, stop) in self.min_toks.items():
            for token in stop:
                logits[index, token] = -math.inf
        return logits


class RefLogitBiasLogitsProcessor(LogitsProcessor):
    """Adds each request's ``{token: bias}`` to its row; mirrors ``LogitBiasLogitsProcessor``
    (builtin.py:119-162). Not argmax-invariant. State: slot → the request's ``logit_bias``
    dict (an empty dict counts as none)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.biases: dict[int, dict[int, float]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.biases, batch_update, lambda p, _, __: p.logit_bias or None)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits[row, token] += bias`` in float32 (159-162)."""
        for index, bias in self.biases.items():
            for token, value in bias.items():
                logits[index, token] += torch.tensor(value, dtype=torch.float32)
        return logits


class RefMinPLogitsProcessor(LogitsProcessor):
    """Drops tokens whose probability is below ``min_p`` times the row's top probability;
    mirrors ``MinPLogitsProcessor`` (builtin.py:23-116) in its softmax form. Argmax-invariant.

    State: slot → min_p as float32 (only non-zero values are stored). ``apply`` (102-116):
    ``probs = softmax(row)``; a token is masked iff ``probs < min_p * max(probs)`` (strict, so a
    token exactly at the threshold is kept). An all ``-inf`` row gives NaN probabilities and is
    left unchanged, as in vLLM."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.min_p: dict[int, float] = {}

    def is_argmax_invariant(self) -> bool:
        return True

    @staticmethod
    def new_state(params: Any, _prompt: list[int] | None, _output: list[int]) -> float | None:
        min_p = float(np.float32(params.min_p))  # stored as float32 (54-100)
        return min_p if min_p else None

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.min_p, batch_update, self.new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, min_p in self.min_p.items():
            row = logits[index]
            probs = torch.softmax(row, dim=-1)
            threshold = probs.max() * min_p  # float32 × float32
            row[probs < threshold] = -math.inf
        return logits


REFERENCE_LOGITS_PROCESSORS: list[type[LogitsProcessor]] = [
    RefMinTokensLogitsProcessor,
    RefLogitBiasLogitsProcessor,
    RefMinPLogitsProcessor,
]


def build_reference_logitsprocs(config: Any, device: torch.device | str) -> LogitsProcessors:
    """The reference trio in vLLM's order (``__init__.py:49-53, 184-217``); with speculative
    decoding only MinTokens, as vLLM."""
    device = torch.device(device)
    classes = REFERENCE_LOGITS_PROCESSORS
    if getattr(config, "speculative_config", None):
        classes = [RefMinTokensLogitsProcessor]
    return LogitsProcessors(cls(config, device, False) for cls in classes)


def _top_k_row(row: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k alone: keep the values >= the row's k-th largest (ties at the k-th value are
    kept); ``topk_topp_sampler.py`` (``apply_top_k_only``)."""
    kth = torch.sort(row, descending=True).values[k - 1]
    return row.masked_fill_(row < kth, -math.inf)


def _top_k_top_p_row(row: torch.Tensor, k: int | None, p: float) -> torch.Tensor:
    """Top-k then top-p on one row, as ``apply_top_k_top_p_pytorch``
    (``topk_topp_sampler.py``): sort ascending; mask sorted values below the k-th largest;
    softmax the sorted row, mask the low tail whose cumulative probability is <= 1 - p, always
    keep the top token; scatter back. Equal logits at the top-p boundary are dropped in
    ``torch.sort``'s order, as in vLLM."""
    values, order = torch.sort(row, descending=False)
    if k is not None:
        kth = values[values.shape[0] - k]
        values = values.masked_fill(values < kth, -math.inf)
    cumulative = torch.softmax(values, dim=-1).cumsum(dim=-1)
    drop = cumulative <= 1 - torch.tensor(p, dtype=torch.float32)
    drop[-1] = False
    values = values.masked_fill(drop, -math.inf)
    row[order] = values
    return row


class ReferenceSampler:
    """vLLM 0.25.1's ``Sampler.forward`` order (``vllm/v1/sample/sampler.py:72-302``), one row
    at a time: fp32 cast → non-argmax-invariant processors → (all greedy: argmax, stop) →
    greedy snapshot → temperature (greedy rows ÷ 1) → argmax-invariant processors → top-k →
    top-p → exponential-race sampling → greedy/random merge.

    The exponential noise ``q`` is drawn exactly as ``logitsproc_rs.sampler.random_sample``
    draws it, so with identically seeded generators both samplers pick the same tokens."""

    def __init__(self, logitsprocs: LogitsProcessors) -> None:
        self.logitsprocs = logitsprocs

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        md = metadata
        logits = logits.to(torch.float32)  # sampler.py:96
        for p in self.logitsprocs.non_argmax_invariant:  # 404-405
            logits = p.apply(logits)
        num_rows = logits.shape[0]

        # Greedy snapshot before temperature and the argmax-invariant processors (239-241).
        greedy: list[int] | None = None
        if not md.all_random:
            greedy = [int(logits[i].argmax()) for i in range(num_rows)]
            if md.all_greedy:
                return SamplerOutput(
                    torch.tensor(greedy, dtype=torch.int64, device=logits.device), logits
                )
        assert md.temperature is not None
        temps = [float(t) for t in md.temperature]

        # Temperature; greedy rows are divided by 1 (227-237).
        for i in range(num_rows):
            t = temps[i]
            if not md.all_random and t < _SAMPLING_EPS:
                t = 1.0
            logits[i] = logits[i] / t

        for p in self.logitsprocs.argmax_invariant:  # 282-283
            logits = p.apply(logits)

        # Top-k, then top-p. vLLM applies top-p to every row once any row uses it, so rows with
        # p = 1 still lose tokens whose probability underflows to 0; the same here.
        vocab = logits.shape[1]
        for i in range(num_rows):
            k = int(md.top_k[i]) if md.top_k is not None else None
            if k is not None and k >= vocab:
                k = None
            if md.top_p is not None:
                _top_k_top_p_row(logits[i], k, float(md.top_p[i]))
            elif k is not None:
                _top_k_row(logits[i], k)

        # Exponential race: argmax(probs / q), q ~ Exp(1); seeded rows draw q from their own
        # generator. Drawn as logitsproc_rs.sampler.random_sample does.
        q = torch.empty_like(logits)
        if len(md.generators) != num_rows:
            q.exponential_()
        for i, g in md.generators.items():
            q[i].exponential_(generator=g)
        sampled = []
        for i in range(num_rows):
            if greedy is not None and temps[i] < _SAMPLING_EPS:
                sampled.append(greedy[i])  # merge (296-301)
                continue
            probs = torch.softmax(logits[i], dim=-1)
            sampled.append(int((probs / q[i]).argmax()))
        return SamplerOutput(torch.tensor(sampled, dtype=torch.int64, device=logits.device), logits)

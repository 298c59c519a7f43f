"""The reference: vLLM 0.25.1's semantics in plain, per-request Python/torch.

Written to be obviously right, not fast: state lives in dicts keyed by batch slot, ``apply``
loops over rows, the sampler handles one row at a time. Tests compare the fast path against it
and benchmarks report ratios to it. Line numbers are vLLM 0.25.1's
(``vllm/v1/sample/logits_processor/builtin.py`` unless another file is named).

Parameters are read as attributes only (``min_p``, ``logit_bias``, ``min_tokens``,
``all_stop_token_ids``, ``allowed_token_ids``, ``bad_words_token_ids``, the three penalties),
so vLLM's own ``SamplingParams`` and ``BatchUpdate`` work too.

Besides vLLM's three built-ins, the transforms vLLM hard-codes in its sampler (allowed token
ids, bad words, penalties) are reference processors here, as they are processors in
``logitsproc_rs``; ``ref_apply_token_bitmask`` is the grammar bitmask and ``ReferenceSampler``
the whole sampler with logprobs. Unlike the fast path they rebuild everything from the
request's history on every step (penalty counts, bad-word matches), as vLLM 0.25.1 does.

An independent oracle: it imports nothing of the package it checks (only the standard library,
numpy and torch). Its interface types (``ReferenceProcessor``, ``RefLogitsProcessors``,
``process_dict_updates``), the sampler's types (``RefSamplingMetadata``, ``RefLogprobsTensors``,
``RefSamplerOutput``), the processor order (``REFERENCE_ORDER``) and the constants are its own,
written from vLLM 0.25.1; ``tests/test_reference.py`` checks that they agree with the fast
path's (a wrong order on either side fails there and in the differential tests).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

# Nothing of the package it checks (sampler, state, interface, params, registry, builtin) is
# imported: its types, order and constants are written here from vLLM 0.25.1 ("the semantics
# note": the project's notes on vLLM 0.25.1's semantics). Inputs (the engine's ``BatchUpdate``,
# ``SamplingParams``, a config, a ``SamplingMetadata``) are read by their attributes only.

T = TypeVar("T")

# --- constants ---------------------------------------------------------------------------------

#: Temperature below this is greedy (vLLM ``sampler.py:17``).
_SAMPLING_EPS = 1e-5
#: A repetition penalty of 1 is off (vLLM ``SamplingParams``).
NEUTRAL_REPETITION_PENALTY = 1.0
#: vLLM's logprobs modes (semantics note §5.1): of the logits as received or as sampled from.
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
#: The engine-wide caps the reference reads (``EngineConfig``; vLLM has none of these
#: processors, so these are ours): the default when the config does not set one.
CAP_DEFAULTS: dict[str, int] = {
    "max_dry_penalty_last_n": 8192,
    "max_no_repeat_ngram_window": 2048,
}


def _vllm_drafts(config: Any) -> bool:
    """Speculative decoding in vLLM 0.25.1's own mode (``draft_rows="vllm"``): a config with
    a ``speculative_config`` whose ``draft_rows`` is ``"vllm"``."""
    return bool(getattr(config, "speculative_config", None)) and (
        getattr(config, "draft_rows", "per_position") == "vllm"
    )


# --- the processor interface and its bookkeeping (vLLM 0.25.1, read by duck typing) -----------


class ReferenceProcessor:
    """vLLM 0.25.1's ``LogitsProcessor`` interface (``interface.py``, semantics note §1.3) as
    the reference's own base: ``update_state(batch_update | None)`` once per step, then
    ``apply(logits)``."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        raise NotImplementedError

    def is_argmax_invariant(self) -> bool:
        raise NotImplementedError

    def update_state(self, batch_update: Any) -> None:
        raise NotImplementedError

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def _is_swap(direction: Any) -> bool:
    """vLLM's ``direct == MoveDirectionality.SWAP``, for any enum member named ``SWAP`` (ours,
    vLLM's) or the value 2."""
    name = getattr(direction, "name", None)
    if name is None and isinstance(direction, int) and not isinstance(direction, bool):
        return direction == 2
    return name == "SWAP"


# vLLM's helper (builtin.py:289-327, kept with its quirks) is the reference's bookkeeping too:
# added, removed, moved; an added request whose state is None clears its slot; a UNIDIRECTIONAL
# move discards the destination's old state and empties the source; a SWAP exchanges, also
# when one side is empty. Removals and moves are skipped while the dict is empty, and a
# removed entry that is falsy does not count as a change.
def process_dict_updates(
    req_entries: dict[int, T],
    batch_update: Any,
    new_state: Callable[[Any, list[int] | None, list[int]], T | None],
) -> bool:
    """vLLM 0.25.1's ``process_dict_updates`` (semantics note §3.0): returns whether the dict
    changed."""
    if not batch_update:
        return False
    updated = False
    for index, params, prompt_tok_ids, output_tok_ids in batch_update.added:
        if (state := new_state(params, prompt_tok_ids, output_tok_ids)) is not None:
            req_entries[index] = state
            updated = True
        elif req_entries.pop(index, None) is not None:
            updated = True
    if req_entries:
        for index in batch_update.removed:
            if req_entries.pop(index, None):
                updated = True
        for a_index, b_index, direct in batch_update.moved:
            a_entry = req_entries.pop(a_index, None)
            b_entry = req_entries.pop(b_index, None)
            if a_entry is not None:
                req_entries[b_index] = a_entry
                updated = True
            if b_entry is not None:
                updated = True
                if _is_swap(direct):
                    req_entries[a_index] = b_entry
    return updated


class RefLogitsProcessors:
    """vLLM 0.25.1's ``LogitsProcessors`` container (``state.py``, semantics note §2.2): the
    processors split by ``is_argmax_invariant()``, each group in construction order;
    ``update_state`` calls every processor's in turn, argmax-invariant ones first (``all``)."""

    def __init__(self, logitsprocs: Iterable[ReferenceProcessor] | None = None) -> None:
        self.argmax_invariant: list[ReferenceProcessor] = []
        self.non_argmax_invariant: list[ReferenceProcessor] = []
        for p in logitsprocs or ():
            group = self.argmax_invariant if p.is_argmax_invariant() else self.non_argmax_invariant
            group.append(p)

    @property
    def all(self) -> Iterator[ReferenceProcessor]:
        yield from self.argmax_invariant
        yield from self.non_argmax_invariant

    def update_state(self, batch_update: Any) -> None:
        for p in self.all:
            p.update_state(batch_update)


# --- the sampler's types (vLLM 0.25.1's field names) --------------------------------------------


@dataclass
class RefSamplingMetadata:
    """Per-step sampling inputs, one entry per batch row, with vLLM's field names (the
    ``ReferenceSampler`` reads any object with these attributes). ``top_k`` holds the vocab
    size for rows without top-k. ``seeds`` / ``positions`` key our ``batch_invariant`` draw;
    the reference (vLLM's sampler) has no such mode and does not read them."""

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


@dataclass
class RefLogprobsTensors:
    """vLLM's ``LogprobsTensors`` (``gather_logprobs`` layout): per row the sampled token
    first, then the top-n."""

    logprob_token_ids: torch.Tensor  # [B, n + 1] int32
    logprobs: torch.Tensor  # [B, n + 1] float32
    selected_token_ranks: torch.Tensor  # [B] int64


@dataclass
class RefSamplerOutput:
    """What the ``ReferenceSampler`` returns: the tokens, the processed logits the random rows
    were sampled from and, when asked, the logprobs."""

    sampled_token_ids: torch.Tensor  # [B] int64
    logits: torch.Tensor
    logprobs_tensors: RefLogprobsTensors | None = None


class _Phases(Protocol):
    """What the ``ReferenceSampler`` reads of a processor container."""

    @property
    def argmax_invariant(self) -> Sequence[Any]: ...

    @property
    def non_argmax_invariant(self) -> Sequence[Any]: ...


__all__ = [
    "CAP_DEFAULTS",
    "LOGPROBS_MODES",
    "NEUTRAL_REPETITION_PENALTY",
    "REFERENCE_ORDER",
    "SPEC_DECODE_BUILTINS",
    "RefAllowedTokenIdsLogitsProcessor",
    "RefBadWordsLogitsProcessor",
    "RefDryLogitsProcessor",
    "RefEpsilonCutoffLogitsProcessor",
    "RefEtaCutoffLogitsProcessor",
    "RefLogitBiasLogitsProcessor",
    "RefLogitsProcessors",
    "RefLogprobsTensors",
    "RefMinPLogitsProcessor",
    "RefMinTokensLogitsProcessor",
    "RefNoRepeatNGramLogitsProcessor",
    "RefPenaltiesLogitsProcessor",
    "RefSamplerOutput",
    "RefSamplingMetadata",
    "RefTopKTopPLogitsProcessor",
    "RefTopNSigmaLogitsProcessor",
    "RefTypicalPLogitsProcessor",
    "RefXTCLogitsProcessor",
    "ReferenceProcessor",
    "ReferenceSampler",
    "build_reference_logitsprocs",
    "check_outputs",
    "process_dict_updates",
    "ref_apply_bad_words_single_batch",
    "ref_apply_token_bitmask",
    "ref_gather_logprobs",
    "ref_xtc_seed",
    "reference_class",
    "reference_of",
    "reference_stage",
]


def check_outputs(batch_update: Any, live: Any) -> None:
    """Output lists as vLLM writes them: async placeholders (``-1``, one per step in flight,
    filled in before more tokens are appended) are only ever a suffix. A token after one is
    refused, as the fast path refuses it: a ``ValueError`` (plain, where the fast path raises
    its subclass ``RequestError``) naming the request's index, the field and the position.
    ``live``: ``(index, output)`` of the lists a processor holds (checked before the update
    changes anything), then the update's added requests."""
    for index, output in live:
        _check_output(index, output)
    for index, _params, _prompt, output in batch_update.added if batch_update else ():
        _check_output(index, output)


def _check_output(index: int, output: Any) -> None:
    first = None
    for pos, t in enumerate(output):
        if isinstance(t, (int, np.integer)) and t == -1:
            first = pos if first is None else first
        elif first is not None:
            # The fast path's message (a ``RequestError``, a ``ValueError``); the reference
            # raises a plain ``ValueError`` so as to import nothing of it.
            raise ValueError(
                f"request at index {index}: field 'output_tok_ids': position {pos} holds a "
                f"token after the async placeholder (-1) at position {first}: placeholders "
                "are only ever a suffix of the output"
            )


class RefMinTokensLogitsProcessor(ReferenceProcessor):
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

    def update_state(self, batch_update: Any) -> None:
        check_outputs(batch_update, ((i, e[1]) for i, e in self.min_toks.items()))
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


class RefLogitBiasLogitsProcessor(ReferenceProcessor):
    """Adds each request's ``{token: bias}`` to its row; mirrors ``LogitBiasLogitsProcessor``
    (builtin.py:119-162). Not argmax-invariant. State: slot → the request's ``logit_bias``
    dict (an empty dict counts as none)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.biases: dict[int, dict[int, float]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: Any) -> None:
        process_dict_updates(self.biases, batch_update, lambda p, _, __: p.logit_bias or None)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits[row, token] += bias`` in float32 (159-162)."""
        for index, bias in self.biases.items():
            for token, value in bias.items():
                logits[index, token] += torch.tensor(value, dtype=torch.float32)
        return logits


class RefMinPLogitsProcessor(ReferenceProcessor):
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

    def update_state(self, batch_update: Any) -> None:
        process_dict_updates(self.min_p, batch_update, self.new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, min_p in self.min_p.items():
            row = logits[index]
            probs = torch.softmax(row, dim=-1)
            threshold = probs.max() * min_p  # float32 × float32
            row[probs < threshold] = -math.inf
        return logits


def _param(params: Any, name: str, default: Any) -> Any:
    """A request parameter read as an attribute; missing or ``None`` reads as ``default``."""
    value = getattr(params, name, None)
    return default if value is None else value


# llama.cpp's DRY constants (src/llama-sampler.cpp): the approximate log of FLT_MAX for the
# exponent clamp, and the most tokens of a breaker's tail.
_DRY_FLOAT_MAX_LOG = np.float32(88.7228391)
_DRY_MAX_TAIL = 20


def ref_dry_penalties(
    last_tokens: Sequence[int],
    multiplier: float,
    base: float,
    allowed_length: int,
    breakers: Sequence[Sequence[int]],
) -> dict[int, float]:
    """llama.cpp's ``llama_sampler_dry_apply`` (steps 1-4), transcribed literally, on
    ``last_tokens`` (the last ``N`` tokens of the context, oldest first; llama.cpp's
    ``last_tokens.rat(i)`` is ``last_tokens[N - 1 - i]``): token → the penalty subtracted from
    its logit (float32). ``breakers`` are token sequences, head first (``dry_processed_breakers``
    holds head → tail)."""
    n_last = len(last_tokens)

    def rat(i: int) -> int:
        return int(last_tokens[n_last - 1 - i])

    processed: dict[int, list[list[int]]] = {}
    for b in breakers:
        processed.setdefault(int(b[0]), []).append([int(t) for t in b[1 : 1 + _DRY_MAX_TAIL]])
    last_n_repeat = n_last
    if last_n_repeat <= allowed_length:
        return {}
    dry_repeat_count = [0] * last_n_repeat
    dry_max_token_repeat: dict[int, int] = {}

    # Step 1: the most recent restart sequence limits the repetition.
    rep_limit = last_n_repeat
    for i in range(last_n_repeat):
        token = rat(i)
        if token not in processed:
            continue
        longest_match = -1
        for tail in processed[token]:
            seq_len = len(tail)
            if seq_len > longest_match and seq_len <= i:
                match = True
                for offset in range(seq_len):
                    if tail[offset] != rat(i - offset - 1):
                        match = False
                        break
                if match:
                    longest_match = seq_len
        if longest_match >= 0:
            rep_limit = i - longest_match
            break
    if rep_limit < allowed_length:
        return {}

    # Step 2: the reverse Z-algorithm, lengths capped at rep_limit.
    last = last_n_repeat - 1
    rt = 0
    lt = 0
    for k in range(1, last_n_repeat):
        if k > rt:
            n = 0
            while n + k < last_n_repeat and rat(n) == rat(n + k):
                n += 1
            dry_repeat_count[last - k] = min(n, rep_limit)
            if n > 0:
                lt = k
                rt = k + n - 1
        else:
            p = k - lt
            right_part_len = rt - k + 1
            if dry_repeat_count[last - p] < right_part_len:
                dry_repeat_count[last - k] = min(dry_repeat_count[last - p], rep_limit)
            else:
                i = rt + 1
                while i < last_n_repeat and rat(i) == rat(i - k):
                    i += 1
                dry_repeat_count[last - k] = min(i - k, rep_limit)
                lt = k
                rt = i - 1

    # Step 3: the token after each long enough repeat gets the largest length.
    for i in range(last_n_repeat - 1):
        repeat_len = dry_repeat_count[i]
        if repeat_len >= allowed_length:
            token = rat(last_n_repeat - 2 - i)
            if token not in dry_max_token_repeat or dry_max_token_repeat[token] < repeat_len:
                dry_max_token_repeat[token] = repeat_len

    # Step 4: the penalties (float32 parameters; std::pow(float, int) is a double pow; the
    # clamp's log rounded to float32 from the double log).
    base32 = np.float32(base)
    max_exponent = 0
    if base32 > np.float32(1.000001):
        max_exponent = int(_DRY_FLOAT_MAX_LOG / np.float32(math.log(float(base32))))
    out: dict[int, float] = {}
    for token, length in dry_max_token_repeat.items():
        if any(len(tail) == 0 for tail in processed.get(token, ())):
            continue  # a single-token breaker
        repeat_exp = length - allowed_length
        if max_exponent > 0 and repeat_exp > max_exponent:
            repeat_exp = max_exponent
        pen = float(np.float32(multiplier)) * math.pow(float(base32), repeat_exp)
        out[token] = float(np.float32(pen))
    return out


class RefDryLogitsProcessor(ReferenceProcessor):
    """llama.cpp's DRY sampler (``llama_sampler_dry_apply``, ``ref_dry_penalties``), per row,
    recomputed from the sequence on every ``apply``: the sequence is the prompt then the
    **live** output list (up to an async placeholder), over its last ``dry_penalty_last_n``
    tokens (-1: ``max_dry_penalty_last_n``); each penalised token's logit (ids below V) loses
    its penalty. Off when ``dry_multiplier`` or ``dry_penalty_last_n`` is 0. Not
    argmax-invariant. State: slot → (params, prompt, live output list)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.max_window = int(
            getattr(vllm_config, "max_dry_penalty_last_n", CAP_DEFAULTS["max_dry_penalty_last_n"])
        )
        self.rows: dict[int, tuple[tuple[Any, ...], list[int], list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def new_state(
        self, params: Any, prompt: list[int] | None, output: list[int]
    ) -> tuple[tuple[Any, ...], list[int], list[int]] | None:
        multiplier = float(_param(params, "dry_multiplier", 0.0))
        last_n = int(_param(params, "dry_penalty_last_n", -1))
        if multiplier == 0.0 or last_n == 0:
            return None
        window = self.max_window if last_n == -1 else last_n
        p = (
            multiplier,
            float(_param(params, "dry_base", 1.75)),
            int(_param(params, "dry_allowed_length", 2)),
            window,
            [list(b) for b in _param(params, "dry_sequence_breakers", ())],
        )
        return (p, list(prompt or ()), output)

    def update_state(self, batch_update: Any) -> None:
        check_outputs(batch_update, ((i, e[2]) for i, e in self.rows.items()))
        process_dict_updates(self.rows, batch_update, self.new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        vocab = logits.shape[-1]
        for index, ((mult, base, allowed, window, breakers), prompt, output) in self.rows.items():
            out = list(output)
            if -1 in out:
                out = out[: out.index(-1)]
            seq = (prompt + out)[-window:]
            for t, pen in sorted(ref_dry_penalties(seq, mult, base, allowed, breakers).items()):
                if 0 <= t < vocab:
                    logits[index, t] -= pen
        return logits


class RefAllowedTokenIdsLogitsProcessor(ReferenceProcessor):
    """Only a request's ``allowed_token_ids`` survive; every other logit of its row becomes
    ``-inf``. vLLM 0.25.1 hard-codes this in its sampler (``sampler.py:396-397``) over a dense
    ``[max_num_seqs, V]`` bool mask kept by ``InputBatch``. Not argmax-invariant.

    State: slot → the set of allowed ids, moved with ``process_dict_updates``, so a SWAP
    exchanges the two rows' sets and a condense (UNIDIRECTIONAL) move leaves nothing behind at
    the source. This is the *intended* behaviour: vLLM 0.25.1 gets both wrong (its swap aliases
    two row views so both rows end up with one mask; its condense never clears the source row,
    so a later request there inherits a stale mask), fixed in 0.33.0."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.allowed: dict[int, frozenset[int]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    @staticmethod
    def new_state(
        params: Any, _prompt: list[int] | None, _output: list[int]
    ) -> frozenset[int] | None:
        ids = getattr(params, "allowed_token_ids", None)
        return None if ids is None else frozenset(int(t) for t in ids)

    def update_state(self, batch_update: Any) -> None:
        process_dict_updates(self.allowed, batch_update, self.new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, allowed in self.allowed.items():
            row = logits[index]
            keep = torch.zeros(row.shape[0], dtype=torch.bool, device=row.device)
            keep[sorted(allowed)] = True
            row.masked_fill_(~keep, -math.inf)
        return logits


def ref_apply_bad_words_single_batch(
    logits_row: torch.Tensor, bad_words_token_ids: list[list[int]], past_tokens_ids: list[int]
) -> torch.Tensor:
    """vLLM's ``_apply_bad_words_single_batch`` (``ops/bad_words.py:9-27``), in place on one
    row: a word longer than the output plus one is skipped; otherwise its last token is banned
    iff the output ends with the rest of the word (always, for a single-token word)."""
    for bad_word_ids in bad_words_token_ids:
        if len(bad_word_ids) > len(past_tokens_ids) + 1:
            continue
        prefix_length = len(bad_word_ids) - 1
        last_token_id = bad_word_ids[-1]
        actual_prefix = list(past_tokens_ids[-prefix_length:]) if prefix_length > 0 else []
        expected_prefix = list(bad_word_ids[:prefix_length])
        assert len(actual_prefix) == len(expected_prefix)
        if actual_prefix == expected_prefix:
            logits_row[last_token_id] = -math.inf
    return logits_row


def ref_bad_words_with_drafts(
    logits: torch.Tensor,
    bad_words: dict[int, list[list[int]]],
    outputs: dict[int, list[int]],
    num_draft_tokens: list[int],
    spec_token_ids: list[list[int]],
) -> torch.Tensor:
    """vLLM's ``apply_bad_words_with_drafts`` (``ops/bad_words.py:39-58``): request ``r`` owns
    ``num_draft_tokens[r]`` rows from ``sum(num_draft_tokens[:r])``; row ``j`` of it is matched
    against ``output + drafts[:j]``."""
    start = 0
    for r, n in enumerate(num_draft_tokens):
        if r in bad_words:
            for j in range(n):
                past = list(outputs[r]) + list(spec_token_ids[r][:j])
                ref_apply_bad_words_single_batch(logits[start + j], bad_words[r], past)
        start += n
    return logits


def ref_min_tokens_with_drafts(
    logits: torch.Tensor,
    requests: dict[int, tuple[int, set[int], list[int]]],
    num_draft_tokens: list[int],
) -> torch.Tensor:
    """vLLM's ``MinTokensLogitsProcessor.apply_with_spec_decode`` (``builtin.py:235-286``):
    for request ``r`` = (min_tokens, stop ids, output), the first
    ``min(max(min_tokens - len(output), 0), num_draft_tokens[r])`` of its rows get every stop
    id masked."""
    start = 0
    for r, n in enumerate(num_draft_tokens):
        if r in requests:
            min_tokens, stop, output = requests[r]
            for j in range(min(max(min_tokens - len(output), 0), n)):
                for t in stop:
                    logits[start + j, t] = -math.inf
        start += n
    return logits


class RefBadWordsLogitsProcessor(ReferenceProcessor):
    """Bad words (``params.bad_words_token_ids``, vLLM's tokenized form): vLLM's
    ``apply_bad_words`` (``ops/bad_words.py:30-36``) per row over the request's **live** output
    list, re-evaluated on every ``apply``. Not argmax-invariant.

    State: slot → (words, live output list); an empty or missing list of words is no state,
    as ``InputBatch`` (``if sampling_params.bad_words_token_ids:``)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.bad_words: dict[int, tuple[list[list[int]], list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    @staticmethod
    def new_state(
        params: Any, _prompt: list[int] | None, output: list[int]
    ) -> tuple[list[list[int]], list[int]] | None:
        words = getattr(params, "bad_words_token_ids", None)
        if not words:
            return None
        return ([list(w) for w in words], output)

    def update_state(self, batch_update: Any) -> None:
        check_outputs(batch_update, ((i, e[1]) for i, e in self.bad_words.items()))
        process_dict_updates(self.bad_words, batch_update, self.new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (words, output) in self.bad_words.items():
            ref_apply_bad_words_single_batch(logits[index], words, output)
        return logits


class RefNoRepeatNGramLogitsProcessor(ReferenceProcessor):
    """HF transformers' ``NoRepeatNGramLogitsProcessor`` (``_get_ngrams`` and
    ``_calc_banned_ngram_tokens``), per row, rebuilt from the sequence on every ``apply``: the
    sequence is the prompt then the **live** output list (up to an async placeholder), taken
    over its last ``max_no_repeat_ngram_window`` tokens; with ``n = no_repeat_ngram_size``,
    nothing is banned while it is shorter than ``n - 1``, else every token that followed an
    earlier occurrence of its last ``n - 1`` tokens is set to ``-inf`` (ids below V). Not
    argmax-invariant. State: slot → (n, prompt, live output list); ``n = 0`` is no state.

    DeepSeek-OCR's fields: ``no_repeat_ngram_output_only`` makes the prompt empty,
    ``no_repeat_ngram_window = w > 0`` takes the last ``w`` tokens instead of the engine's
    window, and ``no_repeat_ngram_whitelist`` ids are never banned (``modes``: slot → (w,
    whitelist) for the slots of ``rows``)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.window = int(
            getattr(
                vllm_config,
                "max_no_repeat_ngram_window",
                CAP_DEFAULTS["max_no_repeat_ngram_window"],
            )
        )
        self.rows: dict[int, tuple[int, list[int], list[int]]] = {}
        self.modes: dict[int, tuple[int, frozenset[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    @staticmethod
    def new_state(
        params: Any, prompt: list[int] | None, output: list[int]
    ) -> tuple[int, list[int], list[int]] | None:
        n = getattr(params, "no_repeat_ngram_size", 0) or 0
        if not n:
            return None
        if getattr(params, "no_repeat_ngram_output_only", False):
            prompt = None
        return (int(n), list(prompt or ()), output)

    def new_mode(
        self, params: Any, prompt: list[int] | None, output: list[int]
    ) -> tuple[int, frozenset[int]] | None:
        if self.new_state(params, prompt, output) is None:
            return None
        window = getattr(params, "no_repeat_ngram_window", 0) or self.window
        return (int(window), frozenset(getattr(params, "no_repeat_ngram_whitelist", None) or ()))

    def update_state(self, batch_update: Any) -> None:
        check_outputs(batch_update, ((i, e[2]) for i, e in self.rows.items()))
        process_dict_updates(self.rows, batch_update, self.new_state)
        process_dict_updates(self.modes, batch_update, self.new_mode)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        vocab = logits.shape[-1]
        for index, (n, prompt, output) in self.rows.items():
            out = list(output)
            if -1 in out:
                out = out[: out.index(-1)]
            window, whitelist = self.modes.get(index, (self.window, frozenset()))
            seq = (prompt + out)[-window:]
            if len(seq) + 1 < n:
                continue
            key = tuple(seq[len(seq) + 1 - n :])
            banned = {
                seq[i + n - 1] for i in range(len(seq) - n + 1) if tuple(seq[i : i + n - 1]) == key
            }
            for t in banned - whitelist:
                if 0 <= t < vocab:
                    logits[index, t] = -math.inf
        return logits


class _RefTruncation(ReferenceProcessor):
    """The four truncations beyond vLLM (top-n-sigma, typical-p, epsilon, eta): state is slot
    → the request's value as float32, only where it is not off; ``apply`` loops over those
    rows and rewrites each one by itself (``mask_row``, on a ``[1, V]`` view of the row).
    Argmax-invariant phase (see ``builtin/typical_p.py`` for typical-p)."""

    FIELD = ""
    NEUTRAL = 0.0

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.values: dict[int, float] = {}

    def is_argmax_invariant(self) -> bool:
        return True

    @classmethod
    def is_off(cls, value: float) -> bool:
        return value == cls.NEUTRAL

    @classmethod
    def new_state(cls, params: Any, _prompt: list[int] | None, _output: list[int]) -> float | None:
        value = float(np.float32(_param(params, cls.FIELD, cls.NEUTRAL)))
        return None if cls.is_off(value) else value

    def update_state(self, batch_update: Any) -> None:
        process_dict_updates(self.values, batch_update, self.new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, value in self.values.items():
            row = logits[index : index + 1]
            row.copy_(self.mask_row(row.clone(), value))
        return logits

    @staticmethod
    def mask_row(row: torch.Tensor, value: float) -> torch.Tensor:
        raise NotImplementedError


class RefTopNSigmaLogitsProcessor(_RefTruncation):
    """llama.cpp's ``llama_sampler_top_n_sigma_apply``: over the logits that are not -inf, the
    max, the mean and the population std (÷ count); every logit below ``max - n * std`` becomes
    -inf. ``n <= 0``: off. A row holding +inf or NaN, or of all -inf, is left alone (llama.cpp's
    threshold is NaN there)."""

    FIELD = "top_n_sigma"

    @classmethod
    def is_off(cls, value: float) -> bool:
        return value <= 0.0

    @staticmethod
    def mask_row(row: torch.Tensor, value: float) -> torch.Tensor:
        counted = row != -math.inf
        count = int(counted.sum())
        if count == 0 or bool(torch.isnan(row).any()) or bool((row == math.inf).any()):
            return row
        mean = row.masked_fill(~counted, 0.0).sum(dim=-1, keepdim=True) / count
        dev = (row - mean).masked_fill(~counted, 0.0)
        std = (dev * dev).sum(dim=-1, keepdim=True).div(count).sqrt()
        n = torch.tensor(value, dtype=torch.float32)
        threshold = row.max() - n * std
        return row.masked_fill(row < threshold, -math.inf)


class RefTypicalPLogitsProcessor(_RefTruncation):
    """HF's ``TypicalLogitsWarper(mass=typical_p)`` (``min_tokens_to_keep=1``), one row at a
    time: tokens sorted by ``|-log p - entropy|``; kept up to the first whose cumulative
    probability (in that order) reaches the mass, and always the first. 1: off."""

    FIELD = "typical_p"
    NEUTRAL = 1.0

    @staticmethod
    def mask_row(row: torch.Tensor, value: float) -> torch.Tensor:
        mass = torch.tensor(value, dtype=torch.float32)
        normalized = torch.log_softmax(row, dim=-1)
        p = torch.exp(normalized)
        ent = -(normalized * p).nansum(-1, keepdim=True)
        shifted = torch.abs((-normalized) - ent)
        sorted_scores, sorted_indices = torch.sort(shifted, descending=False)
        cumulative = row.gather(-1, sorted_indices).softmax(dim=-1).cumsum(dim=-1)
        last = min(int((cumulative < mass).sum()), row.shape[-1] - 1)
        remove_sorted = sorted_scores > sorted_scores[0, last]
        remove_sorted[0, 0] = False
        remove = torch.zeros_like(remove_sorted)
        remove[0, sorted_indices[0]] = remove_sorted[0]
        return row.masked_fill(remove, -math.inf)


class RefEpsilonCutoffLogitsProcessor(_RefTruncation):
    """HF's ``EpsilonLogitsWarper(epsilon_cutoff)`` (``min_tokens_to_keep=1``): a token whose
    probability is below epsilon becomes -inf unless its logit is the row's max. 0: off."""

    FIELD = "epsilon_cutoff"

    @staticmethod
    def mask_row(row: torch.Tensor, value: float) -> torch.Tensor:
        eps = torch.tensor(value, dtype=torch.float32)
        remove = (row.softmax(dim=-1) < eps) & (row < row.max())
        return row.masked_fill(remove, -math.inf)


class RefEtaCutoffLogitsProcessor(_RefTruncation):
    """HF's ``EtaLogitsWarper(eta_cutoff)`` (``min_tokens_to_keep=1``): with the row's entropy
    H (``torch.distributions.Categorical``'s), a token whose probability is below
    ``min(eta, sqrt(eta) * exp(-H))`` becomes -inf unless its logit is the row's max. A row
    whose entropy is NaN (it holds +inf or NaN, or is all -inf) is left alone, where HF's own
    warper raises. 0: off."""

    FIELD = "eta_cutoff"

    @staticmethod
    def mask_row(row: torch.Tensor, value: float) -> torch.Tensor:
        eps = torch.tensor(value, dtype=torch.float32)
        norm = row - row.logsumexp(dim=-1, keepdim=True)
        entropy = -(norm.clamp(min=torch.finfo(norm.dtype).min) * norm.softmax(dim=-1)).sum()
        if bool(torch.isnan(entropy)):
            return row
        eta = torch.min(eps, torch.sqrt(eps) * torch.exp(-entropy))
        remove = (row.softmax(dim=-1) < eta) & (row < row.max())
        return row.masked_fill(remove, -math.inf)


_MASK64 = (1 << 64) - 1


def ref_xtc_seed(seed: int) -> int:
    """The seed of a request's XTC generator (ours; llama.cpp seeds its own RNG per sampler):
    splitmix64's finalizer of ``(seed mod 2**64) xor 0x5854435F53454544`` ("XTC_SEED" in
    ASCII), in ``[0, 2**64)``."""
    z = (((int(seed) & _MASK64) ^ 0x5854435F53454544) + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class RefXTCLogitsProcessor(ReferenceProcessor):
    """XTC (llama.cpp's ``llama_sampler_xtc_apply``), one row at a time. State: slot →
    (probability, threshold) as float32, and the request's own generator when it has a seed
    (seeded with ``ref_xtc_seed(seed)`` on the logits' device); only where XTC is on
    (probability > 0, threshold <= 0.5). ``apply``: ``u`` for every row, drawn as
    ``builtin.xtc.draw_uniforms`` draws it (one batched draw from the global generator unless
    every row is seeded, then each seeded row's own, in row order); then each row with
    ``u < probability``: ``p = softmax(row)``; with at least two tokens at ``p >= threshold``,
    every one of them whose ``p`` is above the least such ``p`` becomes -inf."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = torch.device(device)
        self.state: dict[int, tuple[float, float, torch.Generator | None]] = {}

    def is_argmax_invariant(self) -> bool:
        return True

    def new_state(
        self, params: Any, _prompt: list[int] | None, _output: list[int]
    ) -> tuple[float, float, torch.Generator | None] | None:
        prob = float(np.float32(_param(params, "xtc_probability", 0.0)))
        thr = float(np.float32(_param(params, "xtc_threshold", 0.1)))
        if thr == 0.0:  # a positive threshold below float32's range: the smallest float32
            thr = float(np.finfo(np.float32).smallest_subnormal)
        if prob <= 0.0 or thr > 0.5:
            return None
        seed = getattr(params, "seed", None)
        gen = None
        if seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(ref_xtc_seed(seed))
        return prob, thr, gen

    def update_state(self, batch_update: Any) -> None:
        process_dict_updates(self.state, batch_update, self.new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.state:
            return logits
        rows = logits.shape[0]
        seeded = sorted((i, g) for i, (_, _, g) in self.state.items() if g is not None)
        u = torch.empty(rows, dtype=torch.float32, device=logits.device)
        if len(seeded) != rows:
            u.uniform_()
        for i, g in seeded:
            u[i].uniform_(generator=g)
        for i, (prob, thr, _) in self.state.items():
            if not float(u[i]) < prob:
                continue
            row = logits[i]
            p = row.softmax(dim=-1)
            qualifies = p >= thr
            if int(qualifies.sum()) < 2:
                continue
            least = p[qualifies].min()
            row.masked_fill_(qualifies & (p > least), -math.inf)
        return logits


class RefTopKTopPLogitsProcessor(ReferenceProcessor):
    """The kept top-k / top-p (ours): vLLM 0.25.1's top-k then top-p (``_top_k_top_p_rows``,
    the sampler's own below) over every row of the batch once some request sets either. State:
    slot → (k, p as float32), only where one is on (k >= 1, or p < 1 as float32); ``apply``
    gives every row its request's k (none at or above the vocabulary, or unset) and p (1
    unset), so once a row of the batch uses top-p a row at p = 1 loses its probability-0
    tokens, as in vLLM's batch (on CPU logits; on a device always, as the processor). Last of the
    argmax-invariant phase, where vLLM applies its own."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.state: dict[int, tuple[int, float]] = {}

    def is_argmax_invariant(self) -> bool:
        return True

    @staticmethod
    def new_state(
        params: Any, _prompt: list[int] | None, _output: list[int]
    ) -> tuple[int, float] | None:
        k = int(_param(params, "kept_top_k", 0))
        p = float(np.float32(_param(params, "kept_top_p", 1.0)))
        k = max(k, 0)
        return None if k == 0 and p == 1.0 else (k, p)

    def update_state(self, batch_update: Any) -> None:
        process_dict_updates(self.state, batch_update, self.new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.state:
            return logits
        rows, vocab = logits.shape
        ks: list[int | None] = [None] * rows
        ps = [1.0] * rows
        for i, (k, p) in self.state.items():
            if i < rows:
                ks[i] = k if 0 < k < vocab else None
                ps[i] = p
        if logits.device.type == "cpu" and all(p >= 1.0 for p in ps):
            # As vLLM's batch without top-p: no top-p pass, so p = 1 rows keep their
            # probability-0 tokens. On a device the processor passes top-p always (knowing
            # whether a row uses it would sync), and the pass below runs.
            for i, kept in enumerate(ks):
                if kept is not None:
                    _top_k_row(logits[i], kept)
            return logits
        return _top_k_top_p_rows(logits, ks, ps)


class RefPenaltiesLogitsProcessor(ReferenceProcessor):
    """Repetition, frequency and presence penalties, rebuilt from the full history on every
    ``apply`` as vLLM 0.25.1 does (``ops/penalties.py``, ``layers/utils.py:34-89``). Not
    argmax-invariant; runs after the other non-argmax-invariant processors.

    State: slot → (repetition, frequency, presence) as float32, the prompt ids and the live
    output list; neutral values (1, 0, 0) are no state (those rows would come out unchanged).
    Per row, from scratch:

    * prompt mask: the prompt ids (none for a prompt-embeds request);
    * output counts: a bincount of the output ids in ``[0, V)``; anything else, such as an async
      ``-1`` placeholder, is padding and not counted (``penalties.py:29``);
    * ``row = where(prompt_mask | counts > 0, where(row > 0, row / rep, row * rep), row)``
      on CUDA (vLLM's kernel divides); elsewhere ``row * (1 / rep)`` for positive logits, as
      vLLM's torch fallback multiplies by the reciprocal; then
      ``row -= freq * counts`` and ``row -= pres * (counts > 0)`` in float32.

    ``penalty_last_n = n > 0`` (ours, llama.cpp's): the sequence is the prompt then the output
    up to its first async placeholder; only its last ``n`` positions count, prompt positions
    for the prompt mask and output positions for the counts. ``0`` is no state; ``None`` and
    ``-1`` the whole history as above.
    """

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.penalties: dict[
            int, tuple[tuple[float, float, float], list[int] | None, list[int]]
        ] = {}
        # slot -> penalty_last_n > 0, for the slots of ``penalties`` that set one.
        self.windows: dict[int, int] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    @staticmethod
    def new_state(
        params: Any, prompt: list[int] | None, output: list[int]
    ) -> tuple[tuple[float, float, float], list[int] | None, list[int]] | None:
        if getattr(params, "penalty_last_n", None) == 0:
            return None
        values = (
            float(np.float32(_param(params, "repetition_penalty", NEUTRAL_REPETITION_PENALTY))),
            float(np.float32(_param(params, "frequency_penalty", 0.0))),
            float(np.float32(_param(params, "presence_penalty", 0.0))),
        )
        if values == (NEUTRAL_REPETITION_PENALTY, 0.0, 0.0):
            return None
        return (values, None if prompt is None else list(prompt), output)

    @classmethod
    def new_window(cls, params: Any, prompt: list[int] | None, output: list[int]) -> int | None:
        last_n = getattr(params, "penalty_last_n", None)
        if last_n in (None, -1) or cls.new_state(params, prompt, output) is None:
            return None
        return int(last_n)

    def update_state(self, batch_update: Any) -> None:
        check_outputs(batch_update, ((i, e[2]) for i, e in self.penalties.items()))
        process_dict_updates(self.penalties, batch_update, self.new_state)
        process_dict_updates(self.windows, batch_update, self.new_window)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        vocab = logits.shape[1]
        for index, ((rep, freq, pres), prompt, output) in self.penalties.items():
            row = logits[index]
            last_n = self.windows.get(index)
            if last_n is not None:
                # The window: the last n positions of prompt + output (up to a placeholder).
                out = list(output)
                if -1 in out:
                    out = out[: out.index(-1)]
                start = max(0, len(prompt or ()) + len(out) - last_n)
                output = out[max(0, start - len(prompt or ())) :]
                prompt = (prompt or [])[start:]
            prompt_mask = torch.zeros(vocab, dtype=torch.bool, device=row.device)
            prompt_mask[[t for t in prompt or () if 0 <= t < vocab]] = True
            # numpy integer scalars are ints (vLLM makes a tensor of the list); bools are not.
            real = [
                int(t)
                for t in output
                if isinstance(t, (int, np.integer)) and not isinstance(t, bool) and 0 <= t < vocab
            ]
            counts = torch.bincount(torch.tensor(real, dtype=torch.int64), minlength=vocab)
            counts = counts.to(device=row.device, dtype=torch.float32)
            in_output = counts > 0
            rep_t, freq_t, pres_t = (
                torch.tensor(v, dtype=torch.float32, device=row.device) for v in (rep, freq, pres)
            )
            # vLLM divides on CUDA (its kernel) and multiplies by the reciprocal elsewhere (its
            # torch fallback): up to 1 ulp apart.
            up = row / rep_t if row.device.type == "cuda" else row * (1.0 / rep_t)
            new = torch.where(prompt_mask | in_output, torch.where(row > 0, up, row * rep_t), row)
            new -= freq_t * counts
            new -= pres_t * in_output
            row.copy_(new)
        return logits


#: vLLM 0.25.1's sampler order (semantics note §5.1 and §13.1: ``Sampler.forward`` and
#: ``apply_logits_processors``) as the reference builds it: ``(stage, reference class)``, in the
#: order of construction. Stages: ``sampler_before``, hard-coded in vLLM's sampler before the
#: logits processors (allowed ids, then bad words); ``builtin``, vLLM's
#: ``BUILTIN_LOGITS_PROCESSORS`` (MinTokens, LogitBias, MinP; ``__init__.py:49-53``);
#: ``opt_in``, ours, built only when asked for, where vLLM builds custom processors (after the
#: built-ins): no-repeat-ngram and DRY, then the truncations top-n-sigma, typical-p, epsilon,
#: eta, then XTC (it reads the probabilities they leave), then the kept top-k / top-p (where
#: vLLM's sampler applies its own, after every processor); ``sampler_after``, hard-coded after
#: the custom processors (penalties: repetition, frequency, presence); ``reasoning``, the
#: thinking budget, last, only with a reasoning config. The sampler runs the
#: non-argmax-invariant ones in this order before temperature, the argmax-invariant ones (MinP,
#: the truncations, XTC, the kept top-k / top-p) in this order after it.
REFERENCE_ORDER: tuple[tuple[str, str], ...] = (
    ("sampler_before", "RefAllowedTokenIdsLogitsProcessor"),
    ("sampler_before", "RefBadWordsLogitsProcessor"),
    ("builtin", "RefMinTokensLogitsProcessor"),
    ("builtin", "RefLogitBiasLogitsProcessor"),
    ("builtin", "RefMinPLogitsProcessor"),
    ("opt_in", "RefNoRepeatNGramLogitsProcessor"),
    ("opt_in", "RefDryLogitsProcessor"),
    ("opt_in", "RefTopNSigmaLogitsProcessor"),
    ("opt_in", "RefTypicalPLogitsProcessor"),
    ("opt_in", "RefEpsilonCutoffLogitsProcessor"),
    ("opt_in", "RefEtaCutoffLogitsProcessor"),
    ("opt_in", "RefXTCLogitsProcessor"),
    ("opt_in", "RefTopKTopPLogitsProcessor"),
    ("sampler_after", "RefPenaltiesLogitsProcessor"),
    ("reasoning", "RefThinkingBudgetLogitsProcessor"),
)

#: What vLLM 0.25.1 builds of its built-ins under speculative decoding: MinTokens only
#: (semantics note §5.4, §13.2).
SPEC_DECODE_BUILTINS: tuple[str, ...] = ("RefMinTokensLogitsProcessor",)


def reference_class(name: str) -> type[ReferenceProcessor]:
    """A reference processor class by its name (one of ``REFERENCE_ORDER``'s)."""
    module = "reference_thinking" if name == "RefThinkingBudgetLogitsProcessor" else "reference"
    cls: type[ReferenceProcessor] = getattr(
        importlib.import_module(f"{__package__}.{module}"), name
    )
    return cls


def reference_stage(stage: str) -> list[str]:
    """The reference processors of ``stage``, in ``REFERENCE_ORDER``."""
    return [name for s, name in REFERENCE_ORDER if s == stage]


def reference_of(view: Any) -> type[ReferenceProcessor]:
    """The plain reference of a built-in processor class (its ``REFERENCE``, ``module:Class``,
    read as an attribute)."""
    module, _, name = view.REFERENCE.partition(":")
    ref: type[ReferenceProcessor] = getattr(importlib.import_module(module), name)
    return ref


def build_reference_logitsprocs(
    config: Any,
    device: torch.device | str,
    sampler_transforms: bool = True,
    opt_in: Iterable[str] = (),
) -> RefLogitsProcessors:
    """The reference processors in ``REFERENCE_ORDER``: allowed ids, bad words, MinTokens,
    LogitBias, MinP, the opt-in processors named in ``opt_in`` (reference class names, e.g.
    ``"RefXTCLogitsProcessor"``), penalties (with ``sampler_transforms=False`` and no opt-ins
    exactly vLLM's trio, ``__init__.py:49-53, 184-217``), and the thinking budget with a
    reasoning config. With speculative decoding in vLLM's mode (``draft_rows="vllm"``) only
    MinTokens (plus the sampler transforms), as vLLM, which refuses custom processors there.
    The order of ``logitsproc_rs.build_logitsprocs`` given the opt-ins' views as custom
    processors in their order (``tests/test_reference.py`` checks it)."""
    device = torch.device(device)
    wanted = set(opt_in)
    unknown = wanted - set(reference_stage("opt_in"))
    if unknown:
        raise ValueError(f"not opt-in reference processors: {sorted(unknown)}")
    before = reference_stage("sampler_before") if sampler_transforms else []
    after = reference_stage("sampler_after") if sampler_transforms else []
    middle = reference_stage("builtin")
    custom = [name for name in reference_stage("opt_in") if name in wanted]
    if _vllm_drafts(config):
        if custom:
            raise ValueError("vLLM 0.25.1 refuses custom processors with speculative decoding")
        middle = [name for name in middle if name in SPEC_DECODE_BUILTINS]
    if sampler_transforms and getattr(config, "reasoning_config", None) is not None:
        after += reference_stage("reasoning")
    names = [*before, *middle, *custom, *after]
    return RefLogitsProcessors(reference_class(n)(config, device, False) for n in names)


def ref_apply_token_bitmask(
    logits: torch.Tensor,
    bitmask: Any,
    indices: Any = None,
) -> torch.Tensor:
    """xgrammar's bitmask, one row and one bit at a time, in place: bitmask row ``k`` applies
    to logits row ``indices[k]`` (or ``k`` without indices); bit ``j`` (LSB first) of word
    ``w`` is token ``32 * w + j``; a clear bit sets that logit to ``-inf``. Only tokens below
    ``min(V, 32 * words)`` are touched."""
    words = np.asarray(bitmask.cpu() if isinstance(bitmask, torch.Tensor) else bitmask)
    if indices is None:
        rows = list(range(words.shape[0]))
    elif isinstance(indices, torch.Tensor):
        rows = [int(i) for i in indices.cpu()]
    else:
        rows = [int(i) for i in np.asarray(indices).reshape(-1)]
    vocab = logits.shape[1]
    width = min(vocab, 32 * words.shape[1])
    for k, row in enumerate(rows):
        # Unpack the row's words LSB first: bits[32 * w + j] = (word_w >> j) & 1.
        bits = [(int(word) >> j) & 1 for word in words[k] for j in range(32)]
        blocked = [token for token in range(width) if bits[token] == 0]
        logits[row, blocked] = -math.inf
    return logits


def ref_gather_logprobs(
    logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
) -> RefLogprobsTensors:
    """vLLM's ``gather_logprobs`` (``ops/logprobs.py:11-27``), row by row: per row the sampled
    token's value and the ``num_logprobs`` largest values with their ids; the rank is the number
    of values ``>=`` the sampled token's (so 1 for the top token, ties counted)."""
    ids, vals, ranks = [], [], []
    for i in range(logprobs.shape[0]):
        row = logprobs[i]
        tok = int(token_ids[i])
        top = torch.topk(row, num_logprobs)
        ids.append([tok, *(int(t) for t in top.indices)])
        vals.append(torch.cat((row[tok : tok + 1], top.values)))
        ranks.append(int((row >= row[tok]).sum()))
    device = logprobs.device
    return RefLogprobsTensors(
        torch.tensor(ids, dtype=torch.int32, device=device).reshape(-1, num_logprobs + 1),
        torch.stack(vals) if vals else logprobs.new_empty((0, num_logprobs + 1)),
        torch.tensor(ranks, dtype=torch.int64, device=device),
    )


def _top_k_row(row: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k alone: keep the values >= the row's k-th largest (ties at the k-th value are
    kept); ``topk_topp_sampler.py`` (``apply_top_k_only``)."""
    kth = torch.sort(row, descending=True).values[k - 1]
    return row.masked_fill_(row < kth, -math.inf)


def _top_k_top_p_rows(
    logits: torch.Tensor, ks: Sequence[int | None], ps: Sequence[float]
) -> torch.Tensor:
    """Top-k then top-p, row by row, as ``apply_top_k_top_p_pytorch``
    (``topk_topp_sampler.py``): sort ascending; mask sorted values below the k-th largest;
    softmax the sorted row, mask the low tail whose cumulative probability is <= 1 - p, always
    keep the top token; scatter back. Equal logits at the top-p boundary are dropped in
    ``torch.sort``'s order, as in vLLM.

    The one batched step is the cumulative sum: on CUDA its rounding depends on the tensor's
    shape (one row goes through CUB's device scan, several rows through a block scan whose
    width depends on the row count), so the rows are scanned together in vLLM's ``[B, V]``
    shape. Each row's scan is still independent of the others' values."""
    num_rows = logits.shape[0]
    sorted_rows, orders, probs = [], [], []
    for i in range(num_rows):
        values, order = torch.sort(logits[i], descending=False)
        k = ks[i]
        if k is not None:
            kth = values[values.shape[0] - k]
            values = values.masked_fill(values < kth, -math.inf)
        sorted_rows.append(values)
        orders.append(order)
        probs.append(torch.softmax(values, dim=-1))
    if not num_rows:
        return logits
    cumulative = torch.stack(probs).cumsum(dim=-1)
    for i in range(num_rows):
        drop = cumulative[i] <= 1 - torch.tensor(ps[i], dtype=torch.float32)
        drop[-1] = False
        logits[i][orders[i]] = sorted_rows[i].masked_fill(drop, -math.inf)
    return logits


def _log_softmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``log_softmax`` in float32, one row at a time (vLLM ``compute_logprobs``, 304-306)."""
    rows = [logits[i].log_softmax(dim=-1, dtype=torch.float32) for i in range(logits.shape[0])]
    return torch.stack(rows) if rows else logits.to(torch.float32, copy=True)


def _check_metadata(md: Any, logits: torch.Tensor) -> None:
    """Metadata the sampler cannot use, refused with the fast path's messages (a
    ``ValueError`` naming the field): a per-row tensor that is not one entry per logits row
    (it would broadcast) or on another device, ``all_greedy`` and ``all_random`` both set, no
    temperature unless all greedy, a generator outside the rows."""
    rows = logits.shape[0]
    for name in ("temperature", "top_p", "top_k"):
        t = getattr(md, name)
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] != rows:
            shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(
                f"SamplingMetadata.{name}: expected one entry per logits row ([{rows}]), "
                f"got {shape}"
            )
        if t.device != logits.device:
            raise ValueError(
                f"SamplingMetadata.{name}: on {t.device}, the logits on {logits.device}"
            )
    if md.all_greedy and md.all_random and rows:
        raise ValueError("SamplingMetadata: all_greedy and all_random are both set")
    if not md.all_greedy and md.temperature is None:
        raise ValueError("SamplingMetadata.temperature: needed unless all_greedy")
    bad = [i for i in md.generators if not (0 <= i < rows)]
    if bad:
        raise ValueError(
            f"SamplingMetadata.generators: rows {bad[:8]} outside the {rows} logits rows"
        )


class ReferenceSampler:
    """vLLM 0.25.1's order around the sampler (``vllm/v1/sample/sampler.py:72-302`` and the
    runner's grammar bitmask, section 13 of the semantics note), one row at a time:
    grammar bitmask (in place, model dtype) → raw logprobs (``raw_*`` modes) → fp32 cast →
    non-argmax-invariant processors in container order → (all greedy: argmax, stop) → greedy
    snapshot → temperature (greedy rows ÷ 1) → argmax-invariant processors → top-k → top-p →
    exponential-race sampling → greedy/random merge → logprobs (``processed_*`` modes: of the
    logits the tokens were sampled from).

    The exponential noise ``q`` is drawn exactly as ``logitsproc_rs.sampler.random_sample``
    draws it, so with identically seeded generators both samplers pick the same tokens.

    ``logitsprocs``: any container with ``argmax_invariant`` and ``non_argmax_invariant``
    lists (``RefLogitsProcessors``); ``metadata``: any object with ``RefSamplingMetadata``'s
    attributes (the engine's ``SamplingMetadata`` too)."""

    def __init__(self, logitsprocs: _Phases, logprobs_mode: str = "raw_logprobs") -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}"
            )
        self.logitsprocs = logitsprocs
        self.logprobs_mode = logprobs_mode

    def __call__(
        self,
        logits: torch.Tensor,
        metadata: Any,
        grammar_bitmask: Any = None,
        bitmask_indices: Any = None,
    ) -> RefSamplerOutput:
        md = metadata
        _check_metadata(md, logits)
        mode = self.logprobs_mode
        if grammar_bitmask is not None:  # the runner, before the sampler (section 8.2)
            ref_apply_token_bitmask(logits, grammar_bitmask, bitmask_indices)
        num_logprobs = md.max_num_logprobs
        raw: torch.Tensor | None = None
        if num_logprobs is not None and mode == "raw_logprobs":  # 84-93, 304-306
            raw = _log_softmax_rows(logits)
        elif num_logprobs is not None and mode == "raw_logits":
            raw = logits.to(torch.float32, copy=True)
        logits = logits.to(torch.float32)  # sampler.py:96
        for p in self.logitsprocs.non_argmax_invariant:  # 404-405 (+ hard-coded transforms)
            logits = p.apply(logits)
        out = self._sample(logits, md)
        if num_logprobs is not None:
            if raw is None:
                raw = out.logits
                if mode == "processed_logprobs":
                    raw = _log_softmax_rows(raw)
            out.logprobs_tensors = ref_gather_logprobs(raw, num_logprobs, out.sampled_token_ids)
        return out

    def _sample(self, logits: torch.Tensor, md: Any) -> RefSamplerOutput:
        num_rows = logits.shape[0]

        # Greedy snapshot before temperature and the argmax-invariant processors (239-241).
        greedy: list[int] | None = None
        if not md.all_random:
            greedy = [int(logits[i].argmax()) for i in range(num_rows)]
            if md.all_greedy:
                return RefSamplerOutput(
                    torch.tensor(greedy, dtype=torch.int64, device=logits.device), logits
                )
        assert md.temperature is not None
        temps = [float(t) for t in md.temperature]

        # Temperature; greedy rows are divided by 1 (227-237). By a float32 tensor on the
        # logits' device, as vLLM divides: on CUDA torch turns division by a Python scalar into
        # multiplication by its reciprocal, which differs in the last bit.
        for i in range(num_rows):
            t = temps[i]
            if not md.all_random and t < _SAMPLING_EPS:
                t = 1.0
            logits[i] = logits[i] / torch.tensor(t, dtype=torch.float32, device=logits.device)

        for p in self.logitsprocs.argmax_invariant:  # 282-283
            logits = p.apply(logits)

        # Top-k, then top-p. vLLM applies top-p to every row once any row uses it, so rows with
        # p = 1 still lose tokens whose probability underflows to 0; the same here.
        vocab = logits.shape[1]
        ks: list[int | None] = []
        for i in range(num_rows):
            k = int(md.top_k[i]) if md.top_k is not None else None
            ks.append(None if k is not None and k >= vocab else k)
        if md.top_p is not None:
            _top_k_top_p_rows(logits, ks, [float(p) for p in md.top_p])
        else:
            for i, k in enumerate(ks):
                if k is not None:
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
        return RefSamplerOutput(
            torch.tensor(sampled, dtype=torch.int64, device=logits.device), logits
        )

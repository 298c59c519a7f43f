"""vLLM's per-request sampling semantics inside HF transformers' ``model.generate()``.

``HFLogitsProcessor(params)`` is a transformers ``LogitsProcessor`` (``(input_ids, scores) ->
scores``) that gives row ``i`` of the batch what vLLM 0.25.1 gives a request with
``params[i]``: allowed ids, bad words, min-tokens (stop ids and EOS), logit bias, penalties and
the thinking budget, then temperature, MinP, top-k and top-p. It is a bridge over one
``build_logitsprocs`` pipeline (token feed), not a second implementation:

- **First call of a generation**: every row is added in one ``BatchUpdate``; row ``i``'s prompt
  is ``input_ids[i]``, less the positions where ``attention_mask`` (given to the constructor
  or to ``reset``) is 0, so left padding is not counted as prompt.
- **Later calls**: the token ``generate`` appended (``input_ids[:, -1]``) is fed to the
  pipeline as that row's newest output token; rows that ``generate`` has finished get its pad
  token, which does not matter for them.
- **A new generation** starts fresh when the call does not continue the last one: another row
  count or length than one more token, another prompt, or after ``reset()``. Feeding a
  generation's output straight back into ``generate`` looks like a continuation (same rows,
  one token longer, same prefix) and is taken as one: call ``reset()`` first to treat it as a
  new prompt. ``generate()`` below always resets.
- **Output**: the logits vLLM samples from (after temperature, MinP, top-k, top-p). With any
  random row (temperature > 0) in the batch, greedy rows keep only their argmax token, so
  ``generate(do_sample=True)`` samples random rows from vLLM's distribution and gives greedy
  rows vLLM's greedy token; an all-greedy batch gets vLLM's processed logits unchanged (use
  ``do_sample=False``). Per-request ``seed`` is not honoured (HF draws from torch's global
  generator), nor are ``max_tokens``, ``n`` and ``logprobs``: those are ``generate``'s own.

HF adds processors of its own from the generation config (a model's ``generation_config.json``
may set ``repetition_penalty``, ``top_k`` — 50 when unset! — ``temperature``...); they run
before ours (the penalty kind) or after ours (the sampling warpers), so they would stack on top.
``neutral_generate_kwargs()`` turns all of them off; ``generate()`` passes it.

Beam search (``num_beams > 1``) reorders rows between steps and is rejected: the row count then
differs from ``len(params)``, a ``ValueError`` says so (as does a step whose rows' earlier
tokens changed, had params been given per beam). ``num_return_sequences > 1`` works when
``params`` has one entry per returned sequence (rows are ``repeat_interleave``-d).

``transformers`` is imported on the first construction, not at import time; when it is
installed, instances are ``transformers.LogitsProcessor`` s (a subclass made then).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .builtin import asked_for
from .errors import ConfigError, InputError, RequestError, with_context
from .interface import AddedRequest, BatchUpdate
from .loader import build_logitsprocs, validate_sampling_params
from .params import _SAMPLING_EPS, EngineConfig, SamplingParams, as_engine_config
from .sampler import Sampler, SamplingMetadata
from .state import LogitsProcessors


def neutral_generate_kwargs(do_sample: bool = False) -> dict[str, Any]:
    """``generate`` settings that turn off every HF processor and warper a generation config
    could add, so that only ours apply. The sampling warpers' settings are included only with
    ``do_sample`` (HF warns about them otherwise); note ``top_k=0``: HF's default is 50."""
    args: dict[str, Any] = {
        "do_sample": do_sample,
        "num_beams": 1,
        "repetition_penalty": 1.0,
        "encoder_repetition_penalty": 1.0,
        "no_repeat_ngram_size": 0,
        "encoder_no_repeat_ngram_size": 0,
        "bad_words_ids": None,
        "sequence_bias": None,
        "min_length": 0,
        "min_new_tokens": None,
        "forced_bos_token_id": None,
        "forced_eos_token_id": None,
        "suppress_tokens": None,
        "begin_suppress_tokens": None,
        "exponential_decay_length_penalty": None,
        "guidance_scale": None,
        "watermarking_config": None,
    }
    if do_sample:
        args.update(
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            min_p=None,
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
        )
    return args


@functools.cache
def _transformers_subclass() -> type | None:
    """``HFLogitsProcessor`` with ``transformers.LogitsProcessor`` as a second base, made once
    on first use (None without transformers)."""
    try:
        from transformers import LogitsProcessor as HFBase
    except ImportError:
        return None
    return type(
        "HFLogitsProcessor",
        (HFLogitsProcessor, HFBase),
        {"__module__": __name__, "__qualname__": "HFLogitsProcessor"},
    )


def _row_params(i: int, p: Any) -> Any:
    if isinstance(p, Mapping):
        try:
            return SamplingParams(**p)
        except (TypeError, ValueError) as e:
            raise with_context(e, f"row {i}: ") from e
    if p is None:
        return SamplingParams(temperature=0.0)
    if not hasattr(p, "sampling_type"):
        raise InputError(
            f"row {i}: expected SamplingParams (or a dict of its fields), got {type(p).__name__}"
        )
    return p


def _engine_config(config: Any) -> EngineConfig:
    """The ``engine_config`` argument as an ``EngineConfig``: ``None`` is the default one, a
    mapping of its fields is taken as one (``as_engine_config``); anything else is a
    ``ConfigError`` (the processor rebuilds it per generation, with the batch's sizes)."""
    if config is None:
        return EngineConfig()
    config = as_engine_config(config)
    if not isinstance(config, EngineConfig):
        raise ConfigError(
            "HFLogitsProcessor: engine_config must be an EngineConfig or a mapping of its "
            f"fields, got {type(config).__name__}",
            field="engine_config",
        )
    return config


def _by_row(e: ValueError) -> ValueError:
    """A core error about a request, named by its row (the core names it by its batch index,
    which is the row here)."""
    if isinstance(e, RequestError) and e.index is not None and e.detail is not None:
        assert e.field is not None
        return RequestError.located(
            e.index, e.field, e.detail, where=f"row {e.index}", column=e.column
        )
    return e


def _refuse_call(field: str, detail: str) -> RequestError:
    return RequestError(f"HFLogitsProcessor: {field} {detail}", field=field, detail=detail)


def _check_call(input_ids: Any, scores: Any) -> None:
    """``generate``'s arguments: ``input_ids`` a 2-d integer tensor (a float id is no token:
    it was truncated) with data (not on the meta device), ``scores`` a 2-d floating-point
    tensor of as many rows; else a ``RequestError`` naming the argument."""
    if (
        not isinstance(input_ids, torch.Tensor)
        or input_ids.dim() != 2
        or input_ids.dtype.is_floating_point
        or input_ids.dtype.is_complex
        or input_ids.dtype == torch.bool
    ):
        what = (
            f"a {input_ids.dim()}-d {input_ids.dtype} tensor"
            if isinstance(input_ids, torch.Tensor)
            else type(input_ids).__name__
        )
        raise _refuse_call("input_ids", f"must be a 2-d integer tensor [rows, length], got {what}")
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2 or not scores.is_floating_point():
        what = (
            f"a {scores.dim()}-d {scores.dtype} tensor"
            if isinstance(scores, torch.Tensor)
            else type(scores).__name__
        )
        raise _refuse_call(
            "scores", f"must be a 2-d floating-point tensor [rows, vocab], got {what}"
        )
    for field, t in (("input_ids", input_ids), ("scores", scores)):
        if t.device.type == "meta":
            raise _refuse_call(field, "is on the meta device: a tensor without data")


class HFLogitsProcessor:
    """vLLM's semantics for ``generate()``, one ``SamplingParams`` per batch row.

    ``params``: one entry per row of ``input_ids`` (``SamplingParams``, vLLM's own, a dict of
    fields, or ``None`` for plain greedy). ``attention_mask``: the mask given to ``generate``,
    so that left padding is not taken as prompt. ``engine_config``: an ``EngineConfig`` (or a
    mapping of its fields, taken as one) for the reasoning markers
    (``reasoning_start_token_ids`` / ``reasoning_end_token_ids``, needed by
    ``thinking_token_budget``) and the per-request caps; its ``max_num_seqs`` and
    ``vocab_size`` are ignored (the batch and the logits give them).
    """

    supports_continuous_batching = False  # transformers' flag: one generate() batch at a time

    def __new__(cls, *args: Any, **kwargs: Any) -> HFLogitsProcessor:
        if cls is HFLogitsProcessor:
            cls = _transformers_subclass() or cls
        return super().__new__(cls)

    def __init__(
        self,
        params: Sequence[Any],
        *,
        attention_mask: torch.Tensor | None = None,
        engine_config: EngineConfig | Mapping[str, Any] | None = None,
    ) -> None:
        self.params = [_row_params(i, p) for i, p in enumerate(params)]
        if not self.params:
            raise InputError("params must have one entry per batch row, got none")
        self.engine_config = _engine_config(engine_config)
        for i, p in enumerate(self.params):
            try:
                validate_sampling_params(self.engine_config, p)
            except ValueError as e:
                raise with_context(e, f"row {i}: ") from e
        self.reset(attention_mask)

    def reset(self, attention_mask: torch.Tensor | None = None) -> None:
        """The next call starts a new generation (with this mask for its prompt)."""
        self.attention_mask = attention_mask
        self.procs: LogitsProcessors | None = None
        self._key: tuple[Any, ...] | None = None  # (vocab, device) the pipeline was built for
        self._len = -1  # sequence length at the last call
        self._prompt: torch.Tensor | None = None
        self._last: torch.Tensor | None = None  # input_ids[:, -1] at the last call, host

    def generate(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        """``model.generate`` with this processor, a fresh start, HF's own processors turned off
        and ``do_sample`` set when some row samples; ``kwargs`` override."""
        from transformers import LogitsProcessorList

        self.reset(attention_mask)
        sample = kwargs.get("do_sample", any(p.temperature >= _SAMPLING_EPS for p in self.params))
        args = neutral_generate_kwargs(sample)
        if attention_mask is not None:
            args["attention_mask"] = attention_mask
        args.update(kwargs)
        extra = list(args.pop("logits_processor", None) or [])
        return model.generate(
            input_ids, logits_processor=LogitsProcessorList([*extra, self]), **args
        )

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """One step of ``generate``. Everything is checked before anything changes: a refused
        call leaves the generation as it was, so the corrected call continues it."""
        _check_call(input_ids, scores)
        rows, length = input_ids.shape
        if rows != len(self.params) or scores.shape[0] != rows:
            raise InputError(
                f"HFLogitsProcessor: {rows} rows of input_ids and {scores.shape[0]} of scores "
                f"for {len(self.params)} SamplingParams; give one per row. Beam search "
                "(num_beams > 1) is not supported; with num_return_sequences > 1 repeat each "
                "prompt's params that many times"
            )
        if self._continues(input_ids, scores):
            last = input_ids[:, -1].to("cpu", torch.int64)
            assert self.procs is not None
            negative = torch.nonzero(last < 0).flatten().tolist()
            if negative:
                # The feed would take -1 as a placeholder for a token to come: none comes.
                row = negative[0]
                raise RequestError.located(
                    row,
                    "sampled_token_ids",
                    f"token id {int(last[row])} is negative",
                    where=f"HFLogitsProcessor: bad token: row {row}",
                )
            try:
                self.procs.update_state(None, sampled_token_ids=last)
            except ValueError as e:
                # The pipeline refused the step whole: the generation stays where it was.
                raise with_context(_by_row(e), "HFLogitsProcessor: bad token: ") from e
            self._last = last
        else:
            self._start(input_ids, scores)
        self._len = length
        return self._process(scores.to(torch.float32, copy=True))

    def _continues(self, input_ids: torch.Tensor, scores: torch.Tensor) -> bool:
        """Whether this call is the next step of the generation the pipeline holds."""
        if (
            self.procs is None
            or input_ids.shape[1] != self._len + 1
            or self._key != (scores.shape[1], scores.device)
        ):
            return False
        assert self._prompt is not None and self._last is not None
        if not torch.equal(input_ids[:, : self._prompt.shape[1]], self._prompt):
            return False
        if not torch.equal(input_ids[:, -2].to("cpu", torch.int64), self._last):
            raise InputError(
                "HFLogitsProcessor: the rows' earlier tokens changed between steps (rows "
                "reordered, as beam search does?); call reset() before a new generation"
            )
        return True

    def _start(self, input_ids: torch.Tensor, scores: torch.Tensor) -> None:
        rows, vocab = scores.shape
        mask = self.attention_mask
        if mask is not None and tuple(mask.shape) != tuple(input_ids.shape):
            raise InputError(
                f"HFLogitsProcessor: attention_mask of shape {list(mask.shape)} does not match "
                f"the prompt's input_ids {list(input_ids.shape)}; pass this generation's mask "
                "to reset() (or to generate())"
            )
        # A fresh pipeline per generation (a few ms): nothing of the last one can leak in.
        cfg = dataclasses.replace(
            self.engine_config, max_num_seqs=rows, vocab_size=vocab, num_speculative_tokens=None
        )
        dev = scores.device
        self.procs = build_logitsprocs(
            cfg,
            dev,
            dev.type == "cuda",
            custom_logitsprocs=asked_for(self.params),  # ours beyond vLLM's, where set
            token_feed=True,
        )
        self._sampler = Sampler(self.procs)
        self._md = SamplingMetadata.from_params(self.params, vocab, dev)
        temp = self._md.temperature
        self._greedy = None if temp is None else (temp < _SAMPLING_EPS).unsqueeze(1)
        self._key = (vocab, dev)
        added: list[AddedRequest] = []
        ids = input_ids.tolist()
        keep = mask.tolist() if mask is not None else None
        for i, p in enumerate(self.params):
            prompt = (
                ids[i] if keep is None else [t for t, m in zip(ids[i], keep[i], strict=True) if m]
            )
            added.append((i, p, prompt, []))
        try:
            self.procs.update_state(BatchUpdate(rows, [], added, []))
        except ValueError as e:
            self.procs = None  # nothing half-built survives a rejected batch
            raise with_context(_by_row(e), "HFLogitsProcessor: bad SamplingParams: ") from e
        self._prompt = input_ids.clone()
        self._last = input_ids[:, -1].to("cpu", torch.int64)

    def _process(self, logits: torch.Tensor) -> torch.Tensor:
        """The sampler's transforms up to the distribution it samples from (sampler.py)."""
        md = self._md
        logits = self._sampler.apply_logits_processors(logits)
        if md.all_greedy:
            return logits
        greedy = None if md.all_random else logits.argmax(dim=-1, keepdim=True)
        logits = self._sampler.random_logits(logits, md)
        if greedy is not None:
            assert self._greedy is not None  # set wherever temperature is (not all greedy)
            # Greedy rows in a sampled batch: only their argmax can be drawn.
            others = torch.ones_like(logits, dtype=torch.bool).scatter_(1, greedy, False)
            logits = logits.masked_fill_(others & self._greedy, float("-inf"))
        return logits

"""The built-in processors, one module each, listed once here in vLLM 0.25.1's sampler order.

Each says where vLLM applies it (``STAGE``); every other list is derived from ``BUILTINS``:
``BUILTIN_LOGITS_PROCESSORS`` is vLLM's list (MinTokens → LogitBias → MinP); the transforms
vLLM hard-codes in its sampler are processors here too: ``SAMPLER_TRANSFORMS_BEFORE`` run before
the built-ins (allowed ids, bad words) and ``SAMPLER_TRANSFORMS_AFTER`` after the custom ones
(penalties); ``REASONING_TRANSFORMS`` follow them when a reasoning config exists (the thinking
budget). ``OPT_IN`` processors are ours, not vLLM's: built when asked for (passed as a processor,
or through the vLLM bridges); the sampler runs each in its phase (no-repeat-ngram and DRY with
the argmax-changing ones, the truncations top-n-sigma → typical-p → epsilon → eta, then XTC, then
the kept top-k / top-p, after MinP with the argmax-invariant ones), in this list's order within it.
"""

from collections.abc import Iterable
from typing import Any

from ..registry import TABLES
from ..views import PipelineView, Stage
from ._combined import combined
from .allowed_token_ids import AllowedTokenIdsLogitsProcessor
from .bad_words import BadWordsLogitsProcessor
from .dry import DryLogitsProcessor
from .epsilon_cutoff import EpsilonCutoffLogitsProcessor
from .eta_cutoff import EtaCutoffLogitsProcessor
from .logit_bias import LogitBiasLogitsProcessor
from .min_p import MinPLogitsProcessor
from .min_tokens import MinTokensLogitsProcessor
from .no_repeat_ngram import NoRepeatNGramLogitsProcessor
from .penalties import PenaltiesLogitsProcessor
from .thinking import ThinkingBudgetLogitsProcessor
from .top_k_top_p import TopKTopPLogitsProcessor
from .top_n_sigma import TopNSigmaLogitsProcessor
from .typical_p import TypicalPLogitsProcessor
from .xtc import XTCLogitsProcessor

BUILTINS: tuple[type[PipelineView], ...] = (
    AllowedTokenIdsLogitsProcessor,
    BadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    DryLogitsProcessor,
    MinTokensLogitsProcessor,
    LogitBiasLogitsProcessor,
    MinPLogitsProcessor,
    # Opt-in truncations, run after MinP in the argmax-invariant phase, in this order.
    TopNSigmaLogitsProcessor,
    TypicalPLogitsProcessor,
    EpsilonCutoffLogitsProcessor,
    EtaCutoffLogitsProcessor,
    # XTC after them (it reads the probabilities they leave; docs/semantics.md).
    XTCLogitsProcessor,
    # The kept top-k / top-p last of them: where vLLM's sampler applies its own (min-p →
    # top-k → top-p).
    TopKTopPLogitsProcessor,
    PenaltiesLogitsProcessor,
    ThinkingBudgetLogitsProcessor,
)


def in_stage(stage: Stage) -> list[type[PipelineView]]:
    """The built-ins vLLM applies at ``stage``, in order."""
    return [c for c in BUILTINS if c.STAGE is stage]


BUILTIN_LOGITS_PROCESSORS = in_stage(Stage.BUILTIN)
SAMPLER_TRANSFORMS_BEFORE = in_stage(Stage.SAMPLER_BEFORE)
SAMPLER_TRANSFORMS_AFTER = in_stage(Stage.SAMPLER_AFTER)
REASONING_TRANSFORMS = in_stage(Stage.REASONING)
OPT_IN_PROCESSORS = in_stage(Stage.OPT_IN)


def asked_for(params: Iterable[Any]) -> list[type[PipelineView]]:
    """The opt-in processors some of ``params`` switch on (set a field of that is not only a
    tuning one, e.g. ``no_repeat_ngram_size``), for a front-end that knows its requests up
    front (HF ``generate()``)."""
    rows = list(params)
    return [
        c
        for c in OPT_IN_PROCESSORS
        if any(
            f.is_set(getattr(p, f.attr, None))
            for p in rows
            for t in c.TABLES
            for f in TABLES[t].fields
            if not f.tunes
        )
    ]


# Every built-in as two processors, one per phase: what an engine that calls each processor
# every step loads to pay two calls a step instead of one per built-in (the vLLM bridges'
# recommended form). Their parts run in the order build_logitsprocs gives them with every
# opt-in one passed as a custom processor; the thinking budget is left out of an engine without
# a reasoning config (as build_logitsprocs leaves it out).
_LOOP_ORDER = [
    *SAMPLER_TRANSFORMS_BEFORE,
    *BUILTIN_LOGITS_PROCESSORS,
    *OPT_IN_PROCESSORS,
    *SAMPLER_TRANSFORMS_AFTER,
    *REASONING_TRANSFORMS,
]
EveryFieldLogitsProcessor = combined(
    "EveryFieldLogitsProcessor",
    [c for c in _LOOP_ORDER if not c.ARGMAX_INVARIANT],
    "Every argmax-changing built-in as one processor: allowed ids, bad words, min-tokens, "
    "logit bias, no-repeat-ngram, DRY, penalties, the thinking budget (in that order; the "
    "thinking budget only in an engine with a reasoning config).",
)
EveryFieldSamplingLogitsProcessor = combined(
    "EveryFieldSamplingLogitsProcessor",
    [c for c in _LOOP_ORDER if c.ARGMAX_INVARIANT],
    "Every argmax-invariant built-in as one processor: min-p, top-n-sigma, typical-p, "
    "epsilon, eta, XTC, the kept top-k / top-p (in that order).",
)
COMBINED: tuple[type[PipelineView], ...] = (
    EveryFieldLogitsProcessor,
    EveryFieldSamplingLogitsProcessor,
)

# What vLLM builds of its built-ins under speculative decoding.
SPEC_DECODE_BUILTINS = [c for c in BUILTIN_LOGITS_PROCESSORS if c.WITH_SPEC_DECODE]

__all__ = [
    "BUILTINS",
    "BUILTIN_LOGITS_PROCESSORS",
    "COMBINED",
    "OPT_IN_PROCESSORS",
    "REASONING_TRANSFORMS",
    "SAMPLER_TRANSFORMS_AFTER",
    "SAMPLER_TRANSFORMS_BEFORE",
    "SPEC_DECODE_BUILTINS",
    "AllowedTokenIdsLogitsProcessor",
    "BadWordsLogitsProcessor",
    "DryLogitsProcessor",
    "EpsilonCutoffLogitsProcessor",
    "EtaCutoffLogitsProcessor",
    "EveryFieldLogitsProcessor",
    "EveryFieldSamplingLogitsProcessor",
    "LogitBiasLogitsProcessor",
    "MinPLogitsProcessor",
    "MinTokensLogitsProcessor",
    "NoRepeatNGramLogitsProcessor",
    "PenaltiesLogitsProcessor",
    "ThinkingBudgetLogitsProcessor",
    "TopKTopPLogitsProcessor",
    "TopNSigmaLogitsProcessor",
    "TypicalPLogitsProcessor",
    "XTCLogitsProcessor",
]

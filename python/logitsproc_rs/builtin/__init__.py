"""The built-in processors, one module each.

``BUILTIN_LOGITS_PROCESSORS`` is vLLM's list (MinTokens → LogitBias → MinP). The transforms vLLM
hard-codes in its sampler are processors here too: ``SAMPLER_TRANSFORMS_BEFORE`` run before the
built-ins (allowed ids, bad words) and ``SAMPLER_TRANSFORMS_AFTER`` after the custom ones
(penalties; the thinking budget is added when a reasoning config exists).
"""

from .allowed_token_ids import AllowedTokenIdsLogitsProcessor
from .bad_words import BadWordsLogitsProcessor
from .logit_bias import LogitBiasLogitsProcessor
from .min_p import MinPLogitsProcessor
from .min_tokens import MinTokensLogitsProcessor
from .penalties import PenaltiesLogitsProcessor
from .thinking import ThinkingBudgetLogitsProcessor

BUILTIN_LOGITS_PROCESSORS = [
    MinTokensLogitsProcessor,
    LogitBiasLogitsProcessor,
    MinPLogitsProcessor,
]
SAMPLER_TRANSFORMS_BEFORE = [AllowedTokenIdsLogitsProcessor, BadWordsLogitsProcessor]
SAMPLER_TRANSFORMS_AFTER = [PenaltiesLogitsProcessor]

__all__ = [
    "BUILTIN_LOGITS_PROCESSORS",
    "SAMPLER_TRANSFORMS_AFTER",
    "SAMPLER_TRANSFORMS_BEFORE",
    "AllowedTokenIdsLogitsProcessor",
    "BadWordsLogitsProcessor",
    "LogitBiasLogitsProcessor",
    "MinPLogitsProcessor",
    "MinTokensLogitsProcessor",
    "PenaltiesLogitsProcessor",
    "ThinkingBudgetLogitsProcessor",
]

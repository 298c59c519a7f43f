"""The built-in processors, one module each; ``BUILTIN_LOGITS_PROCESSORS`` is vLLM's order."""

from .logit_bias import LogitBiasLogitsProcessor
from .min_p import MinPLogitsProcessor
from .min_tokens import MinTokensLogitsProcessor

BUILTIN_LOGITS_PROCESSORS = [
    MinTokensLogitsProcessor,
    LogitBiasLogitsProcessor,
    MinPLogitsProcessor,
]

__all__ = [
    "BUILTIN_LOGITS_PROCESSORS",
    "LogitBiasLogitsProcessor",
    "MinPLogitsProcessor",
    "MinTokensLogitsProcessor",
]

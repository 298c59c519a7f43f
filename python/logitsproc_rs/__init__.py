"""logitsproc_rs: vLLM-compatible logits processors with a Rust state core.

The Rust extension (``_core``) owns each processor's per-request tables and applies every
batch change in one call; torch does the math on the logits' device.
"""

from . import _core
from .bitmask import apply_token_bitmask_
from .builtin import (
    BUILTIN_LOGITS_PROCESSORS,
    SAMPLER_TRANSFORMS_AFTER,
    SAMPLER_TRANSFORMS_BEFORE,
    AllowedTokenIdsLogitsProcessor,
    BadWordsLogitsProcessor,
    LogitBiasLogitsProcessor,
    MinPLogitsProcessor,
    MinTokensLogitsProcessor,
    PenaltiesLogitsProcessor,
    ThinkingBudgetLogitsProcessor,
)
from .columns import (
    ArrayColumn,
    Column,
    ColumnLogitsProcessor,
    FloatColumn,
    IntColumn,
    TokensColumn,
)
from .interface import (
    AddedRequest,
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
    MovedRequest,
    RemovedRequest,
)
from .loader import (
    STR_POOLING_REJECTS_LOGITSPROCS,
    STR_SPEC_DEC_REJECTS_LOGITSPROCS,
    STR_SPEC_DEC_REJECTS_MIN_P_LOGIT_BIAS,
    build_logitsprocs,
    validate_logits_processors_parameters,
    validate_sampling_params,
)
from .params import EngineConfig, SamplingParams, SamplingType
from .pipeline import Pipeline, PipelineView
from .sampler import LogprobsTensors, Sampler, SamplerOutput, SamplingMetadata
from .state import BatchUpdateBuilder, LogitsProcessors

__version__ = "0.1.0"

if _core.__version__ != __version__:
    raise ImportError(
        f"logitsproc_rs: native module version {_core.__version__} does not match the "
        f"package version {__version__}; rebuild the extension (make build)"
    )

__all__ = [
    "BUILTIN_LOGITS_PROCESSORS",
    "SAMPLER_TRANSFORMS_AFTER",
    "SAMPLER_TRANSFORMS_BEFORE",
    "STR_POOLING_REJECTS_LOGITSPROCS",
    "STR_SPEC_DEC_REJECTS_LOGITSPROCS",
    "STR_SPEC_DEC_REJECTS_MIN_P_LOGIT_BIAS",
    "AddedRequest",
    "AllowedTokenIdsLogitsProcessor",
    "ArrayColumn",
    "BadWordsLogitsProcessor",
    "BatchUpdate",
    "BatchUpdateBuilder",
    "Column",
    "ColumnLogitsProcessor",
    "EngineConfig",
    "FloatColumn",
    "IntColumn",
    "LogitBiasLogitsProcessor",
    "LogitsProcessor",
    "LogitsProcessors",
    "LogprobsTensors",
    "MinPLogitsProcessor",
    "MinTokensLogitsProcessor",
    "MoveDirectionality",
    "MovedRequest",
    "PenaltiesLogitsProcessor",
    "Pipeline",
    "PipelineView",
    "RemovedRequest",
    "Sampler",
    "SamplerOutput",
    "SamplingMetadata",
    "SamplingParams",
    "SamplingType",
    "ThinkingBudgetLogitsProcessor",
    "TokensColumn",
    "__version__",
    "apply_token_bitmask_",
    "build_logitsprocs",
    "validate_logits_processors_parameters",
    "validate_sampling_params",
]

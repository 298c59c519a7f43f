"""logitsproc_rs: vLLM-compatible logits processors with a Rust state core.

The Rust extension (``_core``) owns each processor's per-request tables and applies every
batch change in one call; torch does the math on the logits' device.
"""

from . import _core
from . import builtin as _builtin
from .bitmask import apply_token_bitmask_

# Every built-in processor and the sampler-order lists (``builtin.__all__``).
from .builtin import *  # noqa: F403
from .columns import (
    ArrayColumn,
    Column,
    ColumnLogitsProcessor,
    FloatColumn,
    IntColumn,
    TokensColumn,
)
from .errors import (
    AllocationError,
    BatchUpdateError,
    ConfigError,
    LogitsprocError,
    ProtocolError,
    RequestError,
    SizeError,
)
from .interface import (
    AdapterLogitsProcessor,
    AddedRequest,
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
    MovedRequest,
    RemovedRequest,
    RequestLogitsProcessor,
    process_dict_updates,
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
from .pipeline import Pipeline
from .sampler import LogprobsTensors, Sampler, SamplerOutput, SamplingMetadata
from .state import BatchUpdateBuilder, LogitsProcessors
from .views import PipelineView

# One version source: rust/Cargo.toml, compiled into the extension (and copied into the
# wheel's metadata by maturin).
__version__: str = _core.__version__


def _check_source_build() -> None:
    """In a source checkout, refuse an extension built from another version of the crate
    (a stale build would otherwise run silently against newer Python code)."""
    import re
    from pathlib import Path

    cargo = Path(__file__).resolve().parents[2] / "rust" / "Cargo.toml"
    if not cargo.is_file():
        return  # an installed wheel: the extension and the Python code shipped together
    found = re.search(r'^version\s*=\s*"([^"]+)"', cargo.read_text(), re.MULTILINE)
    if found and found.group(1) != __version__:
        raise ImportError(
            f"logitsproc_rs: the native module is version {__version__} but {cargo} says "
            f"{found.group(1)}; rebuild the extension (make build)"
        )


_check_source_build()

__all__ = [
    *_builtin.__all__,
    "STR_POOLING_REJECTS_LOGITSPROCS",
    "STR_SPEC_DEC_REJECTS_LOGITSPROCS",
    "STR_SPEC_DEC_REJECTS_MIN_P_LOGIT_BIAS",
    "AdapterLogitsProcessor",
    "AddedRequest",
    "AllocationError",
    "ArrayColumn",
    "BatchUpdate",
    "BatchUpdateBuilder",
    "BatchUpdateError",
    "Column",
    "ColumnLogitsProcessor",
    "ConfigError",
    "EngineConfig",
    "FloatColumn",
    "IntColumn",
    "LogitsProcessor",
    "LogitsProcessors",
    "LogitsprocError",
    "LogprobsTensors",
    "MoveDirectionality",
    "MovedRequest",
    "Pipeline",
    "PipelineView",
    "ProtocolError",
    "RemovedRequest",
    "RequestError",
    "RequestLogitsProcessor",
    "Sampler",
    "SamplerOutput",
    "SamplingMetadata",
    "SamplingParams",
    "SamplingType",
    "SizeError",
    "TokensColumn",
    "__version__",
    "apply_token_bitmask_",
    "build_logitsprocs",
    "process_dict_updates",
    "validate_logits_processors_parameters",
    "validate_sampling_params",
]

"""Type stub for the Rust extension ``logitsproc_rs._core`` (``rust/src/python/*.rs``).

Each state class owns one processor's per-slot table in Rust and exports its host buffers
zero-copy as ``HostBufferView`` (DLPack producers over page-aligned CPU memory). ``update``
takes a vLLM-shaped batch update (duck-typed: ``batch_size``, ``removed``, ``added`` as
``(index, params, prompt_tok_ids, output_tok_ids)``, ``moved`` as ``(index1, index2,
direction)``) and raises ``ValueError`` naming the request index and field for any bad value,
leaving the state unchanged. States that follow live output lists also accept ``None`` (a step
without a batch change).
"""

from collections.abc import Sequence
from typing import Any, final

from typing_extensions import CapsuleType

__all__ = [
    "PAGE_SIZE",
    "AllowedTokenIdsState",
    "BadWordsState",
    "HostBufferView",
    "LogitBiasState",
    "MinPState",
    "MinTokensState",
    "PenaltiesState",
    "ThinkingState",
    "__version__",
]

__version__: str
PAGE_SIZE: int

@final
class HostBufferView:
    """A 1-D view of one Rust host buffer (float32, int32 or int64; device kDLCPU). Not
    constructible from Python; obtained from a state's buffer accessors."""

    def __dlpack__(
        self,
        *,
        stream: Any | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> CapsuleType:
        """A ``dltensor_versioned`` capsule when ``max_version >= (1, 0)``, else a legacy
        ``dltensor`` one. ``BufferError`` for a non-CPU ``dl_device`` or ``copy=True``."""

    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __len__(self) -> int: ...
    @property
    def data_ptr(self) -> int:
        """Address of the first element (page-aligned)."""

    @property
    def nbytes(self) -> int:
        """Allocated bytes, a whole number of pages."""

    @property
    def dtype(self) -> str:
        """``"float32"``, ``"int32"`` or ``"int64"``."""

@final
class MinPState:
    def __new__(cls, capacity: int) -> MinPState: ...
    def unsafe_apply_cpu(self, ptr: int, rows: int, vocab: int, row_stride: int) -> None:
        """Applies in place to float32 CPU logits at ``ptr`` (Rust writes the memory). The caller
        checks dtype float32, device CPU, unit column stride and shape ``[rows, vocab]``."""
    def update(self, batch_update: Any) -> bool:
        """Applies a batch update; True when ``ln(min_p)[:batch_size]`` must be re-copied."""

    def log_min_p(self) -> HostBufferView:
        """Per-slot ``ln(min_p)`` (float32, -inf where unset)."""

    def get(self, index: int) -> float | None:
        """Stored (float32) min_p of a slot; None past the capacity."""

    @property
    def count(self) -> int:
        """Slots with a non-zero min_p."""

    @property
    def batch_size(self) -> int: ...
    @property
    def capacity(self) -> int: ...

@final
class LogitBiasState:
    def __new__(cls, capacity: int, vocab_size: int, max_entries: int) -> LogitBiasState: ...
    def update(self, batch_update: Any) -> bool:
        """Applies a batch update; True when the (row, token, bias) triples were rebuilt."""

    def rows(self) -> HostBufferView: ...
    def cols(self) -> HostBufferView: ...
    def vals(self) -> HostBufferView: ...
    @property
    def len(self) -> int:
        """Number of valid triples."""

    @property
    def padded_len(self) -> int:
        """Valid triples plus no-op padding (a power of two): the prefix to apply."""

    @property
    def active(self) -> int:
        """Requests with a non-empty bias."""

    @property
    def max_entries(self) -> int: ...

@final
class MinTokensState:
    def __new__(
        cls, capacity: int, vocab_size: int, max_stop_ids: int, spec_tokens: int = 0
    ) -> MinTokensState:
        """``spec_tokens``: draft tokens per request under speculative decoding (0 when off)."""

    def spec_decode(self, num_draft_tokens: Sequence[int]) -> tuple[int, int]:
        """Builds the draft-row triples into ``spec_*()``; returns (logits rows of the layout,
        padded triple count)."""

    def spec_rows(self) -> HostBufferView: ...
    def spec_cols(self) -> HostBufferView: ...
    def spec_vals(self) -> HostBufferView: ...
    def update(self, batch_update: Any | None) -> bool:
        """Applies a batch update, or with None only re-checks the live output lengths; True
        when the (row, token) triples were rebuilt."""

    def rows(self) -> HostBufferView: ...
    def cols(self) -> HostBufferView: ...
    def vals(self) -> HostBufferView: ...
    @property
    def len(self) -> int:
        """Number of valid triples."""

    @property
    def padded_len(self) -> int:
        """Valid triples plus no-op padding (a power of two): the prefix to apply."""

    @property
    def active(self) -> int:
        """Requests still below their min_tokens."""

@final
class AllowedTokenIdsState:
    def __new__(cls, capacity: int, vocab_size: int, max_ids: int) -> AllowedTokenIdsState: ...
    def update(self, batch_update: Any) -> bool:
        """Applies a batch update (``params.allowed_token_ids``); True when the exported
        pairs and rows changed."""

    def rows(self) -> HostBufferView: ...
    def cols(self) -> HostBufferView: ...
    def restricted_rows(self) -> HostBufferView:
        """Restricted rows (int64), padded by repeating the first (prefix ``padded_rows``)."""

    @property
    def len(self) -> int: ...
    @property
    def padded_len(self) -> int: ...
    @property
    def n_rows(self) -> int: ...
    @property
    def padded_rows(self) -> int: ...
    @property
    def active(self) -> int: ...

@final
class BadWordsState:
    def __new__(
        cls,
        capacity: int,
        vocab_size: int,
        max_words: int,
        max_word_len: int,
        spec_tokens: int = 0,
    ) -> BadWordsState:
        """``spec_tokens``: draft tokens per request under speculative decoding (0 when off)."""

    @property
    def saw_placeholders(self) -> bool:
        """Whether the last pass stopped at an async placeholder (-1): pass again first."""
    def spec_decode(
        self, num_draft_tokens: Sequence[int], spec_token_ids: Sequence[Sequence[int]]
    ) -> tuple[int, int]:
        """Builds the draft-row bans into ``spec_*()``: request r owns ``num_draft_tokens[r]``
        rows, row j seeing the output plus ``spec_token_ids[r][:j]``. Returns (logits rows,
        padded triple count)."""

    def spec_rows(self) -> HostBufferView: ...
    def spec_cols(self) -> HostBufferView: ...
    def spec_vals(self) -> HostBufferView: ...
    def update(self, batch_update: Any | None) -> bool:
        """Applies a batch update (or, with None, re-matches against the grown outputs); True
        when the banned (row, token) pairs changed."""

    def rows(self) -> HostBufferView: ...
    def cols(self) -> HostBufferView: ...
    def vals(self) -> HostBufferView: ...
    @property
    def len(self) -> int: ...
    @property
    def padded_len(self) -> int: ...
    @property
    def active(self) -> int: ...

@final
class PenaltiesState:
    def __new__(cls, capacity: int, vocab_size: int, ops_capacity: int) -> PenaltiesState: ...
    @property
    def saw_placeholders(self) -> bool:
        """Whether the last pass stopped at an async placeholder (-1): pass again first."""
    def unsafe_apply_cpu(self, ptr: int, rows: int, vocab: int, row_stride: int) -> None:
        """Applies in place to float32 CPU logits at ``ptr`` (Rust writes the memory). The caller
        checks dtype float32, device CPU, unit column stride and shape ``[rows, vocab]``."""
    def update(self, batch_update: Any | None) -> None:
        """Applies a batch update (or, with None, only counts new output tokens)."""

    def next_chunk(self) -> int:
        """Moves the next chunk of (row, token, delta) additions into ``ops_*()``; returns its
        padded length (0 when none are left)."""

    def take_values_changed(self) -> bool:
        """True once after the per-slot penalty values changed."""

    def repetition(self) -> HostBufferView: ...
    def frequency(self) -> HostBufferView: ...
    def presence(self) -> HostBufferView: ...
    def copy_dst(self) -> HostBufferView: ...
    def copy_src(self) -> HostBufferView: ...
    def ops_rows(self) -> HostBufferView: ...
    def ops_cols(self) -> HostBufferView: ...
    def ops_vals(self) -> HostBufferView: ...
    def counted(self, index: int) -> list[int] | None:
        """Output tokens counted so far for one slot (None if untracked)."""

    @property
    def n_copies(self) -> int: ...
    @property
    def zero_row(self) -> int: ...
    @property
    def active(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def prompt_flag(self) -> int: ...

@final
class ThinkingState:
    def __new__(
        cls, capacity: int, vocab_size: int, start_ids: Sequence[int], end_ids: Sequence[int]
    ) -> ThinkingState: ...
    @property
    def saw_placeholders(self) -> bool:
        """Whether the last pass stopped at an async placeholder (-1): pass again first."""
    def update(self, batch_update: Any | None) -> int:
        """Applies a batch update (if any), then advances every tracked request over its new
        output tokens; returns the padded length of the forced (row, token, 1e9) triples."""

    def restep(self) -> int:
        """Steps again the rows whose async placeholder was filled in since ``update``."""

    def rows(self) -> HostBufferView: ...
    def cols(self) -> HostBufferView: ...
    def vals(self) -> HostBufferView: ...
    def forced(self) -> list[tuple[int, int]]:
        """The (row, token) pairs forced this step."""

    @property
    def active(self) -> int: ...

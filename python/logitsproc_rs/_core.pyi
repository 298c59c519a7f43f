"""Type stub for the Rust extension ``logitsproc_rs._core`` (``rust/src/python/*.rs``).

One ``Pipeline`` owns the per-slot tables of every processor of a set (the built-ins it was
built with and the declared columns of custom processors) and exports its host buffers zero-copy
as ``HostBufferView`` (DLPack producers over page-aligned CPU memory). ``step`` takes a
vLLM-shaped batch update (duck-typed: ``batch_size``, ``removed``, ``added`` as ``(index,
params, prompt_tok_ids, output_tok_ids)``, ``moved`` as ``(index1, index2, direction)``) or
``None``, validates everything for every table first, and raises ``ValueError`` naming the
request index and field for any bad value, leaving every table unchanged.
"""

from collections.abc import Callable, Sequence
from typing import Any, final

from typing_extensions import CapsuleType

__all__ = [
    "INT_FIELD_RANGE",
    "PAGE_SIZE",
    "SECTION_ALIGN",
    "HostBufferView",
    "Pipeline",
    "__version__",
    "exponential_draws",
    "field_range_error",
    "gumbel_noise",
    "int_item",
    "registry",
    "top_p_margin",
    "unsafe_exponential_race",
    "unsafe_fused_exponential",
    "unsafe_fused_gumbel",
    "unsafe_gumbel_race",
    "unsafe_mask_top_k_top_p",
    "unsafe_sorted_values",
    "update_fingerprint",
]

__version__: str

def update_fingerprint(batch_update: Any) -> tuple[int, tuple[Any, ...]]:
    """``(fingerprint, objects)`` of a batch update's structure; hold ``objects`` while
    comparing."""

def field_range_error(name: str, value: float, caps: dict[str, int] | None = None) -> str | None:
    """``None`` when ``value`` is inside field ``name``'s declared range (or it has none), else
    the core's refusal (``"must be in [0, 1], got 2"``). An int field takes an int within
    int64 (``TypeError`` else); ``caps`` (engine-config name -> value) checks a range's cap
    end, skipped when its cap is not given."""

def int_item(value: Any) -> int | None:
    """``value`` as the core reads an int from the caller (a Python int that is no bool, or a
    numpy integer scalar, within int64), else ``None``; runs none of the caller's code."""

def registry() -> list[
    tuple[
        str,
        list[tuple[str, int]],
        list[
            tuple[
                str,
                str,
                str,
                float | int | None,
                bool,
                list[str],
                str,
                tuple[float | int | None, list[Any], list[Any]],
            ]
        ],
        bool,
    ]
]:
    """The core's registry: ``(name, caps, fields, history)`` per built-in table in reading
    order; ``caps`` as (engine-config name, default), ``fields`` as (name, SamplingParams
    attribute, kind, neutral value, tunes: whether it only tunes its processor, caps: the
    per-request caps bounding it, item: what an error calls one entry, (off_at_most: the
    values at or below it are off, read as the neutral value, or None; examples: values a
    request may give it, the first not neutral; bad: values refused)), ``history``: whether
    its requests' outputs are read."""

PAGE_SIZE: int
SECTION_ALIGN: int
#: The range of an int request field's value, both ends included (the core reads int64).
INT_FIELD_RANGE: tuple[int, int]

@final
class HostBufferView:
    """A 1-D view of one Rust host buffer (float32, int32 or int64; device kDLCPU). Not
    constructible from Python; obtained from ``Pipeline.buffer`` / ``Pipeline.staging``."""

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
        """``"float32"``, ``"int32"``, ``"int64"`` or ``"uint8"`` (staging copies)."""

# The sort-free sampling tail (rust/src/python/sampling.rs; callers: _tail.py, which checks the
# tensors whose data_ptr it passes).
def unsafe_mask_top_k_top_p(
    ptr: int,
    rows: int,
    vocab: int,
    row_stride: int,
    top_k: list[int] | None = None,
    top_p: list[float] | None = None,
    strict: bool = True,
) -> tuple[list[int], list[int]]:
    """Masks kept sets in place; returns (rows left for the sort, rows decided uncertainly)."""

def unsafe_exponential_race(
    ptr: int,
    rows: int,
    vocab: int,
    row_stride: int,
    need: list[bool],
    default_state: bytes | None,
    seeded: list[tuple[int, int]],
    states: list[bytes],
) -> tuple[list[int], bytes | None, list[bytes]]:
    """vLLM 0.25.1's random_sample on torch's CPU streams; tokens and the states after."""

def unsafe_fused_exponential(
    ptr: int,
    rows: int,
    vocab: int,
    row_stride: int,
    need: list[bool],
    default_state: bytes | None,
    seeded: list[tuple[int, int]],
    states: list[bytes],
    temperature: list[float] | None = None,
    steps: dict[str, list[float]] = ...,
    top_k: list[int] | None = None,
    top_p: list[float] | None = None,
    margin: float | None = None,
) -> tuple[list[int], bytes | None, list[bytes], list[int], list[int], list[tuple[int, bytes]]]:
    """The fused exact tail in place: (tokens, default state after, seeded states after, rows
    left for the sort, rows left after min-p, rows to draw with torch's softmax and their
    streams' states before)."""

def unsafe_fused_gumbel(
    ptr: int,
    rows: int,
    vocab: int,
    row_stride: int,
    need: list[bool],
    seeds: list[int],
    positions: list[int],
    temperature: list[float] | None = None,
    steps: dict[str, list[float]] = ...,
    top_k: list[int] | None = None,
    top_p: list[float] | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """The fused batch-invariant tail in place: (tokens, rows left for the sort, rows decided
    uncertainly)."""

def unsafe_sorted_values(
    ptr: int, rows: int, vocab: int, row_stride: int, which: list[int], out_ptr: int
) -> None:
    """Rows ``which`` of the logits, each's values in ascending order, into out_ptr."""

def unsafe_gumbel_race(
    ptr: int,
    rows: int,
    vocab: int,
    row_stride: int,
    need: list[bool],
    seeds: list[int],
    positions: list[int],
) -> list[int]:
    """The batch-invariant Gumbel race over each needed row's finite entries."""

def gumbel_noise(seed: int, position: int, tokens: list[int]) -> tuple[list[int], list[float]]:
    """The batch-invariant noise's bits and Gumbel values of tokens at (seed, position)."""

def exponential_draws(state: bytes, n: int) -> list[float]:
    """The first n float32 exponential draws torch makes from a CPU generator state."""

def top_p_margin(thr: float) -> float:
    """The strict top-p decision's margin at thr = 1 - p."""

@final
class Pipeline:
    def __new__(
        cls,
        capacity: int,
        vocab_size: int,
        *,
        tables: Sequence[str] = ...,
        caps: Sequence[tuple[str, int]] = ...,
        thinking: tuple[Sequence[int], Sequence[int]] | None = None,
        spec_tokens: int = 0,
        columns: Sequence[tuple[str, str, int, float, Callable[[Any], Any]]] = ...,
        stable_slots: bool = False,
        token_feed: bool = False,
        max_rows: int | None = None,
        host_kernels: bool = False,
        refuse: Sequence[tuple[str, str]] = ...,
    ) -> Pipeline:
        """Builds the built-in ``tables`` named (see ``registry()``), sized by the per-request
        ``caps`` (engine-config names; a cap not given takes its default); ``thinking``:
        (start ids, end ids), needed by the "thinking" table; ``columns``: (name, kind, width,
        default, reader) with kind ``float``/``int``/``array``/``tokens``; ``refuse``: (table,
        hint) for unbuilt tables whose switching fields a request must not set."""

    def step(
        self,
        batch_update: Any | None = None,
        sampled_token_ids: Any | None = None,
        slots: Any | None = None,
        status: list[int] | None = None,
        discard: bool = False,
    ) -> None:
        """One V1 step (token feed first, then the update or the per-step work), atomic."""

    def prepare(
        self,
        batch_update: Any = None,
        sampled_token_ids: Any = None,
        slots: Any = None,
    ) -> None:
        """The first half of ``step``: reads and checks, changes nothing; then ``commit`` or
        ``abort``."""
    def commit(self, status: list[int] | None = None, discard: bool = False) -> None: ...
    def abort(self) -> None: ...
    def add_request(
        self,
        slot: int,
        params: Any,
        prompt_tok_ids: Any | None = None,
        output_tok_ids: Any | None = None,
    ) -> None:
        """Stable slots: checked now, applied by the next ``step_slots``."""

    def remove_request(self, slot: int) -> None: ...
    def step_slots(
        self,
        row_to_slot: Any,
        sampled_token_ids: Any | None = None,
        slots: Any | None = None,
        local_pos: Any | None = None,
        input_ids: Any | None = None,
    ) -> None:
        """Stable slots: feed, pending slot changes, per-step work, row map (and its draft
        layout); atomic."""

    def map_rows(
        self, row_to_slot: Any, local_pos: Any | None = None, input_ids: Any | None = None
    ) -> None: ...
    def remap_rows(self) -> None: ...
    def feed_slots(self, sampled_token_ids: Any, slots: Any) -> None: ...
    def map_draft_rows(
        self,
        row_to_slot: Any,
        positions: Any,
        draft_slots: Any,
        draft_offsets: Any,
        draft_tokens: Any,
    ) -> None: ...
    def restep(self) -> None:
        """Looks again at outputs that ended in an async placeholder (-1)."""

    def stage(self, k: int, all: bool = False) -> tuple[str, int, int] | None:
        """Copies what changed into staging copy ``k``; ``("span", lo, hi)`` or
        ``("packed", words, index_offset)``."""

    def discard(self) -> None: ...
    def staging(self, k: int) -> HostBufferView: ...
    def sections(self) -> list[tuple[str, int, int, str, int]]:
        """(name, byte offset, bytes, dtype, elements) of every arena section."""

    def buffer(self, i: int) -> HostBufferView: ...
    @property
    def max_rows(self) -> int: ...
    @property
    def arena_bytes(self) -> int: ...
    @property
    def last_upload_bytes(self) -> int: ...
    @property
    def uploaded_total(self) -> int: ...
    @property
    def steps(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    def status_names(self) -> list[str]:
        """The names of ``status``'s values, in order (fixed for the pipeline's life)."""

    def status(self) -> list[int]:
        """The counts and padded lengths the applies read, in ``status_names``' order."""

    def status_into(self, out: list[int]) -> None:
        """``status`` written into an existing list (no new container per step)."""

    def triples_add(self, table: str) -> bool | None:
        """Whether ``table``'s triples add to the logits (else they put their values);
        ``None`` for a table without triples."""

    def unsafe_apply_cpu(
        self,
        table: str,
        ptr: int,
        rows: int,
        vocab: int,
        row_stride: int,
        mapped: bool = False,
        float64: bool = False,
    ) -> None:
        """Table ``table`` applied by Rust in place on CPU logits at ``ptr`` (float32, or
        float64 with ``float64``; the caller checked the tensor); ``mapped``: rows through the
        last row map."""

    def spec_min_tokens(self, num_draft_tokens: Any) -> tuple[int, int]: ...
    def spec_bad_words(
        self, num_draft_tokens: Any, spec_token_ids: Sequence[Sequence[int]]
    ) -> tuple[int, int]: ...
    def take_penalty_copies(self) -> int: ...
    def next_penalty_chunk(self) -> int: ...
    @property
    def prompt_flag(self) -> int: ...
    def min_p(self, index: int) -> float | None: ...
    def active(self) -> list[tuple[str, int]]: ...
    def penalties_counted(self, index: int) -> list[int] | None: ...
    def thinking_forced(self) -> list[tuple[int, int]]: ...

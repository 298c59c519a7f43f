"""The sampling tail without a sort: top-k / top-p kept sets and the draw, in two modes.

- ``exact``: vLLM 0.25.1's tokens. The kept set is found without sorting (Rust, CPU), and the
  exponential race ``argmax(probs / q)`` reads torch's CPU generators in Rust: the same ``q``
  torch draws, the same stream positions consumed, the states written back. Only the draws
  that can still win are computed. The separate form (``mask_top_k_top_p_``, then
  ``random_sample_exact`` on torch's ``softmax``) is what the fused pass the ``Sampler`` runs
  (``fused_exponential_``, ``exact.rs``) must equal: there temperature, min-p, the
  truncations, top-k / top-p and the race are one Rust pass per row, the race on our own
  exponentials where its winner is certain, torch's steps for the rest.
- ``batch_invariant``: the Gumbel race ``argmax(x + g)`` over the kept set with counter-based
  noise ``g = G(seed, position, token)`` (``noise.rs``): a request's token depends on its own
  logits, seed and position only, never on its batch, its row or the batch size. On the CPU
  the ``Sampler`` runs it fused (``fused_gumbel_``, ``fused.rs``): temperature, min-p, the
  truncations, XTC, top-k / top-p and the race in one Rust pass per row.

Top-p's boundary is decided in float64; where torch's float32 cumulative sums could decide it
otherwise (the boundary within ``TOP_P_MARGIN`` of ``1 - p``) the row is decided from its
values sorted in Rust and vLLM's torch steps on them; where torch's unstable sort decides it
(a run of equal values cut by the boundary), the row goes through vLLM's sort path itself.
``TAIL_STATS`` counts both. So the kept set always equals the sort path's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ._core import (
    exponential_draws,
    unsafe_exponential_race,
    unsafe_fused_exponential,
    unsafe_fused_gumbel,
    unsafe_gumbel_race,
    unsafe_mask_top_k_top_p,
    unsafe_sorted_values,
)
from .errors import InputError

#: The sampling modes of the ``Sampler``: ``exact`` and ``batch_invariant`` above, ``sort``
#: vLLM 0.25.1's torch code as it is (its sort, then ``exponential_``).
SAMPLING_MODES = ("exact", "batch_invariant", "sort")


@dataclass
class TailStats:
    """Rows through the sort-free kept set; rows it handed to the sort path (``exact``); rows
    it masked by a float64 top-p decision the sort might have made otherwise
    (``batch_invariant``: within the margin, or a run of ties at the boundary, all kept); rows
    the fused ``exact`` pass drew from torch's softmax (too close to call without it, or
    sorted); of the rows handed to the sort, those torch's sort decided (the others: their
    values sorted in Rust, ``_mask_from_sorted_values``)."""

    rows_masked: int = 0
    rows_sorted: int = 0
    rows_uncertain: int = 0
    rows_softmax: int = 0
    rows_torch_sorted: int = 0


TAIL_STATS = TailStats()


def apply_top_k_only(logits: torch.Tensor, k: torch.Tensor, max_top_k: int) -> torch.Tensor:
    """Top-k without a sort: keep values >= the row's k-th largest (ties kept)."""
    vocab = logits.shape[1]
    no_top_k = k == vocab
    k_safe = k.masked_fill(no_top_k, 1)
    kth = logits.topk(min(max_top_k, vocab), dim=1).values.gather(1, (k_safe - 1).unsqueeze(1))
    kth.masked_fill_(no_top_k.unsqueeze(1), float("-inf"))
    return logits.masked_fill_(logits < kth, float("-inf"))


def apply_top_k_top_p(
    logits: torch.Tensor,
    k: torch.Tensor | None,
    p: torch.Tensor | None,
    max_top_k: int | None = None,
) -> torch.Tensor:
    """vLLM's PyTorch top-k/top-p: sort ascending, mask below the k-th value, then mask the
    low tail whose cumulative probability is <= 1 - p (always keeping the top token)."""
    if p is None:
        if k is None:
            return logits
        return apply_top_k_only(logits, k, max_top_k if max_top_k is not None else logits.shape[1])
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k is not None:
        kth = logits_sort.gather(1, (logits_sort.size(1) - k).unsqueeze(1))
        logits_sort.masked_fill_(logits_sort < kth, float("-inf"))
    probs_sum = logits_sort.softmax(dim=-1).cumsum_(dim=-1)
    top_p_mask = probs_sum <= 1 - p.unsqueeze(1)
    top_p_mask[:, -1] = False
    logits_sort.masked_fill_(top_p_mask, float("-inf"))
    return logits.scatter_(dim=-1, index=logits_idx, src=logits_sort)


def _host_f32(t: torch.Tensor) -> bool:
    return (
        t.device.type == "cpu"
        and t.dtype == torch.float32
        and t.dim() == 2
        and (t.shape[1] <= 1 or t.stride(1) == 1)
    )


def _top_k_off_as_vocab(ks: torch.Tensor, vocab: int) -> torch.Tensor:
    """Top-k off as the sort-free path reads it (k <= 0, or above the vocabulary) written as
    ``vocab``: vLLM's code takes only 1..V, where V is off."""
    return ks.masked_fill((ks <= 0) | (ks > vocab), vocab)


def _mask_from_sorted_values(
    logits: torch.Tensor, rows: list[int], k: torch.Tensor | None, p: torch.Tensor
) -> list[int]:
    """vLLM's top-k / top-p kept sets of float32 CPU ``rows`` without torch's sort: each row's
    values sorted in Rust (``sorted.rs``, no indices), then vLLM's own torch arithmetic on
    them (the k-th value, ``softmax``, ``cumsum``, ``<= 1 - p``): the same float32 numbers as
    on its sorted row, so the same masked prefix, which is every value below the first kept
    one. Returns the rows left for torch's sort: a NaN in the row, or a run of equal values
    across the boundary (which of them torch's unstable sort masks is its own)."""
    vocab = logits.shape[1]
    idx = torch.tensor(rows, dtype=torch.long)
    nan = logits.index_select(0, idx).isnan().any(dim=-1).tolist()
    left = [r for r, n in zip(rows, nan, strict=True) if n]
    ok = [r for r, n in zip(rows, nan, strict=True) if not n]
    if not ok:
        return left
    idx = torch.tensor(ok, dtype=torch.long)
    s = torch.empty(len(ok), vocab, dtype=torch.float32)
    stride = logits.stride(0) if logits.shape[0] > 1 else vocab
    unsafe_sorted_values(logits.data_ptr(), logits.shape[0], vocab, stride, ok, s.data_ptr())
    if k is not None:
        ks = _top_k_off_as_vocab(k.index_select(0, idx), vocab)
        kth = s.gather(1, (vocab - ks).unsqueeze(1))
        s.masked_fill_(s < kth, float("-inf"))
    probs_sum = s.softmax(dim=-1).cumsum_(dim=-1)
    mask = probs_sum <= 1 - p.index_select(0, idx).unsqueeze(1)
    mask[:, -1] = False
    b = mask.sum(dim=-1, keepdim=True)  # the cumulative sums never fall: a prefix
    cut = s.gather(1, b)
    before = s.gather(1, (b - 1).clamp_(min=0))
    tie = ((b > 0) & (before == cut) & (cut > float("-inf"))).view(-1).tolist()
    decided = [j for j, t in enumerate(tie) if not t]
    left += [ok[j] for j, t in enumerate(tie) if t]
    if decided:
        at = torch.tensor(decided, dtype=torch.long)
        rows_at = idx.index_select(0, at)
        sub = logits.index_select(0, rows_at)
        sub.masked_fill_(sub < cut.index_select(0, at), float("-inf"))
        logits.index_copy_(0, rows_at, sub)
    return left


def _sort_rows(
    logits: torch.Tensor, rows: list[int], k: torch.Tensor | None, p: torch.Tensor | None
) -> None:
    """vLLM's top-k / top-p on ``rows``, in place: float32 CPU rows with top-p from their
    sorted values (``_mask_from_sorted_values``), the rest by vLLM's sort path."""
    if p is not None and _host_f32(logits):
        rows = _mask_from_sorted_values(logits, rows, k, p)
        TAIL_STATS.rows_torch_sorted += len(rows)
        if not rows:
            return
    idx = torch.tensor(rows, dtype=torch.long, device=logits.device)
    sub = logits.index_select(0, idx)
    ks = None if k is None else k.index_select(0, idx)
    if ks is not None:
        ks = _top_k_off_as_vocab(ks, logits.shape[1])
    ps = None if p is None else p.index_select(0, idx)
    out = apply_top_k_top_p(sub, ks, ps, None if ks is None else int(ks.max()))
    logits.index_copy_(0, idx, out)


def mask_top_k_top_p_(
    logits: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    strict: bool = True,
) -> torch.Tensor:
    """In place: ``-inf`` outside each row's kept set, vLLM 0.25.1's (``top_k``: int64 ``[B]``,
    ``vocab_size`` or more for a row without top-k; ``top_p``: float32 ``[B]``, 1 for a row
    without top-p). Float32 CPU logits take the sort-free path; other logits (CUDA, float64)
    vLLM's sort path. ``strict=False``: a top-p boundary too close to call is decided in
    float64 (ties at it kept) instead of by the sort (``TAIL_STATS.rows_uncertain``).
    Returns ``logits``."""
    if top_k is None and top_p is None:
        return logits
    rows, vocab = logits.shape
    if not _host_f32(logits):
        _sort_rows(logits, list(range(rows)), top_k, top_p)
        return logits
    ks = None if top_k is None else top_k.tolist()
    ps = None if top_p is None else top_p.tolist()
    stride = logits.stride(0) if rows > 1 else vocab
    left, uncertain = unsafe_mask_top_k_top_p(
        logits.data_ptr(), rows, vocab, stride, ks, ps, strict
    )
    TAIL_STATS.rows_masked += rows - len(left)
    TAIL_STATS.rows_uncertain += len(uncertain)
    if left:
        TAIL_STATS.rows_sorted += len(left)
        _sort_rows(logits, left, top_k, top_p)
    return logits


def _state_bytes(g: torch.Generator) -> bytes:
    return bytes(g.get_state().numpy())


def _set_state(g: torch.Generator, state: bytes) -> None:
    g.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))


_STREAM_CHECKED: bool | None = None


def check_torch_stream() -> None:
    """``InputError`` unless this torch's CPU ``exponential_`` draws the numbers the race
    reproduces (checked once per process, on 4,099 draws across two state refills)."""
    global _STREAM_CHECKED
    if _STREAM_CHECKED is None:
        g = torch.Generator().manual_seed(20_261_204)
        state = _state_bytes(g)
        want = torch.empty(4_099).exponential_(generator=g)
        got = torch.tensor(exponential_draws(state, 4_099), dtype=torch.float32)
        _STREAM_CHECKED = bool(torch.equal(got, want))
    if not _STREAM_CHECKED:
        raise InputError(
            f"sampling='exact': torch {torch.__version__}'s CPU exponential_ does not draw the "
            "numbers logitsproc_rs reproduces; use sampling='sort' (vLLM's torch code)"
        )


def _streams(
    generators: Mapping[int, torch.Generator], rows: int
) -> tuple[torch.Generator | None, list[torch.Generator], list[tuple[int, int]]]:
    """The streams vLLM's ``random_sample`` draws from: torch's default generator (``None``
    when every row has its own), the distinct seeded generators, and ``(row, index into
    them)`` in the dict's order (a generator may serve two rows)."""
    default = torch.default_generator if len(generators) != rows else None
    unique: dict[int, int] = {}
    gens: list[torch.Generator] = []
    seeded: list[tuple[int, int]] = []
    for row, g in generators.items():
        if id(g) not in unique:
            unique[id(g)] = len(gens)
            gens.append(g)
        seeded.append((row, unique[id(g)]))
    return default, gens, seeded


def _write_back(
    default: torch.Generator | None,
    default_state: bytes | None,
    gens: list[torch.Generator],
    states: list[bytes],
) -> None:
    if default is not None and default_state is not None:
        _set_state(default, default_state)
    for g, s in zip(gens, states, strict=True):
        _set_state(g, s)


def random_sample_exact(
    probs: torch.Tensor, generators: dict[int, torch.Generator], need: Sequence[bool]
) -> torch.Tensor:
    """vLLM 0.25.1's ``random_sample(probs, generators)`` on float32 CPU probabilities,
    token for token, and the generators left where torch's draws would leave them. ``need``:
    rows whose token is wanted (the others only advance the streams; their token is 0)."""
    rows, vocab = probs.shape
    default, gens, seeded = _streams(generators, rows)
    stride = probs.stride(0) if rows > 1 else vocab
    tokens, default_state, states = unsafe_exponential_race(
        probs.data_ptr(),
        rows,
        vocab,
        stride,
        list(need),
        None if default is None else _state_bytes(default),
        seeded,
        [_state_bytes(g) for g in gens],
    )
    _write_back(default, default_state, gens, states)
    return torch.tensor(tokens, dtype=torch.int64)


def fused_exponential_(
    logits: torch.Tensor,
    temperature: Sequence[float] | None,
    steps: Mapping[str, Sequence[float] | torch.Tensor],
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    generators: dict[int, torch.Generator],
    need: Sequence[bool],
    truncate: Callable[[torch.Tensor, list[int]], None] | None = None,
    margin: float | None = None,
) -> torch.Tensor:
    """The fused ``exact`` tail on float32 CPU ``logits`` (``exact.rs``), in place: divide by
    ``temperature`` (per row, 1 for greedy rows), the ``steps`` of ``_fused.fused_plan``,
    top-k / top-p (strict, as ``mask_top_k_top_p_``), then ``random_sample_exact``'s tokens
    and generator states. Rust decides what it can be certain of; the rest goes through torch
    as the separate path would: rows whose top-p only the sort decides (``_sort_rows``), rows
    left after min-p (a truncation too close to call, typical-p, XTC: ``truncate(logits,
    rows)`` runs the processors' own steps on them, then top-k / top-p), and torch's softmax
    for the rows whose race is too close to call without it, or that Rust did not finish
    (``TAIL_STATS.rows_softmax``). The processed logits are the separate steps', bitwise.
    ``margin``: how certain the race must be (tests only: a huge one sends every row to
    torch's softmax)."""
    rows, vocab = logits.shape
    default, gens, seeded = _streams(generators, rows)
    stride = logits.stride(0) if rows > 1 else vocab
    tokens, default_state, states, needs_sort, truncated, left = unsafe_fused_exponential(
        logits.data_ptr(),
        rows,
        vocab,
        stride,
        list(need),
        None if default is None else _state_bytes(default),
        seeded,
        [_state_bytes(g) for g in gens],
        temperature=None if temperature is None else list(temperature),
        top_k=None if top_k is None else top_k.tolist(),
        top_p=None if top_p is None else top_p.tolist(),
        margin=margin,
        steps=_step_values(steps),
    )
    _write_back(default, default_state, gens, states)
    if top_k is not None or top_p is not None:
        TAIL_STATS.rows_masked += rows - len(needs_sort) - len(truncated)
    if needs_sort:
        TAIL_STATS.rows_sorted += len(needs_sort)
        _sort_rows(logits, needs_sort, top_k, top_p)
    if truncated:
        if truncate is None:
            raise InputError("fused_exponential_: rows left for the truncations, no truncate")
        truncate(logits, truncated)
        idx = torch.tensor(truncated, dtype=torch.long)
        sub = logits.index_select(0, idx)
        pick = None if top_k is None else top_k.index_select(0, idx)
        mask_top_k_top_p_(sub, pick, None if top_p is None else top_p.index_select(0, idx))
        logits.index_copy_(0, idx, sub)
    TAIL_STATS.rows_softmax += len(left)
    if left:  # one race over them, each row on a generator holding its stream's saved state
        replay: dict[int, torch.Generator] = {}
        for j, (_, state) in enumerate(left):
            replay[j] = torch.Generator()
            _set_state(replay[j], state)
        rows_left = torch.tensor([row for row, _ in left], dtype=torch.long)
        probs = logits.index_select(0, rows_left).softmax(dim=-1)
        drawn = random_sample_exact(probs, replay, [True] * len(left)).tolist()
        for (row, _), token in zip(left, drawn, strict=True):
            tokens[row] = token
    return torch.tensor(tokens, dtype=torch.int64)


def gumbel_race(
    logits: torch.Tensor,
    seeds: Sequence[int],
    positions: Sequence[int],
    need: Sequence[bool],
) -> torch.Tensor:
    """The batch-invariant draw over each row's finite logits (float32 CPU): ``argmax(x +
    G(seed, position, token))``, the lowest token on ties; rows not in ``need`` get 0."""
    rows, vocab = logits.shape
    stride = logits.stride(0) if rows > 1 else vocab
    tokens = unsafe_gumbel_race(
        logits.data_ptr(), rows, vocab, stride, list(need), list(seeds), list(positions)
    )
    return torch.tensor(tokens, dtype=torch.int64)


def _step_values(steps: Mapping[str, Sequence[float] | torch.Tensor]) -> dict[str, list[float]]:
    """The plan's steps as the bindings take them: keyword → one float per row (the binding
    refuses a keyword it has no step for)."""
    return {k: v.tolist() if isinstance(v, torch.Tensor) else list(v) for k, v in steps.items()}


def fused_gumbel_(
    logits: torch.Tensor,
    temperature: Sequence[float] | None,
    steps: Mapping[str, Sequence[float] | torch.Tensor],
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    seeds: Sequence[int],
    positions: Sequence[int],
    need: Sequence[bool],
) -> torch.Tensor:
    """The fused ``batch_invariant`` tail on float32 CPU ``logits`` (``fused.rs``), in place:
    divide by ``temperature`` (per row, 1 for greedy rows), the ``steps`` of ``_fused.
    fused_plan`` (min-p, top-n-sigma, typical-p, epsilon, eta, XTC: keyword → per-row
    values), top-k / top-p (non-strict, as ``mask_top_k_top_p_(strict=False)``), then
    ``gumbel_race``'s token for the rows in ``need`` (0 for the others). Rows only the sort
    can decide go through it, then the race. The processed logits left in ``logits`` are the
    separate steps' (``fused.rs`` states where float32 rounding at a truncation's threshold
    may differ)."""
    rows, vocab = logits.shape
    stride = logits.stride(0) if rows > 1 else vocab
    tokens, left, uncertain = unsafe_fused_gumbel(
        logits.data_ptr(),
        rows,
        vocab,
        stride,
        list(need),
        list(seeds),
        list(positions),
        temperature=None if temperature is None else list(temperature),
        top_k=None if top_k is None else top_k.tolist(),
        top_p=None if top_p is None else top_p.tolist(),
        steps=_step_values(steps),
    )
    if top_k is not None or top_p is not None:
        TAIL_STATS.rows_masked += rows - len(left)
        TAIL_STATS.rows_uncertain += len(uncertain)
    if left:
        TAIL_STATS.rows_sorted += len(left)
        _sort_rows(logits, left, top_k, top_p)
        idx = torch.tensor(left, dtype=torch.long)
        sub = logits.index_select(0, idx)
        redrawn = gumbel_race(
            sub, [seeds[r] for r in left], [positions[r] for r in left], [need[r] for r in left]
        )
        for r, t in zip(left, redrawn.tolist(), strict=True):
            tokens[r] = t
    return torch.tensor(tokens, dtype=torch.int64)


def check_mode(mode: str) -> None:
    if mode not in SAMPLING_MODES:
        raise InputError(f"sampling must be one of {SAMPLING_MODES}, got {mode!r}")

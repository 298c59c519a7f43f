"""Draft rows on the V1 front-end (speculative decoding): every processor on every draft row,
over the history that row follows.

Under speculative decoding request ``r`` (V1 batch row ``r``) has drafts ``d_0 .. d_{k-1}``
(``spec_token_ids[r]``), and a logits row of it at draft position ``j`` scores the token after
its committed output followed by ``d_0 .. d_{j-1}``. ``LogitsProcessors.apply_drafts`` lays the
rows out (by default each request's ``k + 1`` rows at positions ``0 .. k``, the drafts' rows
and the bonus row, as vLLM computes them in one forward pass; any ``row_to_request`` and
``positions`` otherwise: vLLM's rejection sampler takes the ``k`` target rows and the bonus
row apart), the pipelines map them (the core replays the drafts through each history-reading
table: ``rust/src/pipeline/draft_replay.rs``), and each processor applies through that map.

A vLLM V1-style processor (its own ``apply(logits)`` over batch rows) has no draft positions:
it runs only if its class says ``APPLIES_TO_DRAFT_ROWS = True``, and then sees each position's
rows as a batch of committed requests (rows at position ``j`` in their requests' batch rows).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from .errors import RequestError


def draft_layout(
    spec_token_ids: Sequence[Sequence[int]],
    row_to_request: Sequence[int] | None,
    positions: Sequence[int] | None,
) -> tuple[list[int], list[int], list[list[int]]]:
    """The row map, each row's draft position and each request's drafts as lists of ints
    (checked: ints, not bools; the core checks ranges). Both of ``row_to_request`` and
    ``positions``, or neither (then each request's ``k + 1`` rows at ``0 .. k``)."""
    drafts = [_int_list(d, "spec_token_ids", r) for r, d in enumerate(spec_token_ids)]
    if (row_to_request is None) != (positions is None):
        detail = "row_to_request and positions go together (each row's request and position)"
        raise RequestError(f"field 'positions': {detail}", field="positions", detail=detail)
    if row_to_request is None:
        rows = [r for r, d in enumerate(drafts) for _ in range(len(d) + 1)]
        pos = [j for d in drafts for j in range(len(d) + 1)]
        return rows, pos, drafts
    assert positions is not None
    rows = _int_list(row_to_request, "row_to_request")
    return rows, _int_list(positions, "positions"), drafts


def _int_list(seq: Any, field: str, request: int | None = None) -> list[int]:
    """A sequence of ints (numpy's too, a 1-D tensor's); anything else, a bool or a non-int
    item is a ``RequestError`` naming ``field`` and the request (or the item's position)."""
    if isinstance(seq, (str, bytes)) or not isinstance(seq, Iterable):
        detail = f"expected a sequence of ints, got {type(seq).__name__}"
        raise RequestError.located(0 if request is None else request, field, detail)
    out = []
    for i, v in enumerate(seq.tolist() if isinstance(seq, torch.Tensor) else seq):
        at = i if request is None else request
        if isinstance(v, bool):
            raise RequestError.located(at, field, f"item {i} is a bool, not an int")
        try:
            out.append(operator.index(v))
        except TypeError:
            raise RequestError.located(at, field, f"item {i} is not an int: {v!r}") from None
    return out


def apply_by_position(
    proc: Any, logits: torch.Tensor, rows: list[int], pos: list[int]
) -> torch.Tensor:
    """A V1-style processor on draft rows: the rows at each position go through its ``apply``
    as one batch whose row ``r`` is request ``r``'s (the others hold zeros and are dropped)."""
    if not rows:
        return logits
    batch = max(rows) + 1
    for j in sorted(set(pos)):
        at = [i for i, p in enumerate(pos) if p == j]
        idx = torch.tensor(at, device=logits.device)
        req = torch.tensor([rows[i] for i in at], device=logits.device)
        x = logits.new_zeros((batch, logits.shape[1]))
        x[req] = logits[idx]
        x = proc.apply(x)
        logits[idx] = x[req].to(logits.dtype)
    return logits

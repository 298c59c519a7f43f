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

import itertools
from collections.abc import Iterable, Mapping, Sequence, Set
from typing import Any

import torch

from ._core import int_item
from .errors import RequestError
from .params import _show

# Most items read from one list of a layout (an endless iterable ends in an error); the core
# refuses more rows or drafts than the configuration holds long before.
_MAX_DRAFTS = 1 << 22


def draft_layout(
    spec_token_ids: Sequence[Sequence[int]],
    row_to_request: Sequence[int] | None,
    positions: Sequence[int] | None,
    batch_size: int | None = None,
) -> tuple[list[int], list[int], list[list[int]]]:
    """The row map, each row's draft position and each request's drafts as lists of ints: the
    one check of a draft layout against the batch (``batch_size``: the step's, ``None`` when
    no pipeline knows it). ``spec_token_ids`` holds one entry per request of the batch, in
    batch order (a list or tuple; a set or a mapping has no order); ints, not bools (the core
    checks the ranges of the tokens and positions). Both of ``row_to_request`` and
    ``positions``, or neither (then each request's ``k + 1`` rows at ``0 .. k``); a row's
    request is one of the batch. Anything else is a ``RequestError`` naming the field (and
    the request, where one is named), before anything changes."""
    most = _MAX_DRAFTS if batch_size is None else batch_size
    entries = _sequence(spec_token_ids, "spec_token_ids", most)
    if batch_size is not None and len(entries) != batch_size:
        n = len(entries) if len(entries) <= most else f"more than {most}"
        detail = f"{n} entries for a batch of {batch_size} requests (one per request, in order)"
        raise _refused(None, "spec_token_ids", detail)
    drafts = [_int_list(d, "spec_token_ids", r) for r, d in enumerate(entries)]
    if (row_to_request is None) != (positions is None):
        detail = "row_to_request and positions go together (each row's request and position)"
        raise _refused(None, "positions", detail)
    if row_to_request is None:
        rows = [r for r, d in enumerate(drafts) for _ in range(len(d) + 1)]
        pos = [j for d in drafts for j in range(len(d) + 1)]
        return rows, pos, drafts
    assert positions is not None
    rows = _int_list(row_to_request, "row_to_request")
    if batch_size is not None:
        for i, r in enumerate(rows):
            if not 0 <= r < batch_size:
                detail = f"row {i}: request {r} is not one of the batch's [0, {batch_size})"
                raise RequestError.located(i, "row_to_request", detail)
    return rows, _int_list(positions, "positions"), drafts


def _refused(index: int | None, field: str, detail: str) -> RequestError:
    if index is not None:
        return RequestError.located(index, field, detail)
    return RequestError.at(field, detail)


def _sequence(seq: Any, field: str, most: int, request: int | None = None) -> list[Any]:
    """The items of an ordered sequence (a list, tuple, 1-D tensor or array, any iterable
    that is no set, mapping, str or bytes), read once and at most ``most + 1`` of them (an
    endless one is refused by its length); anything else, or an iteration that raises, is a
    ``RequestError`` naming ``field`` (and the request)."""
    if isinstance(seq, (str, bytes, Set, Mapping)) or not isinstance(seq, Iterable):
        detail = f"expected a sequence in order, got {type(seq).__name__}"
        raise _refused(request, field, detail)
    try:
        items = seq.tolist() if isinstance(seq, torch.Tensor) else seq
        out = list(itertools.islice(iter(items), most + 1))
    except Exception as e:
        raise _refused(request, field, f"reading it raised {e!r}") from e
    return out


def _int_list(seq: Any, field: str, request: int | None = None) -> list[int]:
    """A sequence of ints (numpy's too, a 1-D tensor's); anything else, a bool or a non-int
    item is a ``RequestError`` naming ``field`` and the request (or the item's position)."""
    items = _sequence(seq, field, _MAX_DRAFTS, 0 if request is None else request)
    if len(items) > _MAX_DRAFTS:
        raise _refused(request, field, f"more than {_MAX_DRAFTS} items")
    out = []
    for i, v in enumerate(items):
        at = i if request is None else request
        if isinstance(v, bool):
            raise RequestError.located(at, field, f"item {i} is a bool, not an int")
        x = int_item(v)  # the core's one rule: no caller code runs
        if x is None:
            raise RequestError.located(at, field, f"item {i} is not an int: {_show(v)}")
        out.append(x)
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

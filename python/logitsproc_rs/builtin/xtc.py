"""XTC, "exclude top choices" (llama.cpp ``llama_sampler_xtc_apply``, text-generation-webui PR
#6335): per step and request draw ``u ~ U[0, 1)``; when ``u < xtc_probability``, among the
tokens whose probability ``p`` (the softmax of the row as it reaches XTC: after temperature and
the truncations) is at least ``xtc_threshold``, every one but the least probable becomes -inf.
Nothing happens when fewer than two tokens qualify (llama.cpp's ``pos_last > 0``; its
``min_keep`` is 1 here, which its check then always meets).

Ties: the least probable qualifying probability is kept by every token that has it, so a row
whose qualifying tokens all share one probability is left alone (llama.cpp keeps whichever of
them its sort puts last; text-generation-webui likewise). Rows holding NaN or +inf, and rows of
all -inf, have a NaN softmax: nothing qualifies, they are left alone.

The draw: a request with a ``seed`` draws its ``u`` from a ``torch.Generator`` of its own on the
logits' device, seeded once when the request is added with ``xtc_seed(seed)`` (a mix of the
seed, so the stream is not the one the sampler's generator, seeded with ``seed`` itself, draws
its noise from); one draw per step while the request is in the batch, so the same seed gives
the same draws whatever else is in the batch. The other rows share one batched draw from
torch's global generator of that device (skipped when every row is seeded). No host sync:
which rows are seeded is host-side bookkeeping (``XTCGenerators``, following the core's slot
changes on every front-end), the draws and the mask are device ops.

It changes the argmax, yet runs in the argmax-invariant phase, on purpose (as typical-p): that
phase is what only randomly sampled rows see (a greedy row takes its token from the snapshot
before it), and a greedy request's ``xtc_probability`` is reset to 0 besides (``SamplingParams``),
so a greedy row is never touched and consumes no draw of its own. See docs/semantics.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..interface import process_dict_updates
from ._truncation import NEG_INF, TruncationView

_MASK64 = (1 << 64) - 1
#: Mixed into a request's seed for its XTC generator ("XTC_SEED" in ASCII).
_XTC_SALT = 0x5854435F53454544
#: llama.cpp: a threshold above 0.5 is off (at most one token can then qualify).
THRESHOLD_OFF_ABOVE = 0.5


def xtc_seed(seed: int) -> int:
    """The seed of a request's XTC generator: splitmix64's finalizer of ``seed`` (mod 2**64)
    xor a salt, in ``[0, 2**64)``."""
    z = ((int(seed) & _MASK64) ^ _XTC_SALT) + 0x9E3779B97F4A7C15 & _MASK64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK64
    return z ^ (z >> 31)


def xtc_values(params: Any) -> tuple[float, float] | None:
    """A request's ``(probability, threshold)`` as the core stores them (float32), or None
    when XTC is off for it (probability 0, threshold above 0.5). Values already checked."""
    p = getattr(params, "xtc_probability", None)
    t = getattr(params, "xtc_threshold", None)
    prob = float(np.float32(0.0 if p is None else p))
    thr = float(np.float32(0.1 if t is None else t))
    if thr == 0.0:  # a positive threshold below float32's range (the core does the same)
        thr = float(np.finfo(np.float32).smallest_subnormal)
    if prob <= 0.0 or thr > THRESHOLD_OFF_ABOVE:
        return None
    return prob, thr


def xtc_generator(params: Any, device: torch.device) -> torch.Generator | None:
    """The request's own XTC generator: only for a request with XTC on and a seed."""
    seed = getattr(params, "seed", None)
    if seed is None or xtc_values(params) is None:
        return None
    return torch.Generator(device=device).manual_seed(xtc_seed(seed))


def draw_uniforms(
    rows: int, device: torch.device, seeded: list[tuple[int, torch.Generator]]
) -> torch.Tensor:
    """``u`` for each row, ``[rows]`` float32: one batched draw from the global generator
    (unless every row is seeded), then each seeded row's own draw, in ``seeded``'s order."""
    u = torch.empty(rows, dtype=torch.float32, device=device)
    if len(seeded) != rows:
        u.uniform_()
    for r, g in seeded:
        u[r].uniform_(generator=g)
    return u


def xtc_mask_(
    logits: torch.Tensor, probability: torch.Tensor, threshold: torch.Tensor, u: torch.Tensor
) -> torch.Tensor:
    """In place: XTC on the rows where ``u < probability`` (all three ``[rows, 1]``;
    probability 0 for rows without XTC)."""
    p = logits.softmax(dim=-1)
    qualifies = p >= threshold
    least = p.masked_fill(~qualifies, float("inf")).amin(dim=-1, keepdim=True)
    fire = (u < probability) & (qualifies.sum(dim=-1, keepdim=True) >= 2)
    return logits.masked_fill_(qualifies & (p > least) & fire, NEG_INF)


class XTCGenerators:
    """The seeded XTC requests' generators by slot, following the core's slot changes (a
    ``pipeline.SlotState``): V1 updates as vLLM's ``process_dict_updates``; stable-slot adds
    and removes pending until the next accepted step, the last one for a slot winning."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.by_slot: dict[int, torch.Generator] = {}
        self._pending: dict[int, torch.Generator | None] = {}

    def _new(self, params: Any, _prompt: Any = None, _output: Any = None) -> Any:
        return xtc_generator(params, self.device)

    def batch_update(self, update: Any) -> None:
        process_dict_updates(self.by_slot, update, self._new)

    def add_request(self, slot: int, params: Any) -> None:
        self._pending[slot] = self._new(params)

    def remove_request(self, slot: int) -> None:
        self._pending[slot] = None

    def step_slots(self) -> None:
        for slot, g in self._pending.items():
            if g is None:
                self.by_slot.pop(slot, None)
            else:
                self.by_slot[slot] = g
        self._pending.clear()

    def seeded_rows(self, rows: int, row_map: list[int] | None) -> list[tuple[int, Any]]:
        """``(row, generator)`` of the logits rows whose request is seeded: rows are slots
        (V1), or mapped through ``row_map`` (stable slots; a slot's rows each draw)."""
        by_slot = self.by_slot
        if not by_slot:
            return []
        if row_map is None:
            return sorted((s, g) for s, g in by_slot.items() if s < rows)
        return [(r, by_slot[s]) for r, s in enumerate(row_map[:rows]) if s in by_slot]


class XTCLogitsProcessor(TruncationView):
    """Reads ``params.xtc_probability`` (0: off) and ``params.xtc_threshold`` (0.1 by default;
    > 0.5: off). See the module for its draw, its ties and why it runs in the
    argmax-invariant phase."""

    TABLES = ("xtc",)
    REFERENCE = "logitsproc_rs.reference:RefXTCLogitsProcessor"

    def attach(self, pipeline: Any) -> None:
        self._gens: XTCGenerators = pipeline.attach_slot_state(
            "xtc", lambda: XTCGenerators(pipeline.device)
        )

    def _apply(self, logits: torch.Tensor, rowspace: bool) -> torch.Tensor:
        pipe = self._pipe
        if not pipe.count("xtc"):
            return logits
        rows = logits.shape[0]
        probability = pipe.dense("xtc.probability", rows, rowspace)
        threshold = pipe.dense("xtc.threshold", rows, rowspace)
        row_map = pipe.host_row_map() if rowspace and self._gens.by_slot else None
        u = draw_uniforms(rows, logits.device, self._gens.seeded_rows(rows, row_map))
        return xtc_mask_(logits, probability, threshold, u.unsqueeze(1))

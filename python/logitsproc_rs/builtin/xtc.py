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
which rows are seeded is the core's (its table keeps each seeded request's seed under a serial
that moves with it, on every front-end; ``XTCGenerators`` holds the generators by serial), the
draws and the mask are device ops. The fused ``batch_invariant`` pass (``_fused.py``) takes a
step's ``u`` through ``XTCLogitsProcessor.uniforms`` too: the same draws either way.

It changes the argmax, yet runs in the argmax-invariant phase, on purpose (as typical-p): that
phase is what only randomly sampled rows see (a greedy row takes its token from the snapshot
before it), and a greedy request's ``xtc_probability`` is reset to 0 besides (``SamplingParams``),
so a greedy row is never touched and consumes no draw of its own. See docs/semantics.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._truncation import NEG_INF, TruncationView

_MASK64 = (1 << 64) - 1
#: Mixed into a request's seed for its XTC generator ("XTC_SEED" in ASCII).
_XTC_SALT = 0x5854435F53454544


def xtc_seed(seed: int) -> int:
    """The seed of a request's XTC generator: splitmix64's finalizer of ``seed`` (mod 2**64)
    xor a salt, in ``[0, 2**64)``."""
    z = ((int(seed) & _MASK64) ^ _XTC_SALT) + 0x9E3779B97F4A7C15 & _MASK64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK64
    return z ^ (z >> 31)


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
    """The seeded XTC requests' generators, by the serial the core's table gives each request
    that has XTC on and a seed (``xtc.serial``, its seed beside it in ``xtc.seed``, 0 where
    none): which slot holds which request (adds, removes, moves, a stable slot's pending
    add, a refused step) is the table's, read here from its host buffers. A generator is made
    on its request's first draw and dropped once the table holds that serial no longer."""

    def __init__(self, pipe: Any) -> None:
        self.device = pipe.device
        self.serial: np.ndarray = pipe.host_section("xtc.serial")
        self.seed: np.ndarray = pipe.host_section("xtc.seed")
        self.by_serial: dict[int, torch.Generator] = {}

    def seeded_rows(self, rows: int, row_map: Any) -> list[tuple[int, torch.Generator]]:
        """``(row, generator)`` of the logits rows whose request is seeded, by row: rows are
        slots (V1, ``row_map`` None), or slots through ``row_map`` (stable slots; each row
        of a slot draws)."""
        serial = self.serial
        if not serial.any():
            return []
        if row_map is None:
            slots = np.arange(min(rows, len(serial)))
        else:
            slots = np.asarray(row_map[:rows], dtype=np.int64)
        out = [(r, self._generator(int(slots[r]))) for r in np.flatnonzero(serial[slots]).tolist()]
        if len(self.by_serial) > len(serial):
            live = set(serial[serial != 0].tolist())
            self.by_serial = {k: g for k, g in self.by_serial.items() if k in live}
        return out

    def _generator(self, slot: int) -> torch.Generator:
        key = int(self.serial[slot])
        g = self.by_serial.get(key)
        if g is None:
            g = torch.Generator(device=self.device).manual_seed(xtc_seed(int(self.seed[slot])))
            self.by_serial[key] = g
        return g


class XTCLogitsProcessor(TruncationView):
    """Reads ``params.xtc_probability`` and ``params.xtc_threshold`` (their default, range and
    what is off: ``rust/src/tables/xtc.rs``). See the module for its draw, its ties and why it
    runs in the argmax-invariant phase."""

    TABLES = ("xtc",)
    REFERENCE = "logitsproc_rs.reference:RefXTCLogitsProcessor"

    def attach(self, pipeline: Any) -> None:
        # One per pipeline, shared by every XTC view on it (each request draws once a step).
        self._gens: XTCGenerators = pipeline.shared_state("xtc", lambda: XTCGenerators(pipeline))

    def _apply(self, logits: torch.Tensor, rowspace: bool) -> torch.Tensor:
        pipe = self._pipe
        if not pipe.count("xtc"):
            return logits
        rows = logits.shape[0]
        probability = pipe.dense("xtc.probability", rows, rowspace)
        threshold = pipe.dense("xtc.threshold", rows, rowspace)
        u = self.uniforms(logits, rowspace)
        return xtc_mask_(logits, probability, threshold, u.unsqueeze(1))

    def uniforms(self, logits: torch.Tensor, rowspace: bool) -> torch.Tensor:
        """This step's ``u`` of each row of ``logits`` (``[rows]`` float32 on their device),
        consuming the draws of the step: ``_apply``'s and the fused pass's (``_fused.py``)."""
        rows = logits.shape[0]
        gens = self._gens
        row_map = self._pipe.host_row_map() if rowspace and gens.serial.any() else None
        return draw_uniforms(rows, logits.device, gens.seeded_rows(rows, row_map))

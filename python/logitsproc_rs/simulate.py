"""An engine's persistent batch in miniature, for tests, the demo and benchmarks.

``PersistentBatch`` reproduces the slot bookkeeping of vLLM 0.25.1's ``InputBatch``: a new
request takes the lowest freed slot (else the end of the batch), ``condense`` moves tail
requests into the holes that are left (UNIDIRECTIONAL moves, popping them from ``removed``),
and ``swap`` reorders (SWAP moves). ``ChurnSimulator`` drives it with seeded random arrivals,
finishes and swaps, and appends a token to every live request's output list each step, so
processors see the same live lists an engine would give them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from .interface import BatchUpdate, MoveDirectionality
from .params import SamplingParams
from .state import BatchUpdateBuilder


@dataclass
class Request:
    req_id: int
    params: SamplingParams
    prompt_token_ids: list[int] | None
    output_token_ids: list[int] = field(default_factory=list)
    max_tokens: int = 64


class PersistentBatch:
    """Slots ``[0, num_reqs)`` of a batch with capacity ``max_num_seqs``."""

    def __init__(self, max_num_seqs: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.slots: list[Request | None] = [None] * max_num_seqs
        self.num_live = 0
        self.builder = BatchUpdateBuilder()

    @property
    def num_reqs(self) -> int:
        """Live requests; after ``condense`` they occupy exactly ``[0, num_reqs)``."""
        return self.num_live

    def remove(self, index: int) -> None:
        assert self.slots[index] is not None
        self.slots[index] = None
        self.num_live -= 1
        self.builder.removed_append(index)

    def add(self, req: Request) -> int:
        index = self.builder.pop_removed()
        if index is None:
            index = self.num_live
        assert index < self.max_num_seqs and self.slots[index] is None
        self.slots[index] = req
        self.num_live += 1
        self.builder.added.append((index, req.params, req.prompt_token_ids, req.output_token_ids))
        return index

    def condense(self) -> None:
        """Fill holes from the tail, as ``InputBatch.condense`` (0.25.1)."""
        empty = self.builder.removed  # the builder's own list, sorted descending
        if not empty:
            return
        if self.num_live == 0:
            return
        last = self.num_live + len(empty) - 1
        while empty:
            while last in empty:
                last -= 1
            hole = self.builder.peek_removed()
            assert hole is not None
            if hole >= last:
                break
            self.builder.pop_removed()
            self.slots[hole], self.slots[last] = self.slots[last], None
            self.builder.moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
            last -= 1

    def swap(self, i1: int, i2: int) -> None:
        self.slots[i1], self.slots[i2] = self.slots[i2], self.slots[i1]
        self.builder.moved.append((i1, i2, MoveDirectionality.SWAP))

    def refresh(self) -> BatchUpdate | None:
        """The step's update (``None`` when nothing changed)."""
        return self.builder.get_and_reset(self.num_live)

    def rows(self) -> list[Request]:
        reqs = self.slots[: self.num_live]
        assert all(r is not None for r in reqs), "batch not condensed"
        return reqs  # type: ignore[return-value]


ParamFactory = Callable[[random.Random], SamplingParams]
TokenFactory = Callable[[random.Random, Request], int]


class ChurnSimulator:
    """Seeded arrivals, finishes and reorders over a ``PersistentBatch``.

    Each ``step()``: every live request gains one output token (from ``next_token``); each
    finishes with probability ``finish_prob`` or at its ``max_tokens``; new requests arrive to
    refill toward ``target_batch`` (with some jitter); the batch condenses; a few random swaps
    reorder it. Returns the step's ``BatchUpdate`` (or ``None``).
    """

    def __init__(
        self,
        max_num_seqs: int,
        vocab_size: int,
        seed: int,
        make_params: ParamFactory,
        target_batch: int | None = None,
        finish_prob: float = 1 / 64,
        swap_prob: float = 0.05,
        max_tokens: tuple[int, int] = (8, 256),
        next_token: TokenFactory | None = None,
        prompt_len: tuple[int, int] = (1, 32),
    ) -> None:
        self.rng = random.Random(seed)
        self.batch = PersistentBatch(max_num_seqs)
        self.vocab_size = vocab_size
        self.make_params = make_params
        self.target = target_batch if target_batch is not None else max_num_seqs
        self.finish_prob = finish_prob
        self.swap_prob = swap_prob
        self.max_tokens = max_tokens
        self.prompt_len = prompt_len
        self.next_token = next_token or (lambda rng, req: rng.randrange(self.vocab_size))
        self._next_id = 0
        self.steps = 0

    def _new_request(self) -> Request:
        rng = self.rng
        prompt = None
        if rng.random() > 0.05:  # a few prompt-embeds requests (no prompt ids)
            prompt = [rng.randrange(self.vocab_size) for _ in range(rng.randint(*self.prompt_len))]
        req = Request(
            req_id=self._next_id,
            params=self.make_params(rng),
            prompt_token_ids=prompt,
            max_tokens=rng.randint(*self.max_tokens),
        )
        self._next_id += 1
        return req

    def step(self) -> BatchUpdate | None:
        rng, batch = self.rng, self.batch
        if self.steps > 0:
            for req in batch.rows():
                req.output_token_ids.append(self.next_token(rng, req))
        self.steps += 1
        for i, req in enumerate(batch.rows()):
            if len(req.output_token_ids) >= req.max_tokens or rng.random() < self.finish_prob:
                batch.remove(i)
        want = self.target - batch.num_live
        if want > 0 and rng.random() < 0.9:
            n = min(want, rng.randint(1, max(1, want)))
            for _ in range(n):
                batch.add(self._new_request())
        batch.condense()
        n = batch.num_live
        if n >= 2 and rng.random() < self.swap_prob * 4:
            for _ in range(rng.randint(1, 3)):
                i1, i2 = rng.randrange(n), rng.randrange(n)
                if i1 != i2:
                    batch.swap(i1, i2)
        return batch.refresh()

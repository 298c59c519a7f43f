"""The demo's workload: a simulated engine's churn, its requests' parameters and its logits.

``EngineWorkload`` drives a ``ChurnSimulator`` the way an engine loop would: each step the
persistent batch condenses and reorders, and every live request's output list grows by the
token *our* sampler picked for it last step (``feed_back``); a stop token (or EOS without
``ignore_eos``) past ``min_tokens`` finishes the request, as an engine's stop check would. It
also holds what an engine rebuilds around the sampler: the ``SamplingMetadata`` (only when the
batch changed) with identically seeded per-request generators for each side, and seeded
synthetic logits with a few boosted columns, so requests repeat tokens (penalties), hit bad
words, open and close thinking sections and end on their stop tokens.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable
from typing import Any

import torch

from ..builtin import BUILTINS
from ..interface import BatchUpdate
from ..params import SamplingParams, SamplingType
from ..reference import RefLogitsProcessors
from ..registry import TABLES
from ..sampler import SamplingMetadata
from ..simulate import ChurnSimulator, Request
from ..state import LogitsProcessors

EOS = 2
STOP_POOL = (3, 4, 5, 6, 7)  # per-request stop_token_ids are drawn from these
HOT_TOKENS = tuple(range(100, 116))  # boosted in the logits: repeats (penalties), bad words
LOGIT_SCALE = 2.0  # logits = randn * LOGIT_SCALE, then the boosts below
HOT_BOOST = 6.0
STOP_BOOST = 5.5  # EOS and the stop pool: requests do end on them (after min_tokens)

# Processor class name (``Ref`` prefix removed) → the request parameter it serves.


def _feature(table: str) -> str:
    """A table's feature: its one request field, or the table's name when it reads several."""
    fields = TABLES[table].fields
    return fields[0].name if len(fields) == 1 else table


# Which request feature each processor serves (by class name, a reference's ``Ref`` prefix
# removed), from the built-ins and the core's registry.
FEATURES = {c.__name__: _feature(c.TABLES[0]) for c in BUILTINS}
# Reasoning markers among the hot tokens, so thinking sections open and budgets run out.
THINK_START = [HOT_TOKENS[-1]]
THINK_END = [HOT_TOKENS[-2], HOT_TOKENS[-3]]

FINISH_PROB = 1 / 128  # the demo's churn: about 1 in 128 requests finishes at random per step
MAX_TOKENS = (16, 512)  # each request's max_tokens is drawn from this range


def processor_name(p: Any) -> str:
    """A processor's class name with a reference's ``Ref`` prefix removed."""
    return re.sub(r"^(Reference|Ref)", "", type(p).__name__)


def processor_features(procs: LogitsProcessors | RefLogitsProcessors) -> set[str]:
    """The request parameters ``procs`` can serve, from the processor class names."""
    out = set()
    for p in procs.all:
        name = processor_name(p)
        if name in FEATURES:
            out.add(FEATURES[name])
    return out


def make_params_factory(
    vocab: int, features: set[str]
) -> Callable[[random.Random], SamplingParams]:
    """Mixed sampling parameters; only the features in ``features`` are ever set."""

    def make_params(rng: random.Random) -> SamplingParams:
        kw: dict[str, Any] = {"max_tokens": None, "eos_token_id": EOS}
        if rng.random() < 0.3:
            kw["temperature"] = 0.0  # greedy
        else:
            kw["temperature"] = rng.choice((0.5, 0.7, 1.0, 1.0, 1.3))
            if rng.random() < 0.7:
                kw["seed"] = rng.randrange(2**31)
            kw["top_k"] = rng.choice((0, 0, 0, 20, 50))
            kw["top_p"] = rng.choice((1.0, 1.0, 1.0, 0.9, 0.95))
            if "min_p" in features and rng.random() < 0.4:
                kw["min_p"] = rng.choice((0.02, 0.05, 0.1, 0.2))
        if "logit_bias" in features and rng.random() < 0.3:
            kw["logit_bias"] = {
                (rng.choice(HOT_TOKENS) if rng.random() < 0.5 else rng.randrange(vocab)): (
                    rng.choice((-100.0, -5.0, -1.5, 0.5, 2.0, 5.0))
                )
                for _ in range(rng.randint(1, 10))
            }
        if "min_tokens" in features and rng.random() < 0.4:
            kw["min_tokens"] = rng.choice((2, 5, 10, 30))
            kw["stop_token_ids"] = rng.sample(STOP_POOL, rng.randint(0, 3))
            kw["ignore_eos"] = rng.random() < 0.05
        if "penalties" in features and rng.random() < 0.3:
            kw["repetition_penalty"] = rng.choice((1.0, 1.1, 1.3))
            kw["frequency_penalty"] = rng.choice((0.0, 0.2, 0.5, -0.3))
            kw["presence_penalty"] = rng.choice((0.0, 0.5, 1.0))
        if "bad_words" in features and rng.random() < 0.15:
            kw["bad_words_token_ids"] = [
                [rng.choice(HOT_TOKENS) for _ in range(rng.randint(1, 3))]
                for _ in range(rng.randint(1, 3))
            ]
        if "thinking_token_budget" in features and rng.random() < 0.3:
            kw["thinking_token_budget"] = rng.choice((0, 4, 16, 64))
        if "allowed_token_ids" in features and rng.random() < 0.05:
            allowed = set(rng.sample(range(vocab), 100)) | set(HOT_TOKENS[:4]) | {EOS}
            kw["allowed_token_ids"] = sorted(allowed)
        return SamplingParams(**kw)

    return make_params


def logit_boosts(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, boosts) for ``make_logits``: the hot tokens and the stop tokens."""
    boost = {t: HOT_BOOST for t in HOT_TOKENS} | {t: STOP_BOOST for t in (EOS, *STOP_POOL)}
    ids = torch.tensor(list(boost), dtype=torch.int64, device=device)
    return ids, torch.tensor(list(boost.values()), dtype=torch.float32, device=device)


def make_logits(
    g: torch.Generator,
    rows: int,
    vocab: int,
    device: torch.device,
    boost_ids: torch.Tensor,
    boost_vals: torch.Tensor,
) -> torch.Tensor:
    """Seeded Gaussian logits, generated on the device, with a few boosted columns."""
    x = torch.randn(rows, vocab, generator=g, device=device).mul_(LOGIT_SCALE)
    x[:, boost_ids] += boost_vals
    return x


@dataclasses.dataclass
class ChurnCounts:
    """What the workload did over a run."""

    steps: int = 0
    none_steps: int = 0  # steps without a batch change (``update`` None)
    added: int = 0
    finished: int = 0
    stop_finished: int = 0  # finished on a stop token or EOS (the rest: max_tokens, at random)
    uni_moves: int = 0
    swaps: int = 0
    max_batch: int = 0
    rows_sampled: int = 0
    random_rows: int = 0
    min_tokens_violations: int = 0  # stop tokens sampled before min_tokens: must stay 0


class EngineWorkload:
    """A simulated engine around the sampler: churn, sampled tokens fed back, the sampling
    metadata of both sides (ours, the reference) and the logits of each step."""

    def __init__(
        self, batch: int, vocab: int, seed: int, features: set[str], device: torch.device
    ) -> None:
        self.vocab, self.device = vocab, device
        self.counts = ChurnCounts()
        self._pending: dict[int, int] = {}  # req_id -> the token our sampler picked last step
        self.sim = ChurnSimulator(
            batch,
            vocab,
            seed,
            make_params_factory(vocab, features),
            finish_prob=FINISH_PROB,
            max_tokens=MAX_TOKENS,
            next_token=self._next_token,
        )
        self._logits_gen = torch.Generator(device=device).manual_seed(seed + 1)
        self._boost_ids, self._boost_vals = logit_boosts(device)
        # req_id -> (ours, reference): identically seeded generators of the seeded rows
        self._gens: dict[int, tuple[torch.Generator, torch.Generator]] = {}
        self._md: tuple[SamplingMetadata, SamplingMetadata] | None = None

    def _next_token(self, _rng: random.Random, req: Request) -> int:
        """Feed back the real sample; a stop token (or EOS without ignore_eos) past
        min_tokens ends the request this step, as an engine's stop check would."""
        c = self.counts
        tok = self._pending.pop(req.req_id)
        n = len(req.output_token_ids)  # tokens generated before this one
        p = req.params
        if tok in p.all_stop_token_ids and n < p.min_tokens:
            c.min_tokens_violations += 1
        is_stop = tok in (p.stop_token_ids or ()) or (tok == p.eos_token_id and not p.ignore_eos)
        if is_stop and n + 1 >= p.min_tokens:
            req.max_tokens = n + 1  # finishes in this step's finish check
            c.stop_finished += 1
        return tok

    def step(self) -> tuple[BatchUpdate | None, list[Request]]:
        """One engine step of churn: (the batch update, the rows after it)."""
        update = self.sim.step()
        rows = self.sim.batch.rows()
        c = self.counts
        c.steps += 1
        c.max_batch = max(c.max_batch, len(rows))
        if update is None:
            c.none_steps += 1
        else:
            c.added += len(update.added)
            for _, _, d in update.moved:
                c.uni_moves += d.name == "UNIDIRECTIONAL"
                c.swaps += d.name == "SWAP"
        return update, rows

    def metadata(
        self, rows: list[Request], changed: bool
    ) -> tuple[SamplingMetadata, SamplingMetadata]:
        """(ours, the reference's) sampling metadata of ``rows``, rebuilt only when the batch
        ``changed``; the same parameters, each side with its own seeded generators."""
        if self._md is None or changed:
            live = {r.req_id for r in rows}
            for rid in [rid for rid in self._gens if rid not in live]:
                del self._gens[rid]
            gen_ours, gen_ref = {}, {}
            for i, r in enumerate(rows):
                if r.params.sampling_type != SamplingType.RANDOM_SEED:
                    continue
                if r.req_id not in self._gens:
                    seed = r.params.seed
                    assert seed is not None  # RANDOM_SEED means a seed
                    self._gens[r.req_id] = (
                        torch.Generator(device=self.device).manual_seed(seed),
                        torch.Generator(device=self.device).manual_seed(seed),
                    )
                gen_ours[i], gen_ref[i] = self._gens[r.req_id]
            md_ours = SamplingMetadata.from_params(
                [r.params for r in rows], self.vocab, self.device, generators=gen_ours
            )
            self._md = md_ours, dataclasses.replace(md_ours, generators=gen_ref)
        c = self.counts
        c.rows_sampled += len(rows)
        c.random_rows += sum(r.params.sampling_type != SamplingType.GREEDY for r in rows)
        return self._md

    def logits(self, rows: int) -> torch.Tensor:
        """This step's logits, ``rows`` x vocab, on the device."""
        return make_logits(
            self._logits_gen, rows, self.vocab, self.device, self._boost_ids, self._boost_vals
        )

    def feed_back(self, rows: list[Request], tokens: list[int]) -> None:
        """The tokens sampled for ``rows``: each request's output list grows by its own next
        step (and a stop token finishes it then)."""
        for r, tok in zip(rows, tokens, strict=True):
            self._pending[r.req_id] = tok

    def finish(self) -> ChurnCounts:
        """The counts of the run, with the requests finished (arrived and no longer live)."""
        self.counts.finished = self.counts.added - self.sim.batch.num_reqs
        return self.counts

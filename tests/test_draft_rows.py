"""Draft rows by position on the stable-slot front-end (speculative decoding, vLLM's Model
Runner V2 layout), against the plain reference, under seeded random churn.

A request owns a run of consecutive rows; the row at draft position ``j`` scores the token
after the committed history followed by the drafts ``d_0 .. d_{j-1}`` (``input_ids`` of the
run's rows ``1 .. j``). Its expected logits are each reference processor applied to one
reference request per row: the slot's params and prompt, and the slot's committed output
followed by those drafts. Every processor that reads histories is on (penalties with and
without a window, bad words, MinTokens, the thinking budget, DRY, no-repeat-ngram), with the
history-free ones (logit bias, allowed ids, the truncations) alongside; each processor's
``apply_rows`` is compared exactly, fed the same input, and ``apply`` gives the chain. After
the step the committed state is untouched: a step without drafts then matches too.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from typing import Any

import pytest
import torch
from bad_input._junk import bad_layouts
from test_differential import random_logits
from test_pipeline import config, make_sim
from test_property import HOT, machine_config

from logitsproc_rs import (
    BatchUpdate,
    ColumnLogitsProcessor,
    EngineConfig,
    FloatColumn,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.builtin import OPT_IN_PROCESSORS, MinPLogitsProcessor, XTCLogitsProcessor
from logitsproc_rs.errors import RequestError
from logitsproc_rs.reference import reference_of

# Every opt-in processor but XTC (its draws are per request and step, not per reference).
OPT_IN = [c for c in OPT_IN_PROCESSORS if c is not XTCLogitsProcessor]
K = 3  # most drafts per request


def random_params(rng: random.Random, vocab: int, start: list[int], end: list[int]) -> Any:
    """A request that turns on a random subset of the history-reading processors."""
    p: dict[str, Any] = {}
    on = rng.random
    if on() < 0.5:
        p["repetition_penalty"] = rng.choice((1.5, 0.5, 2.0))
        p["frequency_penalty"] = rng.choice((0.0, 0.5, -1.0))
        p["presence_penalty"] = rng.choice((0.0, 1.0, -0.5))
        if on() < 0.3:
            p["penalty_last_n"] = rng.choice((1, 2, 4))
    if on() < 0.4:
        p["bad_words_token_ids"] = [
            [rng.choice(HOT) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 3))
        ]
    if on() < 0.4:
        p["min_tokens"] = rng.randint(1, 8)
        p["stop_token_ids"] = rng.sample(HOT, rng.randint(1, 2))
    if on() < 0.3:
        p["thinking_token_budget"] = rng.randint(0, 4)
    if on() < 0.3:
        p["dry_multiplier"] = rng.choice((0.8, 2.0))
        p["dry_allowed_length"] = rng.randint(1, 2)
        p["dry_sequence_breakers"] = [[rng.choice(HOT)]]
        p["dry_penalty_last_n"] = rng.choice((-1, 4, 7))  # short windows slide under drafts
    if on() < 0.3:
        p["no_repeat_ngram_size"] = rng.randint(1, 3)
        p["no_repeat_ngram_window"] = rng.choice((0, 3, 5))
    if on() < 0.2:
        p["logit_bias"] = {rng.randrange(vocab): rng.choice((5.0, -5.0, 0.5))}
    if on() < 0.1:
        p["allowed_token_ids"] = sorted(set(rng.sample(range(vocab), 3)) | {*start, *end})
    if on() < 0.2:
        p["top_n_sigma"] = rng.choice((0.5, 2.0))
    if on() < 0.2:
        p["typical_p"] = rng.choice((0.5, 0.9))
    if on() < 0.2:
        p["epsilon_cutoff"] = rng.choice((0.01, 0.1))
    if on() < 0.2:
        p["eta_cutoff"] = rng.choice((0.01, 0.2))
    return SamplingParams(temperature=rng.choice((0.0, 0.8, 1.0)), **p)


def position_reference(
    ref: Any,
    outputs: dict[int, list[int]],
    batch: int,
    x: torch.Tensor,
    row_map: list[int],
    pos: list[int],
    drafts: dict[int, list[int]],
) -> torch.Tensor:
    """A plain reference processor (V1 batch index = slot, holding the live lists
    ``outputs``) on logits ``x`` whose row ``r`` is slot ``row_map[r]``'s at draft position
    ``pos[r]``: the rows at position ``j`` go through one slot-space batch of a copy of the
    reference that stepped through the slots' first ``j`` drafts, one token per step (the
    reference itself for ``j = 0``)."""
    out = x.clone()
    vocab = x.shape[1]
    for j in range(max(pos, default=-1) + 1):
        if j:
            memo: dict[int, Any] = {}
            ref = copy.deepcopy(ref, memo)
            outputs = {s: memo.get(id(o), list(o)) for s, o in outputs.items()}
            for s in {s for r, s in enumerate(row_map) if pos[r] >= j}:
                outputs[s].append(drafts[s][j - 1])
            ref.update_state(None)
        rows = [r for r in range(len(row_map)) if pos[r] == j]
        y = torch.zeros(batch, vocab)
        for r in rows:
            y[row_map[r]] = x[r]
        y = ref.apply(y)
        for r in rows:
            out[r] = y[row_map[r]]
    return out


def assert_rows_equal(
    name: str, mine: torch.Tensor, theirs: torch.Tensor, what: str, exact: bool = True
) -> None:
    """Exactly; or on a GPU (``exact=False``: CUDA divides by the repetition penalty where
    the CPU multiplies by its reciprocal, as vLLM) the same −inf and close finite values."""
    if not exact:
        finite = torch.isfinite(theirs)
        same_inf = torch.equal(torch.isneginf(mine), torch.isneginf(theirs))
        close = torch.allclose(mine[finite], theirs[finite], rtol=1e-6, atol=1e-5)
        assert same_inf and close, f"{name}: rows differ ({what})"
        return
    if not torch.equal(mine.isnan(), theirs.isnan()) or not torch.equal(
        mine.nan_to_num(), theirs.nan_to_num()
    ):
        bad = (mine != theirs).nonzero().tolist()[:5]
        raise AssertionError(f"{name}: rows differ at {bad} ({what})")


class Churn:
    def __init__(
        self, seed: int, slots: int, vocab: int, emulate: bool = False, device: str = "cpu"
    ) -> None:
        self.device = torch.device(device)
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.cfg = machine_config(slots, vocab, multi_start=bool(seed % 2))
        self.start = list(self.cfg.reasoning_start_token_ids)
        self.end = list(self.cfg.reasoning_end_token_ids)
        self.B, self.V = slots, vocab
        procs = build_logitsprocs(
            self.cfg, "cpu", False, custom_logitsprocs=OPT_IN, stable_slots=True,
            token_feed=True, max_rows=slots * (K + 1), emulate_device=emulate,
        ) if device == "cpu" else build_logitsprocs(
            self.cfg, device, True, custom_logitsprocs=OPT_IN, stable_slots=True,
            token_feed=True, max_rows=slots * (K + 1),
        )  # fmt: skip
        self.pipe = procs.pipeline
        self.procs = [p for p in self.pipe._views if not isinstance(p, MinPLogitsProcessor)]
        self.live: dict[int, tuple[Any, list[int], list[int]]] = {}  # params, prompt, output
        self.last: list[int] = []  # slots that had rows last step
        # One plain reference per processor whose V1 batch index is the slot, fed as the
        # pipeline is; each holds the live output lists of ref_outputs.
        self.refs = [reference_of(type(p))(self.cfg, torch.device("cpu"), False)
                     for p in self.procs]  # fmt: skip
        for r in self.refs:
            r.update_state(BatchUpdate(self.B, [], [], []))
        self.ref_outputs: dict[int, list[int]] = {}
        self.changes: dict[int, Any] = {}

    def token(self, slot: int | None = None) -> int:
        rng, u = self.rng, self.rng.random()
        if u < 0.35:
            return rng.choice(HOT)
        if u < 0.5:
            return rng.choice((*self.start, *self.end))
        out = self.live[slot][2] if slot in self.live else []
        if u < 0.7 and out:
            return rng.choice(out)
        return rng.randrange(self.V)

    def churn(self) -> None:
        rng = self.rng
        for slot in range(self.B):
            u = rng.random()
            if slot in self.live and u < 0.1:
                self.pipe.remove_request(slot)
                del self.live[slot]
                self.changes[slot] = None
            elif u < (0.5 if slot not in self.live else 0.15):
                params = random_params(rng, self.V, self.start, self.end)
                prompt = [self.token() for _ in range(rng.randint(0, 5))]
                if rng.random() < 0.3:
                    prompt += self.start
                output = [self.token() for _ in range(rng.randint(0, 3))]
                self.pipe.add_request(slot, params, prompt, list(output))
                self.live[slot] = (params, prompt, output)
                self.changes[slot] = (params, prompt, output)

    def layout(self, drafts: bool) -> tuple[list[int], list[int], list[int]]:
        slots = [s for s in self.live if self.rng.random() < 0.9]
        self.rng.shuffle(slots)
        row_map, pos, ids = [], [], []
        for s in slots:
            n = self.rng.randint(0, K) if drafts else 0
            for j in range(n + 1):
                row_map.append(s)
                pos.append(j)
                ids.append(self.token(s) if j else self.rng.randrange(self.V))
        return row_map, pos, ids

    def reference(self, k: int, x: torch.Tensor, row_map, pos, ids) -> torch.Tensor:
        drafts: dict[int, list[int]] = {}
        for r, s in enumerate(row_map):
            if pos[r]:
                drafts[s] = ids[r - pos[r] + 1 : r + 1]
        return position_reference(self.refs[k], self.ref_outputs, self.B, x, row_map, pos, drafts)

    def commit_reference(self, feed, changes) -> None:
        """The references' side of a step: the feed to the occupants, then the changes."""
        for s, t in feed:
            self.ref_outputs[s].append(t)
        added, removed = [], []
        for slot, req in changes.items():
            if req is None:
                removed.append(slot)
                self.ref_outputs.pop(slot, None)
            else:
                params, prompt, output = req
                self.ref_outputs[slot] = list(output)
                added.append((slot, params, prompt, self.ref_outputs[slot]))
        update = BatchUpdate(self.B, removed, added, []) if changes else None
        for r in self.refs:
            r.update_state(update)

    def step(self, drafts: bool) -> None:
        # Last step's tokens (one per slot that had rows, as if one draft row won), then churn.
        feed = [(s, self.token(s)) for s in self.last if s in self.live]
        for s, t in feed:  # the feed goes to the slot's occupant before the step's changes
            self.live[s][2].append(t)
        self.churn()
        row_map, pos, ids = self.layout(drafts)
        tokens = [t for _, t in feed] if feed else None
        slots = [s for s, _ in feed] if feed else None
        x = random_logits(self.rng, self.gen, len(row_map), self.V)
        dev = self.device
        chained = self.pipe.apply(
            x.clone().to(dev), row_map, self.procs, tokens, slots, local_pos=pos, input_ids=ids
        ).cpu()
        self.commit_reference(feed, self.changes)
        self.changes = {}
        y = x
        for k, p in enumerate(self.procs):
            mine = p.apply_rows(y.clone().to(dev)).cpu()
            theirs = self.reference(k, y, row_map, pos, ids)
            assert_rows_equal(
                type(p).__name__,
                mine,
                theirs,
                f"map {row_map}, pos {pos}, ids {ids}",
                exact=dev.type == "cpu",
            )
            y = mine
        assert torch.equal(chained, y)
        self.last = sorted(set(row_map))


@pytest.mark.parametrize(
    ("seed", "emulate"), [*((s, False) for s in range(6)), *((s, True) for s in range(6, 9))]
)
def test_draft_rows_match_the_reference_per_position(seed, emulate):
    """The host path (Rust applies in place) and the device path (``emulate_device``: torch
    ops on uploaded tables, as on a GPU)."""
    c = Churn(seed, slots=4, vocab=24, emulate=emulate)
    for _ in range(60):
        c.step(drafts=c.rng.random() < 0.8)


@pytest.mark.parametrize(("seed", "emulate"), [(0, False), (1, False), (2, True)])
def test_v1_draft_rows_match_the_reference_per_position(seed, emulate):
    """The V1 front-end (``LogitsProcessors.apply_drafts``) under a persistent batch's churn
    (adds, finishes, condensing moves, swaps): each request's ``k + 1`` rows at positions
    ``0 .. k``, every processor of ours on them, against the reference per position."""
    v1_churn(seed, emulate)


def v1_churn(seed: int, emulate: bool = False, device: str = "cpu") -> None:
    vocab, batch = 32, 6
    cfg = dataclasses.replace(config(batch, vocab), num_speculative_tokens=K)
    procs = build_logitsprocs(
        cfg, device, device != "cpu", custom_logitsprocs=OPT_IN, emulate_device=emulate
    )
    views = [p for p in procs.all if not isinstance(p, MinPLogitsProcessor)]
    views.sort(key=lambda p: p.is_argmax_invariant())  # the non-invariant ones first
    refs = [reference_of(type(p))(cfg, torch.device("cpu"), False) for p in views]
    sim = make_sim(seed, batch, vocab, placeholders=False)
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    drafted = 0
    for _ in range(50):
        update = sim.step()
        procs.update_state(update)
        for r in refs:
            r.update_state(update)
        rows = sim.batch.rows()
        drafts = [[rng.randrange(vocab) for _ in range(rng.randint(0, K))] for _ in rows]
        row_map = [r for r, d in enumerate(drafts) for _ in range(len(d) + 1)]
        pos = [j for d in drafts for j in range(len(d) + 1)]
        drafted += len(row_map) - len(rows)
        x = random_logits(rng, g, len(row_map), vocab)
        chained = procs.apply_drafts(views, x.clone().to(device), drafts).cpu()
        # A layout that is not this batch's is refused and changes nothing (the rows below
        # are applied through the good layout's map).
        spec, bad_rows, bad_pos = rng.choice(bad_layouts(drafts))
        n = len(row_map) if bad_rows is None else len(bad_rows)
        with pytest.raises(RequestError):
            procs.apply_drafts(views, x[:n].clone().to(device), spec, bad_rows, bad_pos)
        outputs = {r: req.output_token_ids for r, req in enumerate(rows)}
        y = x
        for p, ref in zip(views, refs, strict=True):
            mine = p.apply_rows(y.clone().to(device)).cpu()
            theirs = position_reference(
                ref, outputs, batch, y, row_map, pos, dict(enumerate(drafts))
            )
            assert_rows_equal(type(p).__name__, mine, theirs, f"drafts {drafts}", device == "cpu")
            y = mine
        assert torch.equal(chained, y)
    assert drafted > 50


class _LastDraftBan(ColumnLogitsProcessor):
    """A column processor that reads drafts: on a row at draft position ``p > 0`` it adds
    ``lift * p`` to token 0 and bans the draft just before the row."""

    COLUMNS = (FloatColumn("lift", default=0.0, read=lambda sp: (sp.extra_args or {}).get("lift")),)
    READS_DRAFTS = True

    def is_argmax_invariant(self) -> bool:
        return False

    def transform(self, logits, cols, num_active):
        pos = cols["draft_pos"]
        logits[:, :1] += cols["lift"] * pos
        last = cols["drafts"].gather(1, (pos - 1).clamp(min=0))
        rows = (pos[:, 0] > 0).nonzero()[:, 0]
        logits[rows, last[rows, 0]] = float("-inf")
        return logits


def _last_draft_ban(x, lifts, pos, before):
    """The same, plainly, row by row."""
    out = x.clone()
    for r in range(x.shape[0]):
        out[r, 0] += lifts[r] * pos[r]
        if pos[r]:
            out[r, before[r][-1]] = float("-inf")
    return out


@pytest.mark.parametrize("front", ["v1", "stable"])
def test_a_column_processor_that_reads_drafts_sees_each_rows_position_and_drafts(front):
    rng = random.Random(7)
    vocab, batch = 16, 4
    cfg = EngineConfig(max_num_seqs=batch, vocab_size=vocab, num_speculative_tokens=K)
    kw = {"stable_slots": True, "token_feed": True} if front == "stable" else {}
    procs = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=[_LastDraftBan], **kw)
    proc = next(p for p in procs.all if isinstance(p, _LastDraftBan))
    lifts = [rng.choice((0.0, 0.5, 2.0)) for _ in range(batch)]
    params = [SamplingParams(extra_args={"lift": v} if v else None) for v in lifts]
    if front == "stable":
        for s, p in enumerate(params):
            procs.pipeline.add_request(s, p, [1], [])
    else:
        procs.update_state(
            BatchUpdate(batch, [], [(s, p, [1], []) for s, p in enumerate(params)], [])
        )
    for _ in range(5):
        drafts = [[rng.randrange(vocab) for _ in range(rng.randint(0, K))] for _ in range(batch)]
        rows = [r for r, d in enumerate(drafts) for _ in range(len(d) + 1)]
        pos = [j for d in drafts for j in range(len(d) + 1)]
        before = [drafts[r][:j] for r, j in zip(rows, pos, strict=True)]
        x = torch.randn(len(rows), vocab)
        if front == "stable":
            ids = [drafts[r][j - 1] if j else 0 for r, j in zip(rows, pos, strict=True)]
            got = procs.pipeline.apply(x.clone(), rows, [proc], local_pos=pos, input_ids=ids)
        else:
            procs.update_state(None)
            got = procs.apply_drafts([proc], x.clone(), drafts)
        want = _last_draft_ban(x, [lifts[r] for r in rows], pos, before)
        assert torch.equal(got, want)
    # Without a draft layout every row is at position 0 with no drafts.
    if front == "v1":
        assert torch.equal(proc.apply(x[:batch].clone()), x[:batch])

"""Stateful property test: the whole pipeline against the plain reference, under hypothesis.

A ``RuleBasedStateMachine`` drives ``build_logitsprocs`` (every processor: allowed ids, bad
words, MinTokens, LogitBias, MinP, penalties, thinking budget; one Rust core) and
``build_reference_logitsprocs`` through a persistent batch that follows vLLM's rules
(``simulate.PersistentBatch``: adds into the lowest freed slot, condense moves, SWAPs), with
output lists that grow between steps (stop ids, bad-word prefixes, reasoning markers, async
``-1`` placeholders filled in before ``apply``, truncations), and throws invalid updates,
invalid params, invalid token feeds and logits of the wrong shape at it in between.

After every step:

* the non-argmax-invariant processors give exactly the reference's logits (``torch.equal``),
  and MinP on that agrees up to the documented ties (``test_differential.TIE_TOL``);
* a rejected call raised ``ValueError`` and changed nothing: the arena views, the active
  counts, the status and the next logits are as before (and the reference never sees it, so
  the following valid steps also prove that no hidden state changed);
* nothing but ``ValueError`` ever escapes (pyo3's ``PanicException`` is a ``BaseException``).

``PipelineMachine`` reads the engine's output lists (the list feed), ``TokenFeedMachine``
takes the sampled token ids instead. ``LOGITSPROC_PROPERTY_EXAMPLES=N`` runs N examples of
each (default: a run of well under a minute); ``LOGITSPROC_PROPERTY_STEPS`` sets the steps
of one example.
"""

from __future__ import annotations

import math
import os
import random
from collections import Counter
from types import SimpleNamespace
from typing import Any

import torch
from bad_input._junk import registry_junk
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from test_differential import (
    FREQ_PRES_VALUES,
    REPETITION_VALUES,
    classify_min_p_diffs,
    random_logits,
)

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    MoveDirectionality,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.reference import build_reference_logitsprocs
from logitsproc_rs.simulate import PersistentBatch, Request

SWAP = MoveDirectionality.SWAP
UNI = MoveDirectionality.UNIDIRECTIONAL

EXAMPLES = int(os.environ.get("LOGITSPROC_PROPERTY_EXAMPLES", "150"))
STEPS = int(os.environ.get("LOGITSPROC_PROPERTY_STEPS", "30"))
NO_SHRINK = "LOGITSPROC_PROPERTY_NO_SHRINK"

# Small caps, so that "one over the cap" is cheap to build and often hit by valid requests.
CAPS = dict(
    max_logit_bias_entries=4,
    max_stop_token_ids=4,
    max_bad_words=3,
    max_bad_word_len=3,
    max_allowed_token_ids=6,
)
HOT = (0, 1, 2, 3)  # bad words, stop ids and allowed ids are drawn from these: they match often
BIAS_VALUES = (5.0, -5.0, 0.5, -0.5, 2.25, -100.0, 0.1)
MIN_P_VALUES = (0.0, 0.0, 0.05, 0.3, 1.0)
NAN, INF = math.nan, math.inf


# What the machines exercised, summed over every example of this process (see the last test).
TOTALS: Counter[str] = Counter()


class Unexpected(AssertionError):
    """Something other than ValueError escaped the library."""


def guarded(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call into the library; anything but a ValueError (a TypeError, an IndexError, pyo3's
    ``PanicException``, which is a ``BaseException``) fails the test with its type."""
    try:
        return fn(*args, **kwargs)
    except ValueError:
        raise
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # that is the point
        raise Unexpected(f"{type(e).__module__}.{type(e).__name__} escaped: {e!r}") from e


# --------------------------------------------------------------------------------------------
# Params


def draw_params(data: Any, vocab: int) -> SamplingParams:
    """A valid request (our SamplingParams validates it). Grid values only for the penalties,
    so that ours (Rust, fused) and the reference (torch ops) round identically."""
    d = data.draw
    tok = st.integers(0, vocab - 1)
    hot_or_any = st.one_of(st.sampled_from(HOT), tok)
    logit_bias = d(
        st.one_of(
            st.none(),
            st.just({}),
            st.dictionaries(hot_or_any, st.sampled_from(BIAS_VALUES), min_size=1, max_size=4),
        )
    )
    stop = d(st.lists(hot_or_any, max_size=3, unique=True))
    eos = d(st.one_of(st.none(), st.sampled_from(HOT)))
    allowed = d(st.one_of(st.none(), st.lists(hot_or_any, min_size=1, max_size=6)))
    bad_words = d(
        st.one_of(
            st.none(),
            st.lists(
                st.lists(st.sampled_from(HOT), min_size=1, max_size=3), min_size=1, max_size=3
            ),
        )
    )
    penalties = {}
    if d(st.booleans()):
        penalties = dict(
            repetition_penalty=d(st.sampled_from(REPETITION_VALUES)),
            frequency_penalty=d(st.sampled_from(FREQ_PRES_VALUES)),
            presence_penalty=d(st.sampled_from(FREQ_PRES_VALUES)),
        )
    return SamplingParams(
        temperature=d(st.sampled_from((0.0, 1.0, 1.0))),
        min_p=d(st.sampled_from(MIN_P_VALUES)),
        min_tokens=d(st.sampled_from((0, 0, 1, 2, 4, 9))),
        stop_token_ids=stop,
        eos_token_id=eos,
        logit_bias=logit_bias,
        allowed_token_ids=allowed,
        bad_words_token_ids=bad_words,
        thinking_token_budget=d(st.sampled_from((None, None, -1, 0, 1, 3))),
        max_tokens=None,
        **penalties,
    )


def bad_param_values(vocab: int) -> list[tuple[str, Any]]:
    """(field, value) pairs that no request may carry (each checked: a ValueError)."""
    c = CAPS
    return [
        ("min_p", NAN),
        ("min_p", -0.5),
        ("min_p", 1.5),
        ("min_p", INF),
        ("min_p", "0.1"),
        ("logit_bias", {vocab: 1.0}),
        ("logit_bias", {-1: 1.0}),
        ("logit_bias", {2**40: 1.0}),
        ("logit_bias", {0: NAN}),
        ("logit_bias", {0: -INF}),
        ("logit_bias", {"a": 1.0}),
        ("logit_bias", {0: "x"}),
        ("logit_bias", {i: 1.0 for i in range(c["max_logit_bias_entries"] + 1)}),
        ("logit_bias", [1, 2]),
        ("min_tokens", -1),
        ("min_tokens", 1.5),
        ("min_tokens", "3"),
        ("min_tokens", 2**70),
        ("_all_stop_token_ids", {vocab}),
        ("_all_stop_token_ids", {-1}),
        ("_all_stop_token_ids", set(range(c["max_stop_token_ids"] + 1))),
        ("_all_stop_token_ids", 5),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("repetition_penalty", NAN),
        ("repetition_penalty", INF),
        ("frequency_penalty", NAN),
        ("frequency_penalty", "x"),
        ("presence_penalty", INF),
        ("allowed_token_ids", [vocab]),
        ("allowed_token_ids", [-1]),
        ("allowed_token_ids", list(range(c["max_allowed_token_ids"] + 1))),
        ("allowed_token_ids", [True]),
        ("allowed_token_ids", []),
        ("allowed_token_ids", 5),
        ("bad_words_token_ids", [[vocab]]),
        ("bad_words_token_ids", [[-1]]),
        ("bad_words_token_ids", [[1]] * (c["max_bad_words"] + 1)),
        ("bad_words_token_ids", [[1] * (c["max_bad_word_len"] + 1)]),
        ("bad_words_token_ids", [[]]),
        ("bad_words_token_ids", [5]),
        ("thinking_token_budget", -5),
        ("thinking_token_budget", 1.5),
        ("thinking_token_budget", "x"),
        ("thinking_token_budget", 2**70),
    ]


class RaisingParams:
    """Duck-typed params whose ``field`` getter raises (a buggy or hostile params object)."""

    def __init__(self, base: SamplingParams, field: str, exc: BaseException) -> None:
        self._base, self._field, self._exc = base, field, exc

    def __getattr__(self, name: str) -> Any:
        if name == self._field:
            raise self._exc
        return getattr(self._base, name)


def registry_bad_values(tables: Any) -> list[tuple[str, Any]]:
    """(attribute, value) for every field the core's registry lists for ``tables`` and every
    value of its kind no request may hold (``bad_input._junk``: huge ints, bools and 0-d
    tensors in disguise, endless and raising iterables): a new field inherits them."""
    return [
        ("_all_stop_token_ids" if f.attr == "all_stop_token_ids" else f.attr, v)
        for f, v in registry_junk(tables)
    ]


def draw_bad_params(data: Any, vocab: int, tables: Any = None) -> Any:
    """A request with one bad field: ``bad_param_values``, or (``tables``: the tables the
    pipeline holds) one of the registry's values for them."""
    base = draw_params(data, vocab)
    if data.draw(st.integers(0, 9)) == 0:
        field = data.draw(
            st.sampled_from(("min_p", "logit_bias", "min_tokens", "allowed_token_ids"))
        )
        return RaisingParams(base, field, RuntimeError("boom"))
    bad = bad_param_values(vocab)
    if tables is not None and data.draw(st.booleans()):
        bad = registry_bad_values(tables)
    field, value = data.draw(st.sampled_from(bad))
    # Stop ids are only read while min_tokens is pending; make sure they are.
    object.__setattr__(base, "min_tokens", 3 if field == "_all_stop_token_ids" else base.min_tokens)
    object.__setattr__(base, field, value)
    return base


# --------------------------------------------------------------------------------------------
# The machine


def machine_config(max_num_seqs: int, vocab: int, multi_start: bool) -> EngineConfig:
    """A state machine's engine config: the last vocabulary ids are the reasoning markers (one
    or two start ids, one end id), the caps small (``CAPS``)."""
    start = [vocab - 3, vocab - 2] if multi_start else [vocab - 2]
    return EngineConfig(
        max_num_seqs=max_num_seqs,
        vocab_size=vocab,
        reasoning_start_token_ids=start,
        reasoning_end_token_ids=[vocab - 1],
        **CAPS,
    )


class PipelineMachine(RuleBasedStateMachine):
    TOKEN_FEED = False

    def __init__(self) -> None:
        super().__init__()
        self.stats: dict[str, int] = {}

    def count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1
        TOTALS[f"{type(self).__name__}.{what}"] += 1

    @initialize(
        max_num_seqs=st.integers(1, 6),
        vocab=st.integers(12, 40),
        multi_start=st.booleans(),
        seed=st.integers(0, 2**31),
    )
    def setup(self, max_num_seqs: int, vocab: int, multi_start: bool, seed: int) -> None:
        self.cfg = machine_config(max_num_seqs, vocab, multi_start)
        self.start = list(self.cfg.reasoning_start_token_ids or ())
        self.end = list(self.cfg.reasoning_end_token_ids or ())
        self.V, self.B = vocab, max_num_seqs
        self.ours = guarded(build_logitsprocs, self.cfg, "cpu", False, token_feed=self.TOKEN_FEED)
        self.ref = build_reference_logitsprocs(self.cfg, "cpu")
        self.batch = PersistentBatch(max_num_seqs)
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.next_id = 0

    # --- helpers ----------------------------------------------------------------------------

    @property
    def rows(self) -> list[Request]:
        return self.batch.rows()

    def new_request(self, data: Any, params: Any = None) -> Request:
        v = self.V
        prompt = data.draw(
            st.one_of(
                st.none(),
                st.lists(
                    st.one_of(
                        st.sampled_from((*HOT, *self.start, *self.end)), st.integers(0, v - 1)
                    ),
                    max_size=6,
                ),
            )
        )
        # Resumed (preempted) requests come back with output already generated.
        output = (
            data.draw(st.lists(st.integers(0, v - 1), max_size=3))
            if data.draw(st.booleans())
            else []
        )
        if params is None:
            params = draw_params(data, v)
        self.next_id += 1
        return Request(self.next_id, params, prompt, output)

    def next_token(self, req: Request) -> int:
        """Mostly tokens that matter: hot (bad-word) ids, the request's stop ids, markers."""
        rng, u = self.rng, self.rng.random()
        if u < 0.35:
            return rng.choice(HOT)
        if u < 0.5 and req.params.all_stop_token_ids:
            return rng.choice(sorted(req.params.all_stop_token_ids))
        if u < 0.65:
            return rng.choice((*self.start, *self.end))
        return rng.randrange(self.V)

    def grow(self, data: Any, placeholders: bool) -> tuple[list[int], list[tuple[list[int], int]]]:
        """Each live row gets a token (or none). Returns the feed (by row, -1 for none) and
        the async placeholders to fill in before ``apply`` (list feed only)."""
        feed, pending = [], []
        for req in self.rows:
            u = self.rng.random()
            if u < 0.15:
                feed.append(-1)
                continue
            t = self.next_token(req)
            feed.append(t)
            if placeholders and u < 0.25:
                req.output_token_ids.append(-1)
                pending.append((req.output_token_ids, t))
            else:
                req.output_token_ids.append(t)
        return feed, pending

    def fresh_logits(self, rows: int | None = None) -> torch.Tensor:
        return random_logits(self.rng, self.gen, len(self.rows) if rows is None else rows, self.V)

    def our_logits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = x.clone()
        for p in self.ours.non_argmax_invariant:
            a = guarded(p.apply, a)
        b = a.clone()
        for p in self.ours.argmax_invariant:
            b = guarded(p.apply, b)
        return a, b

    def snapshot(self) -> dict[str, Any]:
        pipe = self.ours.pipeline
        x = self.fresh_logits()
        return {
            "views": [v.clone() for v in pipe.arena.views],
            "active": guarded(pipe.core.active),
            "status": list(pipe.status),
            "core_status": guarded(pipe.core.status),
            "batch_size": pipe.core.batch_size,
            "logits_in": x,
            "logits": self.our_logits(x),
        }

    def assert_unchanged(self, before: dict[str, Any], what: str) -> None:
        after = self.snapshot()
        assert before["active"] == after["active"], what
        assert before["status"] == after["status"], what
        assert before["core_status"] == after["core_status"], what
        assert before["batch_size"] == after["batch_size"], what
        for i, (a, b) in enumerate(zip(before["views"], after["views"], strict=True)):
            assert torch.equal(a, b), f"{what}: arena section {i} changed"
        again = self.our_logits(before["logits_in"])
        for k in range(2):
            assert torch.equal(before["logits"][k], again[k]), f"{what}: logits changed"

    def expect_rejected(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> None:
        before = self.snapshot()
        try:
            guarded(fn, *args, **kwargs)
        except ValueError:
            pass
        else:
            raise AssertionError(f"{what}: accepted")
        self.count("rejected")
        self.assert_unchanged(before, what)

    def step_both(self, update: BatchUpdate | None, feed: list[int] | None = None) -> None:
        if self.TOKEN_FEED and feed is not None:
            guarded(self.ours.update_state, update, sampled_token_ids=feed)
        else:
            guarded(self.ours.update_state, update)
        self.ref.update_state(update)

    def compare(self, pending: list[tuple[list[int], int]] = ()) -> None:
        # vLLM's runner fills async placeholders in before sampling, i.e. before apply.
        for out, t in pending:
            assert out[-1] == -1
            out[-1] = t
        x = self.fresh_logits()
        a, b = self.our_logits(x)
        ra = x.clone()
        for p in self.ref.non_argmax_invariant:
            ra = p.apply(ra)
        if not torch.equal(a, ra):
            # Name the first processor whose output differs, fed the same input on both sides.
            y = x.clone()
            for p, q in zip(
                self.ours.non_argmax_invariant, self.ref.non_argmax_invariant, strict=True
            ):
                mine, theirs = p.apply(y.clone()), q.apply(y.clone())
                if not torch.equal(mine, theirs):
                    r, c = (mine != theirs).nonzero(as_tuple=True)
                    req = self.rows[int(r[0])]
                    where = list(zip(r.tolist(), c.tolist(), strict=True))
                    raise AssertionError(
                        f"{type(p).__name__} differs at {where}: "
                        f"ours {mine[r, c].tolist()} reference {theirs[r, c].tolist()} "
                        f"(input {y[r, c].tolist()}); request {req.params}, prompt "
                        f"{req.prompt_token_ids}, output {req.output_token_ids}"
                    )
                y = theirs
            raise AssertionError(f"non-argmax-invariant phase differs at {int((a != ra).sum())}")
        rb = a.clone()
        for p in self.ref.argmax_invariant:
            rb = p.apply(rb)
        min_p = torch.tensor(
            [float(torch.tensor(r.params.min_p, dtype=torch.float32)) for r in self.rows]
        )
        _ties, bad = classify_min_p_diffs(a, b, rb, min_p)
        assert bad == 0, f"MinP differs at {bad} non-tie positions"
        self.count("compared")
        if not torch.equal(a, x):
            self.count("phase1_changed")
        if _ties:
            self.count("min_p_ties")
        if not torch.equal(b, a):
            self.count("min_p_masked")

    # --- valid steps ------------------------------------------------------------------------

    @rule(data=st.data())
    def churn_step(self, data: Any) -> None:
        """vLLM's step: outputs grow, some requests finish, new ones take the freed slots, the
        batch condenses, a few SWAPs reorder it."""
        feed, pending = self.grow(data, placeholders=not self.TOKEN_FEED)
        batch = self.batch
        n = batch.num_live
        for i in sorted(data.draw(st.sets(st.integers(0, max(0, n - 1)), max_size=n)) if n else ()):
            batch.remove(i)
        free = self.B - batch.num_live
        for _ in range(data.draw(st.integers(0, free))):
            batch.add(self.new_request(data))
        batch.condense()
        n = batch.num_live
        if n >= 2:
            for _ in range(data.draw(st.integers(0, 2))):
                i, j = data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, n - 1))
                if i != j:
                    batch.swap(i, j)
        update = batch.refresh()
        self.count("none" if update is None else "update")
        self.step_both(update, feed)
        self.compare(pending)

    @rule(data=st.data())
    def quiet_step(self, data: Any) -> None:
        """No batch change (``None``); outputs may still grow."""
        feed, pending = self.grow(data, placeholders=not self.TOKEN_FEED)
        if self.TOKEN_FEED and all(t == -1 for t in feed) and data.draw(st.booleans()):
            feed = None  # nothing sampled: the same as an all -1 feed
        self.step_both(None, feed)
        self.count("none")
        self.compare(pending)

    @precondition(lambda self: not self.TOKEN_FEED)
    @rule(data=st.data())
    def truncate_step(self, data: Any) -> None:
        """The engine shrinks an output list in place (list feed only), then a step."""
        rows = [r for r in self.rows if r.output_token_ids]
        if rows:
            r = data.draw(st.sampled_from(rows))
            k = data.draw(st.integers(1, len(r.output_token_ids)))
            # vLLM truncates a list (KV-load failure) between two reads and appends only after
            # the next read, so a read sees a shrink, never a shrink regrown to the old length
            # (tokens rewritten below the tail, which incremental matching does not re-read).
            del r.output_token_ids[-k:]
        self.step_both(None)
        self.compare()

    # --- invalid input ----------------------------------------------------------------------

    def free_slot(self) -> int | None:
        n = self.batch.num_live
        return n if n < self.B else None

    def base_update(self, data: Any) -> tuple[list[Any], list[Any], list[Any], int]:
        """A valid part (an add into a free slot, a SWAP) that must not be applied when the
        bad entry after it rejects the update. Returns (removed, added, moved, batch_size)."""
        n = self.batch.num_live
        added, moved = [], []
        slot = self.free_slot()
        if slot is not None and data.draw(st.booleans()):
            r = self.new_request(data)
            added.append((slot, r.params, r.prompt_token_ids, r.output_token_ids))
            n += 1
        if n >= 2 and data.draw(st.booleans()):
            moved.append((0, n - 1, SWAP))
        return [], added, moved, n

    @rule(data=st.data())
    def bad_params(self, data: Any) -> None:
        """A bad field in one request (after a valid add when there is room for two)."""
        _removed, added, moved, n = self.base_update(data)
        taken = {a[0] for a in added}
        free = [s for s in range(self.batch.num_live, self.B) if s not in taken]
        # No free slot: an add over an occupied slot (vLLM's replacement).
        slot = free[0] if free else data.draw(st.integers(0, self.B - 1))
        n = max(n, slot + 1)
        r = self.new_request(data, params=draw_bad_params(data, self.V, self.ours.pipeline.tables))
        added.append((slot, r.params, r.prompt_token_ids, r.output_token_ids))
        update = BatchUpdate(n, [], added, moved)
        desc = vars(r.params) if isinstance(r.params, SamplingParams) else r.params._field
        self.expect_rejected(f"bad params {desc}", self.ours.update_state, update)
        self.count("bad_params")

    @rule(
        data=st.data(),
        kind=st.sampled_from(
            [
                "added_oob",
                "removed_oob",
                "moved_oob",
                "self_move",
                "batch_over",
                "batch_negative",
                "batch_type",
                "added_twice",
                "added_short",
                "added_long",
                "moved_direction",
                "bool_index",
                "output_not_list",
                "prompt_bad_token",
                "removed_not_iterable",
                "added_not_iterable",
                "index_float",
                "index_huge",
            ]
        ),
    )
    def bad_update(self, data: Any, kind: str) -> None:
        removed, added, moved, n = self.base_update(data)
        B, V = self.B, self.V
        p = draw_params(data, V)
        slot = next(
            (s for s in range(B) if s not in {a[0] for a in added} and s >= self.batch.num_live), 0
        )
        batch_size: Any = n
        if kind == "added_oob":
            added.append(
                (data.draw(st.sampled_from((B, B + 1, 2**31, 2**63 - 1, -1))), p, None, [])
            )
        elif kind == "removed_oob":
            removed.append(data.draw(st.sampled_from((B, 2**40, -1))))
        elif kind == "moved_oob":
            moved.append(
                (
                    0,
                    data.draw(st.sampled_from((B, 2**40, -1))),
                    data.draw(st.sampled_from((SWAP, UNI))),
                )
            )
        elif kind == "self_move":
            i = data.draw(st.integers(0, B - 1))
            moved.append((i, i, data.draw(st.sampled_from((SWAP, UNI)))))
        elif kind == "batch_over":
            batch_size = B + data.draw(st.sampled_from((1, 2**40)))
        elif kind == "batch_negative":
            batch_size = -1
        elif kind == "batch_type":
            batch_size = data.draw(st.sampled_from((2.0, "3", None, [1])))
        elif kind == "added_twice":
            added.append((slot, p, None, []))
            added.append((slot, draw_params(data, V), None, []))
        elif kind == "added_short":
            added.append((slot, p, None))
        elif kind == "added_long":
            added.append((slot, p, None, [], 5))
        elif kind == "moved_direction":
            if B < 2:
                return
            moved.append((0, 1, data.draw(st.sampled_from((3, "SWAP", None, 2.0)))))
        elif kind == "bool_index":
            added.append((True, p, None, []))
        elif kind == "output_not_list":
            added.append((slot, p, None, data.draw(st.sampled_from((5, "abc", (1, 2), None)))))
        elif kind == "prompt_bad_token":
            object.__setattr__(p, "repetition_penalty", 1.5)  # a prompt that a table reads
            added.append((slot, p, [data.draw(st.sampled_from((V, -1, 2**40, 1.5)))], []))
        elif kind == "removed_not_iterable":
            removed = 5  # type: ignore[assignment]
        elif kind == "added_not_iterable":
            added = None  # type: ignore[assignment]
        elif kind == "index_float":
            added.append((1.0, p, None, []))
        elif kind == "index_huge":
            removed.append(2**70)
        if kind in (
            "added_twice",
            "added_short",
            "added_long",
            "output_not_list",
            "prompt_bad_token",
        ):
            batch_size = max(n, slot + 1)
        update = SimpleNamespace(batch_size=batch_size, removed=removed, added=added, moved=moved)
        self.expect_rejected(f"bad update {kind}: {update}", self.ours.update_state, update)
        self.count(f"bad_update.{kind}")

    @rule(data=st.data())
    def bad_logits(self, data: Any) -> None:
        """Logits that do not match the batch: a ValueError, or (a processor with nothing to
        do, like vLLM's early returns) the logits back untouched; never a write."""
        n, v = len(self.rows), self.V
        shape = data.draw(st.sampled_from(((n + 1, v), (n, v + 1), (n, v - 1), (v,), (1, n, v))))
        p = data.draw(st.sampled_from(list(self.ours.all)))
        x = self.fresh_logits(max(n, 1)).reshape(-1)[:1].expand(shape).contiguous()
        x0 = x.clone()
        before = self.snapshot()
        try:
            out = guarded(p.apply, x)
        except ValueError:
            self.count("rejected")
        else:
            assert out is x and torch.equal(x, x0), f"{type(p).__name__} wrote {shape} logits"
            self.count("skipped")
        assert torch.equal(x, x0), "rejected logits were modified"
        self.assert_unchanged(before, f"logits {shape} to {type(p).__name__}")

    @invariant()
    def no_leak(self) -> None:
        if hasattr(self, "ours"):
            assert self.ours.pipeline.core.batch_size == len(self.rows)


class TokenFeedMachine(PipelineMachine):
    """The same, with ``token_feed=True``: the pipeline gets the token each row of the last
    step sampled (-1 for none) instead of reading the output lists, and bad feeds too."""

    TOKEN_FEED = True

    @rule(
        data=st.data(),
        kind=st.sampled_from(
            [
                "out_of_vocab",
                "below_minus_one",
                "too_long",
                "floats",
                "float_tensor",
                "float_array",
                "string",
                "nested",
                "huge",
                "short",
                "long",
                "empty",
                "dict",
                "set",
                "array_2d",
                "tensor_0d",
                "bytes",
                "uint64_past_int64",
                "bool_item",
            ]
        ),
    )
    def bad_feed(self, data: Any, kind: str) -> None:
        import numpy as np

        n = len(self.rows)
        feed: list[Any] = [-1] * n
        pos = data.draw(st.integers(0, max(0, n - 1)))
        if (
            kind
            in (
                "out_of_vocab",
                "below_minus_one",
                "huge",
                "floats",
                "string",
                "nested",
                "bool_item",
            )
            and n == 0
        ):
            feed = [-1]
            pos = 0
        bad: Any = feed
        if kind == "out_of_vocab":
            feed[pos] = self.V
        elif kind == "below_minus_one":
            feed[pos] = data.draw(st.sampled_from((-2, -(2**40))))
        elif kind == "huge":
            feed[pos] = data.draw(st.sampled_from((2**40, 2**63 - 1, 2**70)))
        elif kind == "too_long":
            bad = [-1] * (self.B + 1)
        elif kind == "floats":
            feed[pos] = 1.0
        elif kind == "float_tensor":
            bad = torch.zeros(max(n, 1))
        elif kind == "float_array":
            bad = np.zeros(max(n, 1))
        elif kind == "string":
            bad = "1"
        elif kind == "nested":
            feed[pos] = [1]
        elif kind == "short":
            if n == 0:
                return
            bad = feed[: data.draw(st.integers(0, n - 1))]
        elif kind == "long":
            bad = [-1] * data.draw(st.integers(n + 1, n + 2))
        elif kind == "empty":
            if n == 0:
                return
            bad = []
        elif kind == "dict":
            bad = dict(enumerate(feed))
        elif kind == "set":
            bad = set(feed) | {0}
        elif kind == "array_2d":
            bad = np.array([feed or [-1]])
        elif kind == "tensor_0d":
            bad = torch.tensor(-1)
        elif kind == "bytes":
            bad = np.array(feed, dtype=np.int64).tobytes()
        elif kind == "uint64_past_int64":
            bad = np.array(feed or [0], dtype=np.int64).astype(np.uint64)
            bad[pos] = np.uint64(2**64 - 1)  # would wrap to -1: a silent "no token"
        elif kind == "bool_item":
            feed[pos] = True
        update = None
        if data.draw(st.booleans()):
            _r, added, moved, size = self.base_update(data)
            if added or moved:
                update = BatchUpdate(size, [], added, moved)
        self.expect_rejected(
            f"bad feed {kind}: {bad!r}", self.ours.update_state, update, sampled_token_ids=bad
        )


_SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    report_multiple_bugs=False,
    print_blob=True,
    # LOGITSPROC_PROPERTY_NO_SHRINK=1: report the first failure as found (shrinking a long
    # stateful run can take minutes).
    phases=[p for p in Phase if p is not Phase.shrink or not os.environ.get(NO_SHRINK)],
)

TestPipelineMachine = PipelineMachine.TestCase
TestPipelineMachine.settings = _SETTINGS
TestTokenFeedMachine = TokenFeedMachine.TestCase
TestTokenFeedMachine.settings = _SETTINGS


def test_the_machines_exercised_everything() -> None:
    """Runs after the machines (file order): every kind of step and check happened."""
    if not TOTALS:
        import pytest

        pytest.skip("the machines did not run in this process")
    for m in ("PipelineMachine", "TokenFeedMachine"):
        for what in ("update", "none", "compared", "rejected"):
            assert TOTALS[f"{m}.{what}"] > 0, (m, what, dict(TOTALS))
    print(sorted(TOTALS.items()))

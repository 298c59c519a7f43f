"""Thinking budget: ours (Rust state machine) vs the plain rescanning reference, plus the
bullets of the spec: multi-token markers, budget exhaustion, the forced end walk, re-entry
after a forced end, a prompt that already opened a thinking section, and the 0.25.1 SWAP
duplication bug not reproduced."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

import logitsproc_rs as L
from logitsproc_rs.interface import BatchUpdate, MoveDirectionality
from logitsproc_rs.reference_thinking import RefThinkingBudgetLogitsProcessor
from logitsproc_rs.simulate import ChurnSimulator

VOCAB = 16


def make_cfg(start, end, max_num_seqs=8):
    return L.EngineConfig(
        max_num_seqs=max_num_seqs,
        vocab_size=VOCAB,
        reasoning_start_token_ids=start,
        reasoning_end_token_ids=end,
    )


def forced_by_state(p) -> list[tuple[int, int]]:
    """The (row, token) pairs the processor's Rust state forces this step."""
    return p.pipeline.core.thinking_forced()


def active(p) -> int:
    """Requests the thinking table tracks."""
    return dict(p.pipeline.core.active())["thinking"]


def forced_rows(logits: torch.Tensor) -> dict[int, int]:
    hits = (logits == 1e9).nonzero().tolist()
    return {r: t for r, t in hits}


@pytest.mark.parametrize(
    ("start", "end", "seed", "batch"),
    [
        ([5], [7], 0, 8),
        ([5, 6], [7, 8], 1, 8),
        ([5], [7, 8, 9], 2, 32),
        ([5, 6], [7], 3, 64),
    ],
)
def test_churn_matches_reference(start, end, seed, batch):
    cfg = make_cfg(start, end, max_num_seqs=batch)
    ours = L.ThinkingBudgetLogitsProcessor(cfg, torch.device("cpu"), False)
    ref = RefThinkingBudgetLogitsProcessor(cfg, torch.device("cpu"), False)
    markers = [*start, *end]

    def make_params(rng: random.Random) -> L.SamplingParams:
        budget = rng.choice([None, -1, 0, 1, 2, 3, 6, 12])
        return L.SamplingParams(max_tokens=None, thinking_token_budget=budget)

    def next_token(rng: random.Random, req) -> int:
        # Hot marker tokens so sections open, close and get forced often; sometimes the model
        # "obeys" the force (emits the forced end token).
        if rng.random() < 0.4:
            return rng.choice(markers)
        return rng.randrange(VOCAB)

    sim = ChurnSimulator(
        batch,
        VOCAB,
        seed,
        make_params,
        finish_prob=1 / 16,
        max_tokens=(4, 64),
        next_token=next_token,
    )
    # Prompts that sometimes already opened a thinking section.
    rng = random.Random(seed)
    forced_total = 0
    for _ in range(600):
        update = sim.step()
        if update is not None:
            for _, _, prompt, _ in update.added:
                if prompt is not None and rng.random() < 0.3:
                    prompt.extend(start)
                    prompt.extend(rng.randrange(VOCAB) for _ in range(rng.randint(0, 4)))
        ours.update_state(update)
        ref.update_state(update)
        rows = sim.batch.num_reqs
        a = ours.apply(torch.zeros(rows, VOCAB))
        b = ref.apply(torch.zeros(rows, VOCAB))
        assert torch.equal(a, b), (forced_rows(a), forced_rows(b))
        assert dict(forced_by_state(ours)) == ref.forced
        forced_total += len(ref.forced)
    assert forced_total > 20  # the churn really exercised forcing


def _update(batch_size, added=(), removed=(), moved=()):
    return BatchUpdate(
        batch_size=batch_size, removed=list(removed), added=list(added), moved=list(moved)
    )


def test_budget_forces_end_sequence_then_stops():
    cfg = make_cfg([5], [7, 8])
    p = L.ThinkingBudgetLogitsProcessor(cfg, torch.device("cpu"), False)
    out: list[int] = []
    p.update_state(_update(1, added=[(0, L.SamplingParams(thinking_token_budget=2), [1], out)]))
    seen = []
    for tok in [5, 1, 2, 3, 4, 9]:
        seen.append(forced_by_state(p))
        forced = dict(forced_by_state(p))
        out.append(forced.get(0, tok))  # the model obeys a forced token
        p.update_state(None)
    assert seen == [[], [], [], [(0, 7)], [(0, 8)], []]
    assert out == [5, 1, 2, 7, 8, 9]


def test_prompt_inside_thinking_counts_and_reentry_is_closed():
    cfg = make_cfg([5], [7])
    p = L.ThinkingBudgetLogitsProcessor(cfg, torch.device("cpu"), False)
    out: list[int] = []
    # The prompt opened a section with 2 thinking tokens already: budget 2 is spent.
    p.update_state(
        _update(1, added=[(0, L.SamplingParams(thinking_token_budget=2), [5, 1, 2], out)])
    )
    assert forced_by_state(p) == [(0, 7)]
    out.append(7)
    p.update_state(None)
    assert forced_by_state(p) == []
    out.extend([3, 5])  # a new start marker after a forced end: closed at once
    p.update_state(None)
    assert forced_by_state(p) == [(0, 7)]


def test_swap_with_one_empty_side_moves_state():
    """vLLM 0.25.1 duplicates the state onto both slots; here it moves."""
    cfg = make_cfg([5], [7])
    p = L.ThinkingBudgetLogitsProcessor(cfg, torch.device("cpu"), False)
    out: list[int] = [5]
    p.update_state(
        _update(
            2,
            added=[
                (0, L.SamplingParams(thinking_token_budget=0), None, out),
                (1, L.SamplingParams(), None, []),
            ],
        )
    )
    assert forced_by_state(p) == [(0, 7)]
    p.update_state(_update(2, moved=[(0, 1, MoveDirectionality.SWAP)]))
    assert forced_by_state(p) == [(1, 7)]
    logits = p.apply(torch.zeros(2, VOCAB))
    assert forced_rows(logits) == {1: 7}


def test_force_overrides_minus_inf_and_masks_nothing_else():
    cfg = make_cfg([5], [7])
    p = L.ThinkingBudgetLogitsProcessor(cfg, torch.device("cpu"), False)
    p.update_state(_update(1, added=[(0, L.SamplingParams(thinking_token_budget=0), None, [5])]))
    logits = torch.full((1, VOCAB), float("-inf"))
    logits[0, 3] = 2.0
    p.apply(logits)
    assert logits[0, 7] == 1e9 and logits[0, 3] == 2.0


def test_full_pipeline_builds_thinking_last():
    procs = L.build_logitsprocs(make_cfg([5], [7]), "cpu", False)
    assert type(procs.non_argmax_invariant[-1]).__name__ == "ThinkingBudgetLogitsProcessor"
    assert not any(
        type(p).__name__ == "ThinkingBudgetLogitsProcessor"
        for p in L.build_logitsprocs(
            L.EngineConfig(max_num_seqs=4, vocab_size=VOCAB), "cpu", False
        ).all
    )


@pytest.mark.parametrize("budget", [True, 1.5, -2, "3"])
def test_budget_type_validation(budget):
    with pytest.raises(ValueError, match="thinking_token_budget"):
        L.SamplingParams(thinking_token_budget=budget)


def test_budget_without_reasoning_config():
    with pytest.raises(ValueError, match="reasoning_config"):
        L.validate_sampling_params(L.EngineConfig(), L.SamplingParams(thinking_token_budget=4))
    with pytest.raises(ValueError, match="reasoning"):
        L.ThinkingBudgetLogitsProcessor(L.EngineConfig(), torch.device("cpu"), False)


def test_bad_budget_in_update_names_request_and_field_and_changes_nothing():
    cfg = make_cfg([5], [7])
    p = L.ThinkingBudgetLogitsProcessor(cfg, torch.device("cpu"), False)
    ok = SimpleNamespace(thinking_token_budget=0)
    p.update_state(_update(1, added=[(0, ok, None, [5])]))
    before = forced_by_state(p)
    for bad in (-5, True, 2.5):
        with pytest.raises(ValueError, match=r"index 1.*thinking_token_budget"):
            p.update_state(
                _update(2, added=[(1, SimpleNamespace(thinking_token_budget=bad), None, [])])
            )
        assert forced_by_state(p) == before and active(p) == 1


def test_marker_ids_outside_vocab_rejected():
    with pytest.raises(ValueError, match="reasoning_end_token_ids"):
        L.ThinkingBudgetLogitsProcessor(make_cfg([5], [VOCAB + 3]), torch.device("cpu"), False)


def test_async_placeholder_filled_before_apply_is_seen():
    """vLLM's holder runs in the sampler, after async -1 placeholders were filled in."""
    cfg = make_cfg([5], [7])
    ours = L.ThinkingBudgetLogitsProcessor(cfg, torch.device("cpu"), False)
    ref = RefThinkingBudgetLogitsProcessor(cfg, torch.device("cpu"), False)
    out: list[int] = [5]
    update = _update(1, added=[(0, L.SamplingParams(thinking_token_budget=1), None, out)])
    for p in (ours, ref):
        p.update_state(update)
    out.append(-1)  # async placeholder for the token being generated
    for p in (ours, ref):
        p.update_state(None)
    out[-1] = 3  # filled in before sampling: one thinking token, the budget is spent
    a = ours.apply(torch.zeros(1, VOCAB))
    b = ref.apply(torch.zeros(1, VOCAB))
    assert forced_rows(a) == forced_rows(b) == {0: 7}

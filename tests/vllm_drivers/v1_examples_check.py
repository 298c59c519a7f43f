"""The processors of ``examples/vllm_target_token.py`` against plain per-row versions of their
rules, under seeded churn through our ``build_logitsprocs`` (adds, removals, condense moves and
swaps, in our own update types). Imported by ``tests/test_vllm_v1.py`` (the example as it is)
and by ``v1_vllm_in_ours.py`` (its vLLM form, in a subprocess); imports no vLLM itself."""

from __future__ import annotations

import random
from typing import Any

import torch

from logitsproc_rs import EngineConfig, SamplingParams, build_logitsprocs
from logitsproc_rs.simulate import ChurnSimulator

VOCAB = 48


def ref_target(row: torch.Tensor, params: Any, prompt: Any, out: list[int]) -> torch.Tensor:
    t = (params.extra_args or {}).get("target_token")
    if t is None:
        return row
    keep = torch.full_like(row, float("-inf"))
    keep[t] = row[t]
    return keep


def ref_ban_prompt(row: torch.Tensor, params: Any, prompt: Any, out: list[int]) -> torch.Tensor:
    if not (params.extra_args or {}).get("ban_prompt"):
        return row
    row = row.clone()
    for t in list(prompt) + out[-1:]:
        row[t] = float("-inf")
    return row


REFS = {
    "TargetTokenLogitsProcessor": ref_target,
    "TargetTokenAdapter": ref_target,
    "BanPromptAdapter": ref_ban_prompt,
}


def make_params(rng: random.Random) -> SamplingParams:
    extra: dict[str, Any] = {}
    if rng.random() < 0.5:
        extra["target_token"] = rng.randrange(VOCAB)
    if rng.random() < 0.4:
        extra["ban_prompt"] = True
    return SamplingParams(extra_args=extra or None)


def check_examples(custom: list[Any], steps: int = 60, seed: int = 7) -> dict[str, int]:
    """Builds ``custom`` (classes or ``module:Class`` names, or ``[]`` for entry points only)
    into our ``build_logitsprocs`` and checks each example processor against its rule, row by
    row, every step. Returns counts, so a caller can see that work was done."""
    cfg = EngineConfig(max_num_seqs=16, vocab_size=VOCAB)
    procs = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=custom)
    examples = [p for p in procs.all if type(p).__name__ in REFS]
    sim = _Sim(
        16,
        VOCAB,
        seed,
        make_params,
        target_batch=12,
        finish_prob=0.15,
        swap_prob=0.25,
        max_tokens=(2, 24),
        prompt_len=(1, 4),
    )
    gen = torch.Generator().manual_seed(seed)
    counts = {"steps": 0, "rows_changed": 0, "swaps": 0, "processors": len(examples)}
    for _ in range(steps):
        update = sim.step()
        if update is not None:
            counts["swaps"] += sum(d.name == "SWAP" for _, _, d in update.moved)
        procs.update_state(update)
        rows = sim.batch.rows()
        if not rows:
            continue
        logits = torch.randn(len(rows), VOCAB, generator=gen)
        for p in examples:
            got = p.apply(logits.clone())
            ref = REFS[type(p).__name__]
            for i, req in enumerate(rows):
                want = ref(logits[i], req.params, req.prompt_token_ids, req.output_token_ids)
                if not torch.equal(got[i], want):
                    raise AssertionError(
                        f"step {sim.steps}, row {i}, {type(p).__name__}: {got[i]} != {want}"
                    )
                counts["rows_changed"] += int(not torch.equal(want, logits[i]))
        counts["steps"] += 1
    return counts


class _Sim(ChurnSimulator):
    """Requests that ban their prompt have one (the simulator gives a few none, as prompt
    embeddings; the three-argument form rightly refuses those)."""

    def _new_request(self) -> Any:
        req = super()._new_request()
        if req.prompt_token_ids is None and (req.params.extra_args or {}).get("ban_prompt"):
            req.prompt_token_ids = [0]
        return req

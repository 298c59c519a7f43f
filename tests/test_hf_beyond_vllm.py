"""HF ``generate()`` through ``HFLogitsProcessor`` with the history-reading processors beyond
vLLM that HF has no warper of (DRY, the penalty window, no-repeat-ngram's DeepSeek-OCR mode):
greedy decoding gives the tokens of a plain loop over the same model that applies the processor's
reference (``logitsproc_rs.reference``) to each step's logits. The HF bridge's bookkeeping
(prompt from ``input_ids``, one token a step, the opt-in built when a row asks for it) is what
is under test; each setting also changes the greedy output, so the comparison can fail.

Typical-p, epsilon, eta and HF's no-repeat-ngram are checked against HF's own classes in their
test files. XTC acts on sampled rows only (its draw from its own generator): not here."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from logitsproc_rs import (
    BatchUpdate,
    DryLogitsProcessor,
    EngineConfig,
    NoRepeatNGramLogitsProcessor,
    PenaltiesLogitsProcessor,
    SamplingParams,
)
from logitsproc_rs.reference import reference_of

ROWS, PROMPT, NEW = 3, 8, 24

SETTINGS: dict[str, tuple[type, dict[str, Any]]] = {
    "dry": (
        DryLogitsProcessor,
        {"dry_multiplier": 4.0, "dry_allowed_length": 1, "dry_sequence_breakers": [[7]]},
    ),
    "penalty_last_n": (
        PenaltiesLogitsProcessor,
        {"repetition_penalty": 4.0, "frequency_penalty": 1.5, "penalty_last_n": 4},
    ),
    "no_repeat_ngram_deepseek": (
        NoRepeatNGramLogitsProcessor,
        {
            "no_repeat_ngram_size": 2,
            "no_repeat_ngram_output_only": True,
            "no_repeat_ngram_window": 8,
            "no_repeat_ngram_whitelist": [5],
        },
    ),
}


def _greedy_with_reference(model: Any, ids: torch.Tensor, cls: type, sp: Any) -> torch.Tensor:
    """Greedy decoding, the reference of ``cls`` on every step's last-position logits."""
    cfg = EngineConfig(max_num_seqs=ROWS, vocab_size=model.config.vocab_size)
    ref = reference_of(cls)(cfg, torch.device("cpu"), False)
    outs: list[list[int]] = [[] for _ in range(ROWS)]
    ref.update_state(
        BatchUpdate(ROWS, [], [(i, sp, ids[i].tolist(), outs[i]) for i in range(ROWS)], [])
    )
    seq = ids
    for _ in range(NEW):
        logits = ref.apply(model(seq).logits[:, -1, :].float())
        nxt = logits.argmax(-1)
        for i in range(ROWS):
            outs[i].append(int(nxt[i]))  # the live lists the reference re-reads
        ref.update_state(None)
        seq = torch.cat([seq, nxt[:, None]], 1)
    return seq


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_greedy_generate_equals_a_loop_over_the_reference(tiny_llama: Any, name: str) -> None:
    from logitsproc_rs.hf import HFLogitsProcessor

    cls, setting = SETTINGS[name]
    sp = SamplingParams(temperature=0.0, max_tokens=None, **setting)
    ids = torch.randint(3, 60, (ROWS, PROMPT), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        proc = HFLogitsProcessor([sp] * ROWS)
        ours = proc.generate(tiny_llama, ids, max_new_tokens=NEW, use_cache=False)
        want = _greedy_with_reference(tiny_llama, ids, cls, sp)
        plain = HFLogitsProcessor([SamplingParams(temperature=0.0, max_tokens=None)] * ROWS)
        greedy = plain.generate(tiny_llama, ids, max_new_tokens=NEW, use_cache=False)
    assert torch.equal(ours, want), name
    assert not torch.equal(ours, greedy), f"{name} left greedy decoding unchanged"

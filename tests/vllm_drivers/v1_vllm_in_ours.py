"""vLLM processors run in our ``build_logitsprocs`` unchanged.

- The example processors in their vLLM form (subclasses of vLLM 0.25.1's own
  ``LogitsProcessor`` / ``AdapterLogitsProcessor``, using its ``process_dict_updates``), loaded
  by every route: class, ``module:Class`` and the ``vllm.logits_processors`` entry point. Under
  churn with swaps in our own update types, each matches its per-row rule: they get the update
  in vLLM's types (vLLM's ``MoveDirectionality`` is another enum than ours).
- vLLM's own built-ins from the wheel (LogitBias, MinTokens), loaded by name, give the same
  logits as ours under the same churn.
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path

import torch
import v1_harness  # noqa: F401  (paths, threads)
from v1_examples_check import VOCAB, check_examples
from v1_harness import import_vllm, result, vllm_form_of_example

from logitsproc_rs import EngineConfig, SamplingParams, build_logitsprocs
from logitsproc_rs.simulate import ChurnSimulator

assert "vllm" not in sys.modules  # our package and the checks alone never import vLLM

folder = Path(tempfile.mkdtemp())
mod = vllm_form_of_example(folder, "vllm_style_procs", "ban = vllm_style_procs:BanPromptAdapter")
vint = import_vllm().interface

assert issubclass(mod.TargetTokenLogitsProcessor, vint.LogitsProcessor)
assert not issubclass(mod.TargetTokenLogitsProcessor, __import__("logitsproc_rs").LogitsProcessor)

# Every route: class, "module:Class", entry point (BanPromptAdapter).
counts = check_examples([mod.TargetTokenLogitsProcessor, "vllm_style_procs:TargetTokenAdapter"])
assert counts["processors"] == 3, counts  # the entry point was loaded too
assert counts["swaps"] > 0 and counts["rows_changed"] > 0, counts

# The instances keep the user's own type.
cfg = EngineConfig(max_num_seqs=16, vocab_size=VOCAB)
procs = build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=[mod.TargetTokenLogitsProcessor])
assert any(type(p) is mod.TargetTokenLogitsProcessor for p in procs.all)

# Still refused: a class that derives from neither LogitsProcessor.
try:
    build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=[dict])
    raise AssertionError("a non-processor class was accepted")
except ValueError as e:
    assert "is not a subclass of LogitsProcessor" in str(e), e

# vLLM's own built-ins, unchanged, against ours.
VLLM_BUILTIN = "vllm.v1.sample.logits_processor.builtin"


def make_params(rng: random.Random) -> SamplingParams:
    bias = {rng.randrange(VOCAB): rng.choice((-3.0, 2.5)) for _ in range(rng.randint(0, 3))}
    return SamplingParams(
        logit_bias=bias or None,
        min_tokens=rng.choice((0, 0, 3, 10)),
        stop_token_ids=rng.sample(range(VOCAB), rng.randint(0, 2)),
        eos_token_id=rng.choice((None, 1)),
    )


procs = build_logitsprocs(
    cfg,
    "cpu",
    False,
    sampler_transforms=False,
    custom_logitsprocs=[
        f"{VLLM_BUILTIN}:LogitBiasLogitsProcessor",
        f"{VLLM_BUILTIN}:MinTokensLogitsProcessor",
    ],
)
by = {(type(p).__module__, type(p).__name__): p for p in procs.all}
pairs = [
    (by[("logitsproc_rs.builtin.logit_bias", "LogitBiasLogitsProcessor")],
     by[(VLLM_BUILTIN, "LogitBiasLogitsProcessor")]),
    (by[("logitsproc_rs.builtin.min_tokens", "MinTokensLogitsProcessor")],
     by[(VLLM_BUILTIN, "MinTokensLogitsProcessor")]),
]  # fmt: skip
sim = ChurnSimulator(16, VOCAB, 11, make_params, target_batch=12, finish_prob=0.15,
                     swap_prob=0.25, max_tokens=(2, 24))  # fmt: skip
gen = torch.Generator().manual_seed(11)
compared = changed = 0
for _ in range(80):
    procs.update_state(sim.step())
    n = sim.batch.num_reqs
    if not n:
        continue
    logits = torch.randn(n, VOCAB, generator=gen)
    for ours, theirs in pairs:
        a, b = ours.apply(logits.clone()), theirs.apply(logits.clone())
        assert torch.equal(a, b), (type(ours).__name__, sim.steps)
        compared += 1
        changed += int(not torch.equal(a, logits))
assert changed > 0, "the built-ins never did anything"

result(example_rows_changed=counts["rows_changed"], swaps=counts["swaps"],
       builtin_compared=compared, builtin_changed=changed)  # fmt: skip

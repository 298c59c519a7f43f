"""Our MinTokens on structured-output requests keeps the stop tokens when masking them would
leave the row all −inf (vLLM >= 0.32's fix; 0.25.1 left such a row −inf, and the engine
ended the request with "grammar rejected tokens"), inside vLLM 0.25.1's ``build_logitsprocs``.

Rows: a structured request under min_tokens whose grammar allows only EOS (kept, with its
value), the same request whose grammar allows more (EOS masked, as always), a request without
structured output in the same state (left −inf: vLLM's rule covers structured rows only),
and the structured request once it has its min_tokens (untouched). The rows follow a swap.
"""

from __future__ import annotations

import torch
import v1_harness  # noqa: F401  (paths, threads)
from v1_harness import apply_all, import_vllm, result

from logitsproc_rs import EngineConfig
from logitsproc_rs.vllm import v1

lp = import_vllm()
from vllm.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: E402

V = 16
EOS = 2
procs = lp.build_logitsprocs(
    EngineConfig(max_num_seqs=4, vocab_size=V),
    torch.device("cpu"),
    False,
    False,
    [v1.MinTokensLogitsProcessor],
)


def request(structured: bool) -> SamplingParams:
    sp = SamplingParams(
        extra_args={v1.NAMESPACE: {"min_tokens": 3}},
        structured_outputs=StructuredOutputsParams(json_object=True) if structured else None,
    )
    sp._all_stop_token_ids = {EOS}  # what vLLM's front end sets from the tokenizer
    return sp


outs: list[list[int]] = [[], [], [], [5, 6, 7]]
builder = lp.BatchUpdateBuilder()
for i, structured in enumerate((True, True, False, True)):
    builder.added.append((i, request(structured), [1], outs[i]))
update = builder.get_and_reset(4)
for p in procs.all:
    p.update_state(update)


def grammar_logits() -> torch.Tensor:
    x = torch.randn(4, V)
    x[[0, 2, 3]] = float("-inf")  # the grammar allows only EOS in rows 0, 2 and 3
    x[[0, 2, 3], EOS] = torch.tensor([1.5, 0.5, -0.25])
    return x


x = grammar_logits()
y = apply_all(procs, x.clone())
assert torch.equal(y[0], x[0]), "a structured row left with only its stop token keeps it"
assert y[1, EOS] == float("-inf") and torch.isfinite(y[1]).sum() == V - 1
assert torch.isneginf(y[2]).all(), "a row without structured output: vLLM's rule does not apply"
assert torch.equal(y[3], x[3]), "min_tokens reached: nothing masked"

builder.moved.append((0, 2, lp.MoveDirectionality.SWAP))
update = builder.get_and_reset(4)
for p in procs.all:
    p.update_state(update)
x = grammar_logits()
y = apply_all(procs, x.clone())
assert torch.equal(y[2], x[2]) and torch.isneginf(y[0]).all(), "the rule moves with the request"
outs[2].extend([9, 9, 9])  # the structured request reaches min_tokens
for p in procs.all:
    p.update_state(None)
y = apply_all(procs, x.clone())
assert torch.equal(y[2], x[2])
result(checked=3)

"""vLLM's per-request sampling parameters in HF ``generate()``: one ``SamplingParams`` per row.

A tiny randomly initialised Llama stands in for a real model (no downloads); with a real one,
pass its tokenizer's ``input_ids`` and ``attention_mask``. Run:
``PYTHONPATH=python python examples/hf_generate.py`` (needs transformers: tests/extras/hf.sh).
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from logitsproc_rs import EngineConfig, SamplingParams
from logitsproc_rs.hf import HFLogitsProcessor

torch.manual_seed(0)
model = LlamaForCausalLM(
    LlamaConfig(
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
).eval()
model.generation_config.eos_token_id = None  # every row runs max_new_tokens

pad = 0
input_ids = torch.tensor([[11, 12, 13, 14], [pad, pad, 21, 22], [31, 32, 33, 400]])
attention_mask = (input_ids != pad).long()  # row 1 is left-padded
params = [
    # greedy, with a bias and a bad word
    SamplingParams(temperature=0.0, logit_bias={7: 5.0}, bad_words_token_ids=[[8]]),
    # sampled: penalties, min_p, top-k; EOS 2 blocked for the first 4 tokens
    SamplingParams(
        temperature=0.8,
        min_p=0.05,
        top_k=40,
        repetition_penalty=1.2,
        min_tokens=4,
        eos_token_id=2,
    ),
    # the prompt opened a thinking section (400): at most 3 thinking tokens, then 401 402
    SamplingParams(temperature=0.0, thinking_token_budget=3),
]
proc = HFLogitsProcessor(
    params,
    engine_config=EngineConfig(reasoning_start_token_ids=[400], reasoning_end_token_ids=[401, 402]),
)
with torch.no_grad():
    # generate(): a fresh start, HF's own processors off, do_sample because row 1 samples
    out = proc.generate(model, input_ids, attention_mask, max_new_tokens=8, pad_token_id=pad)
for row, tokens in enumerate(out[:, input_ids.shape[1] :].tolist()):
    print(f"row {row}: {tokens}")
assert out[2, 7:9].tolist() == [401, 402]

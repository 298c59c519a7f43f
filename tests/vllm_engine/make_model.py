"""A tiny random Llama and a local WordLevel tokenizer for the real-engine tests: no download.

Run with the engine environment's python: ``make_model.py DIR``. Idempotent (a complete model
has ``config.json`` written last). float32, head_dim 32 (vLLM's CPU attention refuses 16).
"""

from __future__ import annotations

import json
import os
import sys

VOCAB = 512
SEED = 1234


def main(out: str) -> None:
    if os.path.exists(os.path.join(out, "done")):
        return
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>", "<think>", "</think>"]
    words = specials + [f"w{i}" for i in range(VOCAB - len(specials))]
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(out)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():  # a sharper distribution than init: greedy outputs vary by prompt
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "done"), "w") as f:
        json.dump({"vocab": VOCAB, "seed": SEED}, f)


if __name__ == "__main__":
    main(sys.argv[1])

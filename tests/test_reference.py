"""The reference (``reference.py``) builds its processors in our order."""

from __future__ import annotations

from logitsproc_rs import (
    EngineConfig,
    build_logitsprocs,
)
from logitsproc_rs.reference import (
    build_reference_logitsprocs,
)

V = 8
CFG = EngineConfig(max_num_seqs=4, vocab_size=V)
SPEC = EngineConfig(max_num_seqs=4, vocab_size=V, num_speculative_tokens=2)
SPEC_VLLM = EngineConfig(max_num_seqs=4, vocab_size=V, num_speculative_tokens=2, draft_rows="vllm")


# --- build order -------------------------------------------------------------------------------


def test_reference_build_order_matches_ours():
    for sampler_transforms in (True, False):
        for cfg in (CFG, SPEC, SPEC_VLLM):
            ours = build_logitsprocs(cfg, "cpu", False, sampler_transforms=sampler_transforms)
            ref = build_reference_logitsprocs(cfg, "cpu", sampler_transforms=sampler_transforms)
            names = [type(p).__name__ for p in ours.all]
            ref_names = [type(p).__name__.removeprefix("Ref") for p in ref.all]
            assert names == ref_names

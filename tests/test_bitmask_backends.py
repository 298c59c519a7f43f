"""The grammar bitmask: ours (torch ops here, Triton on CUDA) against xgrammar's own
``apply_token_bitmask_inplace``, which vLLM's runner calls, and the ``Sampler`` with either."""

from __future__ import annotations

import pytest
import torch
from _extras import import_extra

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    Sampler,
    SamplingMetadata,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.bitmask import apply_token_bitmask_

xgrammar = import_extra("xgrammar", "xgrammar not installed (make extras)")


def _bitmask(g: torch.Generator, rows: int, words: int) -> torch.Tensor:
    m = torch.randint(-(2**31), 2**31 - 1, (rows, words), generator=g, dtype=torch.int64)
    m = m.to(torch.int32)
    m[0] = -1  # a row that masks nothing
    return m


@pytest.mark.parametrize("vocab,words", [(64, 2), (100, 4), (100, 3), (33, 2), (1000, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_ours_equals_xgrammar(vocab: int, words: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(vocab * 31 + words)
    rows = 6
    mask = _bitmask(g, rows, words)
    logits = torch.randn(rows, vocab, generator=g).to(dtype)
    ours = apply_token_bitmask_(logits.clone(), mask)
    # xgrammar's own function, as vLLM's runner calls it (float32; non-float32 converted).
    theirs = logits.clone().float()
    xgrammar.apply_token_bitmask_inplace(theirs, mask, vocab_size=min(vocab, 32 * words))
    assert torch.equal(ours.float(), theirs)
    via = apply_token_bitmask_(logits.clone(), mask, kernel="xgrammar")
    assert torch.equal(via, ours)
    assert via.dtype == dtype
    assert bool(torch.isneginf(ours).any())  # the masks did mask


@pytest.mark.parametrize("as_tensor", [False, True])
def test_indices_pair_bitmask_row_k_with_indices_k(as_tensor: bool) -> None:
    """Ours takes compacted rows (bitmask row k for logits row indices[k]); xgrammar's indices
    read the bitmask row of the same number. vLLM's runner scatters first; so do we."""
    g = torch.Generator().manual_seed(5)
    vocab, words = 70, 3
    logits = torch.randn(5, vocab, generator=g)
    mask = _bitmask(g, 2, words)
    mask[0] = 0  # masks everything in the covered columns
    indices = [3, 1]
    idx = torch.tensor(indices) if as_tensor else indices
    ours = apply_token_bitmask_(logits.clone(), mask, idx)
    scattered = torch.full((5, words), -1, dtype=torch.int32)
    scattered[indices] = mask
    theirs = logits.clone()
    xgrammar.apply_token_bitmask_inplace(theirs, scattered, vocab_size=vocab, indices=indices)
    assert torch.equal(ours, theirs)
    assert torch.equal(apply_token_bitmask_(logits.clone(), mask, idx, kernel="xgrammar"), ours)
    assert bool(torch.isneginf(ours[3]).all()) and not bool(torch.isneginf(ours[0]).any())


def test_sampler_with_either_kernel_samples_the_same() -> None:
    cfg = EngineConfig(max_num_seqs=4, vocab_size=96)
    outs = []
    for kernel in ("builtin", "xgrammar"):
        procs = build_logitsprocs(cfg, "cpu", False)
        procs.update_state(
            BatchUpdate(3, [], [(i, SamplingParams(min_p=0.05), None, []) for i in range(3)], [])
        )
        g = torch.Generator().manual_seed(1)
        logits = torch.randn(3, 96, generator=g)
        mask = _bitmask(g, 2, 3)
        gens = {i: torch.Generator().manual_seed(10 + i) for i in range(3)}
        md = SamplingMetadata.from_params([SamplingParams()] * 3, 96, generators=gens)
        out = Sampler(procs, grammar_kernel=kernel)(logits, md, mask, [2, 0])
        outs.append(out)
    assert torch.equal(outs[0].sampled_token_ids, outs[1].sampled_token_ids)
    assert torch.equal(outs[0].logits, outs[1].logits)


def test_unknown_kernel_is_refused() -> None:
    with pytest.raises(ValueError, match="grammar_kernel must be one of"):
        Sampler(
            build_logitsprocs(EngineConfig(max_num_seqs=2, vocab_size=8), "cpu", False),
            grammar_kernel="flashinfer",
        )
    with pytest.raises(ValueError, match="kernel must be one of"):
        apply_token_bitmask_(torch.zeros(1, 8), torch.zeros(1, 1, dtype=torch.int32), kernel="x")

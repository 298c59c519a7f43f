"""The grammar bitmask (``bitmask.py``): bit layout, untouched rows and columns, index kinds,
low-precision logits, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _helpers import assert_same

from logitsproc_rs import (
    apply_token_bitmask_,
)
from logitsproc_rs.reference import (
    ref_apply_token_bitmask,
)

INF = math.inf


def pack(allowed_rows: list[set[int]], words: int) -> np.ndarray:
    """Pack sets of allowed tokens into int32 words, LSB first (built independently of both
    implementations)."""
    out = np.zeros((len(allowed_rows), words), dtype=np.uint32)
    for r, allowed in enumerate(allowed_rows):
        for t in allowed:
            out[r, t // 32] |= np.uint32(1) << np.uint32(t % 32)
    return out.view(np.int32)


def test_bitmask_bit_layout_lsb_first():
    logits = torch.zeros(2, 70)
    words = np.zeros((2, 3), dtype=np.uint32)
    words[0] = [0b101, 1 << 31, 1 << 1]  # tokens 0 and 2; 32 + 31 = 63; 64 + 1 = 65
    words[1] = 0xFFFFFFFF
    words[1, 0] ^= 1 << 3  # everything but token 3
    mask = words.view(np.int32)
    got = apply_token_bitmask_(logits.clone(), mask)
    assert_same(got, ref_apply_token_bitmask(logits.clone(), mask))
    assert set(torch.nonzero(got[0] == 0).flatten().tolist()) == {0, 2, 63, 65}
    assert set(torch.nonzero(got[1] == -INF).flatten().tolist()) == {3}
    assert (pack([{0, 2, 63, 65}], 3) == mask[:1]).all()


def test_bitmask_minus_one_rows_untouched_and_returns_same_tensor():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    logits[1, 5] = -INF
    mask = pack([set(), set(), {7}], 2)
    mask[0] = -1
    mask[1] = -1
    x = logits.clone()
    out = apply_token_bitmask_(x, mask)
    assert out is x
    assert_same(out[:2], logits[:2])
    assert out[2, 7] == logits[2, 7] and int((out[2] == -INF).sum()) == 39


@pytest.mark.parametrize(("vocab", "words"), [(70, 2), (40, 2), (64, 2), (33, 1)])
def test_bitmask_columns_past_min_vocab_and_words_untouched(vocab, words):
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(vocab))
    mask = np.zeros((2, words), dtype=np.int32)  # everything blocked where it applies
    got = apply_token_bitmask_(logits.clone(), mask)
    width = min(vocab, 32 * words)
    assert bool((got[:, :width] == -INF).all())
    assert_same(got[:, width:], logits[:, width:])
    assert_same(got, ref_apply_token_bitmask(logits.clone(), mask))


@pytest.mark.parametrize(
    "make_indices",
    [
        lambda ix: list(ix),
        lambda ix: np.array(ix, dtype=np.int64),
        lambda ix: np.array(ix, dtype=np.int32),
        lambda ix: torch.tensor(ix, dtype=torch.int32),
        lambda ix: torch.tensor(ix, dtype=torch.int64),
    ],
    ids=["list", "numpy64", "numpy32", "tensor32", "tensor64"],
)
@pytest.mark.parametrize("as_numpy", [True, False], ids=["np-mask", "tensor-mask"])
def test_bitmask_indices_kinds(make_indices, as_numpy):
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(1))
    np_mask = pack([{1, 2}, {40, 49}], 2)
    mask = np_mask if as_numpy else torch.from_numpy(np_mask.copy())
    got = apply_token_bitmask_(logits.clone(), mask, make_indices([3, 1]))
    ref = ref_apply_token_bitmask(logits.clone(), np_mask, [3, 1])
    assert_same(got, ref)
    assert_same(got[[0, 2, 4]], logits[[0, 2, 4]])
    assert set(torch.nonzero(got[3] != -INF).flatten().tolist()) == {1, 2}
    assert set(torch.nonzero(got[1] != -INF).flatten().tolist()) == {40, 49}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_bitmask_low_precision_logits(dtype):
    logits = torch.randn(3, 45, generator=torch.Generator().manual_seed(2)).to(dtype)
    mask = pack([{0, 44}, set(range(45)), {31, 32}], 2)
    got = apply_token_bitmask_(logits.clone(), mask)
    assert got.dtype == dtype
    assert_same(got, ref_apply_token_bitmask(logits.clone(), mask))
    assert_same(got[1], logits[1])
    keep = got[0] != -INF
    assert keep.tolist() == [i in (0, 44) for i in range(45)]
    assert_same(got[0][keep], logits[0][keep])


def test_bitmask_zero_rows_with_empty_indices_is_a_no_op():
    """No structured request this step: a ``[0, words]`` bitmask with empty indices."""
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(3))
    got = apply_token_bitmask_(logits.clone(), np.zeros((0, 2), dtype=np.int32), [])
    assert_same(got, logits)


@pytest.mark.parametrize(
    ("mask", "indices", "match"),
    [
        (np.full((2, 2), -1, dtype=np.int64), None, "int32"),
        (np.full((2, 2), -1.0, dtype=np.float32), None, "int32"),
        (torch.full((2, 2), -1, dtype=torch.int64), None, "int32"),
        (torch.full((2, 2), -1.0), None, "int32"),
        (np.full((2,), -1, dtype=np.int32), None, "rows, words"),
        (np.full((2, 2, 1), -1, dtype=np.int32), None, "rows, words"),
        (np.full((3, 2), -1, dtype=np.int32), None, "rows"),
        (np.full((1, 2), -1, dtype=np.int32), None, "rows"),
        (np.full((1, 2), -1, dtype=np.int32), [2], r"indices must be in \[0, 2\)"),
        (np.full((1, 2), -1, dtype=np.int32), [-1], r"indices must be in \[0, 2\)"),
        (np.full((1, 2), -1, dtype=np.int32), np.array([5]), r"indices must be in \[0, 2\)"),
        (np.full((2, 2), -1, dtype=np.int32), [0], "indices"),
        ([[-1, -1], [-1, -1]], None, "numpy array or a tensor"),
    ],
    ids=[
        "np-int64",
        "np-float",
        "tensor-int64",
        "tensor-float",
        "ndim1",
        "ndim3",
        "too-many-rows",
        "too-few-rows",
        "index-past-end",
        "index-negative",
        "numpy-index-past-end",
        "rows-vs-indices",
        "list-mask",
    ],
)
def test_bitmask_bad_input(mask, indices, match):
    logits = torch.randn(2, 40, generator=torch.Generator().manual_seed(4))
    x = logits.clone()
    with pytest.raises(ValueError, match=match):
        apply_token_bitmask_(x, mask, indices)
    assert_same(x, logits)

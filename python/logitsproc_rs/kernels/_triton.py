"""The Triton kernels and their launchers (imported only when a Triton path runs).

Every kernel reproduces the torch path's arithmetic op for op, in float32, so the results are
bit-identical: the launches pass ``enable_fp_fusion=False`` (Triton would otherwise contract
``a * b - c`` into one FMA, rounding once where torch rounds twice), and divisions use
``div_rn`` (IEEE round-to-nearest, as torch's ``/``; Triton's plain ``/`` may be approximate).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_NO_FMA = {"enable_fp_fusion": False}


def _block(n: int, cap: int) -> int:
    return max(16, min(cap, triton.next_power_of_2(n)))


# --- MinP ------------------------------------------------------------------------------------


@triton.jit
def _min_p_kernel(
    logits_ptr, stride, lmp_ptr, map_ptr, V, HAS_MAP: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0)
    slot = row.to(tl.int64)
    if HAS_MAP:
        slot = tl.load(map_ptr + row).to(tl.int64)
    lmp = tl.load(lmp_ptr + slot)
    if lmp == float("-inf"):  # no min_p: the threshold −inf masks nothing
        return
    base = logits_ptr + row.to(tl.int64) * stride
    acc = tl.full([BLOCK], float("-inf"), tl.float32)
    nan = tl.zeros([BLOCK], tl.int32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(base + offs, mask=offs < V, other=float("-inf"))
        # NaN is tracked apart: a GPU max drops NaN where torch's amax propagates it.
        nan = nan | (x != x).to(tl.int32)
        acc = tl.maximum(acc, tl.where(x != x, float("-inf"), x))
    row_max = tl.max(acc, 0)
    # torch: amax is NaN (every comparison false) or +inf (threshold forced to −inf): no mask.
    if (tl.max(nan, 0) != 0) | (row_max == float("inf")):
        return
    threshold = row_max + lmp
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(base + offs, mask=offs < V, other=0.0)
        tl.store(base + offs, float("-inf"), mask=(offs < V) & (x < threshold))


def min_p_(logits: torch.Tensor, log_min_p: torch.Tensor, row_map: torch.Tensor | None):
    rows, vocab = logits.shape
    if rows:
        _min_p_kernel[(rows,)](
            logits,
            logits.stride(0),
            log_min_p,
            log_min_p if row_map is None else row_map,
            vocab,
            HAS_MAP=row_map is not None,
            BLOCK=_block(vocab, 4096),
            **_NO_FMA,
        )
    return logits


# --- penalties -------------------------------------------------------------------------------


@triton.jit
def _penalties_kernel(
    logits_ptr,
    stride,
    cells_ptr,
    cells_stride,
    rep_ptr,
    freq_ptr,
    pres_ptr,
    map_ptr,
    V,
    COUNT_MASK: tl.constexpr,
    HAS_MAP: tl.constexpr,
    DIVIDE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    slot = row.to(tl.int64)
    if HAS_MAP:
        slot = tl.load(map_ptr + row).to(tl.int64)
    rep = tl.load(rep_ptr + slot)
    freq = tl.load(freq_ptr + slot)
    pres = tl.load(pres_ptr + slot)
    # (1, +0.0, +0.0) leaves every logit bit-identical in the torch path: skip the row. (−0.0
    # is not neutral: x − (−0.0) turns a −0.0 logit into +0.0.)
    neutral_fp = (freq.to(tl.int32, bitcast=True) == 0) & (pres.to(tl.int32, bitcast=True) == 0)
    if (rep == 1.0) & neutral_fp:
        return
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < V
    ptr = logits_ptr + row.to(tl.int64) * stride + offs
    x = tl.load(ptr, mask=inside, other=0.0)
    cell = tl.load(cells_ptr + slot * cells_stride + offs, mask=inside, other=0)
    count = cell & COUNT_MASK
    # vLLM's CUDA kernel divides (logit / penalty); its torch fallback multiplies by 1 / penalty.
    up = tl.math.div_rn(x, rep) if DIVIDE else x * tl.math.div_rn(1.0, rep)
    x = tl.where(cell != 0, tl.where(x > 0, up, x * rep), x)
    x = x - freq * count.to(tl.float32)
    x = x - pres * (count > 0).to(tl.float32)
    tl.store(ptr, x, mask=inside)


def penalties_(
    logits: torch.Tensor,
    cells: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    prompt_flag: int,
    row_map: torch.Tensor | None,
    divide: bool,
):
    rows, vocab = logits.shape
    block = _block(vocab, 2048)
    if rows:
        _penalties_kernel[(rows, triton.cdiv(vocab, block))](
            logits,
            logits.stride(0),
            cells,
            cells.stride(0),
            repetition,
            frequency,
            presence,
            repetition if row_map is None else row_map,
            vocab,
            COUNT_MASK=prompt_flag - 1,
            HAS_MAP=row_map is not None,
            DIVIDE=divide,
            BLOCK=block,
            **_NO_FMA,
        )
    return logits


# --- sparse (row, token, value) triples --------------------------------------------------------


@triton.jit
def _sparse_kernel(
    logits_ptr, stride, rows_ptr, cols_ptr, vals_ptr, n, ADD: tl.constexpr, BLOCK: tl.constexpr
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    r = tl.load(rows_ptr + offs, mask=m, other=0).to(tl.int64)
    c = tl.load(cols_ptr + offs, mask=m, other=0).to(tl.int64)
    v = tl.load(vals_ptr + offs, mask=m, other=0.0)
    ptr = logits_ptr + r * stride + c
    if ADD:
        # Pairs are unique except the padding, which adds −0.0 to the first pair (x + −0.0 == x
        # for every x): skipped, so no two lanes read-modify-write one logit.
        m = m & (v.to(tl.int32, bitcast=True) != -2147483648)
        v = tl.load(ptr, mask=m, other=0.0) + v
    # A put's duplicates (padding repeats the first triple) write the same value.
    tl.store(ptr, v, mask=m)


def sparse_(logits, rows, cols, vals, add: bool):
    n = rows.shape[0]
    if n:
        block = _block(n, 1024)
        _sparse_kernel[(triton.cdiv(n, block),)](
            logits, logits.stride(0), rows, cols, vals, n, ADD=add, BLOCK=block, **_NO_FMA
        )
    return logits


# --- bitmasks: the grammar's, and allowed ids as one --------------------------------------------


@triton.jit
def _set_bits_kernel(bits_ptr, words, rows_ptr, cols_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    r = tl.load(rows_ptr + offs, mask=m, other=0).to(tl.int64)
    c = tl.load(cols_ptr + offs, mask=m, other=0)
    one = tl.full([BLOCK], 1, tl.int32)
    tl.atomic_or(bits_ptr + r * words + (c >> 5), one << (c & 31), mask=m)


@triton.jit
def _bitmask_kernel(
    logits_ptr,
    stride,
    n_rows,
    width,
    bits_ptr,
    words,
    idx_ptr,
    HAS_IDX: tl.constexpr,
    BITS_BY_LOGITS_ROW: tl.constexpr,
    ALLOWED: tl.constexpr,
    WBLOCK: tl.constexpr,
):
    """Program (i, j): bitmask words ``[j * WBLOCK, (j + 1) * WBLOCK)`` of entry ``i``; every
    token whose bit is clear (and below ``width``) gets −inf. Store-only: no logit is read."""
    i = tl.program_id(0)
    row = i.to(tl.int64)
    if HAS_IDX:
        row = tl.load(idx_ptr + i).to(tl.int64)
        if ALLOWED:
            # The restricted rows are unique; the padding repeats the first entry.
            if (i > 0) & (row == tl.load(idx_ptr).to(tl.int64)):
                return
        else:
            row = tl.where(row < 0, row + n_rows, row)  # torch's negative indexing
            if (row < 0) | (row >= n_rows):
                return  # out of range: torch raises; a kernel cannot, so it writes nothing
    bits_row = row if BITS_BY_LOGITS_ROW else i.to(tl.int64)
    w = tl.program_id(1) * WBLOCK + tl.arange(0, WBLOCK)
    w_ok = w < words
    word = tl.load(bits_ptr + bits_row * words + w, mask=w_ok, other=-1)
    if ALLOWED:
        # The per-row scratch is left zeroed for the next call (each word has one owner).
        tl.store(bits_ptr + bits_row * words + w, tl.zeros([WBLOCK], tl.int32), mask=w_ok)
    j = tl.arange(0, 32)
    token = w[:, None] * 32 + j[None, :]
    blocked = ((word[:, None] >> j[None, :]) & 1) == 0
    neg = tl.full([WBLOCK, 32], float("-inf"), logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + row * stride + token, neg, mask=blocked & (token < width) & w_ok[:, None])


def token_bitmask_(logits, bitmask, idx, width: int):
    n, words = bitmask.shape
    wblock = _block(triton.cdiv(width, 32), 64)
    _bitmask_kernel[(n, triton.cdiv(triton.cdiv(width, 32), wblock))](
        logits,
        logits.stride(0),
        logits.shape[0],
        width,
        bitmask,
        words,
        bitmask if idx is None else idx,
        HAS_IDX=idx is not None,
        BITS_BY_LOGITS_ROW=False,
        ALLOWED=False,
        WBLOCK=wblock,
    )
    return logits


def keep_only_(logits, rows, cols, restricted, scratch):
    """Allowed ids: set the allowed (row, token) bits in a zeroed ``[rows, words]`` scratch,
    then −inf wherever a restricted row's bit is clear (clearing the scratch as it goes)."""
    vocab = logits.shape[1]
    words = scratch.shape[1]
    n = rows.shape[0]
    block = _block(n, 1024)
    _set_bits_kernel[(triton.cdiv(n, block),)](scratch, words, rows, cols, n, BLOCK=block)
    wblock = _block(words, 64)
    _bitmask_kernel[(restricted.shape[0], triton.cdiv(words, wblock))](
        logits,
        logits.stride(0),
        logits.shape[0],
        vocab,
        scratch,
        words,
        restricted,
        HAS_IDX=True,
        BITS_BY_LOGITS_ROW=True,
        ALLOWED=True,
        WBLOCK=wblock,
    )
    return logits

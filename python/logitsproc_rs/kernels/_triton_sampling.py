# mypy: disallow-untyped-defs=False
# (Triton kernels: pointers and constexprs that triton.jit types at launch, not mypy.)
"""The sort-free sampling tail on the device: top-k / top-p kept sets and a batch-invariant
Gumbel-max draw, one Triton program per row, tiles over the vocabulary, no sort.

Entry points: :func:`mask_top_k_top_p_triton_` (kept sets only, ``-inf`` elsewhere, in place),
:func:`sample_batch_invariant_triton` (the same, then one token per row) and
:func:`sample_fused_triton` (temperature and the truncations first: the fused tail below;
:func:`fused_gumbel_triton_` takes the ``Sampler``'s arguments for it);
:func:`gumbel_noise_triton` exposes the noise alone. CUDA tensors, or CPU tensors under
``TRITON_INTERPRET=1`` (set before triton is imported).

**The search.** A float32 ``x`` maps to a ``uint32`` key whose order is the float order
(``-0.0`` is read as ``+0.0``, so the two tie as they compare). Both thresholds are found by a
search on the key's bits, most significant first: each pass over the row scores ``2^b``
candidate keys at once (the next ``b`` bits, ``DIGIT_BITS``: 4 on CUDA, 8 under the
interpreter), so ``32 / b`` passes decide all 32 bits. Every ``b`` finds the same key.

* top-k (``1 <= k < V``): the largest key ``K`` with ``#{x >= K} >= k``, i.e. the k-th largest
  value counting duplicates; kept: ``x >= K`` (every tie at the k-th value kept; with fewer
  than ``k`` finite values ``K`` is ``-inf``'s key and no finite value is masked). ``k == 1``
  takes the row max directly; ``k >= V`` or ``k <= 0`` is off. **Exact**: vLLM's sort path
  keeps the same set.
* top-p (``p < 1``), on the top-k-kept row: ``e = exp(x - max)`` in float32 (0 outside top-k),
  ``Z = sum e``, ``T = float64(float32(1) - p) * Z``; the largest key ``C`` with ``mass(x < C)
  <= T`` where ``mass`` sums ``e`` in **float64**; kept: ``x >= C`` (clamped so the row max is
  always kept). Equivalently a token of value ``w`` is masked iff ``mass(x <= w) <= T``: the
  maximal ascending prefix of *whole tied groups* whose mass is ``<= 1 - p``. ``p >= 1`` is
  off.

**Where the kept set may differ from vLLM 0.25.1's sort path** (``tail.apply_top_k_top_p``;
``tests/test_triton_sampling.py`` counts every differing row and classifies it as one of these):

1. *Ties at the top-p boundary* — a run of equal values whose ascending cumulative mass
   straddles ``1 - p``: torch's sort is not stable, so the sort path masks an unspecified
   part of the run (only the elements whose own cumsum is ``<= 1 - p``); this kernel keeps the
   whole run (a superset of the sort path's kept set, by the elements of that one value).
2. *Rounding at the top-p boundary* — the sort path compares torch's float32 softmax's float32
   ``cumsum`` with ``1 - p``; this kernel compares float64 sums of float32 ``exp(x - max)``.
   Where the cumulative mass at the boundary is within float32 rounding of ``1 - p`` (the
   test allows ``2e-5`` of probability, ``5e-5`` on CUDA at V = 151,936) the two can put the
   boundary one value apart.
3. *``p == 1`` is off.* vLLM's sort path, called with a ``p`` tensor (a batch where some other
   row has top-p), still masks a ``p == 1`` row's leading tokens whose float32 probability is
   exactly 0 (``cumsum <= 0``); here such a row is untouched (as vLLM's path is when no row
   has top-p).
4. NaN or ``+inf`` logits: unspecified (the sort path's softmax is NaN there too).

**The draw** (:func:`sample_batch_invariant_triton`): ``argmax(x + g)`` over the kept set,
the lowest token on ties, with counter-based noise (all ``uint32`` arithmetic wrapping)::

    fmix32(h): h ^= h >> 16; h *= 0x85EBCA6B; h ^= h >> 13; h *= 0xC2B2AE35; h ^= h >> 16
    key  = fmix32(fmix32(fmix32(fmix32(lo32(seed) ^ 0x9E3779B9) ^ hi32(seed))
                         ^ lo32(position)) ^ hi32(position))
    bits = fmix32(fmix32(token ^ key) + key)
    u    = (float32(bits >> 9) + 0.5) * 2^-23          # exact, strictly inside (0, 1)
    g    = -ln(-ln(u))                                  # float32

``seed`` and ``position`` are int64 read as their 64-bit two's-complement patterns. The bits,
``u`` and the argmax are exact. ``ln`` is float32: under the interpreter numpy's ``log``; on
CUDA libdevice's ``logf`` (within 1 ulp), so ``g`` agrees with any other float32 ``ln`` (the
Rust core's included) to within ``ln``'s rounding, and a token can differ from the CPU's only
where two scores are within that rounding of each other. A row whose kept set has no finite
value samples token 0. The token depends on the row's logits, seed and position only: never on
the batch, the row index or the batch size.

Cost on CUDA: one max pass (none for the draw alone), 8 top-k passes (none when top-k is off
or ``k == 1``), 8 top-p passes (none when top-p is off or top-k kept only the max's ties), and
one masking / sampling pass; every pass reads the row once, only the last writes.

**The fused tail** (:func:`sample_fused_triton`, issue 41's CUDA half): the steps of the CPU
fused pass (``rust/src/sampling/fused.rs``) in one launch, one program per row, in its order:
temperature, min-p, top-n-sigma, typical-p, epsilon, eta, XTC, top-k / top-p, the draw above.
No pass writes but the last; every other pass reads the row and recomputes the steps decided
so far on the fly (each deterministic, so every pass sees the same processed row). Against
the CPU pass:

* temperature (IEEE division: libdevice's ``div_rn`` on CUDA, not an approximate divide) and
  min-p (``x < max + ln(min_p)``, float32): bitwise. XTC's ``u < xtc_probability``: float32,
  bitwise.
* top-n-sigma, typical-p, epsilon, eta, XTC: ``fused.rs``'s float64 statistics (count and
  mean, then the squared deviations; ``sum e``; ``sum e (x - max)`` and the entropy; the
  typicality scores ``|-log p - H|`` and their mass; XTC's ``e >= threshold * sum e``, the
  count and the least of them) and comparisons; the sums are tree-ordered here (a few
  float64 ulps apart) and ``e = exp(x - max)`` is float32 (numpy's or libdevice's ``expf``
  against the core's polynomial, about 1 ulp apart): an entry may be decided differently
  only within ``fused.rs``'s ``BOUNDARY_REL`` (relative) of its threshold.
* typical-p's threshold: the score (float64, its bits as a ``uint64`` key, ordered as the
  scores since they are ``>= 0``) at which the mass in ascending score order first reaches
  ``typical_p``, found by the same digit search as top-p over 64 bits: the largest key ``C``
  with ``mass(key < C) < typical_p * sum e``; kept: ``key <= C`` (the whole tied group at
  the threshold; never reached by rounding: every entry). Typical-p may drop the row's max,
  and XTC does when it fires: a pass after each finds the max the later steps shift by and
  keep (epsilon and eta never mask it; top-k / top-p read it).
* top-k exact; top-p as the kernel above, against the CPU pass's non-strict float64 decision
  (which also keeps whole tied runs): apart only within ``exp`` rounding of ``1 - p``, and on
  ``p == 1`` rows of a batch with top-p (item 3): the CPU pass masks the entries whose float32
  probability is 0 (more than 87 below the max), this kernel leaves them. Such an entry never
  wins the draw (the noise spans less than 20), so the token is the same.
* a row holding NaN or ``+inf``, or no finite value, gets no truncation and no XTC (as
  ``fused.rs``); top-k / top-p and the draw are then item 4's (an all ``-inf`` row samples
  token 0).

Passes per row: the max; top-n-sigma 2; typical-p 1 (the entropy), ``64 / DIGIT_BITS`` (the
threshold) and 1 (the max it leaves); epsilon 1; eta 1; XTC 2 (the sum, then the count and
the least) and 1 more when it masks (the max it leaves): each only on rows that set it (a row
whose value is neutral, or whose XTC draw does not fire, skips the passes); then the top-k and
top-p searches and the last pass, which writes only the entries that changed. A row with
temperature alone, or nothing, reads its row once (the draw), as
:func:`sample_batch_invariant_triton` without top-k / top-p.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import triton
import triton.language as tl

from ..errors import ConfigError, InputError
from . import interpreting

try:  # libdevice's logf / expf on CUDA (the interpreter uses numpy's)
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - an old triton: tl.log / tl.exp everywhere
    libdevice = None

_NO_FMA = {"enable_fp_fusion": False}

#: Bits of the key decided per search pass (``2^bits`` candidates scored at once, ``32 / bits``
#: passes): ``None`` chooses, 4 on CUDA (16 candidates in registers) and 8 under the
#: interpreter (half the passes; its cost is per operation, not per element). Every choice
#: finds the same keys.
DIGIT_BITS: int | None = None


def digit_bits(device: torch.device) -> int:
    if DIGIT_BITS is not None:
        if DIGIT_BITS not in (1, 2, 4, 8):
            raise ConfigError(
                f"DIGIT_BITS must be 1, 2, 4 or 8, got {DIGIT_BITS}", field="DIGIT_BITS"
            )
        return DIGIT_BITS
    return 4 if device.type == "cuda" else 8


# --- the noise -------------------------------------------------------------------------------


@triton.jit
def _fmix32(h):
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _row_key(seed, position):
    """``seed``, ``position``: int64 (scalars or tensors); the ``uint32`` row key."""
    s = seed.to(tl.uint64, bitcast=True)
    q = position.to(tl.uint64, bitcast=True)
    h = _fmix32((s & 0xFFFFFFFF).to(tl.uint32) ^ 0x9E3779B9)
    h = _fmix32(h ^ (s >> 32).to(tl.uint32))
    h = _fmix32(h ^ (q & 0xFFFFFFFF).to(tl.uint32))
    return _fmix32(h ^ (q >> 32).to(tl.uint32))


@triton.jit
def _token_bits(key, token):
    """``key``: uint32; ``token``: any integer type (its low 32 bits)."""
    t = token.to(tl.uint32)
    return _fmix32(_fmix32(t ^ key) + key)


@triton.jit
def _log(x, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:
        return libdevice.log(x)
    else:
        return tl.log(x)


@triton.jit
def _exp(x, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def _gumbel(bits, LIBDEVICE: tl.constexpr):
    u = ((bits >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2^-23
    return -_log(-_log(u, LIBDEVICE), LIBDEVICE)


@triton.jit
def _noise_kernel(
    seed_ptr, pos_ptr, tok_ptr, bits_ptr, g_ptr, n, LIBDEVICE: tl.constexpr, BLOCK: tl.constexpr
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    seed = tl.load(seed_ptr + offs, mask=m, other=0)
    pos = tl.load(pos_ptr + offs, mask=m, other=0)
    tok = tl.load(tok_ptr + offs, mask=m, other=0)
    bits = _token_bits(_row_key(seed, pos), tok)
    tl.store(bits_ptr + offs, bits.to(tl.int64), mask=m)
    tl.store(g_ptr + offs, _gumbel(bits, LIBDEVICE), mask=m)


# --- the kept set and the draw ---------------------------------------------------------------


@triton.jit
def _order_key(x):
    """float32 -> uint32 with the float order (-0.0 and +0.0 one key)."""
    b = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    # negative: all bits flipped; positive: the sign bit set
    return (b ^ ((b >> 31) | -2147483648)).to(tl.uint32, bitcast=True)


@triton.jit
def _tail_kernel(
    x_ptr,
    stride,
    k_ptr,
    p_ptr,
    seed_ptr,
    pos_ptr,
    out_ptr,
    V,
    HAS_K: tl.constexpr,
    HAS_P: tl.constexpr,
    SAMPLE: tl.constexpr,
    LIBDEVICE: tl.constexpr,
    DIGIT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    base = x_ptr + row.to(tl.int64) * stride
    lanes = tl.arange(0, BLOCK)
    digits = tl.arange(0, 1 << DIGIT).to(tl.uint32)
    zero_key = (row * 0).to(tl.uint32)

    # The row max (the top of every kept set; the draw alone does not need it).
    mx = float("-inf")
    if HAS_K or HAS_P:
        for start in range(0, V, BLOCK):
            offs = start + lanes
            x = tl.load(base + offs, mask=offs < V, other=float("-inf"))
            mx = tl.maximum(mx, tl.max(x, 0))
    max_key = _order_key(mx)

    # Top-k: the largest key K with #{key >= K} >= k.
    cut_k = zero_key  # key 0 is below every float: keeps all
    if HAS_K:
        k = tl.load(k_ptr + row)
        if k == 1:
            cut_k = max_key
        elif (k > 1) & (k < V):
            for j in tl.static_range(32 // DIGIT):
                cand = cut_k + (digits << (32 - DIGIT * (j + 1)))
                cnt = tl.zeros([1 << DIGIT], tl.int32)
                for start in range(0, V, BLOCK):
                    offs = start + lanes
                    inside = offs < V
                    key = _order_key(tl.load(base + offs, mask=inside, other=0.0))
                    ge = (key[:, None] >= cand[None, :]) & inside[:, None]
                    cnt += tl.sum(ge.to(tl.int32), 0)
                cut_k += tl.max(tl.where(cnt >= k, digits, 0), 0) << (32 - DIGIT * (j + 1))

    # Top-p on the top-k-kept row: the largest key C with mass(key < C) <= (1 - p) * Z.
    cut_p = zero_key
    if HAS_P:
        p = tl.load(p_ptr + row)
        # Off: p >= 1; nothing to cut: an all -inf row, or top-k kept only the max's ties.
        if (p < 1.0) & (mx > float("-inf")) & (cut_k < max_key):
            thr = (1.0 - p).to(tl.float64)
            total = tl.zeros([], tl.float64)
            for j in tl.static_range(32 // DIGIT):
                cand = cut_p + (digits << (32 - DIGIT * (j + 1)))
                mass = tl.zeros([1 << DIGIT], tl.float64)
                for start in range(0, V, BLOCK):
                    offs = start + lanes
                    inside = offs < V
                    x = tl.load(base + offs, mask=inside, other=float("-inf"))
                    key = _order_key(x)
                    e = tl.where(inside & (key >= cut_k), _exp(x - mx, LIBDEVICE), 0.0)
                    e64 = e.to(tl.float64)
                    below = key[:, None] < cand[None, :]
                    mass += tl.sum(tl.where(below, e64[:, None], 0.0), 0)
                    if j == 0:
                        total += tl.sum(e64, 0)
                ok = mass <= thr * total
                cut_p += tl.max(tl.where(ok, digits, 0), 0) << (32 - DIGIT * (j + 1))
            cut_p = tl.minimum(cut_p, max_key)

    # Mask outside the kept set; the Gumbel race over it.
    cut = tl.maximum(cut_k, cut_p)
    best = float("-inf")
    best_i = row * 0
    if SAMPLE:
        rkey = _row_key(tl.load(seed_ptr + row), tl.load(pos_ptr + row))
    for start in range(0, V, BLOCK):
        offs = start + lanes
        inside = offs < V
        x = tl.load(base + offs, mask=inside, other=float("-inf"))
        kept = _order_key(x) >= cut
        if HAS_K or HAS_P:
            tl.store(base + offs, float("-inf"), mask=inside & ~kept)
        if SAMPLE:
            g = _gumbel(_token_bits(rkey, offs), LIBDEVICE)
            score = tl.where(inside & kept, x + g, float("-inf"))
            tile_best = tl.max(score, 0)
            if tile_best > best:  # strictly: an earlier tile wins a tie
                best = tile_best
                best_i = start + tl.argmax(score, 0, tie_break_left=True)
    if SAMPLE:
        tl.store(out_ptr + row, best_i.to(tl.int64))


# --- launchers -------------------------------------------------------------------------------


def _check_device(t: torch.Tensor, what: str) -> None:
    if t.device.type != "cuda" and not interpreting():
        raise RuntimeError(
            f"{what}: the Triton sampling kernels need CUDA tensors (or TRITON_INTERPRET=1, "
            f"set before triton is imported, for CPU tensors); got {t.device}"
        )


def _check_logits(logits: torch.Tensor, what: str) -> tuple[int, int]:
    """``(rows, vocab)`` of float32 ``[B, V]`` logits with contiguous rows on a device the
    kernels run on; ``InputError`` otherwise."""
    _check_device(logits, what)
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise InputError(f"{what}: expected float32 [B, V] logits, got {logits.dtype} "
                         f"{tuple(logits.shape)}")  # fmt: skip
    rows, vocab = logits.shape
    if vocab > 1 and logits.stride(1) != 1:
        raise InputError(f"{what}: the logits' rows must be contiguous")
    return rows, vocab


def _block(vocab: int) -> int:
    """The tile over the vocabulary one program reads at a time."""
    return max(16, min(1024, triton.next_power_of_2(vocab)))


def _row_param(
    t: torch.Tensor | None, rows: int, dtype: torch.dtype, device: torch.device, what: str
) -> torch.Tensor | None:
    if t is None:
        return None
    if t.shape != (rows,):
        raise InputError(f"{what}: expected shape ({rows},), got {tuple(t.shape)}", field=what)
    return t.to(device=device, dtype=dtype).contiguous()


def _launch(
    logits: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    seeds: torch.Tensor | None,
    positions: torch.Tensor | None,
    sample: bool,
) -> torch.Tensor | None:
    what = "sample_batch_invariant_triton" if sample else "mask_top_k_top_p_triton_"
    rows, vocab = _check_logits(logits, what)
    dev = logits.device
    k = _row_param(top_k, rows, torch.int64, dev, "top_k")
    p = _row_param(top_p, rows, torch.float32, dev, "top_p")
    s = _row_param(seeds, rows, torch.int64, dev, "seeds")
    q = _row_param(positions, rows, torch.int64, dev, "positions")
    out = torch.zeros(rows, dtype=torch.int64, device=dev) if sample else None
    if rows == 0 or vocab == 0 or (not sample and k is None and p is None):
        return out
    dummy = logits
    block = _block(vocab)
    _tail_kernel[(rows,)](
        logits,
        logits.stride(0),
        dummy if k is None else k,
        dummy if p is None else p,
        dummy if s is None else s,
        dummy if q is None else q,
        dummy if out is None else out,
        vocab,
        HAS_K=k is not None,
        HAS_P=p is not None,
        SAMPLE=sample,
        LIBDEVICE=dev.type == "cuda" and libdevice is not None,
        DIGIT=digit_bits(dev),
        BLOCK=block,
        num_warps=8,
        **_NO_FMA,
    )
    return out


def mask_top_k_top_p_triton_(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """In place: ``-inf`` outside each row's top-k / top-p kept set (module docs). ``logits``:
    float32 ``[B, V]``, rows contiguous; ``top_k``: int64 ``[B]`` (``>= V`` or ``<= 0``: off);
    ``top_p``: float32 ``[B]`` in ``(0, 1]`` (``1``: off); either may be ``None`` (off for
    every row). Top-k is exactly vLLM 0.25.1's; top-p may differ from its sort path only at a
    boundary that cuts a run of tied values (here the whole run is kept) or within float
    rounding of ``1 - p``, and on ``p == 1`` rows (off here). Returns ``logits``."""
    _launch(logits, top_k, top_p, None, None, sample=False)
    return logits


def sample_batch_invariant_triton(
    logits: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    seeds: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """The kept sets of :func:`mask_top_k_top_p_triton_` (written in place, so ``logits`` are
    the processed logits afterwards), then one token per row: ``argmax(x + g)`` over the kept
    set, lowest token on ties, ``g`` the counter-based Gumbel noise of (``seeds[i]``,
    ``positions[i]``, token) (int64 ``[B]`` each; module docs). The noise bits are exact; ``g``
    is exact up to float32 ``ln`` rounding. Returns int64 ``[B]`` tokens (0 for a row with no
    finite kept value)."""
    out = _launch(logits, top_k, top_p, seeds, positions, sample=True)
    assert out is not None
    return out


def gumbel_noise_triton(
    seeds: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The noise alone, elementwise over equal-shaped int64 ``seeds``, ``positions`` and
    integer ``tokens``: (``bits`` as int64 in ``[0, 2^32)``, ``g`` float32)."""
    _check_device(tokens, "gumbel_noise_triton")
    if not seeds.shape == positions.shape == tokens.shape:
        raise InputError("gumbel_noise_triton: seeds, positions and tokens differ in shape")
    dev = tokens.device
    s = seeds.to(dev, torch.int64).contiguous().view(-1)
    q = positions.to(dev, torch.int64).contiguous().view(-1)
    t = tokens.to(dev, torch.int64).contiguous().view(-1)
    n = t.numel()
    bits = torch.empty(n, dtype=torch.int64, device=dev)
    g = torch.empty(n, dtype=torch.float32, device=dev)
    if n:
        block = max(16, min(1024, triton.next_power_of_2(n)))
        _noise_kernel[(triton.cdiv(n, block),)](
            s,
            q,
            t,
            bits,
            g,
            n,
            LIBDEVICE=dev.type == "cuda" and libdevice is not None,
            BLOCK=block,
            **_NO_FMA,
        )
    return bits.view(tokens.shape), g.view(tokens.shape)


# --- the fused tail (issue 41): the CPU fused pass's steps, one launch -----------------------


@triton.jit
def _div(x, t, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:
        return libdevice.div_rn(x, t)  # IEEE division, as torch's div_
    else:
        return x / t


@triton.jit
def _typicality_key(x, mx, ln_z, entropy):
    """typical-p's score ``|-(x - mx - ln z) - H|`` (float64, as ``fused.rs``) as a uint64 key
    with the scores' order (a score is >= 0: its bits are ordered as it is)."""
    log_p = (x - mx).to(tl.float64) - ln_z
    return tl.abs(-log_p - entropy).to(tl.uint64, bitcast=True)


@triton.jit
def _processed(
    raw,
    inside,
    t,
    mx,
    mx1,
    minp_thr,
    sig_thr,
    typ_lnz,
    typ_h,
    typ_cut,
    eps_below,
    eta_below,
    xtc_least,
    HAS_T: tl.constexpr,
    HAS_MINP: tl.constexpr,
    HAS_SIGMA: tl.constexpr,
    HAS_TYP: tl.constexpr,
    HAS_EXP: tl.constexpr,
    HAS_XTC: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    """One tile of the row as the steps leave it (``-inf`` where a step masks), each step's
    threshold as far as it is known (an unknown one is neutral: it masks nothing). ``mx``:
    the max after temperature (min-p, top-n-sigma and typical-p's scores); ``mx1``: the max
    typical-p leaves (epsilon, eta and XTC)."""
    x = raw
    if HAS_T:
        x = _div(x, t, LIBDEVICE)
    x = tl.where(inside, x, float("-inf"))
    if HAS_MINP:
        x = tl.where(x < minp_thr, float("-inf"), x)
    if HAS_SIGMA:
        x = tl.where(x.to(tl.float64) < sig_thr, float("-inf"), x)
    if HAS_TYP:
        # Every score above the threshold's key (neutral: the largest key, nothing above).
        atypical = _typicality_key(x, mx, typ_lnz, typ_h) > typ_cut
        x = tl.where(atypical & (x > float("-inf")), float("-inf"), x)
    if HAS_EXP or HAS_XTC:
        # e = exp(x - max) of the row typical-p leaves (a row without a max, all -inf or not
        # needing it, has neutral cutoffs: shift by 0).
        e = _exp(x - tl.where(mx1 > float("-inf"), mx1, 0.0), LIBDEVICE).to(tl.float64)
        if HAS_EXP:
            # epsilon then eta: both compare e with their cutoff * sum, never the max; an
            # entry epsilon masked is masked whatever eta says.
            low = ((e < eps_below) | (e < eta_below)) & (x < mx1)
            x = tl.where(low, float("-inf"), x)
        if HAS_XTC:
            # XTC once it fires: the qualifying entries more likely than the least of them
            # (neutral: +inf, nothing above).
            x = tl.where((e > xtc_least) & (x > float("-inf")), float("-inf"), x)
    return x


@triton.jit
def _fused_kernel(
    x_ptr,
    stride,
    t_ptr,
    minp_ptr,
    sigma_ptr,
    typ_ptr,
    eps_ptr,
    eta_ptr,
    xtc_prob_ptr,
    xtc_thr_ptr,
    xtc_u_ptr,
    k_ptr,
    p_ptr,
    seed_ptr,
    pos_ptr,
    out_ptr,
    V,
    HAS_T: tl.constexpr,
    HAS_MINP: tl.constexpr,
    HAS_SIGMA: tl.constexpr,
    HAS_TYP: tl.constexpr,
    HAS_EPS: tl.constexpr,
    HAS_ETA: tl.constexpr,
    HAS_EXP: tl.constexpr,
    HAS_XTC: tl.constexpr,
    HAS_K: tl.constexpr,
    HAS_P: tl.constexpr,
    LIBDEVICE: tl.constexpr,
    DIGIT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    base = x_ptr + row.to(tl.int64) * stride
    lanes = tl.arange(0, BLOCK)
    digits = tl.arange(0, 1 << DIGIT).to(tl.uint32)
    digits64 = digits.to(tl.uint64)
    zero_key = (row * 0).to(tl.uint32)
    ninf = float("-inf")

    t = tl.full([], 1.0, tl.float32)
    if HAS_T:
        t = tl.load(t_ptr + row)
    # Neutral thresholds (mask nothing) until a step's own is known.
    minp_thr = tl.full([], ninf, tl.float32)
    sig_thr = tl.zeros([], tl.float64) + ninf
    typ_lnz = tl.zeros([], tl.float64)
    typ_h = tl.zeros([], tl.float64)
    typ_cut = (zero_key.to(tl.uint64) + 0xFFFFFFFF) << 32 | 0xFFFFFFFF
    eps_below = tl.zeros([], tl.float64)
    eta_below = tl.zeros([], tl.float64)
    xtc_least = tl.zeros([], tl.float64) + float("inf")

    # The row's values (neutral where the batch has none).
    lmp = tl.full([], ninf, tl.float32)
    n_sigma = tl.zeros([], tl.float32)
    typ = tl.full([], 1.0, tl.float32)
    eps = tl.zeros([], tl.float32)
    eta = tl.zeros([], tl.float32)
    xtc_prob = tl.zeros([], tl.float32)
    xtc_thr = tl.full([], 1.0, tl.float32)
    xtc_u = tl.full([], 1.0, tl.float32)
    k = (row * 0).to(tl.int64)
    p = tl.full([], 1.0, tl.float32)
    if HAS_MINP:
        lmp = tl.load(minp_ptr + row)
    if HAS_SIGMA:
        n_sigma = tl.load(sigma_ptr + row)
    if HAS_TYP:
        typ = tl.load(typ_ptr + row)
    if HAS_EPS:
        eps = tl.load(eps_ptr + row)
    if HAS_ETA:
        eta = tl.load(eta_ptr + row)
    if HAS_XTC:
        xtc_prob = tl.load(xtc_prob_ptr + row)
        xtc_thr = tl.load(xtc_thr_ptr + row)
        xtc_u = tl.load(xtc_u_ptr + row)
    if HAS_K:
        k = tl.load(k_ptr + row)
    if HAS_P:
        p = tl.load(p_ptr + row)
    xtc_fires = xtc_u < xtc_prob  # float32, as torch's ``u < probability``
    trunc = (lmp > ninf) | (n_sigma > 0.0) | (typ < 1.0) | (eps > 0.0) | (eta > 0.0) | xtc_fires
    needs_max = trunc | ((k > 0) & (k < V)) | (p < 1.0)

    # Pass 1: the max after temperature (min-p and top-n-sigma keep it), and whether the row
    # holds NaN (then, as +inf or no finite value, no truncation applies).
    mx = tl.full([], ninf, tl.float32)
    nan = row * 0
    if needs_max:  # a row with temperature alone (or nothing) goes straight to the draw
        for start in range(0, V, BLOCK):
            offs = start + lanes
            inside = offs < V
            raw = tl.load(base + offs, mask=inside, other=ninf)
            x = _processed(raw, inside, t, mx, mx, minp_thr, sig_thr, typ_lnz, typ_h, typ_cut,
                           eps_below, eta_below, xtc_least,
                           HAS_T, False, False, False, False, False, LIBDEVICE)  # fmt: skip
            mx = tl.maximum(mx, tl.max(x, 0))
            nan += tl.sum((x != x).to(tl.int32), 0)
    ok = trunc & (nan == 0) & (mx < float("inf")) & (mx > ninf)

    if HAS_MINP:  # noqa: SIM102 (a constexpr: the step is compiled out)
        if ok & (lmp > ninf):
            minp_thr = mx + lmp  # float32, as the separate min-p

    if HAS_SIGMA:  # noqa: SIM102 (a constexpr: the step is compiled out)
        if ok & (n_sigma > 0.0):
            cnt = tl.zeros([], tl.float64)
            s1 = tl.zeros([], tl.float64)
            for start in range(0, V, BLOCK):
                offs = start + lanes
                inside = offs < V
                raw = tl.load(base + offs, mask=inside, other=ninf)
                x = _processed(raw, inside, t, mx, mx, minp_thr, sig_thr, typ_lnz, typ_h,
                               typ_cut, eps_below, eta_below, xtc_least,
                               HAS_T, HAS_MINP, False, False, False, False, LIBDEVICE)  # fmt: skip
                fin = x > ninf
                cnt += tl.sum(fin.to(tl.float64), 0)
                s1 += tl.sum(tl.where(fin, x.to(tl.float64), 0.0), 0)
            mean = s1 / cnt
            sq = tl.zeros([], tl.float64)
            for start in range(0, V, BLOCK):
                offs = start + lanes
                inside = offs < V
                raw = tl.load(base + offs, mask=inside, other=ninf)
                x = _processed(raw, inside, t, mx, mx, minp_thr, sig_thr, typ_lnz, typ_h,
                               typ_cut, eps_below, eta_below, xtc_least,
                               HAS_T, HAS_MINP, False, False, False, False, LIBDEVICE)  # fmt: skip
                d = tl.where(x > ninf, x.to(tl.float64) - mean, 0.0)
                sq += tl.sum(d * d, 0)
            std = _sqrt(sq / cnt, LIBDEVICE)
            sig_thr = mx.to(tl.float64) - n_sigma.to(tl.float64) * std

    # The max typical-p leaves (epsilon, eta and XTC shift by it and never mask it).
    mx1 = mx
    if HAS_TYP:  # noqa: SIM102 (a constexpr: the step is compiled out)
        if ok & (typ < 1.0):
            # The entropy: -sum p (x - lse) with lse = max + ln(z), as eta's.
            z = tl.zeros([], tl.float64)
            w = tl.zeros([], tl.float64)
            for start in range(0, V, BLOCK):
                offs = start + lanes
                inside = offs < V
                raw = tl.load(base + offs, mask=inside, other=ninf)
                x = _processed(raw, inside, t, mx, mx, minp_thr, sig_thr, typ_lnz, typ_h,
                               typ_cut, eps_below, eta_below, xtc_least,
                               HAS_T, HAS_MINP, HAS_SIGMA, False, False, False,
                               LIBDEVICE)  # fmt: skip
                fin = x > ninf
                e = tl.where(fin, _exp(x - mx, LIBDEVICE), 0.0).to(tl.float64)
                z += tl.sum(e, 0)
                w += tl.sum(e * tl.where(fin, x - mx, 0.0).to(tl.float64), 0)
            typ_lnz = _log(z, LIBDEVICE)
            typ_h = typ_lnz - w / z
            # The threshold: the largest score key C with mass(key < C) < typical_p * z, i.e.
            # the score where the mass in ascending score order first reaches typical_p
            # (every entry scoring at most it kept; never reached: every key kept).
            need = typ.to(tl.float64) * z
            cut = zero_key.to(tl.uint64)
            for j in tl.static_range(64 // DIGIT):
                cand = cut + (digits64 << (64 - DIGIT * (j + 1)))
                mass = tl.zeros([1 << DIGIT], tl.float64)
                for start in range(0, V, BLOCK):
                    offs = start + lanes
                    inside = offs < V
                    raw = tl.load(base + offs, mask=inside, other=ninf)
                    x = _processed(raw, inside, t, mx, mx, minp_thr, sig_thr, typ_lnz, typ_h,
                                   typ_cut, eps_below, eta_below, xtc_least,
                                   HAS_T, HAS_MINP, HAS_SIGMA, False, False, False,
                                   LIBDEVICE)  # fmt: skip
                    fin = x > ninf
                    e64 = tl.where(fin, _exp(x - mx, LIBDEVICE), 0.0).to(tl.float64)
                    key = _typicality_key(x, mx, typ_lnz, typ_h)
                    below = (key[:, None] < cand[None, :]) & fin[:, None]
                    mass += tl.sum(tl.where(below, e64[:, None], 0.0), 0)
                cut += tl.max(tl.where(mass < need, digits64, 0), 0) << (64 - DIGIT * (j + 1))
            typ_cut = cut
            # Typical-p may drop the max: the max of what it keeps.
            mx1 = tl.full([], ninf, tl.float32)
            for start in range(0, V, BLOCK):
                offs = start + lanes
                inside = offs < V
                raw = tl.load(base + offs, mask=inside, other=ninf)
                x = _processed(raw, inside, t, mx, mx, minp_thr, sig_thr, typ_lnz, typ_h,
                               typ_cut, eps_below, eta_below, xtc_least,
                               HAS_T, HAS_MINP, HAS_SIGMA, HAS_TYP, False, False,
                               LIBDEVICE)  # fmt: skip
                mx1 = tl.maximum(mx1, tl.max(x, 0))

    if HAS_EPS:  # noqa: SIM102 (a constexpr: the step is compiled out)
        if ok & (eps > 0.0):
            z = tl.zeros([], tl.float64)
            for start in range(0, V, BLOCK):
                offs = start + lanes
                inside = offs < V
                raw = tl.load(base + offs, mask=inside, other=ninf)
                x = _processed(raw, inside, t, mx, mx1, minp_thr, sig_thr, typ_lnz, typ_h,
                               typ_cut, eps_below, eta_below, xtc_least,
                               HAS_T, HAS_MINP, HAS_SIGMA, HAS_TYP, False, False,
                               LIBDEVICE)  # fmt: skip
                z += tl.sum(_exp(x - mx1, LIBDEVICE).to(tl.float64), 0)
            eps_below = eps.to(tl.float64) * z

    if HAS_ETA:  # noqa: SIM102 (a constexpr: the step is compiled out)
        if ok & (eta > 0.0):
            z = tl.zeros([], tl.float64)
            w = tl.zeros([], tl.float64)
            for start in range(0, V, BLOCK):
                offs = start + lanes
                inside = offs < V
                raw = tl.load(base + offs, mask=inside, other=ninf)
                x = _processed(raw, inside, t, mx, mx1, minp_thr, sig_thr, typ_lnz, typ_h,
                               typ_cut, eps_below, eta_below, xtc_least,
                               HAS_T, HAS_MINP, HAS_SIGMA, HAS_TYP, HAS_EPS, False,
                               LIBDEVICE)  # fmt: skip
                fin = x > ninf
                e = tl.where(fin, _exp(x - mx1, LIBDEVICE), 0.0).to(tl.float64)
                z += tl.sum(e, 0)
                w += tl.sum(e * tl.where(fin, x - mx1, 0.0).to(tl.float64), 0)
            # The categorical's entropy, -sum p (x - lse) with lse = max + ln(z).
            entropy = _log(z, LIBDEVICE) - w / z
            e64 = eta.to(tl.float64)
            cutoff = tl.minimum(e64, _sqrt(e64, LIBDEVICE) * _exp(-entropy, LIBDEVICE))
            eta_below = cutoff * z

    # The max XTC leaves (top-k / top-p read it; the max is kept by every step before).
    mx2 = mx1
    if HAS_XTC:  # noqa: SIM102 (a constexpr: the step is compiled out)
        if ok & xtc_fires:
            z = tl.zeros([], tl.float64)
            for start in range(0, V, BLOCK):
                offs = start + lanes
                inside = offs < V
                raw = tl.load(base + offs, mask=inside, other=ninf)
                x = _processed(raw, inside, t, mx, mx1, minp_thr, sig_thr, typ_lnz, typ_h,
                               typ_cut, eps_below, eta_below, xtc_least,
                               HAS_T, HAS_MINP, HAS_SIGMA, HAS_TYP, HAS_EXP, False,
                               LIBDEVICE)  # fmt: skip
                z += tl.sum(_exp(x - mx1, LIBDEVICE).to(tl.float64), 0)
            # Qualifying: e >= threshold * z; how many, and the least of them.
            at_least = xtc_thr.to(tl.float64) * z
            n_q = row * 0
            least = tl.zeros([], tl.float64) + float("inf")
            for start in range(0, V, BLOCK):
                offs = start + lanes
                inside = offs < V
                raw = tl.load(base + offs, mask=inside, other=ninf)
                x = _processed(raw, inside, t, mx, mx1, minp_thr, sig_thr, typ_lnz, typ_h,
                               typ_cut, eps_below, eta_below, xtc_least,
                               HAS_T, HAS_MINP, HAS_SIGMA, HAS_TYP, HAS_EXP, False,
                               LIBDEVICE)  # fmt: skip
                e = tl.where(x > ninf, _exp(x - mx1, LIBDEVICE), 0.0).to(tl.float64)
                q = e >= at_least
                n_q += tl.sum(q.to(tl.int32), 0)
                least = tl.minimum(least, tl.min(tl.where(q, e, float("inf")), 0))
            if n_q >= 2:
                xtc_least = least
                mx2 = tl.full([], ninf, tl.float32)
                for start in range(0, V, BLOCK):
                    offs = start + lanes
                    inside = offs < V
                    raw = tl.load(base + offs, mask=inside, other=ninf)
                    x = _processed(raw, inside, t, mx, mx1, minp_thr, sig_thr, typ_lnz, typ_h,
                                   typ_cut, eps_below, eta_below, xtc_least,
                                   HAS_T, HAS_MINP, HAS_SIGMA, HAS_TYP, HAS_EXP, HAS_XTC,
                                   LIBDEVICE)  # fmt: skip
                    mx2 = tl.maximum(mx2, tl.max(x, 0))

    # Top-k on the truncated row: the largest key K with #{key >= K} >= k.
    max_key = _order_key(mx2)
    cut_k = zero_key
    if HAS_K:
        if k == 1:
            cut_k = max_key
        elif (k > 1) & (k < V):
            for j in tl.static_range(32 // DIGIT):
                cand = cut_k + (digits << (32 - DIGIT * (j + 1)))
                cnt_k = tl.zeros([1 << DIGIT], tl.int32)
                for start in range(0, V, BLOCK):
                    offs = start + lanes
                    inside = offs < V
                    raw = tl.load(base + offs, mask=inside, other=ninf)
                    x = _processed(raw, inside, t, mx, mx1, minp_thr, sig_thr, typ_lnz, typ_h,
                                   typ_cut, eps_below, eta_below, xtc_least,
                                   HAS_T, HAS_MINP, HAS_SIGMA, HAS_TYP, HAS_EXP, HAS_XTC,
                                   LIBDEVICE)  # fmt: skip
                    key = _order_key(x)
                    ge = (key[:, None] >= cand[None, :]) & inside[:, None]
                    cnt_k += tl.sum(ge.to(tl.int32), 0)
                cut_k += tl.max(tl.where(cnt_k >= k, digits, 0), 0) << (32 - DIGIT * (j + 1))

    # Top-p on the top-k-kept row: the largest key C with mass(key < C) <= (1 - p) * Z.
    cut_p = zero_key
    if HAS_P:  # noqa: SIM102 (a constexpr: the step is compiled out)
        if (p < 1.0) & (mx2 > ninf) & (cut_k < max_key):
            thr = (1.0 - p).to(tl.float64)
            total = tl.zeros([], tl.float64)
            for j in tl.static_range(32 // DIGIT):
                cand = cut_p + (digits << (32 - DIGIT * (j + 1)))
                mass = tl.zeros([1 << DIGIT], tl.float64)
                for start in range(0, V, BLOCK):
                    offs = start + lanes
                    inside = offs < V
                    raw = tl.load(base + offs, mask=inside, other=ninf)
                    x = _processed(raw, inside, t, mx, mx1, minp_thr, sig_thr, typ_lnz, typ_h,
                                   typ_cut, eps_below, eta_below, xtc_least,
                                   HAS_T, HAS_MINP, HAS_SIGMA, HAS_TYP, HAS_EXP, HAS_XTC,
                                   LIBDEVICE)  # fmt: skip
                    key = _order_key(x)
                    e = tl.where(inside & (key >= cut_k), _exp(x - mx2, LIBDEVICE), 0.0)
                    e64 = e.to(tl.float64)
                    below = key[:, None] < cand[None, :]
                    mass += tl.sum(tl.where(below, e64[:, None], 0.0), 0)
                    if j == 0:
                        total += tl.sum(e64, 0)
                okp = mass <= thr * total
                cut_p += tl.max(tl.where(okp, digits, 0), 0) << (32 - DIGIT * (j + 1))
            cut_p = tl.minimum(cut_p, max_key)

    # The last pass: write the processed row where it changed, and the Gumbel race over it.
    cut = tl.maximum(cut_k, cut_p)
    best = float("-inf")
    best_i = row * 0
    rkey = _row_key(tl.load(seed_ptr + row), tl.load(pos_ptr + row))
    for start in range(0, V, BLOCK):
        offs = start + lanes
        inside = offs < V
        raw = tl.load(base + offs, mask=inside, other=ninf)
        x = _processed(raw, inside, t, mx, mx1, minp_thr, sig_thr, typ_lnz, typ_h, typ_cut,
                       eps_below, eta_below, xtc_least,
                       HAS_T, HAS_MINP, HAS_SIGMA, HAS_TYP, HAS_EXP, HAS_XTC,
                       LIBDEVICE)  # fmt: skip
        x = tl.where(_order_key(x) >= cut, x, ninf)
        tl.store(base + offs, x, mask=inside & (x != raw))
        g = _gumbel(_token_bits(rkey, offs), LIBDEVICE)
        score = tl.where(inside, x + g, ninf)
        tile_best = tl.max(score, 0)
        if tile_best > best:  # strictly: an earlier tile wins a tie
            best = tile_best
            best_i = start + tl.argmax(score, 0, tie_break_left=True)
    tl.store(out_ptr + row, best_i.to(tl.int64))


@triton.jit
def _sqrt(x, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:
        return libdevice.sqrt_rn(x)
    else:
        return tl.sqrt(x)


def sample_fused_triton(
    logits: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    temperature: torch.Tensor | None = None,
    log_min_p: torch.Tensor | None = None,
    top_n_sigma: torch.Tensor | None = None,
    typical_p: torch.Tensor | None = None,
    epsilon: torch.Tensor | None = None,
    eta: torch.Tensor | None = None,
    xtc_probability: torch.Tensor | None = None,
    xtc_threshold: torch.Tensor | None = None,
    xtc_u: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """The fused ``batch_invariant`` tail of ``rust/src/sampling/fused.rs`` in one launch, one
    program per row, in place: divide by ``temperature`` (float32 ``[B]``; the caller passes 1
    for greedy rows), min-p (``log_min_p``, ``-inf``: off), top-n-sigma (``<= 0``: off),
    typical-p (``>= 1``: off), epsilon and eta (``<= 0``: off), XTC (it fires where ``xtc_u <
    xtc_probability``; the three given together or not at all), then top-k / top-p as
    :func:`mask_top_k_top_p_triton_`,
    then :func:`sample_batch_invariant_triton`'s draw. Each argument may be ``None`` (off for
    every row); a row whose values are neutral pays for no pass of that step. ``logits`` are
    the processed logits afterwards. Returns int64 ``[B]`` tokens (module docs, "The fused
    tail", for where they may differ from the CPU pass)."""
    what = "sample_fused_triton"
    rows, vocab = _check_logits(logits, what)
    dev = logits.device
    f32, i64 = torch.float32, torch.int64
    t = _row_param(temperature, rows, f32, dev, "temperature")
    mp = _row_param(log_min_p, rows, f32, dev, "log_min_p")
    sg = _row_param(top_n_sigma, rows, f32, dev, "top_n_sigma")
    ep = _row_param(epsilon, rows, f32, dev, "epsilon")
    et = _row_param(eta, rows, f32, dev, "eta")
    ty = _row_param(typical_p, rows, f32, dev, "typical_p")
    xtc = [
        _row_param(v, rows, f32, dev, name)
        for v, name in (
            (xtc_probability, "xtc_probability"),
            (xtc_threshold, "xtc_threshold"),
            (xtc_u, "xtc_u"),
        )
    ]
    has_xtc = xtc[0] is not None
    if any((v is None) == has_xtc for v in xtc):
        raise InputError(f"{what}: xtc_probability, xtc_threshold and xtc_u go together")
    k = _row_param(top_k, rows, i64, dev, "top_k")
    p = _row_param(top_p, rows, f32, dev, "top_p")
    s = _row_param(seeds, rows, i64, dev, "seeds")
    q = _row_param(positions, rows, i64, dev, "positions")
    out = torch.zeros(rows, dtype=i64, device=dev)
    if rows == 0 or vocab == 0:
        return out
    d = logits
    block = _block(vocab)
    _fused_kernel[(rows,)](
        logits,
        logits.stride(0),
        d if t is None else t,
        d if mp is None else mp,
        d if sg is None else sg,
        d if ty is None else ty,
        d if ep is None else ep,
        d if et is None else et,
        *(d if v is None else v for v in xtc),
        d if k is None else k,
        d if p is None else p,
        s,
        q,
        out,
        vocab,
        HAS_T=t is not None,
        HAS_MINP=mp is not None,
        HAS_SIGMA=sg is not None,
        HAS_TYP=ty is not None,
        HAS_EPS=ep is not None,
        HAS_ETA=et is not None,
        HAS_EXP=ep is not None or et is not None,
        HAS_XTC=has_xtc,
        HAS_K=k is not None,
        HAS_P=p is not None,
        LIBDEVICE=dev.type == "cuda" and libdevice is not None,
        DIGIT=digit_bits(dev),
        BLOCK=block,
        num_warps=8,
        **_NO_FMA,
    )
    return out


def fused_gumbel_triton_(
    logits: torch.Tensor,
    temperature: torch.Tensor | None,
    steps: Mapping[str, Sequence[float] | torch.Tensor],
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    seeds: Sequence[int],
    positions: Sequence[int],
) -> torch.Tensor:
    """:func:`sample_fused_triton` called as the ``Sampler`` calls the CPU pass
    (``tail.fused_gumbel_``): ``temperature`` per row (1 for greedy rows), ``steps`` the
    per-row values of ``_fused.fused_plan`` (``log_min_p``, ``top_n_sigma``, ``typical_p``,
    ``epsilon``, ``eta``, ``xtc_probability``, ``xtc_threshold``, ``xtc_u``), the metadata's
    ``top_k`` / ``top_p``, the rows' seeds and positions. Every row is drawn (the caller keeps
    its greedy rows' own tokens)."""
    dev = logits.device

    def per_row(name: str) -> torch.Tensor | None:
        v = steps.get(name)
        return None if v is None else torch.as_tensor(v, dtype=torch.float32, device=dev)

    return sample_fused_triton(
        logits,
        torch.tensor(list(seeds), dtype=torch.int64, device=dev),
        torch.tensor(list(positions), dtype=torch.int64, device=dev),
        temperature=temperature,
        log_min_p=per_row("log_min_p"),
        top_n_sigma=per_row("top_n_sigma"),
        typical_p=per_row("typical_p"),
        epsilon=per_row("epsilon"),
        eta=per_row("eta"),
        xtc_probability=per_row("xtc_probability"),
        xtc_threshold=per_row("xtc_threshold"),
        xtc_u=per_row("xtc_u"),
        top_k=top_k,
        top_p=top_p,
    )

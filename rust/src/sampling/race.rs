//! The exponential race of vLLM 0.25.1's `random_sample` with torch's own random streams:
//! `argmax(probs / q)`, `q ~ Exp(1)` drawn per vocabulary entry from torch's CPU generator,
//! the same numbers torch would draw, consumed the same way, so the token is the one vLLM
//! samples. Only the entries that can still win are drawn in full: an entry with probability
//! 0 never wins, and one whose uniform is too large for its probability to reach the running
//! best is passed over after two words of the stream (no logarithm).

use super::fast_math::exp_nonpositive;
use super::mt19937::{exponential_f32, temper, uniform53, Mt19937};

/// Reused per call: the raw stream words of one row.
#[derive(Default)]
pub struct RaceScratch {
    words: Vec<u32>,
}

/// torch's `probs.div_(q).argmax()` for one row, every `q` computed (the plain form; also the
/// answer when a uniform is 0 and torch's `q` is 0: `p / 0` is inf, `0 / 0` NaN, which torch's
/// argmax takes as the largest).
fn race_row_plain(probs: &[f32], words: &[u32]) -> usize {
    let mut best = (f32::NEG_INFINITY, 0usize);
    for (i, &p) in probs.iter().enumerate() {
        let q = exponential_f32(uniform53(temper(words[2 * i]), temper(words[2 * i + 1])));
        let r = p / q;
        if r.is_nan() {
            return i;
        }
        if r > best.0 {
            best = (r, i);
        }
    }
    best.1
}

/// Entries tested together before any full draw.
const CHUNK: usize = 16;

/// The first test of a chunk, as a bit mask (bit `j`: entry `j` passes): the entries whose
/// uniform's top 21 bits (its first word) do not already rule them out (`u >= hi * 2^32` and
/// `q >= u`), given `reach_hi`, the largest such value (per unit of weight) that can still
/// reach the running best. `xs` are the weights themselves, or (`FROM_LOGITS`) logits whose
/// weights `e^(x - max)` are bounded above by [`weight_bound`], so that no exponential is
/// computed for an entry the test rules out. `AVX2`: the caller runs with AVX2 enabled (whole
/// chunks then take [`chunk_may_reach_avx2`], the same test in eight lanes).
#[inline(always)]
fn chunk_may_reach<const AVX2: bool, const FROM_LOGITS: bool>(
    xs: &[f32],
    ws: &[u32],
    reach_hi: f32,
    max: f32,
) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        if let (Ok(xs), Ok(ws)) = (
            <&[f32; CHUNK]>::try_from(xs),
            <&[u32; 2 * CHUNK]>::try_from(ws),
        ) {
            // SAFETY: AVX2 is enabled in the caller (`AVX2`), and the CPU has it.
            return unsafe { chunk_may_reach_avx2::<FROM_LOGITS>(xs, ws, reach_hi, max) };
        }
    }
    let mut mask = 0u32;
    for (j, (&x, w)) in xs.iter().zip(ws.chunks_exact(2)).enumerate() {
        let p = if FROM_LOGITS { weight_bound(x, max) } else { x };
        let hi = (temper(w[0]) & 0x1f_ffff) as i32 as f32;
        mask |= (((p > 0.0) & (hi <= p * reach_hi)) as u32) << j;
    }
    mask
}

/// An upper bound of `e^(x - max)` for `x <= max` (never below it, within 0.2% of it or
/// of 2^-126): `2^t` for `t = (x - max) log2(e)` bounded by its chord between the integers
/// around `t`, `2^floor(t) (1 + frac(t))`, which is the float32 whose bits are `(t + 127)
/// 2^23` (the exponent and mantissa fields read as one number), raised by 0.1% for the
/// roundings of `t`.
#[inline(always)]
fn weight_bound(x: f32, max: f32) -> f32 {
    let t = ((x - max) * std::f32::consts::LOG2_E).max(-126.0);
    f32::from_bits(((t + 127.0) * 8_388_608.0) as i32 as u32) * 1.001
}

/// [`chunk_may_reach`] on a whole chunk in AVX2 lanes, bit for bit the scalar test: the first
/// words of eight pairs gathered by a shuffle, tempered, their 21 bits converted exactly, the
/// same float32 operations (the bound's float-to-int conversion truncates, as `as i32` does
/// in its range).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn chunk_may_reach_avx2<const FROM_LOGITS: bool>(
    xs: &[f32; CHUNK],
    ws: &[u32; 2 * CHUNK],
    reach_hi: f32,
    max: f32,
) -> u32 {
    use std::arch::x86_64::*;
    let reach = _mm256_set1_ps(reach_hi);
    let zero = _mm256_setzero_ps();
    let mut mask = 0u32;
    for half in 0..CHUNK / 8 {
        // SAFETY: 16 words (eight pairs) from 16 * half, 8 entries from 8 * half: in bounds;
        // the loads are unaligned ones.
        let (a, b, x) = unsafe {
            let w = ws.as_ptr().add(16 * half) as *const __m256i;
            let x = _mm256_loadu_ps(xs.as_ptr().add(8 * half));
            (_mm256_loadu_si256(w), _mm256_loadu_si256(w.add(1)), x)
        };
        let p = if FROM_LOGITS {
            let d = _mm256_sub_ps(x, _mm256_set1_ps(max));
            let t = _mm256_mul_ps(d, _mm256_set1_ps(std::f32::consts::LOG2_E));
            let t = _mm256_max_ps(t, _mm256_set1_ps(-126.0));
            let bits = _mm256_mul_ps(
                _mm256_add_ps(t, _mm256_set1_ps(127.0)),
                _mm256_set1_ps(8_388_608.0),
            );
            let bound = _mm256_castsi256_ps(_mm256_cvttps_epi32(bits));
            _mm256_mul_ps(bound, _mm256_set1_ps(1.001))
        } else {
            x
        };
        // Per 128-bit lane, the even words of a then b: pairs [0 1 4 5 | 2 3 6 7], then the
        // 64-bit quarters put in order.
        let firsts =
            _mm256_shuffle_ps::<0b10_00_10_00>(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b));
        let mut y = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_castps_si256(firsts));
        y = _mm256_xor_si256(y, _mm256_srli_epi32::<11>(y));
        let b_mask = _mm256_set1_epi32(0x9d2c_5680_u32 as i32);
        y = _mm256_xor_si256(y, _mm256_and_si256(_mm256_slli_epi32::<7>(y), b_mask));
        let c_mask = _mm256_set1_epi32(0xefc6_0000_u32 as i32);
        y = _mm256_xor_si256(y, _mm256_and_si256(_mm256_slli_epi32::<15>(y), c_mask));
        y = _mm256_xor_si256(y, _mm256_srli_epi32::<18>(y));
        let hi = _mm256_cvtepi32_ps(_mm256_and_si256(y, _mm256_set1_epi32(0x1f_ffff)));
        let positive = _mm256_cmp_ps::<_CMP_GT_OQ>(p, zero);
        let within = _mm256_cmp_ps::<_CMP_LE_OQ>(hi, _mm256_mul_ps(p, reach));
        mask |= (_mm256_movemask_ps(_mm256_and_ps(positive, within)) as u32) << (8 * half);
    }
    mask
}

/// The largest entry, the first index holding it, and whether any entry is NaN (a NaN is not
/// the largest): the max and the NaN test in lanes, then the first chunk that holds the max.
#[inline(always)]
fn top_and_nan(xs: &[f32]) -> (f32, usize, bool) {
    const L: usize = 16;
    let mut top = [f32::NEG_INFINITY; L];
    let mut nan = false;
    let chunks = xs.chunks_exact(L);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..L {
            top[l] = if c[l] > top[l] { c[l] } else { top[l] };
            nan |= c[l].is_nan();
        }
    }
    let mut m = top
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    for &x in rest {
        m = if x > m { x } else { m };
        nan |= x.is_nan();
    }
    let first = xs
        .chunks(L)
        .enumerate()
        .find(|(_, c)| c.iter().fold(false, |hit, &x| hit | (x == m)))
        .and_then(|(k, c)| c.iter().position(|&x| x == m).map(|j| k * L + j))
        .unwrap_or(0);
    (m, first, nan)
}

/// The race over one row whose stream words (`2 * probs.len()`, untempered) are `words`;
/// compiled for AVX2 where the CPU has it (the same results: integer tests and float32
/// comparisons, no fused multiply-add).
pub fn race_row(probs: &[f32], words: &[u32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        unsafe fn wide(probs: &[f32], words: &[u32]) -> usize {
            race::<true>(probs, words)
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { wide(probs, words) };
        }
    }
    race::<false>(probs, words)
}

#[inline(always)]
fn race<const AVX2: bool>(probs: &[f32], words: &[u32]) -> usize {
    debug_assert_eq!(words.len(), 2 * probs.len());
    // A uniform of 0 (both words 0 after tempering; tempering maps only 0 to 0) or a NaN
    // probability: the plain form decides (torch's NaN rule).
    let zero_lo = words.chunks_exact(2).fold(false, |z, w| z | (w[1] == 0));
    let (top, top_i, nan) = top_and_nan(probs);
    if zero_lo || nan || top <= 0.0 {
        return race_row_plain(probs, words);
    }
    let q_of = |i: usize| uniform53(temper(words[2 * i]), temper(words[2 * i + 1]));
    let mut best = top / exponential_f32(q_of(top_i));
    let mut best_i = top_i;
    // Entry i can reach `best` only if q_i <= p_i / best (to float32 rounding), and
    // q = -log1p(-u) >= u: so a uniform above p_i / best (with slack) cannot. The uniform's
    // top 21 bits (its first word) give a first test for a whole chunk: u >= hi * 2^32.
    const SLACK: f64 = 1.0 + 1e-6;
    const TO_UNIT: f64 = 1.0 / (1u64 << 53) as f64;
    let mut reach = SLACK / best as f64 / TO_UNIT; // in units of the 53-bit integer
    for (c, (ps, ws)) in probs.chunks(CHUNK).zip(words.chunks(2 * CHUNK)).enumerate() {
        let reach_hi = (reach * (1.0 / 4_294_967_296.0) * (1.0 + 1e-5)) as f32 + 1.0;
        let mut pass = chunk_may_reach::<AVX2, false>(ps, ws, reach_hi, 0.0);
        while pass != 0 {
            let j = pass.trailing_zeros() as usize;
            pass &= pass - 1;
            let (i, p) = (c * CHUNK + j, ps[j]);
            if i == top_i {
                continue;
            }
            let u = q_of(i);
            if u as f64 > p as f64 * reach {
                continue;
            }
            let r = p / exponential_f32(u);
            if r > best || (r == best && i < best_i) {
                (best, best_i) = (r, i);
                reach = SLACK / best as f64 / TO_UNIT;
            }
        }
    }
    best_i
}

/// Where each row's draws come from: torch's default generator drawing for every row first
/// (`q.exponential_()`, unless every row has its own), then each seeded row redrawing from
/// its own generator (`q[i].exponential_(generator=g)`), in the order given.
pub struct Streams<'a> {
    pub default: Option<&'a mut Mt19937>,
    /// `(row, index into generators)`, in vLLM's dict order; a generator may serve two rows.
    pub seeded: &'a [(usize, usize)],
    pub generators: &'a mut [Mt19937],
}

/// The stream a row's draws came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamOf {
    Default,
    /// An index into [`Streams::generators`].
    Seeded(usize),
}

/// Walks the streams as torch draws them for `rows` rows of `vocab` entries: for each row in
/// `need`, its `2 * vocab` raw words are filled into `words` and `visit(row, stream, state
/// before the words, words)` is called; the other rows' words are skipped.
pub fn walk_streams(
    rows: usize,
    vocab: usize,
    need: &[bool],
    streams: Streams<'_>,
    words: &mut Vec<u32>,
    mut visit: impl FnMut(usize, StreamOf, &Mt19937, &[u32]),
) {
    let mut own = vec![false; rows];
    for &(r, _) in streams.seeded {
        own[r] = true;
    }
    words.resize(2 * vocab, 0);
    let mut draw = |r: usize, stream: StreamOf, gen: &mut Mt19937| {
        if need[r] {
            let before = gen.clone();
            gen.fill_raw(words);
            visit(r, stream, &before, words);
        } else {
            gen.skip(2 * vocab as u64);
        }
    };
    if let Some(default) = streams.default {
        for (r, &own) in own.iter().enumerate() {
            if own {
                default.skip(2 * vocab as u64);
            } else {
                draw(r, StreamOf::Default, default);
            }
        }
    }
    for &(r, g) in streams.seeded {
        draw(r, StreamOf::Seeded(g), &mut streams.generators[g]);
    }
}

/// vLLM 0.25.1's `random_sample` over `rows` rows of `probs` (stride `row_stride`), the
/// streams advanced as torch would; `need[r] == false` rows only advance them (their token is
/// 0). Returns one token per row.
pub fn exponential_race(
    probs: &[f32],
    rows: usize,
    vocab: usize,
    row_stride: usize,
    need: &[bool],
    streams: Streams<'_>,
    scratch: &mut RaceScratch,
) -> Vec<i64> {
    let mut tokens = vec![0i64; rows];
    walk_streams(
        rows,
        vocab,
        need,
        streams,
        &mut scratch.words,
        |r, _, _, words| {
            let row = &probs[r * row_stride..r * row_stride + vocab];
            tokens[r] = race_row(row, words) as i64;
        },
    );
    tokens
}

/// How far apart (relative) the best and second-best `weight / q` of [`race_certified`] must
/// be for the winner to be torch's whatever its float32 softmax's rounding: torch's `probs / q`
/// differs from `weight / q / sum` by its exp's error (a few ulps, as ours), the division by
/// the sum and the one by `q` (one rounding each), far below this.
pub const CERTAIN_REL: f64 = 1e-5;

/// The race of vLLM's `argmax(softmax(x) / q)` on a row of logits, from our float32 weights
/// `e^(x - max)` (computed only where an entry can still win), not torch's softmax:
/// `Some(token)` where the winner's `weight / q` beats every other entry's by more than
/// `margin` (relative; [`CERTAIN_REL`]), which torch's rounding cannot overturn; `None` where
/// the row is too close to call, where its softmax is NaN (a NaN, `+inf`, or no finite entry),
/// or where a uniform is 0 (torch's own softmax and [`race_row`] must decide it). Pruning as
/// [`race_row`], with twice the margin as slack so that a passed-over entry is certainly
/// beaten.
pub fn race_certified(row: &[f32], words: &[u32], margin: f64) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        unsafe fn wide(row: &[f32], words: &[u32], margin: f64) -> Option<usize> {
            certified::<true>(row, words, margin)
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { wide(row, words, margin) };
        }
    }
    certified::<false>(row, words, margin)
}

#[inline(always)]
fn certified<const AVX2: bool>(row: &[f32], words: &[u32], margin: f64) -> Option<usize> {
    debug_assert_eq!(words.len(), 2 * row.len());
    let zero_lo = words.chunks_exact(2).fold(false, |z, w| z | (w[1] == 0));
    let (max, top_i, nan) = top_and_nan(row);
    if zero_lo || nan || !max.is_finite() {
        return None;
    }
    let q_of = |i: usize| uniform53(temper(words[2 * i]), temper(words[2 * i + 1]));
    let score = |p: f32, u: u64| p as f64 / exponential_f32(u) as f64;
    // The max's weight is e^0 = 1.
    let mut best = score(1.0, q_of(top_i));
    let mut best_i = top_i;
    let mut second = 0.0f64;
    let slack = 1.0 + 2.0 * margin;
    const TO_UNIT: f64 = 1.0 / (1u64 << 53) as f64;
    let mut reach = slack / best / TO_UNIT;
    for (c, (xs, ws)) in row.chunks(CHUNK).zip(words.chunks(2 * CHUNK)).enumerate() {
        let reach_hi = (reach * (1.0 / 4_294_967_296.0) * (1.0 + 1e-5)) as f32 + 1.0;
        let mut pass = chunk_may_reach::<AVX2, true>(xs, ws, reach_hi, max);
        while pass != 0 {
            let j = pass.trailing_zeros() as usize;
            pass &= pass - 1;
            let i = c * CHUNK + j;
            let p = exp_nonpositive(xs[j] - max);
            if i == top_i || p == 0.0 {
                continue;
            }
            let u = q_of(i);
            if u as f64 > p as f64 * reach {
                continue;
            }
            let r = score(p, u);
            if r > best {
                (second, best, best_i) = (best, r, i);
                reach = slack / best / TO_UNIT;
            } else if r > second {
                second = r;
            }
        }
    }
    (second * (1.0 + margin) < best).then_some(best_i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_test_in_lanes_is_the_scalar_one() {
        let mut gen = Mt19937::from_seed(4);
        let mut seed = 2u64;
        let mut passed = 0;
        for case in 0..2000 {
            let mut words = [0u32; 2 * CHUNK];
            gen.fill_raw(&mut words);
            let ps: [f32; CHUNK] = std::array::from_fn(|j| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(3);
                match (seed >> 58) % 4 {
                    0 => 0.0,
                    1 => f32::NAN,
                    _ => (seed >> 40) as f32 / (1u64 << 24) as f32 * (j as f32 + 1.0),
                }
            });
            let reach_hi = [1.0f32, 3e5, 2e6, 1e9][case % 4];
            // As logits: a max among them (or above them), some -inf.
            let logits: [f32; CHUNK] = std::array::from_fn(|j| match j % 5 {
                0 => f32::NEG_INFINITY,
                _ => (ps[j] - 8.0) * 10.0,
            });
            let max = logits.iter().fold(8.0f32, |m, &x| m.max(x));
            let scalar = chunk_may_reach::<false, false>(&ps, &words, reach_hi, 0.0);
            let scalar_logits = chunk_may_reach::<false, true>(&logits, &words, reach_hi, max);
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above).
                let (lanes, lanes_logits) = unsafe {
                    (
                        chunk_may_reach_avx2::<false>(&ps, &words, reach_hi, 0.0),
                        chunk_may_reach_avx2::<true>(&logits, &words, reach_hi, max),
                    )
                };
                assert_eq!(lanes, scalar, "case {case}");
                assert_eq!(lanes_logits, scalar_logits, "case {case}");
            }
            passed += scalar.count_ones();
        }
        assert!(passed > 2000, "{passed}: the test must pass entries too");
    }

    #[test]
    fn weight_bound_is_above_the_weight_and_close() {
        for i in 0..400_000 {
            let d = -(i as f32) * 100.0 / 400_000.0;
            let (w, b) = (exp_nonpositive(d), weight_bound(d, 0.0));
            assert!(b >= w, "{d}: {b} < {w}");
            assert!(b <= (w * 1.07).max(2e-38), "{d}: {b} vs {w}");
        }
        assert!(weight_bound(f32::NEG_INFINITY, 3.0) > 0.0);
    }

    #[test]
    fn top_and_nan_finds_the_first_largest() {
        let mut seed = 1u64;
        for case in 0..500 {
            let v = case % 40 + 1;
            let xs: Vec<f32> = (0..v)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(7);
                    ((seed >> 60) as f32) - 8.0 // few values: ties across lanes
                })
                .collect();
            let top = xs.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let first = xs.iter().position(|&x| x == top).unwrap();
            assert_eq!(top_and_nan(&xs), (top, first, false), "case {case}");
        }
        assert!(top_and_nan(&[1.0, f32::NAN, 0.0]).2);
        assert_eq!(top_and_nan(&[f32::NEG_INFINITY; 9]).0, f32::NEG_INFINITY);
    }

    #[test]
    fn pruned_race_equals_the_plain_one() {
        let mut gen = Mt19937::from_seed(11);
        let mut seed = 5u64;
        for case in 0..200 {
            let v = 1 + case * 13;
            let mut probs: Vec<f32> = (0..v)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let x = (seed >> 40) as f32 / (1u64 << 24) as f32;
                    if (seed >> 17) % 3 == 0 {
                        0.0
                    } else {
                        x.powi(6)
                    }
                })
                .collect();
            let s: f32 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= s.max(1e-30));
            let mut words = vec![0u32; 2 * v];
            gen.fill_raw(&mut words);
            assert_eq!(
                race_row(&probs, &words),
                race_row_plain(&probs, &words),
                "case {case}"
            );
        }
    }
}

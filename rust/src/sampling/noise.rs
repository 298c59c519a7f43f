//! Counter-based noise for the batch-invariant draw: a token's Gumbel noise is a pure function
//! of (request seed, position, token id), so a request's tokens do not depend on its batch,
//! its row or the batch size, and a step can be replayed. The Triton kernel
//! (`kernels/_triton_sampling.py`) computes the same bits.

use super::fast_math::ln_positive;

/// murmur3's 32-bit finalizer: a bijection with full avalanche.
#[inline(always)]
pub fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// The per-row key of (seed, position): both 64-bit words folded in.
pub fn row_key(seed: u64, position: u64) -> u32 {
    let mut h = fmix32(seed as u32 ^ 0x9e37_79b9);
    h = fmix32(h ^ (seed >> 32) as u32);
    h = fmix32(h ^ position as u32);
    fmix32(h ^ (position >> 32) as u32)
}

/// A token's 32 random bits under a row key.
#[inline(always)]
pub fn token_bits(key: u32, token: u32) -> u32 {
    fmix32(fmix32(token ^ key).wrapping_add(key))
}

/// Standard Gumbel noise from 23 of those bits: `u = (bits >> 9 + 0.5) / 2^23` is exact in
/// float32 and strictly inside (0, 1), so the noise is finite.
#[inline(always)]
pub fn gumbel(bits: u32) -> f32 {
    let u = ((bits >> 9) as f32 + 0.5) * (1.0 / (1u32 << 23) as f32);
    -ln_positive(-ln_positive(u))
}

/// The largest noise [`gumbel`] can return (u = 1 - 2^-24), and the smallest (u = 2^-24):
/// a token more than `MAX - MIN` below the row's max can never win the race.
pub fn gumbel_bounds() -> (f32, f32) {
    (gumbel(u32::MAX), gumbel(0))
}

/// Tokens tested together: a chunk is skipped whole when its max cannot reach the best.
const CHUNK: usize = 16;

/// Tokens whose candidates are gathered before any is tested.
const BLOCK: usize = 256;

/// A token whose logit is `c` or more below the running best can win only if its noise
/// reaches `c`, i.e. its uniform is at least `exp(-exp(-c))`. Past each step of `c` that
/// bound rules most tokens out on their bits alone, before any logarithm; past `MAX` nothing
/// can win. Each bound is taken at `c - 0.01`, slack for float32 rounding.
const STEPS: [f32; 3] = [2.0, 5.0, 10.0];

#[inline(always)]
fn uniform(bits: u32) -> f32 {
    ((bits >> 9) as f32 + 0.5) * (1.0 / (1u32 << 23) as f32)
}

/// The Gumbel-max draw over the finite entries of `row`: `argmax(x + g)`, the lowest index
/// on ties; `None` for a row without a finite entry. Only tokens that can still reach the
/// running best get their logarithms (see [`STEPS`]); compiled for AVX2 where the CPU has it
/// (the same results: Rust never fuses a multiply and an add on its own).
pub fn gumbel_race_row(row: &[f32], key: u32) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        unsafe fn wide(row: &[f32], key: u32) -> Option<usize> {
            race(row, key)
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { wide(row, key) };
        }
    }
    race(row, key)
}

#[inline(always)]
fn race(row: &[f32], key: u32) -> Option<usize> {
    let (gmax, _) = gumbel_bounds();
    let v = row.len();
    // Each chunk's max, and the row's.
    let maxes: Vec<f32> = row
        .chunks(CHUNK)
        .map(|xs| {
            xs.iter()
                .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
        })
        .collect();
    let top = maxes
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    if !top.is_finite() {
        return None;
    }
    let top_c = maxes.iter().position(|&m| m == top)?;
    let top_i = top_c * CHUNK + row[top_c * CHUNK..].iter().position(|&x| x == top)?;
    let bound = |c: f32| (-(-(c - 0.01)).exp()).exp();
    let mut r = Race {
        row,
        key,
        best: top + gumbel(token_bits(key, top_i as u32)),
        best_i: top_i,
        needs: (bound(STEPS[0]), bound(STEPS[1]), bound(STEPS[2])),
        out_of_reach: gmax + 0.01,
    };
    // First the chunks near the top: the best rises close to its final value early, and the
    // reach (the best less the largest noise) with it.
    let warm = top - WARM;
    for (c, &m) in maxes.iter().enumerate() {
        if m >= warm {
            let at = c * CHUNK;
            for i in at..(at + CHUNK).min(v) {
                r.try_token(i);
            }
        }
    }
    // Then the rest, block by block: the indices of the tokens within reach gathered without a
    // branch per token, then only those tested against the uniform their gap needs; only the
    // few that pass get their logarithms. Chunks out of reach (or done above) are passed over
    // on their max.
    let mut cand = [0u32; BLOCK];
    for (b, block) in maxes.chunks(BLOCK / CHUNK).enumerate() {
        // Slack for float32 rounding of the scores, relative to their size.
        let floor = r.best - r.out_of_reach - (1e-5 * r.best.abs() + 1e-6);
        let mut n = 0usize;
        for (k, &m) in block.iter().enumerate() {
            if m < floor || m >= warm {
                continue;
            }
            let at = b * BLOCK + k * CHUNK;
            for (j, &x) in row[at..(at + CHUNK).min(v)].iter().enumerate() {
                cand[n] = (at + j) as u32;
                n += (x >= floor) as usize;
            }
        }
        for &i in &cand[..n] {
            r.try_token(i as usize);
        }
    }
    Some(r.best_i)
}
/// Chunks whose max is within this of the row's are raced first.
const WARM: f32 = 4.0;

/// A race in progress.
struct Race<'a> {
    row: &'a [f32],
    key: u32,
    best: f32,
    best_i: usize,
    needs: (f32, f32, f32),
    out_of_reach: f32,
}

impl Race<'_> {
    /// Token `i` takes the lead if its score beats the best (the lowest index on ties); its
    /// logarithms are computed only when its uniform can reach.
    #[inline(always)]
    fn try_token(&mut self, i: usize) {
        let x = self.row[i];
        let b = token_bits(self.key, i as u32);
        // Slack for float32 rounding of the scores, relative to their size.
        let slack = 1e-5 * self.best.abs() + 1e-6;
        let (u1, u2, u3) = self.needs;
        if uniform(b) < needed(self.best - x - slack, u1, u2, u3, self.out_of_reach) {
            return;
        }
        let score = x + gumbel(b);
        if score > self.best || (score == self.best && i < self.best_i) {
            (self.best, self.best_i) = (score, i);
        }
    }
}

/// The uniform a token `gap` below the best needs to reach it (see [`STEPS`]); above 1 when
/// it cannot.
#[inline(always)]
fn needed(gap: f32, u1: f32, u2: f32, u3: f32, out_of_reach: f32) -> f32 {
    let n = if gap < out_of_reach { u3 } else { 2.0 };
    let n = if gap < STEPS[2] { u2 } else { n };
    let n = if gap < STEPS[1] { u1 } else { n };
    if gap < STEPS[0] {
        0.0
    } else {
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_is_finite_and_its_bounds_hold() {
        let (gmax, gmin) = gumbel_bounds();
        assert!(gmax.is_finite() && gmin.is_finite() && gmax > 16.0 && gmin < -2.0);
        for t in 0..100_000u32 {
            let g = gumbel(token_bits(row_key(42, 7), t));
            assert!(g <= gmax && g >= gmin);
        }
    }

    #[test]
    fn pruned_race_equals_the_plain_argmax() {
        let mut seed = 3u64;
        for case in 0..300u64 {
            let v = 1 + (case as usize * 37) % 3000;
            let row: Vec<f32> = (0..v)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let x = ((seed >> 40) as f32 / (1u64 << 24) as f32) * 40.0 - 20.0;
                    if (seed >> 20) % 5 == 0 {
                        f32::NEG_INFINITY
                    } else {
                        x
                    }
                })
                .collect();
            let key = row_key(case, case * 3);
            let plain = row
                .iter()
                .enumerate()
                .filter(|(_, x)| x.is_finite())
                .map(|(i, &x)| (x + gumbel(token_bits(key, i as u32)), i))
                .fold(None, |b: Option<(f32, usize)>, (s, i)| match b {
                    Some((bs, _)) if bs >= s => b,
                    _ => Some((s, i)),
                })
                .map(|(_, i)| i);
            assert_eq!(gumbel_race_row(&row, key), plain, "case {case}");
        }
    }
}

//! The exponential race of vLLM 0.25.1's `random_sample` with torch's own random streams:
//! `argmax(probs / q)`, `q ~ Exp(1)` drawn per vocabulary entry from torch's CPU generator,
//! the same numbers torch would draw, consumed the same way, so the token is the one vLLM
//! samples. Only the entries that can still win are drawn in full: an entry with probability
//! 0 never wins, and one whose uniform is too large for its probability to reach the running
//! best is passed over after two words of the stream (no logarithm).

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

/// The race over one row whose stream words (`2 * probs.len()`, untempered) are `words`;
/// compiled for AVX2 where the CPU has it (the same results: integer tests and float32
/// comparisons, no fused multiply-add).
pub fn race_row(probs: &[f32], words: &[u32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        unsafe fn wide(probs: &[f32], words: &[u32]) -> usize {
            race(probs, words)
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { wide(probs, words) };
        }
    }
    race(probs, words)
}

#[inline(always)]
fn race(probs: &[f32], words: &[u32]) -> usize {
    debug_assert_eq!(words.len(), 2 * probs.len());
    // A uniform of 0 (both words 0 after tempering; tempering maps only 0 to 0) or a NaN
    // probability: the plain form decides (torch's NaN rule).
    let zero_lo = words.chunks_exact(2).fold(false, |z, w| z | (w[1] == 0));
    let nan = probs.iter().fold(false, |n, p| n | p.is_nan());
    let top = probs
        .iter()
        .fold(f32::NEG_INFINITY, |m, &p| if p > m { p } else { m });
    if zero_lo || nan || top <= 0.0 {
        return race_row_plain(probs, words);
    }
    let top_i = probs.iter().position(|&p| p == top).unwrap_or(0);
    let q_of = |i: usize| uniform53(temper(words[2 * i]), temper(words[2 * i + 1]));
    let mut best = top / exponential_f32(q_of(top_i));
    let mut best_i = top_i;
    // Entry i can reach `best` only if q_i <= p_i / best (to float32 rounding), and
    // q = -log1p(-u) >= u: so a uniform above p_i / best (with slack) cannot. The uniform's
    // top 21 bits (its first word) give a first test for a whole chunk: u >= hi * 2^32.
    const SLACK: f64 = 1.0 + 1e-6;
    const TO_UNIT: f64 = 1.0 / (1u64 << 53) as f64;
    let mut reach = SLACK / best as f64 / TO_UNIT; // in units of the 53-bit integer
    let mut pass = [false; CHUNK];
    for (c, (ps, ws)) in probs.chunks(CHUNK).zip(words.chunks(2 * CHUNK)).enumerate() {
        let reach_hi = (reach * (1.0 / 4_294_967_296.0) * (1.0 + 1e-5)) as f32 + 1.0;
        let mut any = false;
        for ((ok, &p), w) in pass.iter_mut().zip(ps).zip(ws.chunks_exact(2)) {
            let hi = (temper(w[0]) & 0x1f_ffff) as i32 as f32;
            *ok = (p > 0.0) & (hi <= p * reach_hi);
            any |= *ok;
        }
        if !any {
            continue;
        }
        for (j, &p) in ps.iter().enumerate() {
            let i = c * CHUNK + j;
            if !pass[j] || i == top_i {
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
    let mut own = vec![None; rows];
    for &(r, g) in streams.seeded {
        own[r] = Some(g);
    }
    let words = &mut scratch.words;
    words.resize(2 * vocab, 0);
    if let Some(default) = streams.default {
        for r in 0..rows {
            if need[r] && own[r].is_none() {
                default.fill_raw(words);
                let row = &probs[r * row_stride..r * row_stride + vocab];
                tokens[r] = race_row(row, words) as i64;
            } else {
                default.skip(2 * vocab as u64);
            }
        }
    }
    for &(r, g) in streams.seeded {
        let gen = &mut streams.generators[g];
        if need[r] {
            gen.fill_raw(words);
            let row = &probs[r * row_stride..r * row_stride + vocab];
            tokens[r] = race_row(row, words) as i64;
        } else {
            gen.skip(2 * vocab as u64);
        }
    }
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;

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

//! The fused sampling tail of `batch_invariant` (issue 41): per row, in one call and with the
//! row in cache after its first read, temperature, min-p, top-n-sigma, epsilon, eta, top-k /
//! top-p and the counter-keyed Gumbel draw, in the `Sampler`'s order. The separate processors
//! (`builtin/min_p.py`, the truncations, [`super::kept`]) stay the reference; this pass masks
//! the same row in place, so the processed logits it leaves are theirs:
//!
//! - temperature and min-p are the same float32 operations as torch's (`div_`, `amax`, one
//!   float32 add and a comparison): bitwise the separate path's.
//! - top-n-sigma, epsilon and eta take their statistics (mean and deviation, the softmax's
//!   sum, the entropy) in float64 where torch reduces in float32, and compare each entry with
//!   the float64 threshold. The kept set is the separate processors' except for entries within
//!   [`BOUNDARY_REL`] (relative) of the threshold, where float32 rounding decides either way.
//! - top-k / top-p are [`super::kept::mask_row`] with `strict = false`, as the separate
//!   `batch_invariant` path runs it.
//!
//! Typical-p and XTC are not fused: the caller runs the separate processors when a row sets
//! them.

use super::fast_math::exp_shifted;
use super::kept::{mask_row, RowOutcome, Scratch};
use super::noise::gumbel_race_row;

/// How close (relative to the size of the quantities compared) an entry must be to a
/// truncation's threshold for float32 rounding to decide it: top-n-sigma compares a logit with
/// `max - n * sigma` (relative to `|max| + n * sigma`), epsilon and eta a probability with
/// their cutoff (relative to the cutoff).
pub const BOUNDARY_REL: f64 = 1e-4;

/// One row's steps; each neutral value turns its step off.
#[derive(Debug, Clone, Copy)]
pub struct RowParams {
    /// The divisor of the row (1: none; the `Sampler` passes 1 for greedy rows, as torch's
    /// `where(temp < eps, 1, temp)`).
    pub temperature: f32,
    /// `ln(min_p)`; `-inf`: off.
    pub log_min_p: f32,
    /// `n` of top-n-sigma; `<= 0`: off.
    pub top_n_sigma: f32,
    /// Epsilon's cutoff; `<= 0`: off.
    pub epsilon: f32,
    /// Eta's cutoff; `<= 0`: off.
    pub eta: f32,
    /// Top-k (`None`, 0 or `>= vocab`: off).
    pub top_k: Option<usize>,
    /// Top-p (`None`: off; `1` in a batch with top-p masks the zero-probability entries, as
    /// vLLM's batch does).
    pub top_p: Option<f32>,
}

impl Default for RowParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            log_min_p: f32::NEG_INFINITY,
            top_n_sigma: 0.0,
            epsilon: 0.0,
            eta: 0.0,
            top_k: None,
            top_p: None,
        }
    }
}

/// Reused buffers of one worker.
#[derive(Default)]
pub struct FusedScratch {
    kept: Scratch,
    exps: Vec<f32>,
}

/// What one row came to: its token (`None`: not drawn: not needed, no finite entry, or left
/// for the sort) and the top-k / top-p outcome (`NeedsSort`: the caller sorts the row and
/// draws it itself; the other steps are applied already).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowResult {
    pub token: Option<usize>,
    pub outcome: RowOutcome,
}

/// The max of a row (NaN when it holds a NaN, as torch's `amax`) and whether it holds `+inf`.
fn row_max(row: &[f32]) -> (f32, bool) {
    const LANES: usize = 16;
    let mut maxes = [f32::NEG_INFINITY; LANES];
    let mut nan = false;
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            maxes[i] = if c[i] > maxes[i] { c[i] } else { maxes[i] };
            nan |= c[i].is_nan();
        }
    }
    for &x in tail {
        maxes[0] = if x > maxes[0] { x } else { maxes[0] };
        nan |= x.is_nan();
    }
    let m = maxes.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    if nan {
        (f32::NAN, false)
    } else {
        (m, m == f32::INFINITY)
    }
}

/// `row /= t` in place (torch's `div_`: one IEEE division per entry) and the row's max.
fn divide_and_max(row: &mut [f32], t: f32) -> (f32, bool) {
    if t != 1.0 {
        row.iter_mut().for_each(|x| *x /= t);
    }
    row_max(row)
}

fn mask_below(row: &mut [f32], threshold: f32) {
    for x in row.iter_mut() {
        if *x < threshold {
            *x = f32::NEG_INFINITY;
        }
    }
}

/// top-n-sigma's threshold `max - n * std` over the entries that are not `-inf` (float64
/// statistics), or `None` where the separate processor masks nothing (no such entry).
fn top_n_sigma_threshold(row: &[f32], max: f32, n: f32) -> Option<f64> {
    let (mut count, mut sum) = (0usize, 0.0f64);
    for &x in row {
        if x > f32::NEG_INFINITY {
            count += 1;
            sum += x as f64;
        }
    }
    if count == 0 {
        return None;
    }
    let mean = sum / count as f64;
    let mut sq = 0.0f64;
    for &x in row {
        if x > f32::NEG_INFINITY {
            let d = x as f64 - mean;
            sq += d * d;
        }
    }
    let std = (sq / count as f64).sqrt();
    Some(max as f64 - n as f64 * std)
}

/// The row's exponentials `e^(x - max)` into `exps` and their float64 sum.
fn exps_and_sum(row: &[f32], max: f32, exps: &mut Vec<f32>) -> f64 {
    exps.clear();
    exps.extend_from_slice(row);
    exp_shifted(exps, max);
    exps.iter().map(|&e| e as f64).sum()
}

/// Masks, never the row's max, the entries whose probability `e / sum` is below `cutoff`.
fn mask_probability_below(row: &mut [f32], exps: &[f32], sum: f64, max: f32, cutoff: f64) {
    let below = cutoff * sum;
    for (x, &e) in row.iter_mut().zip(exps) {
        if (e as f64) < below && *x < max {
            *x = f32::NEG_INFINITY;
        }
    }
}

/// Applies the row's steps in place and draws its token under `key` (`None`: not drawn).
pub fn fused_row(
    row: &mut [f32],
    prm: &RowParams,
    key: Option<u32>,
    s: &mut FusedScratch,
) -> RowResult {
    let outcome = apply_steps(row, prm, false, s);
    let token = match (key, outcome) {
        (Some(key), RowOutcome::Masked | RowOutcome::MaskedUncertain) => gumbel_race_row(row, key),
        _ => None,
    };
    RowResult { token, outcome }
}

/// Applies the row's steps in place, top-k / top-p last ([`mask_row`] with `strict`: a row
/// whose top-p only the sort can decide is left as the other steps made it, `NeedsSort`).
pub fn apply_steps(
    row: &mut [f32],
    prm: &RowParams,
    strict: bool,
    s: &mut FusedScratch,
) -> RowOutcome {
    let (max, mut bad) = divide_and_max(row, prm.temperature);
    // A row holding NaN or +inf, or of all -inf: every statistic is NaN and the separate
    // processors leave it alone.
    bad |= max.is_nan() || max == f32::NEG_INFINITY;
    if !bad && prm.log_min_p > f32::NEG_INFINITY {
        mask_below(row, max + prm.log_min_p);
    }
    if !bad && prm.top_n_sigma > 0.0 {
        if let Some(t) = top_n_sigma_threshold(row, max, prm.top_n_sigma) {
            for x in row.iter_mut() {
                if (*x as f64) < t {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        // The max is kept (`std >= 0`): `max` stands.
    }
    if !bad && prm.epsilon > 0.0 {
        let sum = exps_and_sum(row, max, &mut s.exps);
        mask_probability_below(row, &s.exps, sum, max, prm.epsilon as f64);
    }
    if !bad && prm.eta > 0.0 {
        let sum = exps_and_sum(row, max, &mut s.exps);
        // Categorical's entropy: -sum p (x - lse), lse = max + ln(sum); -inf entries add 0.
        let weighted: f64 = row
            .iter()
            .zip(&s.exps)
            .filter(|(&x, _)| x > f32::NEG_INFINITY)
            .map(|(&x, &e)| e as f64 * (x - max) as f64)
            .sum();
        let entropy = sum.ln() - weighted / sum;
        let eps = prm.eta as f64;
        let cutoff = eps.min(eps.sqrt() * (-entropy).exp());
        mask_probability_below(row, &s.exps, sum, max, cutoff);
    }
    mask_row(row, prm.top_k, prm.top_p, strict, &mut s.kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::noise::row_key;

    fn rng(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// The separate steps one after another, each over the whole row (float64 statistics
    /// as the fused pass: this checks the fusion, the Python tests check torch's rounding).
    fn separate(row: &mut [f32], prm: &RowParams) -> Option<usize> {
        row.iter_mut().for_each(|x| *x /= prm.temperature);
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        if prm.log_min_p > f32::NEG_INFINITY {
            let t = max + prm.log_min_p;
            row.iter_mut()
                .filter(|x| **x < t)
                .for_each(|x| *x = f32::NEG_INFINITY);
        }
        if prm.top_n_sigma > 0.0 {
            let t = top_n_sigma_threshold(row, max, prm.top_n_sigma).unwrap();
            row.iter_mut()
                .filter(|x| (**x as f64) < t)
                .for_each(|x| *x = f32::NEG_INFINITY);
        }
        let mut s = Scratch::default();
        mask_row(row, prm.top_k, prm.top_p, false, &mut s);
        gumbel_race_row(row, row_key(3, 4))
    }

    #[test]
    fn fused_equals_the_steps_one_by_one() {
        let mut seed = 9u64;
        let mut s = FusedScratch::default();
        for case in 0..300 {
            let v = [7usize, 100, 1000, 4000][case % 4];
            let row: Vec<f32> = (0..v).map(|_| rng(&mut seed) * 12.0).collect();
            let prm = RowParams {
                temperature: [1.0f32, 0.7, 1.3][case % 3],
                log_min_p: [f32::NEG_INFINITY, 0.05f32.ln(), 0.2f32.ln()][(case / 3) % 3],
                top_n_sigma: [0.0f32, 1.0, 2.5][(case / 9) % 3],
                top_k: [None, Some(5), Some(50)][(case / 2) % 3],
                top_p: [None, Some(0.9f32), Some(0.5)][(case / 5) % 3],
                ..RowParams::default()
            };
            let mut a = row.clone();
            let mut b = row.clone();
            let want = separate(&mut a, &prm);
            let got = fused_row(&mut b, &prm, Some(row_key(3, 4)), &mut s);
            assert_eq!(a, b, "case {case}");
            assert_eq!(got.token, want, "case {case}");
        }
    }

    #[test]
    fn rows_with_nan_or_inf_are_left_to_top_k_top_p() {
        let mut s = FusedScratch::default();
        let prm = RowParams {
            log_min_p: 0.5f32.ln(),
            top_n_sigma: 1.0,
            epsilon: 0.1,
            eta: 0.1,
            ..RowParams::default()
        };
        let mut row = vec![1.0, f32::INFINITY, -3.0, 0.0];
        fused_row(&mut row, &prm, None, &mut s);
        assert_eq!(row, vec![1.0, f32::INFINITY, -3.0, 0.0]);
        let mut row = vec![f32::NEG_INFINITY; 5];
        let r = fused_row(&mut row, &prm, Some(1), &mut s);
        assert_eq!(r.token, None);
    }

    #[test]
    fn epsilon_and_eta_keep_the_max_and_drop_the_unlikely() {
        let mut s = FusedScratch::default();
        let prm = RowParams {
            epsilon: 0.05,
            ..RowParams::default()
        };
        let mut row = vec![0.0, -10.0, -1.0, -10.0];
        fused_row(&mut row, &prm, None, &mut s);
        let inf = f32::NEG_INFINITY;
        assert_eq!(row, vec![0.0, inf, -1.0, inf]);
        let prm = RowParams {
            eta: 0.5,
            ..RowParams::default()
        };
        let mut row = vec![-5.0, -5.0, -5.0];
        fused_row(&mut row, &prm, None, &mut s);
        assert_eq!(row, vec![-5.0, -5.0, -5.0]); // every entry is the max
    }
}

//! The fused sampling tail of `batch_invariant` (issue 41): per row, in one call and with the
//! row in cache after its first read, temperature, min-p, top-n-sigma, typical-p, epsilon,
//! eta, XTC, top-k / top-p and the counter-keyed Gumbel draw, in the `Sampler`'s order. The
//! separate processors (`builtin/min_p.py`, the truncations, `builtin/xtc.py`,
//! [`super::kept`]) stay the reference; this pass masks the same row in place, so the
//! processed logits it leaves are theirs:
//!
//! - temperature and min-p are the same float32 operations as torch's (`div_`, `amax`, one
//!   float32 add and a comparison): bitwise the separate path's.
//! - top-n-sigma, typical-p, epsilon, eta and XTC take their statistics (mean and deviation,
//!   the softmax's sum, the entropy, the typicality scores and their mass) in float64 where
//!   torch reduces in float32, and compare each entry with the float64 threshold. The kept
//!   set is the separate processors' except for entries within [`BOUNDARY_REL`] (relative) of
//!   the threshold, where float32 rounding decides either way: for typical-p, entries whose
//!   score is that close to the threshold score (relative to `|log p| + H`, the size of what
//!   a score is computed from), or whose cumulative mass in ascending score order, or the
//!   one before it, is that close to `typical_p`; for XTC, in a row with an entry that close
//!   to `xtc_threshold`, the qualifying set may differ by that entry, and with it which
//!   qualifying entries are masked (the least of them, and whether two qualify).
//! - typical-p finds its threshold score by a selection weighted by the probability mass
//!   (three-way partitions around a pivot score), not by sorting the row.
//! - XTC's draw `u` is the caller's (the XTC view's own draws, so seeded streams advance as
//!   on the separate path); `u < xtc_probability` is compared in float32, as torch does.
//! - top-k / top-p are [`super::kept::mask_row`] with `strict = false`, as the separate
//!   `batch_invariant` path runs it.

use super::fast_math::exp_shifted;
use super::kept::{mask_row, RowOutcome, Scratch};
use super::noise::gumbel_race_row;

/// How close (relative to the size of the quantities compared) an entry must be to a
/// truncation's threshold for float32 rounding to decide it: top-n-sigma compares a logit with
/// `max - n * sigma` (relative to `|max| + n * sigma`), epsilon and eta a probability with
/// their cutoff (relative to the cutoff), typical-p a score with the threshold score (relative
/// to `|log p| + H`) and a cumulative mass with `typical_p` (relative to it), XTC a probability
/// with `xtc_threshold` (relative to it).
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
    /// Typical-p's mass; `>= 1`: off.
    pub typical_p: f32,
    /// Eta's cutoff; `<= 0`: off.
    pub eta: f32,
    /// XTC's probability of firing; it fires when `xtc_u < xtc_probability` (0: off).
    pub xtc_probability: f32,
    /// XTC's probability threshold: the tokens at least this likely qualify.
    pub xtc_threshold: f32,
    /// XTC's uniform draw of this row and step, in `[0, 1)`.
    pub xtc_u: f32,
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
            typical_p: 1.0,
            epsilon: 0.0,
            eta: 0.0,
            xtc_probability: 0.0,
            xtc_threshold: 1.0,
            xtc_u: 1.0,
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
    /// The row before the truncations, while a certifying pass may give it up.
    saved: Vec<f32>,
    /// Typical-p's `(score, probability)` of each finite entry.
    scored: Vec<(f64, f64)>,
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

/// The entropy of the row's softmax from its exponentials (`e^(x - max)`, their `sum`):
/// Categorical's `-sum p (x - lse)`, `lse = max + ln(sum)`; `-inf` entries add 0.
fn entropy(row: &[f32], exps: &[f32], sum: f64, max: f32) -> f64 {
    let weighted: f64 = row
        .iter()
        .zip(exps)
        .filter(|(&x, _)| x > f32::NEG_INFINITY)
        .map(|(&x, &e)| e as f64 * (x - max) as f64)
        .sum();
    sum.ln() - weighted / sum
}

/// Typical-p's score of a finite entry: how far its surprisal `-log p` is from the entropy.
fn typicality(x: f32, max: f32, ln_sum: f64, entropy: f64) -> f64 {
    let log_p = (x - max) as f64 - ln_sum;
    (-log_p - entropy).abs()
}

/// Splits `items` into those scoring below `pivot`, at it, and above it (in that order) and
/// returns the ends of the first two parts.
fn partition3(items: &mut [(f64, f64)], pivot: f64) -> (usize, usize) {
    let (mut lt, mut i, mut gt) = (0, 0, items.len());
    while i < gt {
        let score = items[i].0;
        if score < pivot {
            items.swap(lt, i);
            lt += 1;
            i += 1;
        } else if score > pivot {
            gt -= 1;
            items.swap(i, gt);
        } else {
            i += 1;
        }
    }
    (lt, gt)
}

fn mass_of(items: &[(f64, f64)]) -> f64 {
    items.iter().map(|&(_, p)| p).sum()
}

/// Typical-p's threshold score: the score of the entry at which the mass of the entries in
/// ascending score order first reaches `mass` (HF's sort and cumulative sum), found by a
/// weighted selection. Every entry scoring at most it is kept, so the order within equal
/// scores does not matter. `+inf` (keep all) when rounding leaves the total below `mass`, as
/// HF's clamp to the last entry.
fn typical_threshold(items: &mut [(f64, f64)], mass: f64) -> f64 {
    let (mut lo, mut hi, mut below) = (0, items.len(), 0.0f64);
    while lo < hi {
        let part = &mut items[lo..hi];
        let pivot = part[part.len() / 2].0;
        let (lt, gt) = partition3(part, pivot);
        let m_lt = mass_of(&part[..lt]);
        let m_eq = mass_of(&part[lt..gt]);
        // (`lt > 0`: a mass of 0 stops at the least score, as HF's `last_ind` of 0.)
        if lt > 0 && below + m_lt >= mass {
            hi = lo + lt;
        } else if below + m_lt + m_eq >= mass {
            return pivot;
        } else {
            below += m_lt + m_eq;
            lo += gt;
        }
    }
    f64::INFINITY
}

/// HF's `TypicalLogitsWarper` on one row (float64 statistics): masks the entries scoring
/// above the threshold (see [`typical_threshold`]); the most typical entry is always kept.
fn mask_atypical(row: &mut [f32], max: f32, mass: f64, s: &mut FusedScratch) {
    let sum = exps_and_sum(row, max, &mut s.exps);
    let h = entropy(row, &s.exps, sum, max);
    let ln_sum = sum.ln();
    s.scored.clear();
    for (&x, &e) in row.iter().zip(&s.exps) {
        if x > f32::NEG_INFINITY {
            s.scored
                .push((typicality(x, max, ln_sum, h), e as f64 / sum));
        }
    }
    let threshold = typical_threshold(&mut s.scored, mass);
    for x in row.iter_mut() {
        if *x > f32::NEG_INFINITY && typicality(*x, max, ln_sum, h) > threshold {
            *x = f32::NEG_INFINITY;
        }
    }
}

/// XTC once it fires (`builtin/xtc.py`'s `xtc_mask_`, float64 probabilities): when at least
/// two entries are `threshold` likely or more, masks those more likely than the least of them.
fn mask_top_choices(row: &mut [f32], max: f32, threshold: f64, exps: &mut Vec<f32>) {
    let sum = exps_and_sum(row, max, exps);
    let at_least = threshold * sum;
    let (mut count, mut least) = (0usize, f64::INFINITY);
    for &e in exps.iter() {
        let e = e as f64;
        if e >= at_least {
            count += 1;
            least = least.min(e);
        }
    }
    if count < 2 {
        return;
    }
    for (x, &e) in row.iter_mut().zip(exps.iter()) {
        if (e as f64) >= at_least && (e as f64) > least {
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
    steps(row, prm, strict, false, s).expect("only a certifying pass gives a row up")
}

/// [`apply_steps`] for `exact` (top-p `strict`), the truncations certified: `None` where an
/// entry lies within [`BOUNDARY_REL`] of top-n-sigma's, epsilon's or eta's threshold (torch's
/// float32 statistics might decide it the other way), or where typical-p or XTC acts (not
/// certified here); the row is then left as temperature and min-p made it, for the caller to
/// run the processors' own torch steps and top-k / top-p on it.
pub fn apply_steps_certified(
    row: &mut [f32],
    prm: &RowParams,
    s: &mut FusedScratch,
) -> Option<RowOutcome> {
    steps(row, prm, true, true, s)
}

/// Whether a finite entry lies within [`BOUNDARY_REL`] `* scale` of `threshold`.
fn any_near(values: impl Iterator<Item = f64>, threshold: f64, scale: f64) -> bool {
    let band = BOUNDARY_REL * scale;
    values.fold(false, |near, x| near | ((x - threshold).abs() <= band))
}

/// Whether an entry other than the max (kept whatever its probability) has a weight within
/// [`BOUNDARY_REL`] of `below` (relative).
fn any_weight_near(row: &[f32], exps: &[f32], max: f32, below: f64) -> bool {
    let kept = row.iter().zip(exps).filter(|(&x, _)| x < max);
    any_near(kept.map(|(_, &e)| e as f64), below, below)
}

fn steps(
    row: &mut [f32],
    prm: &RowParams,
    strict: bool,
    certify: bool,
    s: &mut FusedScratch,
) -> Option<RowOutcome> {
    let (mut max, mut bad) = divide_and_max(row, prm.temperature);
    // A row holding NaN or +inf, or of all -inf: every statistic is NaN and the separate
    // processors leave it alone.
    bad |= max.is_nan() || max == f32::NEG_INFINITY;
    if !bad && prm.log_min_p > f32::NEG_INFINITY {
        mask_below(row, max + prm.log_min_p);
    }
    let xtc_fires = prm.xtc_u < prm.xtc_probability;
    if certify && !bad {
        if prm.typical_p < 1.0 || xtc_fires {
            return None; // not certified: the caller runs them
        }
        if prm.top_n_sigma > 0.0 || prm.epsilon > 0.0 || prm.eta > 0.0 {
            s.saved.clear();
            s.saved.extend_from_slice(row);
        }
    }
    let give_up = |row: &mut [f32], saved: &[f32]| {
        row.copy_from_slice(saved);
        None
    };
    if !bad && prm.top_n_sigma > 0.0 {
        if let Some(t) = top_n_sigma_threshold(row, max, prm.top_n_sigma) {
            let scale = (max as f64).abs() + (max as f64 - t);
            let finite = row.iter().filter(|x| x.is_finite()).map(|&x| x as f64);
            if certify && any_near(finite, t, scale) {
                return give_up(row, &s.saved);
            }
            for x in row.iter_mut() {
                if (*x as f64) < t {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        // The max is kept (`std >= 0`): `max` stands.
    }
    if !bad && prm.typical_p < 1.0 {
        mask_atypical(row, max, prm.typical_p as f64, s);
        // Typical-p may drop the max: epsilon and eta keep the max of what is left.
        max = row_max(row).0;
    }
    if !bad && prm.epsilon > 0.0 {
        let sum = exps_and_sum(row, max, &mut s.exps);
        let cutoff = prm.epsilon as f64;
        if certify && any_weight_near(row, &s.exps, max, cutoff * sum) {
            return give_up(row, &s.saved);
        }
        mask_probability_below(row, &s.exps, sum, max, cutoff);
    }
    if !bad && prm.eta > 0.0 {
        let sum = exps_and_sum(row, max, &mut s.exps);
        let eps = prm.eta as f64;
        let cutoff = eps.min(eps.sqrt() * (-entropy(row, &s.exps, sum, max)).exp());
        if certify && any_weight_near(row, &s.exps, max, cutoff * sum) {
            return give_up(row, &s.saved);
        }
        mask_probability_below(row, &s.exps, sum, max, cutoff);
    }
    if !bad && xtc_fires {
        mask_top_choices(row, max, prm.xtc_threshold as f64, &mut s.exps);
    }
    Some(mask_row(row, prm.top_k, prm.top_p, strict, &mut s.kept))
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
        if prm.typical_p < 1.0 {
            sorted_typical_p(row, prm.typical_p as f64);
        }
        if prm.xtc_u < prm.xtc_probability {
            plain_xtc(row, prm.xtc_threshold as f64);
        }
        let mut s = Scratch::default();
        mask_row(row, prm.top_k, prm.top_p, false, &mut s);
        gumbel_race_row(row, row_key(3, 4))
    }

    /// The row's max and its softmax in float64 (from float32 exponentials, as the pass).
    fn softmax(row: &[f32]) -> (f32, Vec<f64>) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let e: Vec<f64> = row.iter().map(|&x| (x - max).exp() as f64).collect();
        let sum: f64 = e.iter().sum();
        (max, e.iter().map(|e| e / sum).collect())
    }

    /// HF's typical-p as written: sort by score, cumulative mass, the score where it first
    /// reaches `mass`, mask what scores above it.
    fn sorted_typical_p(row: &mut [f32], mass: f64) {
        let (max, p) = softmax(row);
        let ln_sum = row
            .iter()
            .map(|&x| (x - max).exp() as f64)
            .sum::<f64>()
            .ln();
        let log_p: Vec<f64> = row.iter().map(|&x| (x - max) as f64 - ln_sum).collect();
        let h: f64 = -p
            .iter()
            .zip(&log_p)
            .filter(|(&p, _)| p > 0.0)
            .map(|(p, l)| p * l)
            .sum::<f64>();
        let score: Vec<f64> = log_p.iter().map(|l| (-l - h).abs()).collect();
        let mut order: Vec<usize> = (0..row.len()).filter(|&i| row[i].is_finite()).collect();
        order.sort_by(|&a, &b| score[a].total_cmp(&score[b]));
        let mut cum = 0.0;
        let mut threshold = f64::INFINITY;
        for &i in &order {
            cum += p[i];
            if cum >= mass {
                threshold = score[i];
                break;
            }
        }
        for (x, s) in row.iter_mut().zip(&score) {
            if *s > threshold {
                *x = f32::NEG_INFINITY;
            }
        }
    }

    /// XTC as `xtc_mask_` writes it (it fires: `u < probability`).
    fn plain_xtc(row: &mut [f32], threshold: f64) {
        let (_, p) = softmax(row);
        let qualifies: Vec<bool> = p.iter().map(|&p| p >= threshold).collect();
        let least = p
            .iter()
            .zip(&qualifies)
            .filter(|(_, &q)| q)
            .fold(f64::INFINITY, |m, (&p, _)| m.min(p));
        if qualifies.iter().filter(|&&q| q).count() >= 2 {
            for ((x, &p), &q) in row.iter_mut().zip(&p).zip(&qualifies) {
                if q && p > least {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// The certifying pass masks as the plain one where it answers, and otherwise leaves the
    /// row as temperature and min-p made it; rows with an entry near a threshold do occur.
    #[test]
    fn certified_steps_answer_as_the_plain_ones_or_give_the_row_back() {
        let mut seed = 21u64;
        let mut s = FusedScratch::default();
        let (mut given_up, mut answered) = (0, 0);
        for case in 0..600 {
            let v = [50usize, 400, 3000][case % 3];
            let mut row: Vec<f32> = (0..v).map(|_| rng(&mut seed) * 6.0).collect();
            if case % 4 == 0 {
                row.iter_mut().for_each(|x| *x = (*x * 2.0).round()); // ties at thresholds
            }
            let prm = RowParams {
                temperature: [1.0f32, 0.7][case % 2],
                log_min_p: [f32::NEG_INFINITY, 0.01f32.ln()][(case / 2) % 2],
                top_n_sigma: [0.0f32, 1.0, 2.0][(case / 4) % 3],
                epsilon: [0.0f32, 1e-3][(case / 12) % 2],
                eta: [0.0f32, 1e-3][(case / 24) % 2],
                top_p: [None, Some(0.9f32)][(case / 5) % 2],
                ..RowParams::default()
            };
            let mut plain = row.clone();
            let want = apply_steps(&mut plain, &prm, true, &mut s);
            let mut got = row.clone();
            match apply_steps_certified(&mut got, &prm, &mut s) {
                Some(outcome) => {
                    answered += 1;
                    assert_eq!(outcome, want, "case {case}");
                    assert_eq!(got, plain, "case {case}");
                }
                None => {
                    given_up += 1;
                    let mut first = row.clone();
                    let only_min_p = RowParams {
                        temperature: prm.temperature,
                        log_min_p: prm.log_min_p,
                        ..RowParams::default()
                    };
                    apply_steps(&mut first, &only_min_p, true, &mut s);
                    assert_eq!(got, first, "case {case}");
                }
            }
        }
        assert!(given_up > 0 && answered > 400, "{given_up} / {answered}");
    }

    #[test]
    fn fused_equals_the_steps_one_by_one() {
        let mut seed = 9u64;
        let mut s = FusedScratch::default();
        let mut acted = [0usize; 2];
        for case in 0..300 {
            let v = [7usize, 100, 1000, 4000][case % 4];
            let row: Vec<f32> = (0..v).map(|_| rng(&mut seed) * 12.0).collect();
            let prm = RowParams {
                temperature: [1.0f32, 0.7, 1.3][case % 3],
                log_min_p: [f32::NEG_INFINITY, 0.05f32.ln(), 0.2f32.ln()][(case / 3) % 3],
                top_n_sigma: [0.0f32, 1.0, 2.5][(case / 9) % 3],
                typical_p: [1.0f32, 0.9, 0.3, 0.6][(case / 7) % 4],
                xtc_probability: [0.0f32, 0.5, 1.0][(case / 11) % 3],
                xtc_threshold: [0.1f32, 0.02, 0.001][(case / 13) % 3],
                xtc_u: [0.3f32, 0.7][(case / 4) % 2],
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
            for (step, off) in [
                (
                    0,
                    RowParams {
                        typical_p: 1.0,
                        ..prm
                    },
                ),
                (
                    1,
                    RowParams {
                        xtc_probability: 0.0,
                        ..prm
                    },
                ),
            ] {
                let mut c = row.clone();
                separate(&mut c, &off);
                acted[step] += usize::from(c != a);
            }
        }
        // Typical-p and XTC each masked entries in some cases (the cases are not vacuous).
        assert!(acted.iter().all(|&n| n >= 20), "{acted:?}");
    }

    #[test]
    fn typical_threshold_is_the_score_where_the_mass_is_reached() {
        let items = [(1.0, 0.2), (0.5, 0.3), (0.5, 0.1), (2.0, 0.4)];
        // Ascending scores: 0.5 (mass 0.4 with its tie), 1.0 (0.6), 2.0 (1.0).
        for (mass, want) in [
            (0.0, 0.5),
            (0.35, 0.5),
            (0.4, 0.5),
            (0.45, 1.0),
            (0.9, 2.0),
            (1.1, f64::INFINITY), // never reached: keep all
        ] {
            let mut v = items.to_vec();
            assert_eq!(typical_threshold(&mut v, mass), want, "mass {mass}");
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

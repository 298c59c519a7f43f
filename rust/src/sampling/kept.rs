//! Top-k and top-p kept sets without sorting the row: vLLM 0.25.1's sets
//! (`apply_top_k_top_p`: sort ascending, mask below the k-th largest, then mask the ascending
//! prefix whose cumulative probability is `<= 1 - p`, the largest always kept), found by
//! selection and by bucketing the probability mass.
//!
//! Top-k is exact: the k-th largest value counting duplicates, every tie kept, as the sort.
//! Top-p is decided in float64 and kept only when the decision is certain: torch computes the
//! cumulative sums in float32 over its sorted row, so a boundary within [`TOP_P_MARGIN`] of
//! `1 - p`, or a run of equal values cut by the boundary (torch's sort is not stable, so which
//! of them it masks is not ours to know), makes the row [`RowOutcome::NeedsSort`]: the caller
//! runs the sort on that row. The row is left untouched then.

/// How far from `1 - p` (in probability) the cumulative mass at the boundary must be for the
/// float64 decision to stand for torch's float32 one: `TOP_P_MARGIN_ABS + TOP_P_MARGIN_REL *
/// (1 - p)`. torch's cumulative sums (float32 softmax over its sorted row, float32 results)
/// were measured within 2e-7 of the exact ones at a cumulative mass of 0.1 and 1e-6 near 1
/// (V = 151,936, flat rows: the worst seen); ours, from float32 exponentials, within 3e-7
/// relative. `tests/test_sampling_tail.py` measures torch's again and checks it stays below a
/// quarter of this.
pub const TOP_P_MARGIN_ABS: f64 = 2e-6;
pub const TOP_P_MARGIN_REL: f64 = 8e-6;

/// Mass buckets: the top 10 bits of a float32 probability below 1 (exponent and 3 mantissa
/// bits), counted down from 1.0 so that bucket 0 holds the largest.
const BUCKETS: usize = 1024;
const ONE_BITS: u32 = 0x3f80_0000;

#[inline(always)]
fn bucket(e: f32) -> usize {
    ((ONE_BITS - e.to_bits().min(ONE_BITS)) >> 20) as usize
}

/// What happened to one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOutcome {
    /// Masked in place (possibly nothing to mask).
    Masked,
    /// Masked in place by the float64 decision although it was not certain (not `strict`):
    /// the sort may have cut top-p one entry off, or inside a run of equal values (all kept).
    MaskedUncertain,
    /// Not touched: the caller must apply the sort path to it.
    NeedsSort,
}

/// Reused buffers of one worker.
#[derive(Default)]
pub struct Scratch {
    vals: Vec<f32>,
    /// The sample of `kth_largest`, then the exponentials of `top_p_boundary`.
    idx: Vec<u32>,
    mass: Vec<f64>,
    sample: Vec<f32>,
    bucket: Vec<(f32, u32, f64)>,
}

/// Applies top-k (`k < row.len()`) and top-p (`p < 1`) to one row, in place. `strict`: a row
/// whose top-p decision is not certain is left for the sort ([`RowOutcome::NeedsSort`]);
/// otherwise it is masked by the float64 decision, every tie at the boundary kept.
pub fn mask_row(
    row: &mut [f32],
    k: Option<usize>,
    p: Option<f32>,
    strict: bool,
    s: &mut Scratch,
) -> RowOutcome {
    let v = row.len();
    let k = k.filter(|&k| k < v && k > 0);
    if v == 0 || (k.is_none() && p.is_none()) {
        return RowOutcome::Masked;
    }
    if row.iter().fold(false, |nan, x| nan | x.is_nan()) {
        return RowOutcome::NeedsSort;
    }
    let mut cut = f32::NEG_INFINITY;
    let mut certain = true;
    let candidates = if let Some(k) = k {
        cut = kth_largest(row, k, s);
        // `s.vals`/`s.idx` hold a superset of the kept values; narrow to them.
        let (vals, idx) = (&mut s.vals, &mut s.idx);
        let mut w = 0;
        for r in 0..vals.len() {
            if vals[r] >= cut {
                vals[w] = vals[r];
                idx[w] = idx[r];
                w += 1;
            }
        }
        vals.truncate(w);
        idx.truncate(w);
        true
    } else {
        false
    };
    if let Some(p) = p {
        let thr = (1.0f32 - p).max(0.0) as f64;
        let boundary = if candidates {
            let (vals, idx) = (std::mem::take(&mut s.vals), std::mem::take(&mut s.idx));
            let b = top_p_boundary(&vals, Some(&idx), thr, strict, s);
            s.vals = vals;
            s.idx = idx;
            b
        } else {
            top_p_boundary(row, None, thr, strict, s)
        };
        match boundary {
            Some((b, sure)) => {
                cut = cut.max(b);
                certain = sure;
            }
            None => return RowOutcome::NeedsSort,
        }
    }
    if cut > f32::NEG_INFINITY {
        for x in row.iter_mut() {
            if *x < cut {
                *x = f32::NEG_INFINITY;
            }
        }
    }
    if certain {
        RowOutcome::Masked
    } else {
        RowOutcome::MaskedUncertain
    }
}

/// The k-th largest value of `row` counting duplicates (`0 < k < len`); leaves in
/// `s.vals`/`s.idx` every entry `>=` some value at most that one (a superset of the kept).
pub fn kth_largest(row: &[f32], k: usize, s: &mut Scratch) -> f32 {
    let v = row.len();
    // A threshold from a strided sample, chosen so that about 2k + slack entries pass it.
    let stride = (v / 1024).max(1);
    s.sample.clear();
    s.sample.extend(row.iter().step_by(stride).copied());
    let n = s.sample.len();
    let want = ((2 * k * n) / v + 8).min(n - 1);
    let (_, t, _) = s.sample.select_nth_unstable_by(want, |a, b| b.total_cmp(a));
    let mut floor = *t;
    loop {
        s.vals.clear();
        s.idx.clear();
        // Chunks with nothing at or above the floor (most of them) are passed over on a
        // vectorized max.
        for (c, xs) in row.chunks(16).enumerate() {
            if xs
                .iter()
                .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
                < floor
            {
                continue;
            }
            for (j, &x) in xs.iter().enumerate() {
                if x >= floor {
                    s.vals.push(x);
                    s.idx.push((c * 16 + j) as u32);
                }
            }
        }
        if s.vals.len() >= k {
            break;
        }
        floor = f32::NEG_INFINITY; // the sample misled us: take everything
    }
    let mut tmp = std::mem::take(&mut s.sample);
    tmp.clear();
    tmp.extend_from_slice(&s.vals);
    let (_, kth, _) = tmp.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    let kth = *kth;
    s.sample = tmp;
    kth
}

/// The smallest value top-p keeps among `vals` (at row indices `idx`, or their own positions)
/// and whether the decision is certain (see the module docs); `None` when it is not and
/// `strict`, or when the row has no finite maximum.
fn top_p_boundary(
    vals: &[f32],
    idx: Option<&[u32]>,
    thr: f64,
    strict: bool,
    s: &mut Scratch,
) -> Option<(f32, bool)> {
    let m = vals.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let low = vals.iter().fold(f32::INFINITY, |l, &x| {
        l.min(if x > f32::NEG_INFINITY {
            x
        } else {
            f32::INFINITY
        })
    });
    if !m.is_finite() {
        return None;
    }
    if thr == 0.0 && m - low < NEVER_ZERO_BELOW {
        // p = 1 in a batch with top-p: torch masks the entries whose float32 probability is
        // 0, and here none is.
        return Some((low, true));
    }
    // e = exp(x - m) per entry (vectorized), then its mass per bucket.
    s.sample.clear();
    s.sample.extend_from_slice(vals);
    super::fast_math::exp_shifted(&mut s.sample, m);
    // Four interleaved histograms: runs of entries in one bucket (the flat tail) would
    // otherwise wait on each other's store.
    s.mass.clear();
    s.mass.resize(4 * BUCKETS, 0.0);
    let (h0, rest) = s.mass.split_at_mut(BUCKETS);
    let (h1, rest) = rest.split_at_mut(BUCKETS);
    let (h2, h3) = rest.split_at_mut(BUCKETS);
    let quads = s.sample.chunks_exact(4);
    for &e in quads.remainder() {
        h0[bucket(e)] += e as f64;
    }
    for q in quads {
        h0[bucket(q[0])] += q[0] as f64;
        h1[bucket(q[1])] += q[1] as f64;
        h2[bucket(q[2])] += q[2] as f64;
        h3[bucket(q[3])] += q[3] as f64;
    }
    for b in 0..BUCKETS {
        h0[b] += h1[b] + h2[b] + h3[b];
    }
    s.mass.truncate(BUCKETS);
    let total: f64 = s.mass.iter().sum();
    if thr == 0.0 {
        return zero_probability_cut(vals, m, total, strict);
    }
    // Walk up from the smallest values to the bucket where the masked mass passes thr.
    let limit = thr * total;
    let margin = (TOP_P_MARGIN_ABS + TOP_P_MARGIN_REL * thr) * total;
    let mut certain = true;
    let mut below = 0.0f64;
    let mut b = BUCKETS;
    while b > 0 {
        b -= 1;
        if below + s.mass[b] > limit - if strict { margin } else { 0.0 } {
            break;
        }
        below += s.mass[b];
    }
    // The entries of bucket b, ascending by value (index order among ties does not matter:
    // a cut inside a run of ties is refused below).
    s.bucket.clear();
    for (j, (&x, &e)) in vals.iter().zip(&s.sample).enumerate() {
        if bucket(e) == b {
            let i = idx.map_or(j as u32, |idx| idx[j]);
            s.bucket.push((x, i, e as f64));
        }
    }
    s.bucket
        .sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let n = s.bucket.len();
    let mut prev: Option<f32> = None; // the last masked value
    for (j, &(x, _, e)) in s.bucket.iter().enumerate() {
        let after = below + e;
        let is_max = b == 0 && j == n - 1;
        if after <= limit && !is_max {
            // Masked; certain only if clearly below.
            certain &= after <= limit - margin;
            if !certain && strict {
                return None;
            }
            below = after;
            prev = Some(x);
            continue;
        }
        // x is the first kept value: certain only if clearly above (the max is kept
        // whatever its sum), and not a cut inside a run of equal values.
        certain &= (after > limit + margin || is_max) && prev != Some(x);
        if !certain && strict {
            return None;
        }
        return Some((x, certain));
    }
    // Bucket b held nothing kept (only reachable through the margin test): not certain.
    None
}

/// Below this distance to the max (in logits) an entry's float32 probability is never 0:
/// `e^-80 / V` stays above float32's smallest subnormal for any vocabulary below 2^20.
const NEVER_ZERO_BELOW: f32 = 80.0;

/// `p = 1` (`thr = 0`): torch's top-p masks exactly the entries whose float32 probability
/// `e * (1 / S)` is 0. Certain when the exact value is below 2^-152 (0) or at least 2^-148
/// (not 0) and `e` is a normal float32 (within 87 of the max), or when `e` underflows to 0
/// whatever the exponential (more than 104.5 below); otherwise torch's exponential and
/// rounding decide (`strict`: refused; else kept when the exact value reaches 2^-150).
fn zero_probability_cut(vals: &[f32], m: f32, total: f64, strict: bool) -> Option<(f32, bool)> {
    let (zero, half, nonzero) = (2f64.powi(-152), 2f64.powi(-150), 2f64.powi(-148));
    let mut cut = f32::INFINITY;
    let mut certain = true;
    for &x in vals {
        let d = (m - x) as f64;
        if d > 104.5 {
            continue;
        }
        let r = (-d).exp() / total;
        let sure = d <= 87.0 && (r >= nonzero || r < zero);
        certain &= sure;
        if !sure && strict {
            return None;
        }
        if r >= half {
            cut = cut.min(x);
        }
    }
    Some((cut, certain))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vLLM's sort path, in float64 sums (no rounding question on these inputs).
    fn sorted_kept(row: &[f32], k: Option<usize>, p: Option<f32>) -> Vec<bool> {
        let v = row.len();
        let mut order: Vec<usize> = (0..v).collect();
        order.sort_by(|&a, &b| row[a].total_cmp(&row[b]).then(a.cmp(&b)));
        let mut x: Vec<f32> = order.iter().map(|&i| row[i]).collect();
        if let Some(k) = k.filter(|&k| k < v) {
            let kth = x[v - k];
            x.iter_mut()
                .filter(|y| **y < kth)
                .for_each(|y| *y = f32::NEG_INFINITY);
        }
        let mut keep = vec![true; v];
        for (j, &i) in order.iter().enumerate() {
            keep[i] = x[j] > f32::NEG_INFINITY;
        }
        if let Some(p) = p.filter(|&p| p < 1.0) {
            let m = x[v - 1];
            let e: Vec<f64> = x.iter().map(|&y| ((y - m) as f64).exp()).collect();
            let s: f64 = e.iter().sum();
            let thr = (1.0f32 - p) as f64;
            let mut c = 0.0;
            for j in 0..v - 1 {
                c += e[j] / s;
                if c <= thr {
                    keep[order[j]] = false;
                }
            }
        }
        keep
    }

    fn rng(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    #[test]
    fn kept_sets_equal_the_sort_or_are_refused() {
        let mut seed = 1u64;
        let mut refused = 0;
        for case in 0..400 {
            let v = [5usize, 17, 100, 1000, 5000][case % 5];
            let scale = [0.5f32, 3.0, 10.0][case % 3];
            let row: Vec<f32> = (0..v)
                .map(|_| {
                    let x = rng(&mut seed) * scale;
                    if case % 7 == 0 {
                        (x * 2.0).round()
                    } else {
                        x
                    } // ties
                })
                .collect();
            let k = [None, Some(1), Some(3), Some(v / 2), Some(v - 1)][case % 5]
                .filter(|_| case % 4 != 0);
            let p = [None, Some(0.1f32), Some(0.5), Some(0.9), Some(0.999)][(case / 5) % 5];
            let want = sorted_kept(&row, k, p);
            let mut got = row.clone();
            match mask_row(&mut got, k, p, true, &mut Scratch::default()) {
                RowOutcome::MaskedUncertain => unreachable!("strict"),
                RowOutcome::Masked => {
                    let kept: Vec<bool> = got.iter().map(|&y| y > f32::NEG_INFINITY).collect();
                    assert_eq!(kept, want, "case {case} v {v} k {k:?} p {p:?}");
                }
                RowOutcome::NeedsSort => {
                    refused += 1;
                    assert_eq!(got, row);
                }
            }
        }
        assert!(refused < 80, "{refused} of 400 rows refused");
    }
}

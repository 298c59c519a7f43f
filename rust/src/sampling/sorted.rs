//! A row's values in ascending order, without their indices: a least-significant-digit radix
//! sort on the float32 bits (three passes of 11 bits), linear in the row's length. The `exact`
//! tail takes it for a row whose top-p boundary only torch's float32 arithmetic on the sorted
//! row can decide: torch's softmax and cumulative sum of these values are those of vLLM's sorted
//! row (the same sequence, whichever way torch's unstable sort orders equal values), so the
//! kept set follows from them without torch's sort, except where a run of equal values
//! straddles the boundary.

/// Bits of a float32 in an order that is its numeric order (negative values reversed below the
/// positive ones; `-0.0` just below `0.0`, which compare equal and so may come either way).
#[inline(always)]
fn key(x: f32) -> u32 {
    let b = x.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}

#[inline(always)]
fn value(k: u32) -> f32 {
    f32::from_bits(if k >> 31 == 1 { k & 0x7fff_ffff } else { !k })
}

const DIGIT: u32 = 11;
const BINS: usize = 1 << DIGIT;

/// `row`'s values in ascending order into `out` (`scratch`: reused). NaN must not occur (the
/// caller sends NaN rows to torch's sort).
pub fn sort_values(row: &[f32], out: &mut Vec<f32>, scratch: &mut Vec<u32>) {
    let n = row.len();
    let mut keys: Vec<u32> = row.iter().map(|&x| key(x)).collect();
    scratch.resize(n, 0);
    let mut counts = [[0usize; BINS]; 3];
    for &k in &keys {
        for (d, c) in counts.iter_mut().enumerate() {
            c[((k >> (DIGIT * d as u32)) as usize) & (BINS - 1)] += 1;
        }
    }
    let (mut src, mut dst) = (&mut keys, scratch);
    for (d, c) in counts.iter().enumerate() {
        if c.contains(&n) {
            continue; // every key has this digit: the pass would not move anything
        }
        let mut at = [0usize; BINS];
        let mut sum = 0;
        for (a, &m) in at.iter_mut().zip(c) {
            *a = sum;
            sum += m;
        }
        for &k in src.iter() {
            let b = ((k >> (DIGIT * d as u32)) as usize) & (BINS - 1);
            dst[at[b]] = k;
            at[b] += 1;
        }
        std::mem::swap(&mut src, &mut dst);
    }
    out.clear();
    out.extend(src.iter().map(|&k| value(k)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_as_the_standard_library() {
        let mut seed = 12u64;
        let (mut out, mut scratch) = (Vec::new(), Vec::new());
        for case in 0..300 {
            let n = [0usize, 1, 7, 100, 5000][case % 5];
            let row: Vec<f32> = (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    match (seed >> 59) % 8 {
                        0 => f32::NEG_INFINITY,
                        1 => f32::INFINITY,
                        2 => 0.0,
                        3 => -0.0,
                        4 => ((seed >> 40) % 7) as f32 - 3.0, // ties
                        _ => f32::from_bits((seed >> 32) as u32 & 0xff7f_ffff), // any finite
                    }
                })
                .collect();
            let mut want = row.clone();
            want.sort_by(f32::total_cmp);
            sort_values(&row, &mut out, &mut scratch);
            assert_eq!(out.len(), want.len());
            for (a, b) in out.iter().zip(&want) {
                assert!(
                    a == b || (a.is_nan() && b.is_nan()),
                    "case {case}: {a} vs {b}"
                );
            }
        }
    }
}

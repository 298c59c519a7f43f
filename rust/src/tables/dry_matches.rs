//! DRY's match lengths over a whole window at once, for a request's admission and a rebuild:
//! the Z-algorithm on the reversed window (llama.cpp's way), O(window) whatever the tokens.
//! Replaying the window token by token instead costs, per token, the earlier occurrences of the
//! newest `allowed_length` tokens: quadratic in the window when one token repeats.

/// For each position `j` of `w`, the length of the longest common suffix of `w[..=j]` and `w`
/// (at `j = w.len() - 1`: the whole window).
pub fn suffix_matches(w: &[i64]) -> Vec<u32> {
    let n = w.len();
    let rev = |i: usize| w[n - 1 - i];
    // z[k]: the longest common prefix of the reversed window and its suffix from k.
    let mut z = vec![0u32; n];
    if n == 0 {
        return z;
    }
    z[0] = n as u32;
    let (mut l, mut r) = (0usize, 0usize); // the rightmost match found: [l, r)
    for k in 1..n {
        let mut m = if k < r {
            (r - k).min(z[k - l] as usize)
        } else {
            0
        };
        while k + m < n && rev(m) == rev(k + m) {
            m += 1;
        }
        z[k] = m as u32;
        if k + m > r {
            (l, r) = (k, k + m);
        }
    }
    z.reverse(); // position j = n - 1 - k
    z
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equals_the_direct_count() {
        let mut rng = 5u64;
        for case in 0..200 {
            let n = case % 40;
            let alphabet = 1 + (case % 4) as u64;
            let w: Vec<i64> = (0..n)
                .map(|_| {
                    rng = rng
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((rng >> 33) % alphabet) as i64
                })
                .collect();
            let got = suffix_matches(&w);
            for j in 0..n {
                let mut m = 0;
                while m <= j && w[j - m] == w[n - 1 - m] {
                    m += 1;
                }
                assert_eq!(got[j] as usize, m, "{w:?} at {j}");
            }
        }
    }
}

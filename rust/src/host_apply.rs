//! The sparse applies on host logits, in place: what the torch path does with `index_put_`
//! (triples) and `index_fill_` (allowed ids), in one pass over the valid entries instead of
//! several tensor ops. On the CPU a torch op on a small batch costs tens of microseconds of
//! fixed overhead, which is most of a processor's cost in an engine step there.

use crate::buffer::HostBuffer;
use crate::sparse::SparseRows;

/// `logits[r, c] += v` (`add`) or `= v` for each valid triple `(r, c, v)` with `r < rows`
/// and `c < vocab` (the padding is not read: it only exists for fixed-length device views).
pub fn apply_triples(
    logits: &mut [f32],
    triples: &SparseRows<f32>,
    rows: usize,
    vocab: usize,
    row_stride: usize,
    add: bool,
) {
    let n = triples.len();
    let (rs, cs, vs) = (
        triples.rows().prefix(n),
        triples.cols().prefix(n),
        triples.vals().prefix(n),
    );
    for ((&r, &c), &v) in rs.iter().zip(cs).zip(vs) {
        let (r, c) = (r as usize, c as usize);
        if r >= rows || c >= vocab {
            continue;
        }
        let x = &mut logits[r * row_stride + c];
        if add {
            *x += v;
        } else {
            *x = v;
        }
    }
}

/// Allowed ids: every logit of the first `n_rows` restricted rows becomes −inf except those
/// at the valid `(row, token)` pairs, which keep their values.
pub fn keep_only(
    logits: &mut [f32],
    pairs: &SparseRows<f32>,
    restricted: &HostBuffer<i64>,
    n_rows: usize,
    rows: usize,
    vocab: usize,
    row_stride: usize,
) {
    let n = pairs.len();
    let (rs, cs) = (pairs.rows().prefix(n), pairs.cols().prefix(n));
    let restricted = restricted.prefix(n_rows);
    if !fill_gaps(logits, rs, cs, restricted, rows, vocab, row_stride) {
        save_fill_restore(logits, rs, cs, restricted, rows, vocab, row_stride);
    }
}

/// The table writes each row's pairs together, tokens ascending: then only the gaps between
/// allowed tokens are written. Returns `false` (nothing written) when the pairs are not in
/// that order or a restricted row has none, for [`save_fill_restore`].
fn fill_gaps(
    logits: &mut [f32],
    rs: &[i32],
    cs: &[i32],
    restricted: &[i64],
    rows: usize,
    vocab: usize,
    row_stride: usize,
) -> bool {
    let mut runs: Vec<(usize, usize, usize)> = Vec::with_capacity(restricted.len());
    let mut start = 0;
    while start < rs.len() {
        let row = rs[start];
        let mut end = start + 1;
        while end < rs.len() && rs[end] == row {
            if cs[end] <= cs[end - 1] {
                return false;
            }
            end += 1;
        }
        runs.push((row as usize, start, end));
        start = end;
    }
    let mut seen = runs.iter().map(|r| r.0).collect::<Vec<_>>();
    seen.sort_unstable();
    if seen.windows(2).any(|w| w[0] == w[1])
        || restricted
            .iter()
            .any(|&r| r < 0 || seen.binary_search(&(r as usize)).is_err())
    {
        return false;
    }
    for (row, start, end) in runs {
        if row >= rows {
            continue;
        }
        let line = &mut logits[row * row_stride..row * row_stride + vocab];
        let mut next = 0;
        for &c in &cs[start..end] {
            let c = (c as usize).min(vocab);
            line[next.min(c)..c].fill(f32::NEG_INFINITY);
            next = c + 1;
        }
        if next < vocab {
            line[next..].fill(f32::NEG_INFINITY);
        }
    }
    true
}

fn save_fill_restore(
    logits: &mut [f32],
    rs: &[i32],
    cs: &[i32],
    restricted: &[i64],
    rows: usize,
    vocab: usize,
    row_stride: usize,
) {
    let mut kept: Vec<(usize, f32)> = Vec::with_capacity(rs.len());
    for (&r, &c) in rs.iter().zip(cs) {
        let (r, c) = (r as usize, c as usize);
        if r < rows && c < vocab {
            let at = r * row_stride + c;
            kept.push((at, logits[at]));
        }
    }
    for &r in restricted {
        if r >= 0 && (r as usize) < rows {
            let start = r as usize * row_stride;
            logits[start..start + vocab].fill(f32::NEG_INFINITY);
        }
    }
    for (at, v) in kept {
        logits[at] = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sparse::Padding;

    #[test]
    fn triples_add_and_write_only_valid_entries() {
        let mut t = SparseRows::<f32>::new(8);
        t.rebuild(
            [(0, 1, 2.0), (1, 3, -1.0), (5, 0, 9.0)],
            Padding::FirstWithValue(-0.0),
        );
        let mut x = vec![1.0f32; 2 * 5];
        apply_triples(&mut x, &t, 2, 4, 5, true);
        assert_eq!(x, [1.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0]);
        apply_triples(&mut x, &t, 2, 4, 5, false);
        assert_eq!(x[1], 2.0);
        assert_eq!(x[8], -1.0);
    }

    #[test]
    fn keep_only_masks_restricted_rows_but_their_pairs() {
        let mut p = SparseRows::<f32>::new(8);
        p.rebuild([(1, 0, 0.0), (1, 2, 0.0)], Padding::RepeatFirst);
        let mut restricted = HostBuffer::new(4, 0i64);
        restricted.set(0, 1);
        let mut x: Vec<f32> = (0..6).map(|v| v as f32).collect();
        keep_only(&mut x, &p, &restricted, 1, 2, 3, 3);
        let inf = f32::NEG_INFINITY;
        assert_eq!(x, [0.0, 1.0, 2.0, 3.0, inf, 5.0]);
        // Pairs out of order take the save / fill / restore path: the same result.
        let mut q = SparseRows::<f32>::new(8);
        q.rebuild([(1, 2, 0.0), (1, 0, 0.0)], Padding::RepeatFirst);
        let mut y: Vec<f32> = (0..6).map(|v| v as f32).collect();
        keep_only(&mut y, &q, &restricted, 1, 2, 3, 3);
        assert_eq!(y, x);
    }
}

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
    let (rs, cs, vs) = (triples.rows(), triples.cols(), triples.vals());
    for k in 0..triples.len() {
        let (r, c) = (rs.get(k) as usize, cs.get(k) as usize);
        if r >= rows || c >= vocab {
            continue;
        }
        let x = &mut logits[r * row_stride + c];
        if add {
            *x += vs.get(k);
        } else {
            *x = vs.get(k);
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
    let (rs, cs) = (pairs.rows(), pairs.cols());
    let inside = |k: usize| {
        let (r, c) = (rs.get(k) as usize, cs.get(k) as usize);
        (r < rows && c < vocab).then_some(r * row_stride + c)
    };
    let kept: Vec<(usize, f32)> = (0..pairs.len())
        .filter_map(|k| inside(k).map(|at| (at, logits[at])))
        .collect();
    for i in 0..n_rows {
        let r = restricted.get(i);
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
    }
}

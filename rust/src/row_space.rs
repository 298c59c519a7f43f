//! Row-space copies of slot-space triples, for the stable-slot front-end (vLLM's Model
//! Runner V2): each step gives a row → slot map under which a slot may own several logits
//! rows, and a sparse table's copy holds its slots' triples once per row.

use crate::arena::Staged;
use crate::error::Result;
use crate::sparse::{Padding, SparseRows};

/// One sparse table's row-space copy.
pub struct RowCopy {
    triples: SparseRows<f32>,
    pad: Padding<f32>,
    names: [&'static str; 3],
    /// Scratch reused each step (no allocation per step).
    start: Vec<usize>,
    entries: Vec<(usize, i32, f32)>,
}

impl RowCopy {
    /// Room for `len` triples (rows × the per-request cap), exported under `names`.
    pub fn try_new(len: usize, pad: Padding<f32>, names: [&'static str; 3]) -> Result<Self> {
        Ok(RowCopy {
            triples: SparseRows::try_new(len.max(1), "max_rows")?,
            pad,
            names,
            start: Vec::new(),
            entries: Vec::new(),
        })
    }

    pub fn triples(&self) -> &SparseRows<f32> {
        &self.triples
    }

    pub fn padded_len(&self) -> usize {
        self.triples.padded_len()
    }

    /// Rewrites the copy from slot-space triples `src` (grouped by slot in ascending order):
    /// row `r` gets the triples of slot `row_to_slot[r]`. Returns whether the copy changed.
    pub fn remap(&mut self, src: &SparseRows<f32>, capacity: usize, row_to_slot: &[usize]) -> bool {
        self.begin();
        self.capture(src, capacity, row_to_slot.iter().copied().enumerate());
        self.finish()
    }

    /// Starts a copy built in parts ([`capture`](Self::capture), then
    /// [`finish`](Self::finish)): the draft rows of a speculative-decoding step, each
    /// captured from its slot's triples at its own draft position.
    pub fn begin(&mut self) {
        self.entries.clear();
    }

    /// Adds the triples slot `s` holds in `src` now for each `(row, s)` of `rows`.
    pub fn capture(
        &mut self,
        src: &SparseRows<f32>,
        capacity: usize,
        rows: impl Iterator<Item = (usize, usize)>,
    ) {
        let n = src.len();
        let start = &mut self.start;
        start.clear();
        start.resize(capacity + 1, 0);
        for i in 0..n {
            start[src.rows().get(i) as usize + 1] += 1;
        }
        for s in 0..capacity {
            start[s + 1] += start[s];
        }
        let entries = &mut self.entries;
        for (r, s) in rows {
            for i in start[s]..start[s + 1] {
                if entries.len() >= self.triples.capacity() {
                    break; // cannot happen: the copy holds rows × per-request cap
                }
                entries.push((r, src.cols().get(i), src.vals().get(i)));
            }
        }
    }

    /// Writes what was captured since [`begin`](Self::begin), ordered by row (a row's own
    /// triples keep their order). Returns whether the copy changed.
    pub fn finish(&mut self) -> bool {
        self.entries.sort_by_key(|e| e.0); // stable; already sorted when mapped in one go
        self.triples.rebuild_if_changed(&self.entries, self.pad)
    }

    pub fn visit(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        self.triples.visit_as(self.names, f);
    }
}

/// Restricted-row padding: repeats of the first up to a power of two.
pub fn padded_rows(n: usize, cap: usize) -> usize {
    if n == 0 {
        0
    } else {
        n.next_power_of_two().min(cap)
    }
}

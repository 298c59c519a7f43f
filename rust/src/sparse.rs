//! Flattened `(row, token, value)` triples for processors whose state is sparse per row.
//!
//! LogitBias (add `value`) and MinTokens (write `value` = -inf) both apply as one indexed write
//! over such triples. They are rebuilt only when the state changed, into fixed-capacity host
//! buffers that Python views zero-copy; `version` counts rebuilds so Python knows when to copy.

use std::sync::Arc;

use crate::buffer::HostBuffer;

pub struct SparseRows {
    rows: Arc<HostBuffer<i32>>,
    cols: Arc<HostBuffer<i32>>,
    vals: Arc<HostBuffer<f32>>,
    len: usize,
    version: u64,
}

impl SparseRows {
    pub fn new(capacity: usize) -> Self {
        SparseRows {
            rows: Arc::new(HostBuffer::new(capacity, 0)),
            cols: Arc::new(HostBuffer::new(capacity, 0)),
            vals: Arc::new(HostBuffer::new(capacity, 0.0)),
            len: 0,
            version: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.rows.len()
    }

    /// Number of valid triples (the prefix `[0, len)` of each buffer).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Incremented by every rebuild.
    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn rows(&self) -> &Arc<HostBuffer<i32>> {
        &self.rows
    }

    pub fn cols(&self) -> &Arc<HostBuffer<i32>> {
        &self.cols
    }

    pub fn vals(&self) -> &Arc<HostBuffer<f32>> {
        &self.vals
    }

    /// Rewrites the triples from `entries` (row, token, value). The caller guarantees the total
    /// fits (per-request caps times slot count equals the capacity).
    pub fn rebuild(&mut self, entries: impl IntoIterator<Item = (usize, i32, f32)>) {
        let mut n = 0;
        for (row, col, val) in entries {
            self.rows.set(n, row as i32);
            self.cols.set(n, col);
            self.vals.set(n, val);
            n += 1;
        }
        self.len = n;
        self.version += 1;
    }

    /// Snapshot of the valid triples (tests).
    pub fn triples(&self) -> Vec<(i32, i32, f32)> {
        (0..self.len)
            .map(|i| (self.rows.get(i), self.cols.get(i), self.vals.get(i)))
            .collect()
    }
}

/// Whether any slot in `[min(a, b), max(a, b))` is active: a batch-size change exposes or hides
/// those rows, so the flattened triples must be rebuilt.
pub fn resize_touches_active(is_active: impl Fn(usize) -> bool, a: usize, b: usize) -> bool {
    (a.min(b)..a.max(b)).any(is_active)
}

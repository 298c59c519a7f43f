//! Flattened `(row, token, value)` triples for processors whose state is sparse per row.
//!
//! LogitBias (add `value`) and MinTokens (write `value` = -inf) both apply as one indexed write
//! over such triples. They are rebuilt only when the state changed, into fixed-capacity host
//! buffers that Python views zero-copy; `version` counts rebuilds so Python knows when to copy.
//!
//! The valid prefix is padded up to a power of two (`padded_len`) with no-op triples, so Python
//! only ever needs views of a handful of lengths and can cache them instead of slicing torch
//! tensors every step (a torch slice costs about a microsecond of host time).

use crate::arena::Staged;
use crate::buffer::{Element, HostBuffer};
use crate::error::{Error, Result};

pub struct SparseRows<V: Element = f32> {
    rows: HostBuffer<i32>,
    cols: HostBuffer<i32>,
    vals: HostBuffer<V>,
    len: usize,
    padded_len: usize,
    version: u64,
}

/// How the padding after the valid triples is written.
#[derive(Clone, Copy, Debug)]
pub enum Padding<V> {
    /// Repeat the first triple with this value (e.g. −0.0 for an additive apply: x + −0.0 == x
    /// for every x, including −0.0 and NaN).
    FirstWithValue(V),
    /// Repeat the first triple unchanged (for an idempotent write such as "set to −inf").
    RepeatFirst,
}

/// Smallest padded length: below this, padding costs nothing measurable.
const MIN_PADDED: usize = 16;

impl<V: Element + Default> SparseRows<V> {
    pub fn new(capacity: usize) -> Self {
        Self::try_new(capacity, "triples").unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`new`](Self::new); an impossible size or a failed allocation is an error naming
    /// `field`.
    pub fn try_new(capacity: usize, field: &'static str) -> Result<Self> {
        Ok(SparseRows {
            rows: HostBuffer::try_new(capacity, 0, field)?,
            cols: HostBuffer::try_new(capacity, 0, field)?,
            vals: HostBuffer::try_new(capacity, V::default(), field)?,
            len: 0,
            padded_len: 0,
            version: 0,
        })
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

    /// Valid triples plus no-op padding: the length Python should view and apply.
    pub fn padded_len(&self) -> usize {
        self.padded_len
    }

    /// Incremented by every rebuild.
    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn rows(&self) -> &HostBuffer<i32> {
        &self.rows
    }

    pub fn cols(&self) -> &HostBuffer<i32> {
        &self.cols
    }

    pub fn vals(&self) -> &HostBuffer<V> {
        &self.vals
    }

    /// Rewrites the triples from `entries` (row, token, value) and pads them. The caller
    /// guarantees the total fits (per-request caps times slot count equals the capacity).
    pub fn rebuild(&mut self, entries: impl IntoIterator<Item = (usize, i32, V)>, pad: Padding<V>) {
        let mut n = 0;
        for (row, col, val) in entries {
            self.rows.set(n, row as i32);
            self.cols.set(n, col);
            self.vals.set(n, val);
            n += 1;
        }
        self.len = n;
        self.padded_len = if n == 0 {
            0
        } else {
            n.max(MIN_PADDED).next_power_of_two().min(self.capacity())
        };
        if n > 0 {
            let (row, col) = (self.rows.get(0), self.cols.get(0));
            let val = match pad {
                Padding::FirstWithValue(v) => v,
                Padding::RepeatFirst => self.vals.get(0),
            };
            self.rows.fill(n, self.padded_len, row);
            self.cols.fill(n, self.padded_len, col);
            self.vals.fill(n, self.padded_len, val);
        }
        self.version += 1;
    }

    /// Rewrites the triples only if `entries` differ from the current ones (so an unchanged
    /// step uploads nothing). Returns whether they were rebuilt.
    pub fn rebuild_if_changed(&mut self, entries: &[(usize, i32, V)], pad: Padding<V>) -> bool {
        if self.holds(entries) {
            return false;
        }
        self.rebuild(entries.iter().copied(), pad);
        true
    }

    /// Whether the valid triples are exactly `entries`.
    pub fn holds(&self, entries: &[(usize, i32, V)]) -> bool {
        entries.len() == self.len
            && entries.iter().enumerate().all(|(i, &(r, c, v))| {
                self.rows.get(i) as usize == r && self.cols.get(i) == c && self.vals.get(i) == v
            })
    }

    /// Snapshot of the valid triples (tests).
    pub fn triples(&self) -> Vec<(i32, i32, V)> {
        (0..self.len)
            .map(|i| (self.rows.get(i), self.cols.get(i), self.vals.get(i)))
            .collect()
    }
}

impl<V: Element + Default> SparseRows<V> {
    /// Visits the three buffers under the given names (a table's prefix is part of them).
    pub fn visit_as(
        &mut self,
        names: [&'static str; 3],
        f: &mut dyn FnMut(&'static str, &mut dyn Staged),
    ) {
        f(names[0], &mut self.rows);
        f(names[1], &mut self.cols);
        f(names[2], &mut self.vals);
    }
}

/// Speculative decoding's row layout: request `r` owns `num_draft[r]` consecutive logits rows
/// starting at `offsets[r]`. Returns the offsets and the total row count.
pub fn draft_offsets(num_draft: &[usize]) -> Result<(Vec<usize>, usize)> {
    let mut offsets = Vec::with_capacity(num_draft.len());
    let mut total: usize = 0;
    for (r, &n) in num_draft.iter().enumerate() {
        offsets.push(total);
        total = total
            .checked_add(n)
            .filter(|&t| t <= i32::MAX as usize)
            .ok_or_else(|| {
                Error::invalid(
                    r,
                    "num_draft_tokens",
                    "the draft rows add up to more than 2**31",
                )
            })?;
    }
    Ok((offsets, total))
}

/// Rebuilds `out` from draft-row triples, refusing more than it can hold (a caller passing more
/// draft tokens than the configured speculative tokens).
pub fn rebuild_draft_rows(
    out: &mut SparseRows<f32>,
    triples: Vec<(usize, i32, f32)>,
) -> Result<()> {
    if triples.len() > out.capacity() {
        return Err(Error::invalid(
            0,
            "num_draft_tokens",
            format!(
                "the draft layout needs {} masked entries, more than the {} reserved \
                 (num_draft_tokens above the configured speculative tokens?)",
                triples.len(),
                out.capacity()
            ),
        ));
    }
    out.rebuild(triples, Padding::RepeatFirst);
    Ok(())
}

/// Whether any slot in `[min(a, b), max(a, b))` is active: a batch-size change exposes or hides
/// those rows, so the flattened triples must be rebuilt.
pub fn resize_touches_active(is_active: impl Fn(usize) -> bool, a: usize, b: usize) -> bool {
    (a.min(b)..a.max(b)).any(is_active)
}

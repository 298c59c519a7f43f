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

/// The padded length of `n` valid triples in a buffer of `capacity`.
fn padded_len(n: usize, capacity: usize) -> usize {
    if n == 0 {
        0
    } else {
        n.max(MIN_PADDED).next_power_of_two().min(capacity)
    }
}

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
        self.padded_len = padded_len(n, self.capacity());
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

    /// As [`rebuild_if_changed`](Self::rebuild_if_changed), writing only the triples that
    /// differ: the span between the common prefix and the common suffix (aligned at the end),
    /// and the padding where the first triple or the length changed. Returns whether they
    /// were rebuilt.
    pub fn assign(&mut self, entries: &[(usize, i32, V)], pad: Padding<V>) -> bool {
        let (old, new) = (self.len, entries.len());
        let same = |s: &Self, i: usize, (r, c, v): (usize, i32, V)| {
            s.rows.get(i) as usize == r && s.cols.get(i) == c && s.vals.get(i) == v
        };
        let lo = (0..old.min(new))
            .find(|&i| !same(self, i, entries[i]))
            .unwrap_or(old.min(new));
        if lo == old && old == new {
            return false;
        }
        let mut tail = 0;
        while tail < old.min(new) - lo && same(self, old - 1 - tail, entries[new - 1 - tail]) {
            tail += 1;
        }
        assert!(new <= self.capacity(), "sparse rows over capacity");
        let mut p = self.patch();
        let s = &mut *p.s;
        if old != new {
            s.rows.copy_within(old - tail, new - tail, tail);
            s.cols.copy_within(old - tail, new - tail, tail);
            s.vals.copy_within(old - tail, new - tail, tail);
        }
        for (k, &(r, c, v)) in entries[lo..new - tail].iter().enumerate() {
            s.rows.set(lo + k, r as i32);
            s.cols.set(lo + k, c);
            s.vals.set(lo + k, v);
        }
        s.len = new;
        p.high = old.max(new);
        p.changed = true;
        p.finish(pad)
    }

    /// Whether the valid triples are exactly `entries`.
    pub fn holds(&self, entries: &[(usize, i32, V)]) -> bool {
        entries.len() == self.len
            && entries.iter().enumerate().all(|(i, &(r, c, v))| {
                self.rows.get(i) as usize == r && self.cols.get(i) == c && self.vals.get(i) == v
            })
    }

    /// Starts an in-place change of some rows' triples (see [`Patch`]): what a full
    /// [`rebuild`](Self::rebuild) from the same rows would write, at the cost of the rows
    /// that changed (plus one move of the triples after each).
    pub fn patch(&mut self) -> Patch<'_, V> {
        let first = (self.len > 0).then(|| (self.rows.get(0), self.cols.get(0), self.vals.get(0)));
        Patch {
            len0: self.len,
            first,
            high: self.len,
            changed: false,
            s: self,
        }
    }

    /// The valid triples' range of `row` (rows are grouped in ascending order).
    fn row_range(&self, row: usize) -> (usize, usize) {
        let rows = self.rows.prefix(self.len);
        let a = rows.partition_point(|&r| (r as usize) < row);
        let b = a + rows[a..].partition_point(|&r| r as usize == row);
        (a, b)
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

/// An in-place change of a [`SparseRows`] whose triples are grouped by row in ascending order
/// (as every slot-space table writes them): each [`set_row`](Self::set_row) replaces one row's
/// triples, [`truncate_rows`](Self::truncate_rows) drops the rows from some row on, and
/// [`finish`](Self::finish) rewrites the padding and counts one rebuild. The result is
/// exactly what `rebuild` from the same rows would write in `[0, padded_len)`.
pub struct Patch<'a, V: Element> {
    s: &'a mut SparseRows<V>,
    len0: usize,
    first: Option<(i32, i32, V)>,
    /// Highest valid length reached while patching (the padding up to it was overwritten).
    high: usize,
    changed: bool,
}

impl<V: Element + Default> Patch<'_, V> {
    /// Makes `new` the triples of `row` (in order), moving the later rows' triples. The caller
    /// guarantees the total fits (per-request caps times slot count equals the capacity).
    /// Returns whether the row's triples changed.
    pub fn set_row<I>(&mut self, row: usize, new: I) -> bool
    where
        I: ExactSizeIterator<Item = (i32, V)> + Clone,
    {
        let s = &mut *self.s;
        let (a, b) = s.row_range(row);
        let m = new.len();
        if m == b - a
            && new
                .clone()
                .enumerate()
                .all(|(k, (c, v))| s.cols.get(a + k) == c && s.vals.get(a + k) == v)
        {
            return false;
        }
        let len = s.len - (b - a) + m;
        assert!(len <= s.capacity(), "sparse rows over capacity");
        if m != b - a {
            let tail = s.len - b;
            s.rows.copy_within(b, a + m, tail);
            s.cols.copy_within(b, a + m, tail);
            s.vals.copy_within(b, a + m, tail);
        }
        if m > 0 {
            s.rows.fill(a, a + m, row as i32);
        }
        for (k, (c, v)) in new.enumerate() {
            s.cols.set(a + k, c);
            s.vals.set(a + k, v);
        }
        s.len = len;
        self.high = self.high.max(len);
        self.changed = true;
        true
    }

    /// Drops the triples of every row `>= row`.
    pub fn truncate_rows(&mut self, row: usize) {
        let (a, _) = self.s.row_range(row);
        if a < self.s.len {
            self.s.len = a;
            self.changed = true;
        }
    }

    /// As [`finish`](Self::finish) when some row changed; else nothing (no rebuild counted).
    /// Returns whether some row changed.
    pub fn finish_if_changed(self, pad: Padding<V>) -> bool {
        self.changed && self.finish(pad)
    }

    /// Pads the triples as [`SparseRows::rebuild`] does and counts one rebuild. Returns
    /// whether any row changed.
    pub fn finish(self, pad: Padding<V>) -> bool {
        let s = self.s;
        let n = s.len;
        s.padded_len = padded_len(n, s.capacity());
        if n > 0 {
            let (row, col) = (s.rows.get(0), s.cols.get(0));
            let val = match pad {
                Padding::FirstWithValue(v) => v,
                Padding::RepeatFirst => s.vals.get(0),
            };
            let padded = s.padded_len;
            let same_first = self.first == Some((row, col, s.vals.get(0)));
            let old_padded = padded_len(self.len0, s.capacity());
            let mut fill = |from: usize, to: usize| {
                if from < to {
                    s.rows.fill(from, to, row);
                    s.cols.fill(from, to, col);
                    s.vals.fill(from, to, val);
                }
            };
            if same_first {
                // The old padding (the same triple) is intact from the highest length reached
                // on: only the rest is written.
                fill(n, self.high.min(padded));
                fill(old_padded.max(self.high), padded);
            } else {
                fill(n, padded);
            }
        }
        s.version += 1;
        self.changed
    }
}

/// Brings row-grouped slot-space triples up to date after a batch change, in place: the rows
/// in `touched` (the slots the change reached), the rows a batch-size change from `old_bs` to
/// `bs` hid or exposed, each set to `row(slot)` (`None`: no state). Counts one rebuild.
pub fn patch_rows<V, I>(
    triples: &mut SparseRows<V>,
    touched: &[usize],
    old_bs: usize,
    bs: usize,
    row: impl Fn(usize) -> Option<I>,
    pad: Padding<V>,
) where
    V: Element + Default,
    I: ExactSizeIterator<Item = (i32, V)> + Clone,
{
    let mut p = triples.patch();
    if bs < old_bs {
        p.truncate_rows(bs);
    }
    let set = |p: &mut Patch<'_, V>, i: usize| match row(i).filter(|_| i < bs) {
        Some(entries) => p.set_row(i, entries),
        None => p.set_row(i, std::iter::empty()),
    };
    for &i in touched {
        set(&mut p, i);
    }
    for i in old_bs..bs {
        set(&mut p, i);
    }
    p.finish(pad);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The padded prefix of every buffer, bit for bit.
    fn view(s: &SparseRows<f32>) -> (usize, Vec<i32>, Vec<i32>, Vec<u32>) {
        let n = s.padded_len();
        (
            s.len(),
            s.rows().to_vec(n),
            s.cols().to_vec(n),
            s.vals().to_vec(n).iter().map(|v| v.to_bits()).collect(),
        )
    }

    #[test]
    fn patching_rows_writes_what_a_rebuild_writes() {
        let (slots, per_row) = (12usize, 5usize);
        let mut x: u64 = 7;
        let mut next = |n: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % n
        };
        for pad in [Padding::FirstWithValue(-0.0), Padding::RepeatFirst] {
            let mut state: Vec<Option<Vec<(i32, f32)>>> = vec![None; slots];
            let (mut patched, mut rebuilt, mut assigned) = (
                SparseRows::<f32>::new(slots * per_row),
                SparseRows::<f32>::new(slots * per_row),
                SparseRows::<f32>::new(slots * per_row),
            );
            let mut bs = 0;
            for _ in 0..3000 {
                let mut touched = Vec::new();
                for _ in 0..next(4) {
                    let i = next(slots as u64) as usize;
                    let n = next(per_row as u64 + 1) as usize;
                    state[i] = (n > 0).then(|| {
                        (0..n)
                            .map(|_| (next(50) as i32, next(3) as f32 - 1.0))
                            .collect()
                    });
                    touched.push(i);
                }
                let old_bs = bs;
                if next(4) == 0 {
                    bs = next(slots as u64 + 1) as usize;
                }
                patch_rows(
                    &mut patched,
                    &touched,
                    old_bs,
                    bs,
                    |i| state[i].as_ref().map(|e| e.iter().copied()),
                    pad,
                );
                let all: Vec<_> = state[..bs]
                    .iter()
                    .enumerate()
                    .filter_map(|(r, e)| e.as_ref().map(|e| (r, e)))
                    .flat_map(|(r, e)| e.iter().map(move |&(t, v)| (r, t, v)))
                    .collect();
                let differs = !assigned.holds(&all);
                assert_eq!(assigned.assign(&all, pad), differs);
                rebuilt.rebuild(all, pad);
                assert_eq!(view(&patched), view(&rebuilt));
                assert_eq!(view(&assigned), view(&rebuilt));
                assert_eq!(patched.version(), rebuilt.version());
            }
        }
    }
}

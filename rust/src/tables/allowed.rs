//! Allowed token ids: every token outside a request's set becomes −inf.
//!
//! State is per slot and moves with its request through the generic table, so a SWAP exchanges
//! the two rows' sets and a condense move leaves nothing behind at the source (vLLM 0.25.1 gets
//! both wrong: its swap aliases two row views and its condense never clears the source row).
//! Exported as (row, token) pairs of allowed entries plus the list of restricted rows; apply
//! saves the allowed logits, fills the restricted rows with −inf, and writes the saved values
//! back.

use crate::arena::{HasBuffers, Staged};
use crate::batch::BatchUpdate;
use crate::buffer::HostBuffer;
use crate::error::{Error, Result};
use crate::fields::Example as E;
use crate::fields::{FieldKind, FieldSpec, Fields};
use crate::limits::check_token;
use crate::processor::{
    self, Admission, HostApply, HostData, HostLogits, MapsRows, StatusSink, StepContext, Table,
};
use crate::row_space::{padded_rows, RowCopy};
use crate::sparse::{resize_touches_active, Padding, SparseRows};
use crate::table::SlotTable;
use crate::tables::Build;

/// Per-request caps (engine-config names) and their defaults.
pub const CAPS: &[(&str, usize)] = &[("max_allowed_token_ids", 4096)];

/// The request fields allowed ids read. Duplicates are allowed in the list and the cap
/// applies to the distinct ids, so a bounded multiple is read.
pub const FIELDS: &[FieldSpec] = &[FieldSpec::new(
    "allowed_token_ids",
    FieldKind::Ids {
        cap: "max_allowed_token_ids",
        factor: 4,
    },
)
.examples(&[E::Ids(&[2, 5, 6, 7, 13, 42])])];

pub struct AllowedState {
    table: SlotTable<Vec<i32>>,
    pairs: SparseRows<f32>,
    rows: HostBuffer<i64>,
    n_rows: usize,
    padded_rows: usize,
    vocab_size: usize,
    max_ids: usize,
    batch_size: usize,
}

impl AllowedState {
    pub fn new(capacity: usize, vocab_size: usize, max_ids: usize) -> Self {
        Self::try_new(capacity, vocab_size, max_ids).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`new`](Self::new); a failed allocation is an error.
    pub fn try_new(capacity: usize, vocab_size: usize, max_ids: usize) -> Result<Self> {
        Ok(AllowedState {
            table: SlotTable::new(capacity),
            pairs: SparseRows::try_new(capacity * max_ids, "max_allowed_token_ids")?,
            rows: HostBuffer::try_new(capacity, 0, "max_num_seqs")?,
            n_rows: 0,
            padded_rows: 0,
            vocab_size,
            max_ids,
            batch_size: 0,
        })
    }

    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    pub fn active(&self) -> usize {
        self.table.active()
    }

    pub fn pairs(&self) -> &SparseRows<f32> {
        &self.pairs
    }

    /// Restricted rows (prefix `[0, padded_rows)`, padded by repeating the first).
    pub fn rows(&self) -> &HostBuffer<i64> {
        &self.rows
    }

    /// Whether slot `index` has an allowed set.
    pub fn is_restricted(&self, index: usize) -> bool {
        self.table.get(index).is_some()
    }

    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    pub fn padded_rows(&self) -> usize {
        self.padded_rows
    }

    pub fn check(&self, index: usize, ids: Option<Vec<i64>>) -> Result<Option<Vec<i32>>> {
        let Some(ids) = ids else { return Ok(None) };
        if ids.is_empty() {
            return Err(Error::invalid(
                index,
                "allowed_token_ids",
                "must not be empty (it would ban every token)",
            ));
        }
        let mut out: Vec<i32> = Vec::with_capacity(ids.len());
        for t in ids {
            out.push(check_token(index, "allowed_token_ids", t, self.vocab_size)?);
        }
        out.sort_unstable();
        out.dedup();
        if out.len() > self.max_ids {
            return Err(Error::TooManyEntries {
                index,
                field: "allowed_token_ids",
                count: out.len(),
                cap: self.max_ids,
            });
        }
        Ok(Some(out))
    }

    /// Applies a batch change (validated first); returns whether the exported pairs changed.
    pub fn update(&mut self, update: BatchUpdate<Option<Vec<i64>>>) -> Result<bool> {
        update.validate(self.capacity())?;
        let update = update.try_map_added(|i, ids| self.check(i, ids))?;
        Ok(self.commit(update))
    }

    /// Applies an update whose indices and sets were already checked; returns whether the
    /// exported pairs changed.
    pub fn commit(&mut self, update: BatchUpdate<Option<Vec<i32>>>) -> bool {
        let new_bs = update.batch_size;
        let mut changed = self.table.apply_validated(update);
        changed |= resize_touches_active(|i| self.table.get(i).is_some(), self.batch_size, new_bs);
        self.batch_size = new_bs;
        if changed {
            self.rebuild();
        }
        changed
    }

    fn rebuild(&mut self) {
        let bs = self.batch_size;
        let table = &self.table;
        self.pairs.rebuild(
            table
                .iter()
                .take_while(|(row, _)| *row < bs)
                .flat_map(|(row, ids)| ids.iter().map(move |&t| (row, t, 0.0))),
            Padding::RepeatFirst,
        );
        let mut n = 0;
        for (row, _) in table.iter().take_while(|(row, _)| *row < bs) {
            self.rows.set(n, row as i64);
            n += 1;
        }
        self.n_rows = n;
        self.padded_rows = if n == 0 {
            0
        } else {
            n.next_power_of_two().min(self.capacity())
        };
        if n > 0 {
            let first = self.rows.get(0);
            self.rows.fill(n, self.padded_rows, first);
        }
    }
}

impl HasBuffers for AllowedState {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        self.pairs
            .visit_as(["allowed.rows", "allowed.cols", "allowed.vals"], f);
        f("allowed.restricted_rows", &mut self.rows);
    }
}

/// Allowed ids in a pipeline: the state and its row-space copies (stable slots).
pub struct AllowedTable {
    pub state: AllowedState,
    rows: Option<AllowedRows>,
}

/// The row-space pairs and restricted rows of one step's row map.
struct AllowedRows {
    pairs: RowCopy,
    restricted: HostBuffer<i64>,
    restricted_len: usize,
}

impl AllowedTable {
    /// `row_space`: rows of the stable-slot front-end (`None`: no row-space copy).
    pub fn try_new(
        capacity: usize,
        vocab_size: usize,
        max_ids: usize,
        row_space: Option<usize>,
    ) -> Result<Self> {
        Ok(AllowedTable {
            state: AllowedState::try_new(capacity, vocab_size, max_ids)?,
            rows: row_space
                .map(|r| -> Result<AllowedRows> {
                    Ok(AllowedRows {
                        pairs: RowCopy::try_new(
                            r * max_ids,
                            Padding::RepeatFirst,
                            [
                                "rows.allowed.rows",
                                "rows.allowed.cols",
                                "rows.allowed.vals",
                            ],
                        )?,
                        restricted: HostBuffer::try_new(r, 0, "row_to_slot")?,
                        restricted_len: 0,
                    })
                })
                .transpose()?,
        })
    }
}

impl HasBuffers for AllowedTable {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        self.state.visit_buffers(f);
    }
}

impl Table for AllowedTable {
    fn name(&self) -> &str {
        "allowed"
    }

    fn check(&self, index: usize, fields: &mut Fields, _: Admission) -> Result<processor::Entry> {
        let ids = fields.take_ids(&FIELDS[0]);
        Ok(processor::entry(self.state.check(index, ids)?))
    }

    fn commit(&mut self, update: BatchUpdate<processor::Entry>, _: &StepContext<'_>) {
        self.state.commit(processor::unbox(update));
    }

    fn active(&self) -> Option<usize> {
        Some(self.state.active())
    }

    fn status(&self, out: &mut StatusSink<'_>) {
        out("allowed", self.state.pairs().padded_len());
        out("allowed_rows", self.state.padded_rows());
        let rows = self.rows.as_ref();
        out("rows.allowed", rows.map_or(0, |r| r.pairs.padded_len()));
        out(
            "rows.allowed_rows",
            rows.map_or(0, |r| padded_rows(r.restricted_len, r.restricted.len())),
        );
    }

    fn host(&self) -> Option<&dyn HostApply> {
        Some(self)
    }

    fn rows_mut(&mut self) -> Option<&mut dyn MapsRows> {
        Some(self)
    }
}

impl HostApply for AllowedTable {
    fn apply_host(&self, l: &mut HostLogits<'_>) -> std::result::Result<(), &'static str> {
        match (&mut l.data, l.row_to_slot) {
            (HostData::F32(data), None) => {
                let s = &self.state;
                crate::host_apply::keep_only(
                    data,
                    s.pairs(),
                    s.rows(),
                    s.n_rows(),
                    l.rows,
                    l.vocab,
                    l.row_stride,
                );
                Ok(())
            }
            (_, Some(_)) => Err("has no host apply through a row map"),
            _ => Err("applies on float32 logits only"),
        }
    }
}

/// The row-space copy of the pairs and of the restricted rows (stable slots).
impl MapsRows for AllowedTable {
    fn map_rows(&mut self, row_to_slot: &[usize], capacity: usize) {
        let Some(r) = &mut self.rows else { return };
        if !r.pairs.remap(self.state.pairs(), capacity, row_to_slot) {
            return;
        }
        let mut n = 0;
        for (row, &slot) in row_to_slot.iter().enumerate() {
            if self.state.is_restricted(slot) {
                r.restricted.set(n, row as i64);
                n += 1;
            }
        }
        r.restricted_len = n;
        if n > 0 {
            let first = r.restricted.get(0);
            r.restricted
                .fill(n, padded_rows(n, r.restricted.len()), first);
        }
    }

    fn visit_late_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        if let Some(r) = &mut self.rows {
            r.pairs.visit(f);
            f("rows.allowed.restricted_rows", &mut r.restricted);
        }
    }
}

/// Builds the table for a pipeline (the registry's entry).
pub fn build(b: &Build<'_>) -> Result<Box<dyn Table>> {
    let n = b.cap("max_allowed_token_ids")?;
    Ok(Box::new(AllowedTable::try_new(
        b.capacity,
        b.vocab_size,
        n,
        b.rows,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Move;

    #[test]
    fn swap_and_condense_carry_the_set() {
        let mut s = AllowedState::new(4, 10, 8);
        let mut u = BatchUpdate::new(3);
        u.added = vec![(0, Some(vec![3, 1, 3])), (1, None), (2, Some(vec![7]))];
        assert!(s.update(u).unwrap());
        assert_eq!(s.rows().to_vec(2), vec![0, 2]);
        let mut u = BatchUpdate::new(3);
        u.moved = vec![Move::swap(0, 1)];
        assert!(s.update(u).unwrap());
        assert_eq!(
            s.pairs()
                .triples()
                .iter()
                .map(|t| (t.0, t.1))
                .collect::<Vec<_>>(),
            vec![(1, 1), (1, 3), (2, 7)]
        );
        // Condense 2 -> 0 (0 was removed and not refilled): source emptied.
        let mut u = BatchUpdate::new(2);
        u.moved = vec![Move::unidirectional(2, 0)];
        s.update(u).unwrap();
        assert_eq!(s.rows().to_vec(s.n_rows()), vec![0, 1]);
        let mut u = BatchUpdate::new(3);
        u.added = vec![(2, None)];
        assert!(!s.update(u).unwrap());
    }

    #[test]
    fn rejects_empty_and_out_of_vocab() {
        let mut s = AllowedState::new(4, 10, 8);
        for ids in [vec![], vec![10]] {
            let mut u = BatchUpdate::new(1);
            u.added = vec![(0, Some(ids))];
            assert!(s
                .update(u)
                .unwrap_err()
                .to_string()
                .contains("allowed_token_ids"));
        }
    }
}

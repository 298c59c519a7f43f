//! LogitBias state: per-slot sparse `token -> bias`, flattened to (row, token, bias) triples.
//!
//! Each request may carry at most `max_entries` biases (a stated cap, so the flattened buffers
//! have a fixed size). Triples are rebuilt only when some slot's biases changed or a batch-size
//! change hid or exposed a biased row. Within a row, entries keep the request's own order.

use crate::arena::{HasBuffers, Staged};
use crate::batch::BatchUpdate;
use crate::error::{Error, Result};
use crate::fields::Example as E;
use crate::fields::{FieldKind, FieldSpec, Fields};
use crate::limits::check_token;
use crate::processor::{self, Admission, HostApply, MapsRows, StatusSink, StepContext, Table};
use crate::sparse::{patch_rows, resize_touches_active, Padding, SparseRows};
use crate::table::SlotTable;
use crate::tables::triples::{TripleState, TripleTable};
use crate::tables::Build;

/// Per-request caps (engine-config names) and their defaults.
pub const CAPS: &[(&str, usize)] = &[("max_logit_bias_entries", 1024)];

/// The request fields LogitBias reads.
pub const FIELDS: &[FieldSpec] = &[FieldSpec::new(
    "logit_bias",
    FieldKind::Bias {
        cap: "max_logit_bias_entries",
    },
)
.examples(&[E::Bias(&[(42, -5.0), (7, 2.5)])])];

pub struct LogitBiasState {
    table: SlotTable<Vec<(i32, f32)>>,
    triples: SparseRows,
    vocab_size: usize,
    max_entries: usize,
    batch_size: usize,
    /// Scratch: the slots the last update reached.
    touched: Vec<usize>,
}

impl LogitBiasState {
    pub fn new(capacity: usize, vocab_size: usize, max_entries: usize) -> Self {
        Self::try_new(capacity, vocab_size, max_entries).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`new`](Self::new); a failed allocation is an error.
    pub fn try_new(capacity: usize, vocab_size: usize, max_entries: usize) -> Result<Self> {
        Ok(LogitBiasState {
            table: SlotTable::new(capacity),
            triples: SparseRows::try_new(capacity * max_entries, "max_logit_bias_entries")?,
            vocab_size,
            max_entries,
            batch_size: 0,
            touched: Vec::new(),
        })
    }

    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// Slots holding a non-empty bias.
    pub fn active(&self) -> usize {
        self.table.active()
    }

    pub fn triples(&self) -> &SparseRows {
        &self.triples
    }

    pub fn get(&self, index: usize) -> Option<&[(i32, f32)]> {
        self.table.get(index).map(Vec::as_slice)
    }

    /// Checks one request's biases: ids in `[0, vocab_size)`, finite values, at most the cap.
    /// An empty list means "no bias", as an empty dict does in vLLM.
    pub fn check(&self, index: usize, entries: Vec<(i64, f64)>) -> Result<Option<Vec<(i32, f32)>>> {
        if entries.len() > self.max_entries {
            return Err(Error::TooManyEntries {
                index,
                field: "logit_bias",
                count: entries.len(),
                cap: self.max_entries,
            });
        }
        if entries.is_empty() {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(entries.len());
        for (token, bias) in entries {
            check_token(index, "logit_bias", token, self.vocab_size)?;
            // Checked after the cast: a finite f64 beyond f32's range would become inf.
            if !(bias as f32).is_finite() {
                return Err(Error::invalid(
                    index,
                    "logit_bias",
                    format!("bias for token {token} must be a finite float32, got {bias}"),
                ));
            }
            if out.iter().any(|&(t, _)| t == token as i32) {
                return Err(Error::invalid(
                    index,
                    "logit_bias",
                    format!("token id {token} appears twice"),
                ));
            }
            out.push((token as i32, bias as f32));
        }
        Ok(Some(out))
    }

    /// Validates everything, applies the update, and rebuilds the triples if needed.
    /// Returns whether the triples were rebuilt.
    pub fn update(&mut self, update: BatchUpdate<Vec<(i64, f64)>>) -> Result<bool> {
        update.validate(self.capacity())?;
        let update = update.try_map_added(|i, e| self.check(i, e))?;
        Ok(self.commit(update))
    }

    /// Applies an update whose indices and entries were already checked. Returns whether the
    /// triples were rebuilt.
    pub fn commit(&mut self, update: BatchUpdate<Option<Vec<(i32, f32)>>>) -> bool {
        let new_bs = update.batch_size;
        self.touched.clear();
        let changed = self
            .table
            .apply_validated_touching(update, &mut self.touched);
        let old_bs = self.batch_size;
        let resized = resize_touches_active(|i| self.table.get(i).is_some(), old_bs, new_bs);
        self.batch_size = new_bs;
        if changed || resized {
            // Only the rows the update reached (or the resize hid or exposed) are rewritten.
            let table = &self.table;
            patch_rows(
                &mut self.triples,
                &self.touched,
                old_bs,
                new_bs,
                |i| table.get(i).map(|e| e.iter().copied()),
                Padding::FirstWithValue(-0.0),
            );
            return true;
        }
        false
    }
}

impl HasBuffers for LogitBiasState {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        self.triples
            .visit_as(["logit_bias.rows", "logit_bias.cols", "logit_bias.vals"], f);
    }
}

/// LogitBias in a pipeline.
pub type LogitBiasTable = TripleTable<LogitBiasState>;

impl Table for LogitBiasTable {
    fn name(&self) -> &str {
        LogitBiasState::NAME
    }

    fn check(&self, index: usize, fields: &mut Fields, _: Admission) -> Result<processor::Entry> {
        let bias = fields.take_bias(&FIELDS[0]);
        Ok(processor::entry(self.state.check(index, bias)?))
    }

    fn commit(&mut self, update: BatchUpdate<processor::Entry>, _: &StepContext<'_>) {
        self.state.commit(processor::unbox(update));
    }

    fn status(&self, out: &mut StatusSink<'_>) {
        self.status_into(out);
    }

    fn active(&self) -> Option<usize> {
        Some(self.state.active())
    }

    fn host(&self) -> Option<&dyn HostApply> {
        Some(self)
    }

    fn rows_mut(&mut self) -> Option<&mut dyn MapsRows> {
        Some(self)
    }
}

impl TripleState for LogitBiasState {
    const NAME: &'static str = "logit_bias";
    const ADDS: bool = true;
    const ROW_BUFFERS: [&'static str; 3] = [
        "rows.logit_bias.rows",
        "rows.logit_bias.cols",
        "rows.logit_bias.vals",
    ];
    const PADDING: Padding<f32> = Padding::FirstWithValue(-0.0);

    fn triples(&self) -> &SparseRows<f32> {
        &self.triples
    }
}

/// Builds the table for a pipeline (the registry's entry).
pub fn build(b: &Build<'_>) -> Result<Box<dyn Table>> {
    let n = b.cap("max_logit_bias_entries")?;
    let state = LogitBiasState::try_new(b.capacity, b.vocab_size, n)?;
    Ok(Box::new(LogitBiasTable::try_new(
        state,
        b.row_space(n),
        None,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Move;

    #[test]
    fn flatten_follows_rows_and_batch_size() {
        let mut s = LogitBiasState::new(4, 100, 3);
        let mut u = BatchUpdate::new(3);
        u.added = vec![
            (2, vec![(5, 1.0), (7, -2.0)]),
            (0, vec![(1, 0.5)]),
            (1, vec![]),
        ];
        assert!(s.update(u).unwrap());
        assert_eq!(
            s.triples().triples(),
            vec![(0, 1, 0.5), (2, 5, 1.0), (2, 7, -2.0)]
        );
        // Shrinking past row 2 hides it.
        let mut u = BatchUpdate::new(2);
        u.moved = vec![Move::swap(0, 1)];
        assert!(s.update(u).unwrap());
        assert_eq!(s.triples().triples(), vec![(1, 1, 0.5)]);
        // An add without bias into an empty slot changes nothing.
        let mut u = BatchUpdate::new(2);
        u.added = vec![(0, vec![])];
        assert!(!s.update(u).unwrap());
    }

    #[test]
    fn rejects_bad_entries() {
        let mut s = LogitBiasState::new(4, 100, 2);
        for bad in [
            vec![(100, 1.0)],
            vec![(-1, 1.0)],
            vec![(3, f64::INFINITY)],
            vec![(1, 0.0), (2, 0.0), (3, 0.0)],
        ] {
            let mut u = BatchUpdate::new(2);
            u.added = vec![(0, vec![(1, 1.0)]), (1, bad)];
            let e = s.update(u).unwrap_err().to_string();
            assert!(e.contains("index 1") && e.contains("logit_bias"), "{e}");
            assert_eq!(s.active(), 0);
        }
    }
}

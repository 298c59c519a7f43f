//! The shape most built-ins share: a table that exports `(row, token, value)` triples (logit
//! bias, min-tokens, bad words, the thinking budget, no-repeat-ngram, DRY). A [`TripleTable`]
//! holds the state and what every one of them needs the same way: the stable slots' row-space
//! copy of its triples, the draft-row masks of the V1 speculative-decoding path, their status
//! and buffers, and the CPU apply from the triples. Each table implements
//! [`Table`](crate::processor::Table) (and [`ReadsHistory`](crate::processor::ReadsHistory)
//! if it reads histories) on its own `TripleTable<State>`, from the state's own methods; the
//! shared parts are written here once ([`HostApply`], [`MapsRows`],
//! [`TripleTable::status_into`]). [`TripleState`] carries the few facts they need.

use crate::arena::{HasBuffers, Staged};
use crate::error::Result;
use crate::processor::{DraftRow, HostApply, MapsRows, StatusSink, StepContext};
use crate::row_space::RowCopy;
use crate::sparse::{Padding, SparseRows};

/// A state that exports triples: what its table's shared parts need.
pub trait TripleState: HasBuffers + Send + Sync + 'static {
    /// The table's name (its registry entry's), which also names its status counts.
    const NAME: &'static str;
    /// Whether its triples' values add to the logits (else they overwrite them).
    const ADDS: bool;
    /// Its row-space copy's buffers (`rows.<NAME>.rows`, `.cols`, `.vals`).
    const ROW_BUFFERS: [&'static str; 3];
    /// Its draft-row masks' buffers, for a state with a speculative-decoding form.
    const DRAFT_BUFFERS: [&'static str; 3] = ["", "", ""];
    /// How its padded triples are padded (the row-space copy pads the same way).
    const PADDING: Padding<f32> = Padding::RepeatFirst;

    /// Its triples (slot space, V1 rows).
    fn triples(&self) -> &SparseRows<f32>;
}

/// A [`TripleState`] in a pipeline, with the row-space copy of its triples and, for the
/// states that have them, the draft-row masks of the V1 speculative-decoding path.
pub struct TripleTable<S> {
    pub state: S,
    rows: Option<RowCopy>,
    /// Draft-row masks (speculative decoding on the V1 path), for the states that have them.
    pub spec: Option<SparseRows<f32>>,
    row_status: String,
}

impl<S: TripleState> TripleTable<S> {
    /// `state` with a row-space copy of `row_space` triples (stable slots) and room for
    /// `drafts` draft-row triples (speculative decoding).
    pub fn try_new(state: S, row_space: Option<usize>, drafts: Option<usize>) -> Result<Self> {
        Ok(TripleTable {
            rows: row_space
                .map(|n| RowCopy::try_new(n, S::PADDING, S::ROW_BUFFERS))
                .transpose()?,
            spec: drafts
                .map(|n| SparseRows::try_new(n, "num_speculative_tokens"))
                .transpose()?,
            row_status: format!("rows.{}", S::NAME),
            state,
        })
    }

    /// The row-space copy of the last row map (stable slots).
    pub fn row_copy(&self) -> Option<&RowCopy> {
        self.rows.as_ref()
    }

    /// Its [`Table::status`](crate::processor::Table::status): `"<NAME>"`, the padded
    /// triples, then `"rows.<NAME>"`, the row-space copy's.
    pub fn status_into(&self, out: &mut StatusSink<'_>) {
        out(S::NAME, self.state.triples().padded_len());
        out(
            &self.row_status,
            self.rows.as_ref().map_or(0, RowCopy::padded_len),
        );
    }
}

impl<S: TripleState> HasBuffers for TripleTable<S> {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        self.state.visit_buffers(f);
    }
}

impl<S: TripleState> HostApply for TripleTable<S> {
    fn triples(&self) -> Option<(&SparseRows<f32>, bool)> {
        Some((self.state.triples(), S::ADDS))
    }
}

/// The row-space copy of the triples: remapped whole for a row map, or captured row by row at
/// each draft position of the draft replay.
impl<S: TripleState> MapsRows for TripleTable<S> {
    fn map_rows(&mut self, row_to_slot: &[usize], capacity: usize) {
        if let Some(r) = &mut self.rows {
            r.remap(self.state.triples(), capacity, row_to_slot);
        }
    }

    fn visit_late_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        if let Some(r) = &mut self.rows {
            r.visit(f);
        }
        if let Some(s) = &mut self.spec {
            s.visit_as(S::DRAFT_BUFFERS, f);
        }
    }

    fn draft_begin(&mut self) {
        if let Some(r) = &mut self.rows {
            r.begin();
        }
    }

    fn draft_capture(&mut self, rows: &[DraftRow<'_>], ctx: &StepContext<'_>) {
        if let Some(r) = &mut self.rows {
            let slots = rows.iter().map(|d| (d.row, d.slot));
            r.capture(self.state.triples(), ctx.capacity, slots);
        }
    }

    fn draft_finish(&mut self) {
        if let Some(r) = &mut self.rows {
            r.finish();
        }
    }
}

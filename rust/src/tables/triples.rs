//! The shape most built-ins share: a table that exports `(row, token, value)` triples (logit
//! bias, min-tokens, bad words, the thinking budget, no-repeat-ngram, DRY). Each implements
//! [`Table`] itself, saying only what is its own; [`TripleTable`] adds what every one of them
//! needs the same way: the stable slots' row-space copy of its triples, the draft-row masks of
//! the V1 speculative-decoding path, and their status and buffers. [`TripleState`] carries the
//! few facts that copy needs (its buffers' names, its padding).

use crate::arena::{HasBuffers, Staged};
use crate::batch::BatchUpdate;
use crate::error::Result;
use crate::fields::Fields;
use crate::history::HistoryId;
use crate::processor::{self, Admission, DraftRow, HostLogits, StatusSink, StepContext, Table};
use crate::row_space::RowCopy;
use crate::sparse::{Padding, SparseRows};

/// A table whose [`Table::triples`] is always `Some`: what its row-space copy needs.
pub trait TripleState: Table {
    /// Its row-space copy's buffers (`rows.<NAME>.rows`, `.cols`, `.vals`).
    const ROW_BUFFERS: [&'static str; 3];
    /// Its draft-row masks' buffers, for a state with a speculative-decoding form.
    const DRAFT_BUFFERS: [&'static str; 3] = ["", "", ""];
    /// How its padded triples are padded (the row-space copy pads the same way).
    const PADDING: Padding<f32> = Padding::RepeatFirst;
}

/// A [`TripleState`] in a pipeline: the state's own [`Table`], plus the row-space copy of its
/// triples. Every method is the state's; the row-space ones then do the copy's part, so a
/// state that had its own would keep it.
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
            row_status: format!("rows.{}", state.name()),
            state,
        })
    }

    /// The row-space copy of the last row map (stable slots).
    pub fn row_copy(&self) -> Option<&RowCopy> {
        self.rows.as_ref()
    }

    /// The state's triples and the row-space copy, when there is one.
    fn triples_and_copy(&mut self) -> Option<(&SparseRows<f32>, &mut RowCopy)> {
        let triples = self.state.triples()?.0;
        Some((triples, self.rows.as_mut()?))
    }
}

impl<S: TripleState> HasBuffers for TripleTable<S> {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        self.state.visit_buffers(f);
    }
}

impl<S: TripleState> Table for TripleTable<S> {
    fn name(&self) -> &str {
        self.state.name()
    }

    fn check(&self, index: usize, fields: &mut Fields, a: Admission) -> Result<processor::Entry> {
        self.state.check(index, fields, a)
    }

    fn commit(&mut self, update: BatchUpdate<processor::Entry>, ctx: &StepContext<'_>) {
        self.state.commit(update, ctx);
    }

    fn step(&mut self, ctx: &StepContext<'_>) {
        self.state.step(ctx);
    }

    fn status(&self, out: &mut StatusSink<'_>) {
        self.state.status(out);
        out(
            &self.row_status,
            self.rows.as_ref().map_or(0, RowCopy::padded_len),
        );
    }

    fn active(&self) -> Option<usize> {
        self.state.active()
    }

    fn readers(&self, f: &mut dyn FnMut(&HistoryId)) {
        self.state.readers(f);
    }

    fn wants_prompt(&self, fields: &Fields) -> bool {
        self.state.wants_prompt(fields)
    }

    fn stepping(&self) -> bool {
        self.state.stepping()
    }

    fn saw_placeholders(&self) -> bool {
        self.state.saw_placeholders()
    }

    fn restep(&mut self, ctx: &StepContext<'_>) {
        self.state.restep(ctx);
    }

    fn triples(&self) -> Option<(&SparseRows<f32>, bool)> {
        self.state.triples()
    }

    fn apply_host(&self, logits: &mut HostLogits<'_>) -> std::result::Result<(), &'static str> {
        self.state.apply_host(logits)
    }

    fn map_rows(&mut self, row_to_slot: &[usize], capacity: usize) {
        self.state.map_rows(row_to_slot, capacity);
        if let Some((triples, r)) = self.triples_and_copy() {
            r.remap(triples, capacity, row_to_slot);
        }
    }

    fn visit_late_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        self.state.visit_late_buffers(f);
        if let Some(r) = &mut self.rows {
            r.visit(f);
        }
        if let Some(s) = &mut self.spec {
            s.visit_as(S::DRAFT_BUFFERS, f);
        }
    }

    fn draft_begin(&mut self) {
        self.state.draft_begin();
        if let Some(r) = &mut self.rows {
            r.begin();
        }
    }

    fn draft_capture(&mut self, rows: &[DraftRow<'_>], ctx: &StepContext<'_>) {
        self.state.draft_capture(rows, ctx);
        if let Some((triples, r)) = self.triples_and_copy() {
            let slots = rows.iter().map(|d| (d.row, d.slot));
            r.capture(triples, ctx.capacity, slots);
        }
    }

    fn draft_finish(&mut self) {
        self.state.draft_finish();
        if let Some(r) = &mut self.rows {
            r.finish();
        }
    }

    fn replays_drafts(&self) -> bool {
        self.state.replays_drafts()
    }

    fn draft_save(&mut self, slots: &[usize]) {
        self.state.draft_save(slots);
    }

    fn draft_restore(&mut self, ctx: &StepContext<'_>) {
        self.state.draft_restore(ctx);
    }
}

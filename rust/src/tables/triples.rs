//! The shape most built-ins share: a state that exports `(row, token, value)` triples (logit
//! bias, min-tokens, bad words, the thinking budget, no-repeat-ngram). [`TripleTable`] wraps such
//! a state with what every one of them needs the same way: the stable slots' row-space copy,
//! the draft-row masks of the V1 speculative-decoding path, the status Python reads, the CPU
//! apply. A state says only what is its own ([`TripleState`]).

use std::any::Any;

use crate::arena::{HasBuffers, Staged};
use crate::batch::BatchUpdate;
use crate::error::Result;
use crate::fields::Fields;
use crate::history::HistoryId;
use crate::processor::{self, Admission, DraftRow, StatusSink, StepContext, Table};
use crate::row_space::RowCopy;
use crate::sparse::{Padding, SparseRows};

/// A table state that exports triples.
pub trait TripleState: HasBuffers + Send + Sync + 'static {
    /// The table's name: its status entry, and `rows.<NAME>` for its row-space copy.
    const NAME: &'static str;
    /// Its row-space copy's buffers (`rows.<NAME>.rows`, `.cols`, `.vals`).
    const ROW_BUFFERS: [&'static str; 3];
    /// Its draft-row masks' buffers, for a state with a speculative-decoding form.
    const DRAFT_BUFFERS: [&'static str; 3] = ["", "", ""];
    /// Whether the values add to the logits (else they overwrite them).
    const ADDS: bool = false;
    /// How its padded triples are padded (the row-space copy pads the same way).
    const PADDING: Padding<f32> = Padding::RepeatFirst;

    fn check(&self, index: usize, fields: &mut Fields, a: Admission) -> Result<processor::Entry>;
    fn commit(&mut self, update: BatchUpdate<processor::Entry>, ctx: &StepContext<'_>);
    fn triples(&self) -> &SparseRows<f32>;
    /// Requests it tracks.
    fn active(&self) -> usize;

    /// The per-step work of a step without a batch change.
    fn step(&mut self, _ctx: &StepContext<'_>) {}
    fn stepping(&self) -> bool {
        false
    }
    fn saw_placeholders(&self) -> bool {
        false
    }
    fn restep(&mut self, _ctx: &StepContext<'_>) {}
    fn wants_prompt(&self, _fields: &Fields) -> bool {
        false
    }
    fn readers(&self, _f: &mut dyn FnMut(&HistoryId)) {}

    /// Draft replay: keeps what `step` may change for `slots` in a way the histories
    /// shrinking back does not undo (by default nothing: the state follows them back).
    fn draft_save(&mut self, _slots: &[usize]) {}

    /// After the replay, the histories back as committed: the state as before it (by
    /// default one more step, which follows the histories back).
    fn draft_restore(&mut self, ctx: &StepContext<'_>) {
        self.step(ctx);
    }
}

/// A [`TripleState`] in a pipeline.
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
            state,
            rows: row_space
                .map(|n| RowCopy::try_new(n, S::PADDING, S::ROW_BUFFERS))
                .transpose()?,
            spec: drafts
                .map(|n| SparseRows::try_new(n, "num_speculative_tokens"))
                .transpose()?,
            row_status: format!("rows.{}", S::NAME),
        })
    }

    /// The row-space copy of the last row map (stable slots).
    pub fn row_copy(&self) -> Option<&RowCopy> {
        self.rows.as_ref()
    }
}

impl<S: TripleState> HasBuffers for TripleTable<S> {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        self.state.visit_buffers(f);
    }
}

impl<S: TripleState> Table for TripleTable<S> {
    fn name(&self) -> &str {
        S::NAME
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

    fn active(&self) -> Option<usize> {
        Some(self.state.active())
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

    fn wants_prompt(&self, fields: &Fields) -> bool {
        self.state.wants_prompt(fields)
    }

    fn readers(&self, f: &mut dyn FnMut(&HistoryId)) {
        self.state.readers(f);
    }

    fn status(&self, out: &mut StatusSink<'_>) {
        out(S::NAME, self.state.triples().padded_len());
        out(
            &self.row_status,
            self.rows.as_ref().map_or(0, RowCopy::padded_len),
        );
    }

    fn triples(&self) -> Option<(&SparseRows<f32>, bool)> {
        Some((self.state.triples(), S::ADDS))
    }

    fn map_rows(&mut self, row_to_slot: &[usize], capacity: usize) {
        if let Some(r) = &mut self.rows {
            r.remap(self.state.triples(), capacity, row_to_slot);
        }
    }

    fn draft_save(&mut self, slots: &[usize]) {
        self.state.draft_save(slots);
    }

    fn draft_restore(&mut self, ctx: &StepContext<'_>) {
        self.state.draft_restore(ctx);
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

    fn visit_late_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        if let Some(r) = &mut self.rows {
            r.visit(f);
        }
        if let Some(s) = &mut self.spec {
            s.visit_as(S::DRAFT_BUFFERS, f);
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

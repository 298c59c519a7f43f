//! The one shape every table of a pipeline has.
//!
//! A [`Table`] is the per-slot state of one processor (a built-in, or one column of a custom
//! processor). The pipeline holds a list of them and loops: every added request is checked by
//! every table before anything changes (`check` is pure), then every table commits the same
//! update with its own payload, then runs its per-step work. Nothing in the pipeline names a
//! table; the built-ins are listed once, in [`crate::tables`].

use std::any::Any;

use crate::arena::HasBuffers;
use crate::batch::BatchUpdate;
use crate::error::Result;
use crate::fields::Fields;
use crate::history::{HistoryId, HistoryStore};
use crate::sparse::SparseRows;

/// One table's checked payload for one added request; `None` is the neutral request (the
/// table holds nothing for it). Only the table that made it reads it back.
pub type Entry = Option<Box<dyn Any + Send + Sync>>;

/// Wraps a table's own payload as an [`Entry`].
pub fn entry<T: Any + Send + Sync>(value: Option<T>) -> Entry {
    value.map(|v| Box::new(v) as Box<dyn Any + Send + Sync>)
}

/// Unwraps an update's entries into the table's own payload type. An entry of another type
/// cannot happen (the pipeline hands each table back what its own `check` made).
pub fn unbox<T: Any>(update: BatchUpdate<Entry>) -> BatchUpdate<Option<T>> {
    update.map_added(|e| e.map(|b| *b.downcast::<T>().expect("a table's own entry")))
}

/// What `check` may read besides the request's fields: its output history, installed in the
/// pipeline's store before the check.
#[derive(Clone, Copy, Debug)]
pub struct Admission {
    pub history: HistoryId,
    pub output_len: usize,
}

/// What a commit or a step's work may read.
pub struct StepContext<'a> {
    pub batch_size: usize,
    pub store: &'a HistoryStore,
    pub capacity: usize,
}

/// One logits row of a speculative-decoding step (stable slots): its slot, and the draft
/// tokens that precede it in its slot's run of rows (row `j` of a run follows drafts
/// `0..j`). Its transforms read the slot's history followed by `drafts`.
#[derive(Clone, Copy, Debug)]
pub struct DraftRow<'a> {
    pub row: usize,
    pub slot: usize,
    pub drafts: &'a [i64],
}

/// Host logits a CPU apply writes in place: `rows` rows of `vocab` logits, row `r` at
/// `r * row_stride`; with `row_to_slot` (stable slots) row `r` takes slot `row_to_slot[r]`'s
/// state, else slot `r`'s.
pub struct HostLogits<'a> {
    pub data: HostData<'a>,
    pub rows: usize,
    pub vocab: usize,
    pub row_stride: usize,
    pub row_to_slot: Option<&'a [usize]>,
}

pub enum HostData<'a> {
    F32(&'a mut [f32]),
    F64(&'a mut [f64]),
}

/// Called with each (name, value) of a table's status, in a fixed order.
pub type StatusSink<'a> = dyn FnMut(&str, usize) + 'a;

/// The per-slot state of one processor: a small core every table has, and optional
/// capabilities, each its own trait, that a table exposes through an accessor (`None` by
/// default), so a table writes only what is its own and the pipeline calls a capability only
/// on the tables that have it.
///
/// - **Core**: [`name`](Self::name), [`check`](Self::check), [`commit`](Self::commit),
///   [`status`](Self::status) (required), [`step`](Self::step) and [`active`](Self::active)
///   (default: nothing), and its exported buffers ([`HasBuffers`]).
/// - **Reads output histories** ([`ReadsHistory`], through [`history`](Self::history) /
///   [`history_mut`](Self::history_mut)): which histories it reads, whether it wants the
///   prompt, the async placeholders, and the draft replay's save and rollback.
/// - **Applies on host logits** ([`HostApply`], through [`host`](Self::host)): its sparse
///   triples and the CPU apply.
/// - **Row space** ([`MapsRows`], through [`rows_mut`](Self::rows_mut); stable slots and draft
///   rows): its copy laid out by rows instead of slots.
///
/// One accessor per capability, not one for all: a `&mut` accessor cannot hand out two
/// capabilities of the same table at once (the draft replay uses a table's history and row
/// space in turn); and the history has a shared one too, for the questions the pipeline asks
/// from `&self` methods (`wants_prompt`, `saw_placeholders`).
///
/// The pipeline finds a table of a known type by upcasting to [`Any`] (`Tables::get`).
pub trait Table: HasBuffers + Any + Send + Sync {
    /// The processor's name (the registry's, or a column's declared name).
    fn name(&self) -> &str;

    /// Checks one added request at batch index `index`; nothing is written. A table takes the
    /// fields it owns out of `fields` (each field is read by one table; the prompt is shared).
    fn check(&self, index: usize, fields: &mut Fields, admission: Admission) -> Result<Entry>;

    /// Applies a validated update (removed, moved, and this table's entries of the added).
    fn commit(&mut self, update: BatchUpdate<Entry>, ctx: &StepContext<'_>);

    /// The per-step work of a step without a batch change (new output tokens).
    fn step(&mut self, _ctx: &StepContext<'_>) {}

    /// What Python reads after a step, as named counts (the same names every call).
    fn status(&self, out: &mut StatusSink<'_>);

    /// Requests this table tracks (`None`: not reported, as for columns). For a table that
    /// reads histories, a count above zero is also what makes a step advance it.
    fn active(&self) -> Option<usize> {
        None
    }

    /// Its output-history reading, if it reads histories.
    fn history(&self) -> Option<&dyn ReadsHistory> {
        None
    }

    /// As [`history`](Self::history), to step or roll back.
    fn history_mut(&mut self) -> Option<&mut dyn ReadsHistory> {
        None
    }

    /// Its CPU apply, if it has one.
    fn host(&self) -> Option<&dyn HostApply> {
        None
    }

    /// Its row-space copy, if it has one.
    fn rows_mut(&mut self) -> Option<&mut dyn MapsRows> {
        None
    }
}

impl dyn Table {
    /// Applies this table to host logits in place, or says why it cannot (see
    /// [`HostApply::apply_host`]; a table without [`host`](Table::host) has no host apply).
    pub fn apply_host(&self, logits: &mut HostLogits<'_>) -> std::result::Result<(), &'static str> {
        match self.host() {
            Some(h) => h.apply_host(logits),
            None => Err("has no host apply"),
        }
    }
}

/// A table that reads its requests' output histories: the pipeline syncs what it reads before
/// a step, steps it while it has [`active`](Table::active) requests, and replays draft tokens
/// through it (stable slots under speculative decoding).
pub trait ReadsHistory: Table {
    /// The output histories this table reads each step.
    fn readers(&self, f: &mut dyn FnMut(&HistoryId));

    /// Whether this table reads the request's prompt, given its fields (the prompt is read
    /// from the engine only when some table wants it).
    fn wants_prompt(&self, _fields: &Fields) -> bool {
        false
    }

    /// Whether the last step stopped at an async placeholder in some output.
    fn saw_placeholders(&self) -> bool {
        false
    }

    /// Looks again at the outputs that stopped at a placeholder: by default one more
    /// [`step`](Table::step), which reads on from where the last one stopped.
    fn restep(&mut self, ctx: &StepContext<'_>) {
        if self.saw_placeholders() {
            self.step(ctx);
        }
    }

    // The pipeline's draft replay (`pipeline/draft_replay.rs`): `draft_save` if the table
    // `replays_drafts`; for each draft position, the drafts pushed onto the histories, `step`
    // (replaying tables) and the row-space capture ([`MapsRows`]); the histories cut back;
    // `draft_restore` (replaying tables, when some draft was pushed). Save / restore are the
    // rollback journal: the tables save different things (DRY and no-repeat-ngram their own
    // undo records, MinTokens and thinking their entries, bad words nothing).

    /// Whether the draft replay steps this table at every draft position (its state follows
    /// the histories through `step`, and back when they shrink again). A table that computes
    /// its draft rows from [`DraftRow::drafts`] alone says false.
    fn replays_drafts(&self) -> bool {
        true
    }

    /// Draft replay: keeps what the replay's steps may change for `slots` in a way the
    /// histories shrinking back does not undo.
    fn draft_save(&mut self, _slots: &[usize]) {}

    /// After the replay, the histories back as committed: puts the table's state back as
    /// it was before the replay (by default one more step, which follows them back).
    fn draft_restore(&mut self, ctx: &StepContext<'_>) {
        self.step(ctx);
    }
}

/// A table that applies itself to host logits (the CPU path, from the table itself).
pub trait HostApply {
    /// The `(row, token, value)` triples this table writes on V1 rows, and whether their
    /// values add to the logits (else they overwrite them); `None` for a table applied
    /// otherwise.
    fn triples(&self) -> Option<(&SparseRows<f32>, bool)> {
        None
    }

    /// Applies this table to host logits in place; `Err` says why it cannot here (a dtype or
    /// a row map it has no host form for). By default a table with `triples` writes or adds
    /// them on float32 V1 rows.
    fn apply_host(&self, logits: &mut HostLogits<'_>) -> std::result::Result<(), &'static str> {
        let Some((triples, add)) = self.triples() else {
            return Err("has no host apply");
        };
        match (&mut logits.data, logits.row_to_slot) {
            (HostData::F32(data), None) => {
                crate::host_apply::apply_triples(
                    data,
                    triples,
                    logits.rows,
                    logits.vocab,
                    logits.row_stride,
                    add,
                );
                Ok(())
            }
            (_, Some(_)) => Err("has no host apply through a row map"),
            _ => Err("applies on float32 logits only"),
        }
    }
}

/// A table with a row-space copy (stable slots): its state laid out by logits rows, each row
/// taking its slot's, rebuilt for every row map. Under speculative decoding the copy of a
/// table that reads histories is built row by row instead, each row at its own draft position
/// (`draft_begin`, a `draft_capture` per position, `draft_finish`).
pub trait MapsRows {
    /// Builds this table's row-space copy for a row → slot map.
    fn map_rows(&mut self, row_to_slot: &[usize], capacity: usize);

    /// Buffers laid out after every table's own (row-space and draft-row copies).
    fn visit_late_buffers(
        &mut self,
        f: &mut dyn FnMut(&'static str, &mut dyn crate::arena::Staged),
    );

    /// Starts this step's row-space copy, built row by row from
    /// [`draft_capture`](Self::draft_capture) instead of [`map_rows`](Self::map_rows).
    fn draft_begin(&mut self) {}

    /// Captures `rows` into the row-space copy from the table's state now. For a table that
    /// [`replays_drafts`](ReadsHistory::replays_drafts), the histories of the rows' slots end
    /// in the rows' drafts at this point and its `step` has read them; any other table reads
    /// the drafts from the rows.
    fn draft_capture(&mut self, _rows: &[DraftRow<'_>], _ctx: &StepContext<'_>) {}

    /// Ends the row-space copy begun by [`draft_begin`](Self::draft_begin).
    fn draft_finish(&mut self) {}
}

//! MinTokens state: while a request has fewer than `min_tokens` outputs, its stop tokens
//! (stop_token_ids ∪ EOS) are masked to −inf.
//!
//! The state holds a handle to the request's live output list and re-checks its length on every
//! step, also on steps without a batch change: an entry whose output has reached `min_tokens` is
//! dropped and the (row, token) triples are rebuilt.

use crate::arena::{HasBuffers, Staged};
use crate::batch::BatchUpdate;
use crate::error::{Error, Result};
use crate::fields::Example as E;
use crate::fields::{FieldKind, FieldSpec, Fields, Range};
use crate::history::HistoryId;
use crate::history::TokenHistory;
use crate::limits::check_token;
use crate::processor::{
    self, Admission, HostApply, MapsRows, ReadsHistory, StatusSink, StepContext, Table,
};
use crate::sparse::{
    draft_offsets, patch_rows, rebuild_draft_rows, resize_touches_active, Padding, SparseRows,
};
use crate::table::SlotTable;
use crate::tables::triples::{TripleState, TripleTable};
use crate::tables::Build;

/// Per-request caps (engine-config names) and their defaults.
pub const CAPS: &[(&str, usize)] = &[("max_stop_token_ids", 128)];

/// The request fields MinTokens reads: the stop ids are held (and checked against the
/// vocabulary) only when `min_tokens` > 0, but read and capped either way: a cap holds whether
/// or not its field is in use ([`FieldSpec::when_positive`]).
pub const FIELDS: &[FieldSpec] = &[
    FieldSpec::new("min_tokens", FieldKind::Int { neutral: 0 })
        .range(Range::int_at_least(0))
        .examples(&[E::Int(8)]),
    FieldSpec::new(
        "stop_token_ids",
        FieldKind::Ids {
            cap: "max_stop_token_ids",
            factor: 1,
        },
    )
    .from_attr("all_stop_token_ids")
    .when_positive("min_tokens")
    .tunes()
    .examples(&[E::Ids(&[2, 13])]),
];

/// One added request's parameters, as read from its sampling params.
pub struct MinTokensParams<H> {
    pub min_tokens: i64,
    pub stop_token_ids: Vec<i64>,
    pub output: H,
    /// The output's length now (a new request's history may not be readable yet).
    pub output_len: usize,
}

/// One tracked request (checked parameters and its output handle).
#[derive(Clone)]
pub struct Entry<H> {
    min_tokens: usize,
    stop: Vec<i32>,
    output: H,
}

pub struct MinTokensState<H> {
    table: SlotTable<Entry<H>>,
    triples: SparseRows,
    vocab_size: usize,
    max_stop_ids: usize,
    batch_size: usize,
    /// Scratch: the slots the last update reached, or whose entry the length check dropped.
    touched: Vec<usize>,
    /// The draft replay's saved entries (the length check drops an entry for good).
    saved: Vec<(usize, Option<Entry<H>>)>,
}

impl<H: TokenHistory> MinTokensState<H> {
    pub fn new(capacity: usize, vocab_size: usize, max_stop_ids: usize) -> Self {
        Self::try_new(capacity, vocab_size, max_stop_ids).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`new`](Self::new); a failed allocation is an error.
    pub fn try_new(capacity: usize, vocab_size: usize, max_stop_ids: usize) -> Result<Self> {
        Ok(MinTokensState {
            table: SlotTable::new(capacity),
            triples: SparseRows::try_new(capacity * max_stop_ids, "max_stop_token_ids")?,
            vocab_size,
            max_stop_ids,
            batch_size: 0,
            touched: Vec::new(),
            saved: Vec::new(),
        })
    }

    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Requests still below their min_tokens.
    pub fn active(&self) -> usize {
        self.table.active()
    }

    pub fn triples(&self) -> &SparseRows {
        &self.triples
    }

    /// Checks one request and decides whether it needs an entry at all (vLLM: none when
    /// min_tokens is 0 or the output is already long enough).
    pub fn check(&self, index: usize, p: MinTokensParams<H>) -> Result<Option<Entry<H>>> {
        let min_tokens = FIELDS[0].checked_int(index, p.min_tokens, None)? as usize;
        if p.stop_token_ids.len() > self.max_stop_ids {
            return Err(Error::TooManyEntries {
                index,
                field: "stop_token_ids",
                count: p.stop_token_ids.len(),
                cap: self.max_stop_ids,
            });
        }
        let mut stop = Vec::with_capacity(p.stop_token_ids.len());
        for t in p.stop_token_ids {
            let t = check_token(index, "stop_token_ids", t, self.vocab_size)?;
            if !stop.contains(&t) {
                stop.push(t);
            }
        }
        if min_tokens == 0 || p.output_len >= min_tokens {
            return Ok(None);
        }
        Ok(Some(Entry {
            min_tokens,
            stop,
            output: p.output,
        }))
    }

    /// Applies a batch change (validated first), then the per-step length check.
    /// Returns whether the triples were rebuilt.
    pub fn update(
        &mut self,
        update: BatchUpdate<MinTokensParams<H>>,
        store: &H::Store,
    ) -> Result<bool> {
        update.validate(self.capacity())?;
        let update = update.try_map_added(|i, p| self.check(i, p))?;
        Ok(self.commit(update, store))
    }

    /// Applies an update whose entries were already checked, then the per-step length check.
    /// Returns whether the triples were rebuilt.
    pub fn commit(&mut self, update: BatchUpdate<Option<Entry<H>>>, store: &H::Store) -> bool {
        let new_bs = update.batch_size;
        self.touched.clear();
        let mut changed = self
            .table
            .apply_validated_touching(update, &mut self.touched);
        let old_bs = self.batch_size;
        changed |= resize_touches_active(|i| self.table.get(i).is_some(), old_bs, new_bs);
        self.batch_size = new_bs;
        self.step(changed, old_bs, store)
    }

    /// A step without a batch change: only the output lengths are re-checked.
    pub fn update_none(&mut self, store: &H::Store) -> bool {
        self.touched.clear();
        self.step(false, self.batch_size, store)
    }

    /// Speculative decoding (vLLM `apply_with_spec_decode`): request `r` owns
    /// `num_draft[r]` consecutive logits rows; the first `min(min_tokens - len(output),
    /// num_draft[r])` of them get every stop token masked. Writes the (row, token, −inf)
    /// triples into `out` and returns how many logits rows the layout has.
    pub fn spec_decode_triples(
        &self,
        num_draft: &[usize],
        out: &mut SparseRows,
        store: &H::Store,
    ) -> Result<usize> {
        let (offsets, total) = draft_offsets(num_draft)?;
        let mut triples = Vec::new();
        for (req, e) in self.table.iter() {
            if req >= num_draft.len() {
                break;
            }
            let n_mask = e
                .min_tokens
                .saturating_sub(e.output.len(store))
                .min(num_draft[req]);
            // Checked before expanding: a huge draft count must be an error, not an allocation.
            if n_mask.saturating_mul(e.stop.len())
                > out.capacity() - triples.len().min(out.capacity())
            {
                return Err(crate::error::Error::invalid(
                    req,
                    "num_draft_tokens",
                    format!(
                        "the draft layout needs more than the {} masked entries reserved \
                         (num_draft_tokens above the configured speculative tokens?)",
                        out.capacity()
                    ),
                ));
            }
            for row in offsets[req]..offsets[req] + n_mask {
                triples.extend(e.stop.iter().map(|&t| (row, t, f32::NEG_INFINITY)));
            }
        }
        rebuild_draft_rows(out, triples)?;
        Ok(total)
    }

    /// The per-step length check after an update (`changed`: it changed some state;
    /// `self.touched`: the slots it reached; `old_bs`: the batch size before it).
    fn step(&mut self, mut changed: bool, old_bs: usize, store: &H::Store) -> bool {
        if self.table.active() > 0 {
            let touched = &mut self.touched;
            let before = touched.len();
            self.table.retain_into(
                |_, e| e.output.len(store) < e.min_tokens,
                |i| touched.push(i),
            );
            changed |= touched.len() > before;
        }
        if changed {
            // Only the rows the update reached, or whose entry was dropped, are rewritten.
            let table = &self.table;
            patch_rows(
                &mut self.triples,
                &self.touched,
                old_bs,
                self.batch_size,
                |i| {
                    table
                        .get(i)
                        .map(|e| e.stop.iter().map(|&t| (t, f32::NEG_INFINITY)))
                },
                Padding::RepeatFirst,
            );
        }
        changed
    }
}

impl<H> HasBuffers for MinTokensState<H> {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        self.triples
            .visit_as(["min_tokens.rows", "min_tokens.cols", "min_tokens.vals"], f);
    }
}

/// MinTokens in a pipeline.
pub type MinTokensTable = TripleTable<MinTokensState<HistoryId>>;

impl Table for MinTokensTable {
    fn name(&self) -> &str {
        MinTokensState::NAME
    }

    fn check(&self, index: usize, fields: &mut Fields, a: Admission) -> Result<processor::Entry> {
        let p = MinTokensParams {
            min_tokens: fields.int(&FIELDS[0]),
            stop_token_ids: fields.take_ids(&FIELDS[1]).unwrap_or_default(),
            output: a.history,
            output_len: a.output_len,
        };
        Ok(processor::entry(self.state.check(index, p)?))
    }

    fn commit(&mut self, update: BatchUpdate<processor::Entry>, ctx: &StepContext<'_>) {
        self.state.commit(processor::unbox(update), ctx.store);
    }

    fn step(&mut self, ctx: &StepContext<'_>) {
        self.state.update_none(ctx.store);
    }

    fn status(&self, out: &mut StatusSink<'_>) {
        self.status_into(out);
    }

    /// Requests still below their min_tokens.
    fn active(&self) -> Option<usize> {
        Some(self.state.active())
    }

    fn history(&self) -> Option<&dyn ReadsHistory> {
        Some(self)
    }

    fn history_mut(&mut self) -> Option<&mut dyn ReadsHistory> {
        Some(self)
    }

    fn host(&self) -> Option<&dyn HostApply> {
        Some(self)
    }

    fn rows_mut(&mut self) -> Option<&mut dyn MapsRows> {
        Some(self)
    }
}

impl ReadsHistory for MinTokensTable {
    fn readers(&self, f: &mut dyn FnMut(&HistoryId)) {
        for (_, e) in self.state.table.iter() {
            f(&e.output);
        }
    }

    /// Keeps the entries of `slots` (a draft may reach a request's min_tokens, and the
    /// length check then drops its entry for good).
    fn draft_save(&mut self, slots: &[usize]) {
        let s = &mut self.state;
        s.saved.clear();
        for &slot in slots {
            s.saved.push((slot, s.table.get(slot).cloned()));
        }
    }

    /// Puts back what [`draft_save`](ReadsHistory::draft_save) kept, with their triples.
    fn draft_restore(&mut self, ctx: &StepContext<'_>) {
        let s = &mut self.state;
        s.touched.clear();
        for (slot, e) in s.saved.drain(..) {
            s.table.replace(slot, e);
            s.touched.push(slot);
        }
        let bs = s.batch_size;
        MinTokensState::step(s, true, bs, ctx.store);
    }
}

impl TripleState for MinTokensState<HistoryId> {
    const NAME: &'static str = "min_tokens";
    const ADDS: bool = false;
    const ROW_BUFFERS: [&'static str; 3] = [
        "rows.min_tokens.rows",
        "rows.min_tokens.cols",
        "rows.min_tokens.vals",
    ];
    const DRAFT_BUFFERS: [&'static str; 3] = [
        "spec.min_tokens.rows",
        "spec.min_tokens.cols",
        "spec.min_tokens.vals",
    ];

    fn triples(&self) -> &SparseRows<f32> {
        &self.triples
    }
}

/// Builds the table for a pipeline (the registry's entry).
pub fn build(b: &Build<'_>) -> Result<Box<dyn Table>> {
    let n = b.cap("max_stop_token_ids")?;
    let state = MinTokensState::try_new(b.capacity, b.vocab_size, n)?;
    Ok(Box::new(MinTokensTable::try_new(
        state,
        b.row_space(n),
        b.drafts(n),
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{SharedHistory, TokenHistory};

    fn params(min: i64, stop: Vec<i64>, out: &SharedHistory) -> MinTokensParams<SharedHistory> {
        MinTokensParams {
            min_tokens: min,
            stop_token_ids: stop,
            output: out.clone(),
            output_len: out.len(&()),
        }
    }

    #[test]
    fn masks_until_output_long_enough() {
        let out = SharedHistory::default();
        let mut s = MinTokensState::new(4, 10, 4);
        let mut u = BatchUpdate::new(1);
        u.added = vec![(0, params(2, vec![2, 3], &out))];
        assert!(s.update(u, &()).unwrap());
        assert_eq!(s.triples().len(), 2);
        out.write().unwrap().push(5);
        assert!(!s.update_none(&()));
        out.write().unwrap().push(6);
        assert!(s.update_none(&()));
        assert_eq!(s.triples().len(), 0);
        assert_eq!(s.active(), 0);
    }

    #[test]
    fn spec_decode_masks_the_first_rows_only() {
        let out = SharedHistory::default();
        out.write().unwrap().push(1);
        let mut s = MinTokensState::new(4, 10, 4);
        let mut u = BatchUpdate::new(2);
        u.added = vec![(1, params(3, vec![2], &out))];
        s.update(u, &()).unwrap();
        let mut spec = SparseRows::new(64);
        // Request 0 owns rows 0..3, request 1 rows 3..7; 3 - 1 = 2 rows of request 1 masked.
        assert_eq!(s.spec_decode_triples(&[3, 4], &mut spec, &()).unwrap(), 7);
        let rows: Vec<i32> = spec.triples().iter().map(|t| t.0).collect();
        assert_eq!(rows, vec![3, 4]);
    }

    #[test]
    fn rejects_negative_and_out_of_vocab() {
        let out = SharedHistory::default();
        let mut s = MinTokensState::new(4, 10, 4);
        let mut u = BatchUpdate::new(1);
        u.added = vec![(0, params(-1, vec![], &out))];
        assert!(s
            .update(u, &())
            .unwrap_err()
            .to_string()
            .contains("min_tokens"));
        let mut u = BatchUpdate::new(1);
        u.added = vec![(0, params(3, vec![10], &out))];
        assert!(s
            .update(u, &())
            .unwrap_err()
            .to_string()
            .contains("stop_token_ids"));
        assert_eq!(s.active(), 0);
    }
}

//! The pipeline's output histories: admitting a new request's history, the token feed, and
//! the once-per-step sync of list-fed histories with the engine's lists.

use super::{Checked, Pipeline, RequestParams};
use crate::batch::SlotOps;
use crate::error::{Error, Result};
use crate::history::{HistoryId, HistorySource, HistoryStore};
use crate::table::SlotTable;

impl<S: HistorySource> Pipeline<S> {
    pub(super) fn push_feed(&mut self, tokens: &[i64], slots: Option<&[usize]>) {
        for (r, &t) in tokens.iter().enumerate() {
            if t >= 0 {
                if let Some(&id) = self.outputs.get(slots.map_or(r, |s| s[r])) {
                    self.store.tokens_mut(id).push(t);
                }
            }
        }
    }

    /// Installs a new request's history and checks it against every table; on an error the
    /// history is released again, so nothing is left behind.
    pub(super) fn admit(&mut self, index: usize, mut p: RequestParams<S>) -> Result<Checked> {
        let tokens = std::mem::take(&mut p.output.tokens);
        let output_len = tokens.len();
        let unresolved = tokens.iter().position(|&t| t < 0).unwrap_or(usize::MAX);
        let id = self.store.install(tokens);
        let i = id.index();
        if self.sources.len() <= i {
            self.sources.resize_with(i + 1, || None);
            self.unresolved.resize(i + 1, usize::MAX);
        }
        self.sources[i] = p.output.source.take();
        self.listed += usize::from(self.sources[i].is_some());
        self.unresolved[i] = unresolved;
        let checked = self
            .check(index, p, id, output_len)
            .inspect_err(|_| self.uninstall(id))?;
        if !self.reads_output(&checked) && self.sources[i].take().is_some() {
            // No table reads this output: nothing to re-read every step.
            self.listed -= 1;
        }
        Ok(checked)
    }

    pub(super) fn uninstall(&mut self, id: HistoryId) {
        self.listed -= release(&mut self.store, &mut self.sources, &mut self.unresolved, id);
    }

    /// List feed: brings the histories up to date with their sources (see [`sync_history`]):
    /// all of them at a step, or only those that ended in an async placeholder
    /// (`only_unresolved`) before a re-step.
    pub(super) fn sync_sources(&mut self, only_unresolved: bool) -> Result<()> {
        if self.listed == 0 {
            return Ok(());
        }
        if !std::mem::take(&mut self.rewrites_kept) {
            self.store.clear_rewritten();
        }
        let Pipeline {
            tables,
            store,
            sources,
            unresolved,
            synced,
            sync_epoch,
            ..
        } = self;
        *sync_epoch += 1;
        let epoch = *sync_epoch;
        if synced.len() < sources.len() {
            synced.resize(sources.len(), 0);
        }
        // Only the histories some table will read: a request whose min_tokens were reached, or
        // whose thinking ended, is not re-read.
        let mut junk: Option<(HistoryId, crate::history::BadEntry)> = None;
        let mut sync = |id: &HistoryId| {
            let i = id.index();
            if junk.is_some()
                || synced[i] == epoch
                || (only_unresolved && unresolved[i] == usize::MAX)
            {
                return;
            }
            synced[i] = epoch;
            if let Some(src) = &sources[i] {
                match src.sync_into(store.tokens_mut(*id), &mut unresolved[i]) {
                    Ok(rewritten) => store.mark_rewritten(*id, rewritten),
                    Err(bad) => {
                        // The copy holds what came before the bad entry: the next sync
                        // re-reads from there (and finds nothing replaced before it, so the
                        // mark is set now).
                        unresolved[i] = unresolved[i].min(bad.pos);
                        store.mark_rewritten(*id, bad.rewritten);
                        junk = Some((*id, bad));
                    }
                }
            }
        };
        for h in tables.iter().filter_map(|t| t.history()) {
            h.readers(&mut sync);
        }
        match junk {
            None => Ok(()),
            Some((id, bad)) => {
                // Refused: no table reads what this sync brought up to date, so what it found
                // replaced stays marked for the next sync (as after an aborted step), which
                // finds the copies already current. Without this a refused step or re-step
                // hid a truncated and regrown output from the tables that rely on the mark.
                self.rewrites_kept = true;
                let slot = self
                    .outputs
                    .iter()
                    .find(|(_, &h)| h == id)
                    .map_or(0, |(s, _)| s);
                Err(Error::invalid(slot, "output_tok_ids", bad.to_string()))
            }
        }
    }

    /// The output history of the request in `slot` (tests, debugging).
    pub fn history(&self, slot: usize) -> Option<&[i64]> {
        self.outputs.get(slot).map(|&id| self.store.tokens(id))
    }

    /// Checks a token feed without appending anything. Without `slots` the feed has one entry
    /// per row of the last step (the batch before this step's update), −1 for a row that got
    /// no token; with `slots`, `tokens[k]` is for slot `slots[k]` (a slot may repeat, one entry
    /// per token). A bad entry is named by its position (`index`).
    pub(super) fn check_feed(&self, tokens: &[i64], slots: Option<&[usize]>) -> Result<()> {
        match slots {
            Some(s) if s.len() != tokens.len() => {
                let pos = s.len().min(tokens.len());
                return Err(Error::invalid(
                    pos,
                    "sampled_token_ids",
                    format!(
                        "position {pos}: {} tokens for {} slots (one slot per token)",
                        tokens.len(),
                        s.len()
                    ),
                ));
            }
            None if tokens.len() != self.batch_size => {
                let pos = self.batch_size.min(tokens.len());
                return Err(Error::invalid(
                    pos,
                    "sampled_token_ids",
                    format!(
                        "position {pos}: {} entries for the {} rows of the last step (one per \
                         row, -1 for a row that got no token)",
                        tokens.len(),
                        self.batch_size
                    ),
                ));
            }
            _ => {}
        }
        if tokens.len() > self.max_rows() {
            return Err(Error::TooLarge {
                field: "sampled_token_ids",
                value: tokens.len(),
                max: self.max_rows(),
            });
        }
        for (r, &t) in tokens.iter().enumerate() {
            let slot = slots.map_or(r, |s| s[r]);
            if slot >= self.capacity {
                return Err(Error::invalid(
                    r,
                    "slots",
                    format!(
                        "position {r}: slot {slot} outside [0, {}) (max_num_seqs)",
                        self.capacity
                    ),
                ));
            }
            if t == -1 {
                continue;
            }
            if t < 0 || t as u64 >= self.vocab_size as u64 {
                return Err(Error::invalid(
                    r,
                    "sampled_token_ids",
                    format!(
                        "position {r}: token id {t} outside [0, {}) (or -1 for none)",
                        self.vocab_size
                    ),
                ));
            }
            if self.listed > 0
                && self
                    .outputs
                    .get(slot)
                    .is_some_and(|id| self.sources[id.index()].is_some())
            {
                return Err(Error::invalid(
                    r,
                    "sampled_token_ids",
                    format!(
                        "position {r}: slot {slot}'s request is read from the engine's output \
                         list (the list feed); build the pipeline with token_feed=True to pass \
                         sampled token ids"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Frees a history (and its source) that no table refers to any more; returns how many
/// sources went with it (0 or 1).
pub(super) fn release<S>(
    store: &mut HistoryStore,
    sources: &mut [Option<S>],
    unresolved: &mut [usize],
    id: HistoryId,
) -> usize {
    store.release(id);
    unresolved[id.index()] = usize::MAX;
    usize::from(sources[id.index()].take().is_some())
}

/// The slots' history ids under the table rule; a history displaced from its slot is released.
pub(super) struct OutputOps<'a, S> {
    pub(super) slots: &'a mut SlotTable<HistoryId>,
    pub(super) store: &'a mut HistoryStore,
    pub(super) sources: &'a mut Vec<Option<S>>,
    pub(super) unresolved: &'a mut Vec<usize>,
    pub(super) listed: &'a mut usize,
}

impl<S> SlotOps for OutputOps<'_, S> {
    type Value = HistoryId;

    fn put(&mut self, index: usize, value: Option<HistoryId>) {
        if let Some(old) = self.slots.replace(index, value) {
            *self.listed -= release(self.store, self.sources, self.unresolved, old);
        }
    }

    fn take(&mut self, index: usize) -> Option<HistoryId> {
        self.slots.replace(index, None)
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.slots.swap(a, b);
    }
}

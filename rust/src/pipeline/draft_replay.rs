//! Draft rows by position (speculative decoding on the stable-slot front-end, vLLM's Model
//! Runner V2 layout): a request owns a run of consecutive logits rows, and the row at draft
//! position `j` of the run scores the token after its committed history followed by the
//! drafts `d_0 .. d_{j-1}`. Every table that reads histories must see that prefix.
//!
//! One mechanism serves every such table: the drafts are replayed through the histories.
//! Position by position, each drafted slot's history is extended by its next draft, the
//! tables step (reading the new token as they read any committed one) and capture the rows
//! at that position into their row-space copy; then the histories are cut back to what was
//! committed and the tables return to the committed state: by one more step, which follows
//! the histories back (the path an engine that drops rejected drafts from its output lists
//! takes), or, for a table whose step changes a request for good (MinTokens drops a request
//! that reached its length, the thinking budget ends), from the states it saved before the
//! replay (`Table::draft_save` / `draft_restore`). A table that would rather compute its
//! draft rows from the drafts alone says so (`Table::replays_drafts`).

use super::Pipeline;
use crate::error::{Error, Result};
use crate::history::{HistoryId, HistorySource};
use crate::processor::{DraftRow, StepContext};

/// The draft layout of a row map: each row's position in its slot's run of rows, and the
/// token fed to the model at each row (MRV2's `expanded_local_pos` and `input_ids`). The row
/// at position `j >= 1` was fed draft `d_{j-1}`; a row at position 0 starts its slot's run
/// (its token, the last committed one, is not read).
#[derive(Clone, Copy, Debug)]
pub struct DraftLayout<'a> {
    pub local_pos: &'a [usize],
    pub input_ids: &'a [i64],
}

impl DraftLayout<'_> {
    /// Whether some row follows a draft.
    pub fn has_drafts(&self) -> bool {
        self.local_pos.iter().any(|&p| p > 0)
    }
}

/// The highest draft position a stable-slot row may have: the configured speculative tokens,
/// or what the row space holds per slot beyond one row (`max_rows / capacity - 1`, rounded
/// up). Buffers sized per draft row (the penalties' cells) are sized by it.
pub fn max_draft_pos(spec_tokens: usize, row_factor: usize) -> usize {
    spec_tokens.max(row_factor.saturating_sub(1)).max(1)
}

impl<S: HistorySource> Pipeline<S> {
    /// Checks a draft layout against its row map: one position and one token per row; a row
    /// at position `j >= 1` follows the row at `j - 1` of the same slot and was fed a token
    /// id of the vocabulary; a slot has one run of rows.
    pub(super) fn check_draft_shape(&self, map: &[usize], d: DraftLayout<'_>) -> Result<()> {
        for (field, len) in [
            ("local_pos", d.local_pos.len()),
            ("input_ids", d.input_ids.len()),
        ] {
            if len != map.len() {
                return Err(Error::invalid(
                    len.min(map.len()),
                    field,
                    format!(
                        "{len} entries for {} rows of the row map: one per row",
                        map.len()
                    ),
                ));
            }
        }
        let rows_cap = self.tables.rows.as_ref().map_or(0, |r| r.row_to_slot.len());
        let most = max_draft_pos(self.spec_tokens, rows_cap.div_ceil(self.capacity.max(1)));
        if let Some((r, &p)) = d.local_pos.iter().enumerate().find(|(_, &p)| p > most) {
            return Err(Error::invalid(
                r,
                "local_pos",
                format!(
                    "row {r} is at draft position {p}, beyond the {most} this pipeline holds \
                     (num_speculative_tokens, or max_rows / max_num_seqs - 1)"
                ),
            ));
        }
        let mut starts = vec![false; self.capacity];
        for (r, (&s, &p)) in map.iter().zip(d.local_pos).enumerate() {
            if p == 0 {
                if std::mem::replace(&mut starts[s], true) {
                    return Err(Error::invalid(
                        r,
                        "local_pos",
                        format!(
                            "row {r} starts a second run of rows for slot {s}: a slot's rows \
                             are consecutive, at positions 0, 1, ..."
                        ),
                    ));
                }
                continue;
            }
            if r == 0 || map[r - 1] != s || d.local_pos[r - 1] != p - 1 {
                return Err(Error::invalid(
                    r,
                    "local_pos",
                    format!(
                        "row {r} (slot {s}) is at draft position {p}, but the row before it \
                         is not position {} of the same slot",
                        p - 1
                    ),
                ));
            }
            let t = d.input_ids[r];
            if t < 0 || t as u64 >= self.vocab_size as u64 {
                return Err(Error::invalid(
                    r,
                    "input_ids",
                    format!(
                        "row {r} (slot {s}, draft position {p}) was fed token {t}, not a \
                         token id in [0, {})",
                        self.vocab_size
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The histories a layout extends must be whole: a draft cannot follow an async
    /// placeholder the engine has not filled in yet.
    pub(super) fn check_draft_histories(&self, map: &[usize], d: DraftLayout<'_>) -> Result<()> {
        for (r, (&s, &p)) in map.iter().zip(d.local_pos).enumerate() {
            if p != 1 {
                continue;
            }
            if let Some(id) = self.outputs.get(s) {
                if self
                    .unresolved
                    .get(id.index())
                    .is_some_and(|&u| u != usize::MAX)
                {
                    return Err(Error::Protocol(format!(
                        "row {r}: slot {s}'s output still ends in an async placeholder (-1); \
                         draft rows need it filled in first (restep)"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Builds the row-space copies of the history-reading tables for the last row map's
    /// draft layout (checked): see the module docs.
    pub(super) fn replay_drafts(&mut self) {
        // Taken out while the tables change, put back at the end (no copy per step).
        let rs = self.tables.rows.as_mut().expect("a stable-slot pipeline");
        let (local_pos, input_ids) = rs.drafts.take().expect("a draft layout");
        let map = std::mem::take(&mut rs.map);
        let max_pos = local_pos.iter().copied().max().unwrap_or(0);
        let rows_at = |j: usize| -> Vec<DraftRow<'_>> {
            (0..map.len())
                .filter(|&r| local_pos[r] == j)
                .map(|r| DraftRow {
                    row: r,
                    slot: map[r],
                    drafts: &input_ids[r + 1 - j..r + 1],
                })
                .collect()
        };
        let mut extended: Vec<(HistoryId, usize)> = Vec::new();
        let tables = &mut self.tables;
        let history = &tables.history;
        let mut reading: Vec<_> = tables
            .list
            .iter_mut()
            .zip(history)
            .filter_map(|(t, &h)| h.then_some(t))
            .collect();
        let drafted: Vec<usize> = rows_at(1).iter().map(|d| d.slot).collect();
        for t in reading.iter_mut() {
            t.draft_begin();
            if t.replays_drafts() {
                t.draft_save(&drafted);
            }
        }
        for j in 0..=max_pos {
            let rows = rows_at(j);
            if j > 0 {
                for d in &rows {
                    if let Some(&id) = self.outputs.get(d.slot) {
                        let tokens = self.store.tokens_mut(id);
                        if j == 1 {
                            extended.push((id, tokens.len()));
                        }
                        tokens.push(d.drafts[j - 1]);
                    }
                }
                let ctx = StepContext {
                    batch_size: self.batch_size,
                    store: &self.store,
                    capacity: self.capacity,
                };
                for t in reading.iter_mut().filter(|t| t.replays_drafts()) {
                    t.step(&ctx);
                }
            }
            let ctx = StepContext {
                batch_size: self.batch_size,
                store: &self.store,
                capacity: self.capacity,
            };
            for t in reading.iter_mut() {
                t.draft_capture(&rows, &ctx);
            }
        }
        // Back to the committed histories, and the tables with them.
        for &(id, len) in &extended {
            self.store.tokens_mut(id).truncate(len);
        }
        let ctx = StepContext {
            batch_size: self.batch_size,
            store: &self.store,
            capacity: self.capacity,
        };
        for t in reading.iter_mut() {
            if max_pos > 0 && t.replays_drafts() {
                t.draft_restore(&ctx);
            }
            t.draft_finish();
        }
        let rs = self.tables.rows.as_mut().expect("a stable-slot pipeline");
        rs.map = map;
        rs.drafts = Some((local_pos, input_ids));
    }
}

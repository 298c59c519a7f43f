//! Draft rows by position (speculative decoding, on the row space: the stable slots' row map
//! in vLLM Model Runner V2's layout, or a V1 pipeline's draft rows): a request owns several
//! logits rows, and its row at draft position `j` scores the token after its committed
//! history followed by the drafts `d_0 .. d_{j-1}`. Every table that reads histories must
//! see that prefix.
//!
//! One mechanism serves every such table: the drafts are replayed through the histories.
//! Position by position, each drafted slot's history is extended by its next draft, the
//! tables step (reading the new token as they read any committed one) and capture the rows
//! at that position into their row-space copy; then the histories are cut back to what was
//! committed and the tables return to the committed state: by one more step, which follows
//! the histories back (the path an engine that drops rejected drafts from its output lists
//! takes), or through `ReadsHistory::draft_save` / `draft_restore`: from the states a table
//! saved before the replay (MinTokens drops a request that reached its length for good; the
//! thinking budget counts steps), or by undoing the pushed tokens (DRY and no-repeat-ngram,
//! whose shrink path would index the whole window again). A table that would rather compute
//! its draft rows from the drafts alone says so (`ReadsHistory::replays_drafts`: the
//! penalties). The row-space copy is built by each table's `MapsRows`: `draft_begin`, a
//! `draft_capture` per position, `draft_finish`.

use super::Pipeline;
use crate::error::{Error, Result};
use crate::history::{HistoryId, HistorySource};
use crate::processor::{DraftRow, ReadsHistory, StepContext};

/// Speculative decoding's layout of a row map: each row's draft position, and the drafts
/// of each drafted slot. A row at position `j` scores the token after its slot's committed
/// history followed by the slot's first `j` drafts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Drafts {
    /// Per row: how many of its slot's drafts precede it (0: the committed history only).
    pub pos: Vec<usize>,
    /// The drafted slots, each once; slot `slots[k]`'s drafts are
    /// `tokens[offsets[k]..offsets[k + 1]]`.
    pub slots: Vec<usize>,
    pub offsets: Vec<usize>,
    pub tokens: Vec<i64>,
}

impl Drafts {
    /// Per-slot drafts, each `(slot, drafts)`, and each row's position.
    pub fn new(pos: Vec<usize>, drafted: &[(usize, &[i64])]) -> Self {
        let mut d = Drafts {
            pos,
            offsets: vec![0],
            ..Drafts::default()
        };
        for &(slot, tokens) in drafted {
            d.slots.push(slot);
            d.tokens.extend_from_slice(tokens);
            d.offsets.push(d.tokens.len());
        }
        d
    }

    /// vLLM Model Runner V2's layout: a slot owns a run of consecutive rows, `local_pos[r]` is
    /// row `r`'s position in its run (`expanded_local_pos`) and `input_ids[r]` the token fed
    /// at it (`input_ids`: at position `j >= 1` the draft `d_{j-1}`; at 0 the last committed
    /// token, not read). Refused unless every row at `j >= 1` follows the row at `j - 1` of
    /// the same slot, and each slot has one run.
    pub fn from_runs(map: &[usize], local_pos: &[usize], input_ids: &[i64]) -> Result<Self> {
        for (field, len) in [
            ("local_pos", local_pos.len()),
            ("input_ids", input_ids.len()),
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
        let mut d = Drafts {
            pos: local_pos.to_vec(),
            offsets: vec![0],
            ..Drafts::default()
        };
        let mut run_start = 0;
        let mut started = std::collections::HashSet::new();
        for (r, (&s, &p)) in map.iter().zip(local_pos).enumerate() {
            if p == 0 {
                if !started.insert(s) {
                    return Err(Error::invalid(
                        r,
                        "local_pos",
                        format!(
                            "row {r} starts a second run of rows for slot {s}: a slot's rows \
                             are consecutive, at positions 0, 1, ..."
                        ),
                    ));
                }
                run_start = r;
                continue;
            }
            if r == 0 || map[r - 1] != s || local_pos[r - 1] != p - 1 {
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
            if r + 1 == map.len() || local_pos[r + 1] == 0 {
                // The run ends here: its drafts are the tokens fed at rows 1..=p.
                d.slots.push(s);
                d.tokens.extend_from_slice(&input_ids[run_start + 1..=r]);
                d.offsets.push(d.tokens.len());
            }
        }
        Ok(d)
    }

    /// Whether some row follows a draft.
    pub fn has_drafts(&self) -> bool {
        self.pos.iter().any(|&p| p > 0)
    }

    /// The drafts of the `k`-th drafted slot.
    pub(super) fn of(&self, k: usize) -> &[i64] {
        &self.tokens[self.offsets[k]..self.offsets[k + 1]]
    }
}

impl<S: HistorySource> Pipeline<S> {
    /// Checks a draft layout against its row map: one position per row, at most the
    /// pipeline's draft positions and at most its slot's drafts; drafted slots each once, in
    /// range; drafts token ids of the vocabulary.
    pub(super) fn check_draft_shape(&self, map: &[usize], d: &Drafts) -> Result<()> {
        if d.pos.len() != map.len() {
            return Err(Error::invalid(
                d.pos.len().min(map.len()),
                "local_pos",
                format!(
                    "{} positions for {} rows of the row map: one per row",
                    d.pos.len(),
                    map.len()
                ),
            ));
        }
        if d.offsets.len() != d.slots.len() + 1
            || d.offsets.first() != Some(&0)
            || d.offsets.windows(2).any(|w| w[0] > w[1])
            || d.offsets.last() != Some(&d.tokens.len())
        {
            return Err(Error::invalid(
                0,
                "draft_tokens",
                "draft offsets that do not split the draft tokens".to_string(),
            ));
        }
        let mut drafted = vec![usize::MAX; self.capacity];
        for (k, &s) in d.slots.iter().enumerate() {
            if s >= self.capacity {
                return Err(Error::invalid(
                    k,
                    "draft_slots",
                    format!("slot {s} outside [0, {}) (max_num_seqs)", self.capacity),
                ));
            }
            if drafted[s] != usize::MAX {
                return Err(Error::invalid(
                    k,
                    "draft_slots",
                    format!("slot {s} has a second run of rows (a slot's drafts come once)"),
                ));
            }
            drafted[s] = k;
            if let Some((i, &t)) = d
                .of(k)
                .iter()
                .enumerate()
                .find(|(_, &t)| t < 0 || t as u64 >= self.vocab_size as u64)
            {
                return Err(Error::invalid(
                    s, // the slot: on the V1 front-end, the request
                    "input_ids",
                    format!(
                        "slot {s}'s draft {i} is token {t}, not a token id in [0, {})",
                        self.vocab_size
                    ),
                ));
            }
        }
        let rows_cap = self.tables.rows.as_ref().map_or(0, |r| r.row_to_slot.len());
        let most =
            crate::tables::max_draft_pos(self.spec_tokens, rows_cap.div_ceil(self.capacity.max(1)));
        for (r, (&s, &p)) in map.iter().zip(&d.pos).enumerate() {
            if p == 0 {
                continue;
            }
            if p > most {
                return Err(Error::invalid(
                    r,
                    "local_pos",
                    format!(
                        "row {r} is at draft position {p}, beyond the {most} this pipeline \
                         holds (num_speculative_tokens, or max_rows / max_num_seqs - 1)"
                    ),
                ));
            }
            let have = match drafted[s] {
                usize::MAX => 0,
                k => d.of(k).len(),
            };
            if p > have {
                return Err(Error::invalid(
                    r,
                    "local_pos",
                    format!("row {r} is at draft position {p}, but slot {s} has {have} drafts"),
                ));
            }
        }
        Ok(())
    }

    /// The histories a layout extends must be whole: a draft cannot follow an async
    /// placeholder the engine has not filled in yet.
    pub(super) fn check_draft_histories(&self, d: &Drafts) -> Result<()> {
        for &s in &d.slots {
            if let Some(id) = self.outputs.get(s) {
                if self
                    .unresolved
                    .get(id.index())
                    .is_some_and(|&u| u != usize::MAX)
                {
                    return Err(Error::Protocol(format!(
                        "slot {s}'s output still ends in an async placeholder (-1); draft rows \
                         need it filled in first (restep)"
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
        let rs = self
            .tables
            .rows
            .as_mut()
            .expect("a pipeline with a row space");
        let d = rs.drafts.take().expect("a draft layout");
        let map = std::mem::take(&mut rs.map);
        let max_pos = d.pos.iter().copied().max().unwrap_or(0);
        // Each drafted slot's drafts, and how far its rows reach into them.
        let mut drafted = vec![usize::MAX; self.capacity];
        for (k, &s) in d.slots.iter().enumerate() {
            drafted[s] = k;
        }
        let mut reach = vec![0; d.slots.len()];
        for (&s, &p) in map.iter().zip(&d.pos) {
            if p > 0 {
                reach[drafted[s]] = reach[drafted[s]].max(p);
            }
        }
        let rows_at = |j: usize| -> Vec<DraftRow<'_>> {
            (0..map.len())
                .filter(|&r| d.pos[r] == j)
                .map(|r| DraftRow {
                    row: r,
                    slot: map[r],
                    drafts: if j == 0 {
                        &[]
                    } else {
                        &d.of(drafted[map[r]])[..j]
                    },
                })
                .collect()
        };
        let replayed: Vec<usize> = (0..d.slots.len()).filter(|&k| reach[k] > 0).collect();
        let replayed_slots: Vec<usize> = replayed.iter().map(|&k| d.slots[k]).collect();
        let mut extended: Vec<(HistoryId, usize)> = Vec::new();
        for &k in &replayed {
            if let Some(&id) = self.outputs.get(d.slots[k]) {
                extended.push((id, self.store.tokens(id).len()));
            }
        }
        let mut reading: Vec<&mut dyn ReadsHistory> = self
            .tables
            .list
            .iter_mut()
            .filter_map(|t| t.history_mut())
            .collect();
        for t in reading.iter_mut() {
            if let Some(r) = t.rows_mut() {
                r.draft_begin();
            }
            if t.replays_drafts() {
                t.draft_save(&replayed_slots);
            }
        }
        for j in 0..=max_pos {
            if j > 0 {
                for &k in &replayed {
                    if reach[k] >= j {
                        if let Some(&id) = self.outputs.get(d.slots[k]) {
                            self.store.tokens_mut(id).push(d.of(k)[j - 1]);
                        }
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
            let rows = rows_at(j);
            let ctx = StepContext {
                batch_size: self.batch_size,
                store: &self.store,
                capacity: self.capacity,
            };
            for r in reading.iter_mut().filter_map(|t| t.rows_mut()) {
                r.draft_capture(&rows, &ctx);
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
            if let Some(r) = t.rows_mut() {
                r.draft_finish();
            }
        }
        let rs = self
            .tables
            .rows
            .as_mut()
            .expect("a pipeline with a row space");
        rs.map = map;
        rs.drafts = Some(d);
    }
}

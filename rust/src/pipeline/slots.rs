//! The stable-slot front-end (vLLM's Model Runner V2): slot changes staged until the step,
//! and the row-space copies of the sparse tables for each step's row → slot map.

use super::draft_replay::Drafts;
use super::{Pipeline, RequestParams};
use crate::batch::BatchUpdate;
use crate::buffer::HostBuffer;
use crate::error::{Error, Result};
use crate::history::HistorySource;

/// The stable slots' row map: the exported row → slot buffer and this step's map.
pub(super) struct RowSpace {
    pub(super) row_to_slot: HostBuffer<i64>,
    /// Each row's draft position, and the drafts before it (`max_pos` per row, −1 padded):
    /// what a column processor that reads drafts gets (`rows.draft_pos`, `rows.drafts`).
    pub(super) draft_pos: HostBuffer<i64>,
    pub(super) drafts_before: HostBuffer<i64>,
    pub(super) max_pos: usize,
    pub(super) rows: usize,
    pub(super) map: Vec<usize>,
    /// This step's draft layout, if it has one (kept for a re-map after a re-step).
    pub(super) drafts: Option<Drafts>,
}

impl RowSpace {
    pub(super) fn try_new(rows: usize, max_pos: usize) -> Result<Self> {
        Ok(RowSpace {
            row_to_slot: HostBuffer::try_new(rows, 0, "row_to_slot")?,
            draft_pos: HostBuffer::try_new(rows, 0, "max_rows")?,
            drafts_before: HostBuffer::try_new(rows.saturating_mul(max_pos), -1, "max_rows")?,
            max_pos,
            rows: 0,
            map: Vec::new(),
            drafts: None,
        })
    }

    /// Writes each row's draft position and the drafts before it (only what changed).
    fn write_drafts(&mut self) {
        let w = self.max_pos;
        // Each slot's place among the drafted ones (one pass, not a search per row).
        let mut drafted = vec![usize::MAX; self.map.iter().max().map_or(0, |&s| s + 1)];
        if let Some(d) = &self.drafts {
            for (k, &s) in d.slots.iter().enumerate() {
                if s < drafted.len() {
                    drafted[s] = k;
                }
            }
        }
        for r in 0..self.map.len() {
            let (p, before): (usize, &[i64]) = match &self.drafts {
                Some(d) if d.pos[r] > 0 => (d.pos[r], &d.of(drafted[self.map[r]])[..d.pos[r]]),
                _ => (0, &[]),
            };
            if self.draft_pos.get(r) != p as i64 {
                self.draft_pos.set(r, p as i64);
            }
            for j in 0..w {
                let t = before.get(j).copied().unwrap_or(-1);
                if self.drafts_before.get(r * w + j) != t {
                    self.drafts_before.set(r * w + j, t);
                }
            }
        }
    }
}

impl<S: HistorySource> Pipeline<S> {
    /// Stable slots: request `params` occupies `slot` from the next step on, replacing
    /// whatever the slot held. Checked now (an error changes nothing); applied by the next
    /// [`step_slots`](Self::step_slots), in call order with the other changes of the step.
    pub fn add_request(&mut self, slot: usize, params: RequestParams<S>) -> Result<()> {
        if slot >= self.capacity {
            return Err(Error::IndexOutOfRange {
                index: slot,
                field: "slot",
                capacity: self.capacity,
            });
        }
        let checked = self.admit(slot, params)?;
        self.drop_pending(slot);
        self.pending.push((slot, Some(checked)));
        Ok(())
    }

    /// Stable slots: `slot` is free from the next step on.
    pub fn remove_request(&mut self, slot: usize) -> Result<()> {
        if slot >= self.capacity {
            return Err(Error::IndexOutOfRange {
                index: slot,
                field: "slot",
                capacity: self.capacity,
            });
        }
        self.drop_pending(slot);
        self.pending.push((slot, None));
        Ok(())
    }

    /// Stable slots: tokens committed by slot (`tokens[k]` for `slots[k]`), appended without
    /// a step; the next step's tables read them with that step's own feed. For an engine
    /// that committed more tokens since the last step than one feed holds (`max_rows`).
    /// Checked first: a refused feed appends nothing.
    pub fn feed_slots(&mut self, tokens: &[i64], slots: &[usize]) -> Result<()> {
        self.check_row_map(&[])?;
        self.check_feed(tokens, Some(slots))?;
        self.push_feed(tokens, Some(slots));
        Ok(())
    }

    /// Forgets a pending change of `slot` (a later change of the same slot replaces it).
    pub(super) fn drop_pending(&mut self, slot: usize) {
        if let Some(k) = self.pending.iter().position(|(s, _)| *s == slot) {
            if let (_, Some(c)) = self.pending.remove(k) {
                self.uninstall(c.id);
            }
        }
    }

    /// Stable slots, one step: the token feed (tokens by slot), the slot changes made since
    /// the last step, the per-step work, then the row map of this step's logits (with its
    /// draft layout under speculative decoding). The feed, the map and the layout are checked
    /// before anything changes.
    pub fn step_slots(
        &mut self,
        row_to_slot: &[usize],
        feed: Option<(&[i64], &[usize])>,
        drafts: Option<Drafts>,
    ) -> Result<()> {
        self.check_row_map(row_to_slot)?;
        if let Some(d) = &drafts {
            self.check_draft_shape(row_to_slot, d)?;
        }
        if let Some((tokens, slots)) = feed {
            self.check_feed(tokens, Some(slots))?;
        }
        self.sync_sources(false)?;
        if let Some((tokens, slots)) = feed {
            self.push_feed(tokens, Some(slots));
        }
        if self.pending.is_empty() {
            self.work_none();
        } else {
            let mut u = BatchUpdate::new(self.capacity);
            for (slot, change) in std::mem::take(&mut self.pending) {
                match change {
                    Some(c) => u.added.push((slot, c)),
                    None => u.removed.push(slot),
                }
            }
            self.commit(u);
        }
        // Checked above: only the histories can refuse the drafts now, when one still ends
        // in an async placeholder. The rows are then mapped without them and the replay
        // waits for the re-step that placeholders call for (`remap_rows`).
        let whole = drafts
            .as_ref()
            .is_none_or(|d| self.check_draft_histories(d).is_ok());
        self.map_checked(row_to_slot, drafts, whole);
        Ok(())
    }

    pub(super) fn check_row_map(&self, row_to_slot: &[usize]) -> Result<()> {
        let Some(rs) = &self.tables.rows else {
            return Err(Error::Protocol(
                "this pipeline was built without stable slots".into(),
            ));
        };
        if row_to_slot.len() > rs.row_to_slot.len() {
            return Err(Error::TooLarge {
                field: "row_to_slot",
                value: row_to_slot.len(),
                max: rs.row_to_slot.len(),
            });
        }
        if let Some((r, &s)) = row_to_slot
            .iter()
            .enumerate()
            .find(|&(_, &s)| s >= self.capacity)
        {
            return Err(Error::invalid(
                r,
                "row_to_slot",
                format!(
                    "position {r}: slot {s} outside [0, {}) (max_num_seqs)",
                    self.capacity
                ),
            ));
        }
        Ok(())
    }

    /// Stable slots: logits row `r` belongs to slot `row_to_slot[r]` this step, at the draft
    /// position `drafts` gives it (none: every row gets its slot's committed state). Builds
    /// the row-space copies of the sparse tables (only rewritten when they change) and the
    /// row map the dense tables are gathered with.
    pub fn map_rows(&mut self, row_to_slot: &[usize], drafts: Option<Drafts>) -> Result<()> {
        self.check_row_map(row_to_slot)?;
        if let Some(d) = &drafts {
            self.check_draft_shape(row_to_slot, d)?;
            self.check_draft_histories(d)?;
        }
        self.map_checked(row_to_slot, drafts, true);
        Ok(())
    }

    /// [`map_rows`](Self::map_rows) of a checked map; `replay`: the drafts' histories are
    /// whole (else the layout is kept for [`remap_rows`](Self::remap_rows) only).
    fn map_checked(&mut self, row_to_slot: &[usize], drafts: Option<Drafts>, replay: bool) {
        let cap = self.capacity;
        let rs = self.tables.rows.as_mut().expect("checked above");
        for (r, &s) in row_to_slot.iter().enumerate() {
            if r >= rs.rows || rs.row_to_slot.get(r) != s as i64 {
                rs.row_to_slot.set(r, s as i64);
            }
        }
        rs.rows = row_to_slot.len();
        rs.map.clear();
        rs.map.extend_from_slice(row_to_slot);
        rs.drafts = drafts.filter(Drafts::has_drafts);
        rs.write_drafts();
        let replay = replay && rs.drafts.is_some();
        let map = &rs.map;
        // Under a replay the tables that read histories build theirs row by row instead.
        for t in self.tables.list.iter_mut() {
            let replayed = replay && t.history().is_some();
            if let Some(r) = t.rows_mut().filter(|_| !replayed) {
                r.map_rows(map, cap);
            }
        }
        if replay {
            self.replay_drafts();
        }
    }

    /// Maps the last row map again, with its draft layout (after a re-step).
    pub fn remap_rows(&mut self) -> Result<()> {
        let Some(rs) = self.tables.rows.as_mut() else {
            return self.check_row_map(&[]);
        };
        let map = std::mem::take(&mut rs.map);
        let drafts = rs.drafts.take();
        self.map_rows(&map, drafts)
    }

    /// Row map of the last [`map_rows`](Self::map_rows), if any.
    pub fn row_map(&self) -> Option<&[usize]> {
        self.tables.rows.as_ref().map(|r| r.map.as_slice())
    }
}

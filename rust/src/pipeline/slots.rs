//! The stable-slot front-end (vLLM's Model Runner V2): slot changes staged until the step,
//! and the row-space copies of the sparse tables for each step's row → slot map.

use super::{Pipeline, RequestParams, Tables};
use crate::batch::BatchUpdate;
use crate::buffer::HostBuffer;
use crate::error::{Error, Result};
use crate::history::HistorySource;
use crate::sparse::{Padding, SparseRows};

/// Row-space copies of the sparse tables (stable-slot front-end).
pub(super) struct RowSpace {
    pub(super) row_to_slot: HostBuffer<i64>,
    pub(super) rows: usize,
    pub(super) logit_bias: SparseRows<f32>,
    pub(super) min_tokens: SparseRows<f32>,
    pub(super) bad_words: SparseRows<f32>,
    pub(super) allowed: SparseRows<f32>,
    pub(super) allowed_rows: HostBuffer<i64>,
    pub(super) allowed_rows_len: usize,
    pub(super) thinking: SparseRows<f32>,
    pub(super) map: Vec<usize>,
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

    /// Forgets a pending change of `slot` (a later change of the same slot replaces it).
    pub(super) fn drop_pending(&mut self, slot: usize) {
        if let Some(k) = self.pending.iter().position(|(s, _)| *s == slot) {
            if let (_, Some(c)) = self.pending.remove(k) {
                self.uninstall(c.id);
            }
        }
    }

    /// Stable slots, one step: the token feed (tokens by slot), the slot changes made since
    /// the last step, the per-step work, then the row map of this step's logits. The feed and
    /// the map are checked before anything changes.
    pub fn step_slots(
        &mut self,
        row_to_slot: &[usize],
        feed: Option<(&[i64], &[usize])>,
    ) -> Result<()> {
        self.check_row_map(row_to_slot)?;
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
        self.map_rows(row_to_slot)
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
        if let Some(&s) = row_to_slot.iter().find(|&&s| s >= self.capacity) {
            return Err(Error::IndexOutOfRange {
                index: s,
                field: "row_to_slot",
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// Stable slots: logits row `r` belongs to slot `row_to_slot[r]` this step. Builds the
    /// row-space copies of the sparse tables (only rewritten when they change) and the row map
    /// the dense tables are gathered with.
    pub fn map_rows(&mut self, row_to_slot: &[usize]) -> Result<()> {
        self.check_row_map(row_to_slot)?;
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
        let Tables {
            logit_bias,
            min_tokens,
            bad_words,
            thinking,
            allowed,
            rows,
            ..
        } = &mut self.tables;
        let rs = rows.as_mut().expect("checked above");
        let map = &rs.map;
        if let Some(s) = logit_bias {
            remap(
                s.triples(),
                cap,
                map,
                &mut rs.logit_bias,
                Padding::FirstWithValue(-0.0),
            );
        }
        if let Some(s) = min_tokens {
            remap(
                s.triples(),
                cap,
                map,
                &mut rs.min_tokens,
                Padding::RepeatFirst,
            );
        }
        if let Some(s) = bad_words {
            remap(
                s.triples(),
                cap,
                map,
                &mut rs.bad_words,
                Padding::RepeatFirst,
            );
        }
        if let Some(s) = thinking {
            remap(
                s.triples(),
                cap,
                map,
                &mut rs.thinking,
                Padding::RepeatFirst,
            );
        }
        if let Some(s) = allowed {
            if remap(s.pairs(), cap, map, &mut rs.allowed, Padding::RepeatFirst) {
                let restricted: Vec<usize> = (0..map.len())
                    .filter(|&r| s.is_restricted(map[r]))
                    .collect();
                rs.allowed_rows_len = restricted.len();
                let padded = padded_rows(restricted.len(), rs.allowed_rows.len());
                for (k, &r) in restricted.iter().enumerate() {
                    rs.allowed_rows.set(k, r as i64);
                }
                if let Some(&first) = restricted.first() {
                    rs.allowed_rows.fill(restricted.len(), padded, first as i64);
                }
            }
        }
        Ok(())
    }

    /// Row map of the last [`map_rows`](Self::map_rows), if any.
    pub fn row_map(&self) -> Option<&[usize]> {
        self.tables.rows.as_ref().map(|r| r.map.as_slice())
    }
}

/// Restricted-row padding: repeats of the first up to a power of two.
pub(super) fn padded_rows(n: usize, cap: usize) -> usize {
    if n == 0 {
        0
    } else {
        n.next_power_of_two().min(cap)
    }
}

/// Rewrites `out` as the row-space copy of slot-space triples `src`: every row gets the triples
/// of its slot. Returns whether `out` changed.
pub(super) fn remap(
    src: &SparseRows<f32>,
    capacity: usize,
    row_to_slot: &[usize],
    out: &mut SparseRows<f32>,
    pad: Padding<f32>,
) -> bool {
    // Triples are grouped by slot in ascending order: find each slot's range once.
    let n = src.len();
    let mut start = vec![0usize; capacity + 1];
    for i in 0..n {
        start[src.rows().get(i) as usize + 1] += 1;
    }
    for s in 0..capacity {
        start[s + 1] += start[s];
    }
    let mut entries = Vec::new();
    for (r, &s) in row_to_slot.iter().enumerate() {
        for i in start[s]..start[s + 1] {
            if entries.len() >= out.capacity() {
                break; // cannot happen: out holds rows × per-request cap
            }
            entries.push((r, src.cols().get(i), src.vals().get(i)));
        }
    }
    out.rebuild_if_changed(&entries, pad)
}

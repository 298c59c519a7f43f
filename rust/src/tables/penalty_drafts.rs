//! The penalties on draft rows (speculative decoding, stable slots): the row at draft
//! position `j` counts the committed history followed by the drafts `d_0 .. d_{j-1}`.
//!
//! The draft replay does not step the penalties (their device count matrix holds committed
//! counts only, and a replay would queue additions to it and back). Instead each draft row
//! gets the cells that differ from its slot's committed ones, computed from the drafts:
//! `(row, token, count | PROMPT_FLAG)` after the drafts, for the tokens the drafts counted
//! and, with a window (`penalty_last_n`), the tokens the drafts pushed out of it. A row
//! holds at most `2 j` of them. The apply then penalizes those tokens from their original
//! logits with the row's cells, after the committed form ran over the whole row.

use super::{Entry, PenaltiesState, PROMPT_FLAG};
use crate::error::Result;
use crate::history::TokenHistory;
use crate::processor::DraftRow;
use crate::sparse::{Padding, SparseRows};

/// A stable-slot pipeline's draft-row cells (exported as `rows.penalties.*`).
pub(super) struct DraftCells {
    pub(super) cells: SparseRows<i32>,
    entries: Vec<(usize, i32, i32)>,
    /// Scratch per row: `(token, count change, prompt positions leaving the window)`.
    delta: Vec<(i32, i32, u32)>,
}

impl DraftCells {
    pub(super) fn try_new(len: usize) -> Result<Self> {
        Ok(DraftCells {
            cells: SparseRows::try_new(len.max(1), "max_rows")?,
            entries: Vec::new(),
            delta: Vec::new(),
        })
    }

    pub(super) fn begin(&mut self) {
        self.entries.clear();
    }

    /// Writes the captured cells, ordered by row (stable: a row's own keep their order).
    pub(super) fn finish(&mut self) {
        self.entries.sort_by_key(|e| e.0);
        let n = self.entries.len().min(self.cells.capacity());
        self.cells
            .rebuild_if_changed(&self.entries[..n], Padding::RepeatFirst);
    }
}

impl<H: TokenHistory> PenaltiesState<H> {
    /// The cells of `rows` that differ from their slots' committed ones.
    pub(super) fn capture_drafts(&mut self, rows: &[DraftRow<'_>]) {
        let Some(d) = &mut self.drafts else { return };
        let vocab = self.vocab_size as i64;
        for r in rows {
            if r.drafts.is_empty() {
                continue;
            }
            let Some(e) = self.table.get(r.slot) else {
                continue; // no penalties for this request
            };
            draft_delta(e, r.drafts, vocab, &mut d.delta);
            for &(t, dcount, leaving) in &d.delta {
                let count = e.counts.get(t) as i32 + dcount;
                let (before, after) = match &e.window {
                    None => {
                        let p = e.prompt_set.contains(t);
                        (p, p)
                    }
                    Some(w) => {
                        let c = w.prompt_counts.get(t);
                        (c > 0, c > leaving)
                    }
                };
                if dcount != 0 || before != after {
                    let flag = if after { PROMPT_FLAG } else { 0 };
                    d.entries.push((r.row, t, count | flag));
                }
            }
        }
    }
}

/// The count changes of one request after `drafts` (and, with a window, the prompt
/// positions that leave it), by token, into `delta`.
fn draft_delta<H>(e: &Entry<H>, drafts: &[i64], vocab: i64, delta: &mut Vec<(i32, i32, u32)>) {
    delta.clear();
    let Some(w) = &e.window else {
        for &t in drafts {
            of(delta, t as i32).1 += 1;
        }
        return;
    };
    // The committed window is the last `n` positions of the prompt and the counted output;
    // the drafts extend it by `drafts.len()` positions.
    let end = w.prompt_len + e.counted.len();
    let (lo, end2) = (end.saturating_sub(w.n), end + drafts.len());
    let lo2 = end2.saturating_sub(w.n);
    for p in lo..lo2.min(end) {
        if p < w.prompt_len {
            let t = w.prompt_tail[p + w.prompt_tail.len() - w.prompt_len];
            of(delta, t).2 += 1;
        } else {
            let t = e.counted[p - w.prompt_len];
            if t >= 0 && (t as i64) < vocab {
                of(delta, t).1 -= 1;
            }
        }
    }
    for &t in &drafts[lo2.max(end) - end..] {
        of(delta, t as i32).1 += 1;
    }
}

/// Token `t`'s entry of a delta (a few tokens: a linear search).
fn of(delta: &mut Vec<(i32, i32, u32)>, t: i32) -> &mut (i32, i32, u32) {
    let i = match delta.iter().position(|d| d.0 == t) {
        Some(i) => i,
        None => {
            delta.push((t, 0, 0));
            delta.len() - 1
        }
    };
    &mut delta[i]
}

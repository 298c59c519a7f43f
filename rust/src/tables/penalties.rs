//! Repetition / frequency / presence penalties with incremental token counts.
//!
//! vLLM rebuilds every request's token counts from its whole history each step; here each
//! tracked slot remembers how many of its output tokens were already counted and reads only the
//! new ones, so a step costs the same at 16 or 4,096 generated tokens.
//!
//! The counts themselves live on the logits' device as one int32 matrix `[capacity + 1, V]`:
//! `count | PROMPT_FLAG` per (slot, token), where `PROMPT_FLAG` marks prompt tokens (repetition
//! uses prompt ∪ output; frequency and presence use output counts only). Row `capacity` is kept
//! all-zero. This module computes, per update, the *operations* that keep that matrix in step:
//! - row copies `(dst, src)` from the pre-update rows (a moved request takes its counts along;
//!   a new request copies the zero row), applied at once as one gather/scatter;
//! - `(row, token, delta)` additions: `PROMPT_FLAG` for a new request's distinct prompt tokens,
//!   `+1` per newly generated token, `-1` when an output list shrank.
//!
//! Penalty values are dense per slot (neutral 1/0/0 where untracked), so the device apply is a
//! few fused passes over `[batch_size, V]`; rows with neutral values come out bit-identical.
//!
//! `penalty_last_n` (llama.cpp's name) restricts the three penalties to the last `n` positions
//! of the request's sequence (prompt, then its output up to an async placeholder): each
//! penalty keeps vLLM's token set, repetition prompt ∪ output and frequency / presence output
//! only, taken over those positions. `None` or −1 is the whole history (the code path of a
//! request without it, bit for bit), 0 turns the request's penalties off. The window slides
//! incrementally: a token entering it adds its count (or its prompt flag), a token leaving it
//! removes it again, so a step still costs O(new tokens); the prompt tokens kept are the
//! last `n` only (the window never reaches further back, even when the output shrinks).

use crate::arena::{HasBuffers, Staged};
use crate::batch::{BatchUpdate, SlotOps};
use crate::buffer::HostBuffer;
use crate::error::Result;
use crate::fields::Example as E;
use crate::fields::{FieldKind, FieldSpec, Fields, Range};
use crate::history::HistoryId;
use crate::history::TokenHistory;
use crate::limits::check_token;
use crate::processor::{
    self, Admission, DraftRow, HostApply, HostData, HostLogits, MapsRows, ReadsHistory, StatusSink,
    StepContext, Table,
};
use crate::sparse::{Padding, SparseRows};
use crate::table::SlotTable;
use crate::tables::Build;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

#[path = "penalty_drafts.rs"]
mod drafts;
use drafts::DraftCells;

/// Bit marking "token occurs in the prompt" in a device count cell.
pub const PROMPT_FLAG: i32 = 1 << 30;

/// The request fields the penalties read; any of them off its neutral value makes the
/// prompt read too.
pub const FIELDS: &[FieldSpec] = &[
    FieldSpec::new("repetition_penalty", FieldKind::Float { neutral: 1.0 })
        .range(Range::at_least(0.0).open_lo().note("(1: off)"))
        .examples(&[E::Float(1.1)]),
    FieldSpec::new("frequency_penalty", FieldKind::Float { neutral: 0.0 })
        .range(Range::closed(-2.0, 2.0))
        .examples(&[E::Float(0.5)]),
    FieldSpec::new("presence_penalty", FieldKind::Float { neutral: 0.0 })
        .range(Range::closed(-2.0, 2.0))
        .examples(&[E::Float(-0.5)]),
    FieldSpec::new("penalty_last_n", FieldKind::OptInt)
        .range(Range::int_at_least(-1).note("(None or -1: the whole history; 0: off)"))
        .tunes()
        .examples(&[E::Int(16), E::Int(-1), E::Int(0), E::Int(3), E::Int(64)])
        .bad(&[E::Int(-2)]),
];

/// One added request's penalty parameters.
pub struct PenaltyParams<H> {
    pub repetition_penalty: f64,
    pub frequency_penalty: f64,
    pub presence_penalty: f64,
    /// `penalty_last_n`: `None` or −1 the whole history, 0 off, `n > 0` the last `n` positions.
    pub last_n: Option<i64>,
    pub prompt: Option<Vec<i64>>,
    pub output: H,
}

/// One tracked request (checked penalties, prompt and its output handle).
pub struct Entry<H> {
    values: (f32, f32, f32),
    output: H,
    /// Output tokens already counted (a copy, so a shrinking list can be undone exactly).
    counted: Vec<i32>,
    /// Distinct prompt tokens, emitted as PROMPT_FLAG additions when the entry is fresh.
    prompt: Vec<i32>,
    /// The same as a set (without a window), for the draft rows' cells.
    prompt_set: Counts,
    /// Output count per token id: what the CPU apply reads (the device keeps its own copy).
    /// With a window, the output tokens inside it only.
    counts: Counts,
    /// `penalty_last_n > 0`: the window (then `prompt` is empty; the window's prompt tokens
    /// are in `Window::prompt_counts`).
    window: Option<Window>,
}

/// A request's penalty window: positions `[lo, hi)` of its sequence (the prompt, then the
/// counted output) are what its counts and prompt flags hold.
struct Window {
    n: usize,
    prompt_len: usize,
    /// The prompt's last `min(n, prompt_len)` tokens: the only ones the window can reach.
    prompt_tail: Vec<i32>,
    /// How often each prompt token occurs inside the window (its flag is set while > 0).
    prompt_counts: Counts,
    lo: usize,
    hi: usize,
}

impl Window {
    /// Moves the window to `[lo2, hi2)`: the positions leaving it are uncounted, the ones
    /// entering it counted (every position below `max(hi, hi2)` must be in `counted`).
    #[allow(clippy::too_many_arguments)]
    fn slide(
        &mut self,
        lo2: usize,
        hi2: usize,
        counted: &[i32],
        counts: &mut Counts,
        row: usize,
        vocab: i64,
        pending: Option<&mut Vec<(usize, i32, i32)>>,
    ) {
        let (lo, hi) = (self.lo, self.hi);
        let mut sink = pending;
        for p in (lo..hi.min(lo2)).chain(lo.max(hi2)..hi) {
            self.edit(p, false, counted, counts, row, vocab, sink.as_deref_mut());
        }
        for p in (lo2..hi2.min(lo)).chain(lo2.max(hi)..hi2) {
            self.edit(p, true, counted, counts, row, vocab, sink.as_deref_mut());
        }
        self.lo = lo2;
        self.hi = hi2;
    }

    /// Counts (`add`) or uncounts the token at position `p`.
    #[allow(clippy::too_many_arguments)]
    fn edit(
        &mut self,
        p: usize,
        add: bool,
        counted: &[i32],
        counts: &mut Counts,
        row: usize,
        vocab: i64,
        pending: Option<&mut Vec<(usize, i32, i32)>>,
    ) {
        if p < self.prompt_len {
            let t = self.prompt_tail[p + self.prompt_tail.len() - self.prompt_len];
            let flip = if add {
                self.prompt_counts.add(t) == 1
            } else {
                self.prompt_counts.sub(t);
                !self.prompt_counts.contains(t)
            };
            if let (true, Some(pending)) = (flip, pending) {
                pending.push((row, t, if add { PROMPT_FLAG } else { -PROMPT_FLAG }));
            }
            return;
        }
        let t = counted[p - self.prompt_len];
        if t < 0 || (t as i64) >= vocab {
            return; // takes its place but is never counted
        }
        if add {
            counts.add(t);
        } else {
            counts.sub(t);
        }
        if let Some(pending) = pending {
            pending.push((row, t, if add { 1 } else { -1 }));
        }
    }
}

/// Where a slot's device row comes from after an update.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Origin {
    Row(usize),
    Fresh,
    Empty,
}

pub struct PenaltiesState<H> {
    table: SlotTable<Entry<H>>,
    repetition: HostBuffer<f32>,
    frequency: HostBuffer<f32>,
    presence: HostBuffer<f32>,
    copy_dst: HostBuffer<i64>,
    copy_src: HostBuffer<i64>,
    n_copies: usize,
    ops: SparseRows<i32>,
    pending: Vec<(usize, i32, i32)>,
    pending_pos: usize,
    /// Whether the device count matrix is kept (the `pending` ops); the CPU path reads `counts`.
    device_ops: bool,
    vocab_size: usize,
    batch_size: usize,
    origin: Vec<Origin>,
    is_touched: Vec<bool>,
    /// Scratch: the slots the last update reached, once each.
    touched: Vec<usize>,
    /// Some output list ended in an async placeholder (-1) at the last count: the engine may
    /// fill it in before the logits are processed, so the caller should count again then.
    placeholders: bool,
    scratch: Vec<i64>,
    /// Stable slots: the draft rows' cells (speculative decoding).
    drafts: Option<DraftCells>,
}

impl<H: TokenHistory> PenaltiesState<H> {
    /// `ops_capacity`: triples per upload chunk (larger batches of ops go in several chunks).
    pub fn new(capacity: usize, vocab_size: usize, ops_capacity: usize) -> Self {
        Self::try_new(capacity, vocab_size, ops_capacity).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`new`](Self::new); a failed allocation is an error.
    pub fn try_new(capacity: usize, vocab_size: usize, ops_capacity: usize) -> Result<Self> {
        Ok(PenaltiesState {
            table: SlotTable::new(capacity),
            repetition: HostBuffer::try_new(capacity, 1.0, "max_num_seqs")?,
            frequency: HostBuffer::try_new(capacity, 0.0, "max_num_seqs")?,
            presence: HostBuffer::try_new(capacity, 0.0, "max_num_seqs")?,
            copy_dst: HostBuffer::try_new(capacity, 0, "max_num_seqs")?,
            copy_src: HostBuffer::try_new(capacity, 0, "max_num_seqs")?,
            n_copies: 0,
            ops: SparseRows::try_new(ops_capacity.max(1), "max_num_seqs")?,
            pending: Vec::new(),
            pending_pos: 0,
            device_ops: true,
            vocab_size,
            batch_size: 0,
            origin: (0..capacity).map(Origin::Row).collect(),
            is_touched: vec![false; capacity],
            touched: Vec::new(),
            placeholders: false,
            scratch: Vec::new(),
            drafts: None,
        })
    }

    /// Room for `len` draft-row cells (stable slots under speculative decoding).
    pub fn with_draft_rows(mut self, len: usize) -> Result<Self> {
        self.drafts = Some(DraftCells::try_new(len)?);
        Ok(self)
    }

    /// The draft rows' cells (`(row, token, count | PROMPT_FLAG)`), if kept.
    pub fn draft_cells(&self) -> Option<&SparseRows<i32>> {
        self.drafts.as_ref().map(|d| &d.cells)
    }

    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Whether to produce the device matrix's row copies and count additions (default true).
    /// The CPU path applies from the counts kept here and needs neither.
    pub fn set_device_ops(&mut self, on: bool) {
        self.device_ops = on;
    }

    /// The all-zero device row new requests copy from.
    pub fn zero_row(&self) -> usize {
        self.capacity()
    }

    /// Slots with a non-neutral penalty.
    pub fn active(&self) -> usize {
        self.table.active()
    }

    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    pub fn repetition(&self) -> &HostBuffer<f32> {
        &self.repetition
    }

    pub fn frequency(&self) -> &HostBuffer<f32> {
        &self.frequency
    }

    pub fn presence(&self) -> &HostBuffer<f32> {
        &self.presence
    }

    pub fn copy_dst(&self) -> &HostBuffer<i64> {
        &self.copy_dst
    }

    pub fn copy_src(&self) -> &HostBuffer<i64> {
        &self.copy_src
    }

    /// Row copies to apply (the prefix of `copy_dst` / `copy_src`).
    pub fn n_copies(&self) -> usize {
        self.n_copies
    }

    /// Row copies to apply, once: later calls return 0 until the next update adds some (a
    /// copy applied twice would undo the count additions made after it).
    pub fn take_copies(&mut self) -> usize {
        std::mem::take(&mut self.n_copies)
    }

    /// The current chunk of `(row, token, delta)` additions.
    pub fn ops(&self) -> &SparseRows<i32> {
        &self.ops
    }

    /// Output counts of one slot as the core sees them (tests, debugging).
    pub fn counted(&self, index: usize) -> Option<&[i32]> {
        self.table.get(index).map(|e| e.counted.as_slice())
    }

    pub fn check(&self, index: usize, p: PenaltyParams<H>) -> Result<Option<Entry<H>>> {
        // Checked as the float32 the apply uses (the range's `Finite` end): a float64 beyond
        // float32's range, or below its smallest value, would turn logits into inf or NaN.
        let rep = FIELDS[0].checked(index, p.repetition_penalty)?;
        FIELDS[1].checked(index, p.frequency_penalty)?;
        FIELDS[2].checked(index, p.presence_penalty)?;
        let last_n = match p.last_n {
            None => None,
            Some(n) => match FIELDS[3].checked_int(index, n, None)? {
                -1 => None,
                n => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            },
        };
        let values = (
            rep as f32,
            p.frequency_penalty as f32,
            p.presence_penalty as f32,
        );
        if values == (1.0, 0.0, 0.0) || last_n == Some(0) {
            return Ok(None);
        }
        let mut prompt = Vec::new();
        let mut prompt_set = Counts::default();
        let mut window = None;
        if let Some(n) = last_n {
            let tokens = p.prompt.unwrap_or_default();
            let mut tail = Vec::with_capacity(n.min(tokens.len()));
            let start = tokens.len().saturating_sub(n);
            for (i, &t) in tokens.iter().enumerate() {
                let t = check_token(index, "prompt_tok_ids", t, self.vocab_size)?;
                if i >= start {
                    tail.push(t);
                }
            }
            // Empty, at the prompt's end: the first count slides it over the prompt's tail.
            window = Some(Window {
                n,
                prompt_len: tokens.len(),
                prompt_counts: Counts::with_capacity(tail.len()),
                prompt_tail: tail,
                lo: tokens.len(),
                hi: tokens.len(),
            });
        } else if let Some(tokens) = p.prompt {
            // Distinct ids in first-occurrence order.
            let mut seen = Counts::with_capacity(tokens.len());
            for t in tokens {
                let t = check_token(index, "prompt_tok_ids", t, self.vocab_size)?;
                if seen.add(t) == 1 {
                    prompt.push(t);
                }
            }
            prompt_set = seen;
        }
        Ok(Some(Entry {
            values,
            output: p.output,
            counted: Vec::with_capacity(64),
            prompt,
            prompt_set,
            counts: Counts::with_capacity(32),
            window,
        }))
    }

    fn write_values(&mut self, index: usize, v: (f32, f32, f32)) {
        let old = (
            self.repetition.get(index),
            self.frequency.get(index),
            self.presence.get(index),
        );
        if old != v {
            self.repetition.set(index, v.0);
            self.frequency.set(index, v.1);
            self.presence.set(index, v.2);
        }
    }

    /// Applies a batch change (validated first), then counts the new output tokens.
    pub fn update(
        &mut self,
        update: BatchUpdate<PenaltyParams<H>>,
        store: &H::Store,
    ) -> Result<()> {
        update.validate(self.capacity())?;
        let update = update.try_map_added(|i, p| self.check(i, p))?;
        self.commit(update, store);
        Ok(())
    }

    /// Applies an update whose entries were already checked, then counts the new output tokens.
    pub fn commit(&mut self, update: BatchUpdate<Option<Entry<H>>>, store: &H::Store) {
        self.begin_step();

        // Where each touched slot's device row comes from: the table rule replayed on the
        // pre-update row numbers.
        let mut origins = Origins {
            origin: &mut self.origin,
            is_touched: &mut self.is_touched,
            touched: std::mem::take(&mut self.touched),
        };
        origins.touched.clear();
        update.replay_ref(&mut origins, |e| {
            Some(if e.is_some() {
                Origin::Fresh
            } else {
                Origin::Empty
            })
        });
        let touched = origins.touched;
        self.batch_size = update.batch_size;
        self.table.apply_validated(update);

        for &i in &touched {
            self.is_touched[i] = false;
            let origin = std::mem::replace(&mut self.origin[i], Origin::Row(i));
            let values = self.table.get(i).map(|e| e.values);
            self.write_values(i, values.unwrap_or((1.0, 0.0, 0.0)));
            if values.is_none() || !self.device_ops {
                // Untracked: its device row is never read with non-neutral values. Or no
                // device matrix at all.
                continue;
            }
            let src = match origin {
                Origin::Row(j) if j == i => continue,
                Origin::Row(j) => j,
                Origin::Fresh => self.zero_row(),
                Origin::Empty => unreachable!("a tracked slot always has an origin"),
            };
            self.copy_dst.set(self.n_copies, i as i64);
            self.copy_src.set(self.n_copies, src as i64);
            self.n_copies += 1;
            if origin == Origin::Fresh {
                let entry = self.table.get(i).expect("tracked");
                self.pending
                    .extend(entry.prompt.iter().map(|&t| (i, t, PROMPT_FLAG)));
            }
        }
        self.touched = touched;
        self.count_new_tokens(store);
    }

    /// A step without a batch change: only new output tokens are counted.
    pub fn update_none(&mut self, store: &H::Store) {
        self.begin_step();
        self.count_new_tokens(store);
    }

    fn begin_step(&mut self) {
        self.n_copies = 0;
        self.pending.clear();
        self.pending_pos = 0;
    }

    fn count_new_tokens(&mut self, store: &H::Store) {
        self.placeholders = false;
        if self.table.active() == 0 {
            return;
        }
        let vocab = self.vocab_size as i64;
        let scratch = &mut self.scratch;
        let pending = &mut self.pending;
        let ops = self.device_ops;
        let mut placeholders = false;
        for (row, e) in self.table.iter_mut() {
            let len = e.output.len(store);
            // Keep the counted prefix that the list still holds. The list may have shrunk (the
            // engine dropped rejected tokens) or shrunk and regrown: step back from its end to
            // the last position that still holds the counted token. One element is read per
            // row and step in the usual case, however long the output.
            let mut keep = e.counted.len().min(len);
            while keep > 0
                && e.output.token_at(store, keep - 1).map(clamp_id) != Some(e.counted[keep - 1])
            {
                keep -= 1;
            }
            if let Some(w) = &mut e.window {
                // The window's counts change only by sliding it: back to the kept prefix's
                // window (shrunk or rewritten outputs, rare), then on over the new tokens.
                if keep < e.counted.len() {
                    let end = w.prompt_len + keep;
                    let (lo2, hi2) = (end.saturating_sub(w.n), end);
                    w.slide(
                        lo2,
                        hi2,
                        &e.counted,
                        &mut e.counts,
                        row,
                        vocab,
                        ops.then_some(&mut *pending),
                    );
                    e.counted.truncate(keep);
                }
                if len > keep {
                    scratch.clear();
                    e.output.read_from(store, keep, scratch);
                    for &t in scratch.iter() {
                        if t < 0 {
                            placeholders = true;
                            break;
                        }
                        e.counted.push(clamp_id(t));
                    }
                }
                let end = w.prompt_len + e.counted.len();
                if (w.lo, w.hi) != (end.saturating_sub(w.n), end) {
                    let (lo2, hi2) = (end.saturating_sub(w.n), end);
                    w.slide(
                        lo2,
                        hi2,
                        &e.counted,
                        &mut e.counts,
                        row,
                        vocab,
                        ops.then_some(&mut *pending),
                    );
                }
                continue;
            }
            if keep < e.counted.len() {
                for t in e.counted.drain(keep..) {
                    if t >= 0 && (t as i64) < vocab {
                        e.counts.sub(t);
                        if ops {
                            pending.push((row, t, -1));
                        }
                    }
                }
            }
            if len > keep {
                scratch.clear();
                e.output.read_from(store, keep, scratch);
                for &t in scratch.iter() {
                    // Async placeholders (-1) sit at the tail until the engine fills them in;
                    // stop there and count them once they are real tokens.
                    if t < 0 {
                        placeholders = true;
                        break;
                    }
                    // An id outside the vocabulary takes its place but is never counted.
                    let t = clamp_id(t);
                    e.counted.push(t);
                    if (t as i64) < vocab {
                        e.counts.add(t);
                        if ops {
                            pending.push((row, t, 1));
                        }
                    }
                }
            }
        }
        self.placeholders = placeholders;
    }

    /// Applies the penalties in place to float32 logits on the host, touching only the tokens
    /// each tracked request has seen (prompt ∪ output): row `r` is
    /// `logits[r * row_stride .. r * row_stride + vocab]`, rows `0..rows`. The arithmetic is
    /// the device apply's, element for element (rows and tokens it skips are ones the dense
    /// form leaves unchanged, up to the sign of a zero).
    /// With `row_to_slot`, logits row `r` takes the state of slot `row_to_slot[r]` (the
    /// stable-slot front-end); without, row `r` is slot `r`.
    pub fn apply_to_rows<F: Logit>(
        &self,
        logits: &mut [F],
        rows: usize,
        vocab: usize,
        row_stride: usize,
        row_to_slot: Option<&[usize]>,
    ) {
        assert!(
            vocab <= self.vocab_size
                && (rows == 0 || (rows - 1) * row_stride + vocab <= logits.len())
                && row_to_slot.is_none_or(|m| m.len() >= rows)
        );
        // Draft rows (stable slots): the cells that differ from the slot's, by row.
        let empty = [];
        let (draft_rows, draft_cols, draft_vals, n_draft) = match (&self.drafts, row_to_slot) {
            (Some(d), Some(_)) => (
                d.cells.rows().prefix(d.cells.len()),
                d.cells.cols().prefix(d.cells.len()),
                d.cells.vals().prefix(d.cells.len()),
                d.cells.len(),
            ),
            _ => (&empty[..], &empty[..], &empty[..], 0),
        };
        let mut next_draft = 0;
        let mut originals: Vec<F> = Vec::new();
        let mut apply_row = |row: usize, e: &Entry<H>| {
            let (rep, freq, pres) = e.values;
            let line = &mut logits[row * row_stride..row * row_stride + vocab];
            // vLLM on the CPU (its torch fallback) multiplies positive logits by the float32
            // reciprocal rather than dividing (its CUDA kernel): up to 1 ulp apart. The
            // penalty terms are float32 (vLLM's tensors), widened for float64 logits.
            let (inv, rep) = (F::from(1.0 / rep), F::from(rep));
            let zero = F::from(0.0);
            let penalize = |x: F, count: u32| -> F {
                let x = if x > zero { x * inv } else { x * rep };
                let x = x - F::from(freq * count as f32);
                x - F::from(pres * if count > 0 { 1.0 } else { 0.0 })
            };
            // This row's draft cells (rows are visited in order): their tokens are penalized
            // from their original logits below, after the committed form.
            while next_draft < n_draft && (draft_rows[next_draft] as usize) < row {
                next_draft += 1;
            }
            let first = next_draft;
            while next_draft < n_draft && draft_rows[next_draft] as usize == row {
                next_draft += 1;
            }
            let cells = first..next_draft;
            originals.clear();
            originals.extend(cells.clone().map(|k| line[draft_cols[k] as usize]));
            for (t, c) in e.counts.iter() {
                line[t as usize] = penalize(line[t as usize], c);
            }
            let prompt: &mut dyn Iterator<Item = i32> = match &e.window {
                None => &mut e.prompt.iter().copied(),
                Some(w) => &mut w.prompt_counts.iter().map(|(t, _)| t),
            };
            for t in prompt {
                if !e.counts.contains(t) {
                    line[t as usize] = penalize(line[t as usize], 0);
                }
            }
            for (k, &x) in cells.zip(&originals) {
                let cell = draft_vals[k];
                let count = (cell & (PROMPT_FLAG - 1)) as u32;
                line[draft_cols[k] as usize] = if cell != 0 { penalize(x, count) } else { x };
            }
        };
        match row_to_slot {
            Some(map) => {
                for (row, &slot) in map[..rows].iter().enumerate() {
                    if let Some(e) = self.table.get(slot) {
                        apply_row(row, e);
                    }
                }
            }
            None => {
                for (row, e) in self.table.iter() {
                    if row >= rows {
                        break;
                    }
                    apply_row(row, e);
                }
            }
        }
    }

    /// Moves the next chunk of pending additions into the export buffers; returns the padded
    /// length to apply (0 when none are left).
    pub fn next_chunk(&mut self) -> usize {
        let cap = self.ops.capacity();
        let end = (self.pending_pos + cap).min(self.pending.len());
        if self.pending_pos >= end {
            return 0;
        }
        let chunk = &self.pending[self.pending_pos..end];
        self.ops
            .rebuild(chunk.iter().copied(), Padding::FirstWithValue(0));
        self.pending_pos = end;
        self.ops.padded_len()
    }
}

impl<H> HasBuffers for PenaltiesState<H> {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        f("penalties.repetition", &mut self.repetition);
        f("penalties.frequency", &mut self.frequency);
        f("penalties.presence", &mut self.presence);
        f("penalties.copy_dst", &mut self.copy_dst);
        f("penalties.copy_src", &mut self.copy_src);
        self.ops.visit_as(
            [
                "penalties.ops_rows",
                "penalties.ops_cols",
                "penalties.ops_vals",
            ],
            f,
        );
    }
}

/// The origin of each slot's device row, replayed with the table rule; `touched` lists every
/// slot an operation reached, once.
struct Origins<'a> {
    origin: &'a mut Vec<Origin>,
    is_touched: &'a mut Vec<bool>,
    touched: Vec<usize>,
}

impl Origins<'_> {
    fn touch(&mut self, i: usize) {
        if !self.is_touched[i] {
            self.is_touched[i] = true;
            self.touched.push(i);
        }
    }
}

impl SlotOps for Origins<'_> {
    type Value = Origin;

    fn put(&mut self, index: usize, value: Option<Origin>) {
        self.touch(index);
        self.origin[index] = value.unwrap_or(Origin::Empty);
    }

    fn take(&mut self, index: usize) -> Option<Origin> {
        self.touch(index);
        Some(std::mem::replace(&mut self.origin[index], Origin::Empty))
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.touch(a);
        self.touch(b);
        self.origin.swap(a, b);
    }
}

/// A logits element the host kernel works on (float32, or float64 without a round trip).
pub trait Logit:
    Copy + PartialOrd + From<f32> + std::ops::Mul<Output = Self> + std::ops::Sub<Output = Self>
{
}

impl Logit for f32 {}
impl Logit for f64 {}

/// Output count per token id: a flat open-addressing map (linear probing, at most half
/// full, deletion by backward shift), token ids hashed with a key drawn once per process.
/// One probe in the usual case and no allocation once grown; its memory is twice the distinct
/// tokens counted.
#[derive(Clone, Debug)]
struct Counts {
    /// `(token, count)`; `EMPTY` keys are free. Empty, or a power-of-two length.
    cells: Vec<(i32, u32)>,
    len: usize,
    key: u64,
}

const EMPTY: i32 = -1;

impl Default for Counts {
    fn default() -> Self {
        Counts {
            cells: Vec::new(),
            len: 0,
            key: hash_key(),
        }
    }
}

/// The process's hash key, from the standard library's random hasher keys. A fixed hash lets
/// a prompt choose ids that share their home cells (those with the smallest hashes), piling
/// them into one probe run: counting it was quadratic in its distinct ids.
fn hash_key() -> u64 {
    static KEY: OnceLock<u64> = OnceLock::new();
    *KEY.get_or_init(|| RandomState::new().build_hasher().finish())
}

impl Counts {
    /// Room for `n` distinct tokens without growing.
    fn with_capacity(n: usize) -> Self {
        let mut c = Counts::default();
        if n > 0 {
            c.cells = vec![(EMPTY, 0); (2 * n).next_power_of_two().max(8)];
        }
        c
    }

    /// The cell a probe for `t` starts at: `t` with the key, mixed (splitmix64's finalizer),
    /// its high bits scaled to the length.
    #[inline]
    fn home(&self, t: i32) -> usize {
        let mut z = u64::from(t as u32) ^ self.key;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (((z >> 32) * self.cells.len() as u64) >> 32) as usize
    }

    /// The cell holding `t`, or the free cell where it would go.
    #[inline]
    fn find(&self, t: i32) -> usize {
        let mask = self.cells.len() - 1;
        let mut i = self.home(t);
        loop {
            let k = self.cells[i].0;
            if k == t || k == EMPTY {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    fn get(&self, t: i32) -> u32 {
        if self.cells.is_empty() {
            return 0;
        }
        let c = self.cells[self.find(t)];
        if c.0 == t {
            c.1
        } else {
            0
        }
    }

    fn contains(&self, t: i32) -> bool {
        self.get(t) > 0
    }

    /// Adds one to `t`'s count (`t >= 0`); returns the new count.
    #[inline]
    fn add(&mut self, t: i32) -> u32 {
        if 2 * (self.len + 1) > self.cells.len() {
            self.grow();
        }
        let i = self.find(t);
        let cell = &mut self.cells[i];
        if cell.0 == EMPTY {
            *cell = (t, 0);
            self.len += 1;
        }
        cell.1 += 1;
        cell.1
    }

    /// Takes one from `t`'s count, removing it at zero (nothing if `t` is not counted).
    fn sub(&mut self, t: i32) {
        if self.cells.is_empty() {
            return;
        }
        let mask = self.cells.len() - 1;
        let mut i = self.find(t);
        if self.cells[i].0 != t {
            return;
        }
        self.cells[i].1 -= 1;
        if self.cells[i].1 > 0 {
            return;
        }
        // Backward-shift deletion: later cells of the probe run move into the hole when
        // their home does not lie strictly between the hole and them.
        self.len -= 1;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let k = self.cells[j].0;
            if k == EMPTY {
                break;
            }
            let h = self.home(k);
            let between = if i <= j {
                i < h && h <= j
            } else {
                i < h || h <= j
            };
            if !between {
                self.cells[i] = self.cells[j];
                i = j;
            }
        }
        self.cells[i] = (EMPTY, 0);
    }

    fn grow(&mut self) {
        let old = std::mem::take(&mut self.cells);
        self.cells = vec![(EMPTY, 0); (old.len() * 2).max(8)];
        for (t, c) in old {
            if t != EMPTY {
                let i = self.find(t);
                self.cells[i] = (t, c);
            }
        }
    }

    /// `(token, count)` of every counted token, in no particular order.
    fn iter(&self) -> impl Iterator<Item = (i32, u32)> + '_ {
        self.cells.iter().copied().filter(|c| c.0 != EMPTY)
    }
}

/// A token id as stored in `counted` (ids beyond int32 saturate; they are never counted).
fn clamp_id(t: i64) -> i32 {
    t.clamp(-1, i32::MAX as i64) as i32
}

impl Table for PenaltiesState<HistoryId> {
    fn name(&self) -> &str {
        "penalties"
    }

    fn check(&self, index: usize, fields: &mut Fields, a: Admission) -> Result<processor::Entry> {
        let p = PenaltyParams {
            repetition_penalty: fields.float(&FIELDS[0]),
            frequency_penalty: fields.float(&FIELDS[1]),
            presence_penalty: fields.float(&FIELDS[2]),
            last_n: fields.opt_int(&FIELDS[3]),
            prompt: fields.prompt.clone(),
            output: a.history,
        };
        Ok(processor::entry(PenaltiesState::check(self, index, p)?))
    }

    fn commit(&mut self, update: BatchUpdate<processor::Entry>, ctx: &StepContext<'_>) {
        PenaltiesState::commit(self, processor::unbox(update), ctx.store);
    }

    fn step(&mut self, ctx: &StepContext<'_>) {
        self.update_none(ctx.store);
    }

    fn active(&self) -> Option<usize> {
        Some(PenaltiesState::active(self))
    }

    fn status(&self, out: &mut StatusSink<'_>) {
        out("penalties", PenaltiesState::active(self));
        out(
            "rows.penalties",
            self.drafts.as_ref().map_or(0, |d| d.cells.padded_len()),
        );
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

impl ReadsHistory for PenaltiesState<HistoryId> {
    /// The outputs this table reads at its next step.
    fn readers(&self, f: &mut dyn FnMut(&HistoryId)) {
        for (_, e) in self.table.iter() {
            f(&e.output);
        }
    }

    fn wants_prompt(&self, fields: &Fields) -> bool {
        // The three penalties (a window alone penalizes nothing).
        FIELDS[..3].iter().any(|f| fields.is_set(f))
    }

    /// Whether the last count stopped at an async placeholder (see `placeholders`).
    fn saw_placeholders(&self) -> bool {
        self.placeholders
    }

    fn replays_drafts(&self) -> bool {
        false // computes its draft rows from the drafts (penalty_drafts.rs)
    }
}

impl HostApply for PenaltiesState<HistoryId> {
    fn apply_host(&self, l: &mut HostLogits<'_>) -> std::result::Result<(), &'static str> {
        let (rows, vocab, stride, map) = (l.rows, l.vocab, l.row_stride, l.row_to_slot);
        match &mut l.data {
            HostData::F32(data) => self.apply_to_rows(data, rows, vocab, stride, map),
            HostData::F64(data) => self.apply_to_rows(data, rows, vocab, stride, map),
        }
        Ok(())
    }
}

/// The draft rows' cells (`penalty_drafts.rs`): each draft row's counts are the slot's plus
/// the drafts before it.
impl MapsRows for PenaltiesState<HistoryId> {
    fn map_rows(&mut self, _row_to_slot: &[usize], _capacity: usize) {
        // A row map without drafts: every row reads its slot's committed cells.
        if let Some(d) = &mut self.drafts {
            d.begin();
            d.finish();
        }
    }

    fn visit_late_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        if let Some(d) = &mut self.drafts {
            d.cells.visit_as(
                [
                    "rows.penalties.rows",
                    "rows.penalties.cols",
                    "rows.penalties.vals",
                ],
                f,
            );
        }
    }

    fn draft_begin(&mut self) {
        if let Some(d) = &mut self.drafts {
            d.begin();
        }
    }

    fn draft_capture(&mut self, rows: &[DraftRow<'_>], _ctx: &StepContext<'_>) {
        self.capture_drafts(rows);
    }

    fn draft_finish(&mut self) {
        if let Some(d) = &mut self.drafts {
            d.finish();
        }
    }
}

/// Builds the table for a pipeline (the registry's entry).
pub fn build(b: &Build<'_>) -> Result<Box<dyn Table>> {
    let cap = b.capacity;
    let mut p = PenaltiesState::try_new(cap, b.vocab_size, (4 * cap).max(16384))?;
    p.set_device_ops(!b.cfg.host_kernels);
    if let Some(rows) = b.rows {
        // A draft row at position j holds at most 2 j cells (drafts in, window out).
        p = p.with_draft_rows(rows.saturating_mul(2 * b.max_draft_pos()))?;
    }
    Ok(Box::new(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Move;
    use crate::history::SharedHistory;

    fn params(rep: f64, out: &SharedHistory, prompt: Vec<i64>) -> PenaltyParams<SharedHistory> {
        PenaltyParams {
            repetition_penalty: rep,
            frequency_penalty: 0.5,
            presence_penalty: 0.0,
            last_n: None,
            prompt: Some(prompt),
            output: out.clone(),
        }
    }

    fn drain(s: &mut PenaltiesState<SharedHistory>) -> Vec<(i32, i32, i32)> {
        let mut all = Vec::new();
        while s.next_chunk() > 0 {
            all.extend(s.ops().triples());
        }
        all
    }

    #[test]
    fn counts_incrementally_and_moves_rows() {
        let out0 = SharedHistory::default();
        let out1 = SharedHistory::default();
        out1.write().unwrap().extend([4, 4]);
        let mut s = PenaltiesState::new(4, 10, 3);
        let mut u = BatchUpdate::new(2);
        u.added = vec![
            (0, params(1.2, &out0, vec![1, 1, 2])),
            (1, params(1.0, &out1, vec![])),
        ];
        s.update(u, &()).unwrap();
        assert_eq!(s.n_copies(), 2);
        assert_eq!(s.copy_src().to_vec(2), vec![4, 4]); // both from the zero row
        assert_eq!(
            drain(&mut s),
            vec![
                (0, 1, PROMPT_FLAG),
                (0, 2, PROMPT_FLAG),
                (1, 4, 1),
                (1, 4, 1)
            ]
        );
        assert_eq!(s.repetition().to_vec(2), vec![1.2, 1.0]); // the values were written

        out0.write().unwrap().extend([7, -1]);
        s.update_none(&());
        assert_eq!(drain(&mut s), vec![(0, 7, 1)]);
        out0.write().unwrap()[1] = 3; // placeholder filled in
        s.update_none(&());
        assert_eq!(drain(&mut s), vec![(0, 3, 1)]);

        // Condense: 1 -> 0 after 0 finished; the counts follow as a row copy.
        let mut u = BatchUpdate::new(1);
        u.moved = vec![Move::unidirectional(1, 0)];
        s.update(u, &()).unwrap();
        assert_eq!(
            (s.n_copies(), s.copy_dst().get(0), s.copy_src().get(0)),
            (1, 0, 1)
        );
        assert_eq!(s.frequency().get(1), 0.0);
        assert_eq!(s.counted(0), Some(&[4, 4][..]));

        out1.write().unwrap().truncate(1);
        s.update_none(&());
        assert_eq!(drain(&mut s), vec![(0, 4, -1)]);
    }

    #[test]
    fn shrink_then_regrow_to_the_same_length_recounts() {
        let out = SharedHistory::default();
        out.write().unwrap().extend([1, 2, 3]);
        let mut s = PenaltiesState::new(2, 10, 16);
        let mut u = BatchUpdate::new(1);
        u.added = vec![(0, params(1.5, &out, vec![]))];
        s.update(u, &()).unwrap();
        drain(&mut s);
        {
            let mut v = out.write().unwrap();
            v.pop();
            v.push(5);
        }
        s.update_none(&());
        assert_eq!(drain(&mut s), vec![(0, 3, -1), (0, 5, 1)]);
        assert_eq!(s.counted(0), Some(&[1, 2, 5][..]));
    }

    /// The window's cells, written plainly: `count | PROMPT_FLAG` over the last `n` positions
    /// of prompt + output (the output up to its first placeholder).
    fn window_cells(prompt: &[i64], out: &[i64], n: usize, vocab: usize) -> Vec<i32> {
        let real: Vec<i64> = out.iter().copied().take_while(|&t| t >= 0).collect();
        let seq: Vec<(bool, i64)> = prompt
            .iter()
            .map(|&t| (true, t))
            .chain(real.iter().map(|&t| (false, t)))
            .collect();
        let mut cells = vec![0; vocab];
        for &(is_prompt, t) in &seq[seq.len().saturating_sub(n)..] {
            if (t as usize) < vocab {
                if is_prompt {
                    cells[t as usize] |= PROMPT_FLAG;
                } else {
                    cells[t as usize] += 1;
                }
            }
        }
        cells
    }

    #[test]
    fn the_window_slides_with_shrinks_and_placeholders() {
        let vocab = 6;
        let mut rng = 11u64;
        let mut next = |m: u64| {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 33) % m
        };
        for n in [1usize, 2, 3, 5, 9, 40] {
            let out = SharedHistory::default();
            let prompt: Vec<i64> = (0..7).map(|_| next(vocab as u64) as i64).collect();
            let mut s = PenaltiesState::new(2, vocab, 5);
            let mut p = params(1.5, &out, prompt.clone());
            p.last_n = Some(n as i64);
            let mut u = BatchUpdate::new(1);
            u.added = vec![(0, p)];
            s.update(u, &()).unwrap();
            let mut cells = vec![0i32; vocab];
            for step in 0..150 {
                for (r, t, d) in drain(&mut s) {
                    assert_eq!(r, 0);
                    cells[t as usize] += d;
                }
                let v = out.read().unwrap().clone();
                let want = window_cells(&prompt, &v, n, vocab);
                assert_eq!(cells, want, "n={n} step={step} out={v:?}");
                // The CPU apply's view: the same counts and prompt flags.
                let e = s.table.get(0).unwrap();
                let mut host = vec![0i32; vocab];
                for (t, c) in e.counts.iter() {
                    host[t as usize] += c as i32;
                }
                for (t, _) in e.window.as_ref().unwrap().prompt_counts.iter() {
                    host[t as usize] |= PROMPT_FLAG;
                }
                assert_eq!(host, want, "host n={n} step={step}");
                {
                    let mut w = out.write().unwrap();
                    if let Some(last) = w.last_mut().filter(|t| **t < 0) {
                        *last = next(vocab as u64 + 2) as i64; // filled in (maybe >= V)
                    } else {
                        match next(10) {
                            0 if w.len() >= 3 => {
                                let k = w.len() - 1 - next(3) as usize;
                                w.truncate(k);
                            }
                            1 => w.push(-1),
                            _ => w.push(next(vocab as u64) as i64),
                        }
                    }
                }
                s.update_none(&());
            }
        }
    }

    #[test]
    fn penalty_last_n_zero_is_off_and_negative_is_refused() {
        let out = SharedHistory::default();
        let mut s = PenaltiesState::new(2, 10, 8);
        let mut p = params(1.5, &out, vec![1]);
        p.last_n = Some(0);
        assert!(s.check(0, p).unwrap().is_none());
        let mut p = params(1.5, &out, vec![1]);
        p.last_n = Some(-1);
        assert!(s.check(0, p).unwrap().unwrap().window.is_none());
        let mut p = params(1.5, &out, vec![1]);
        p.last_n = Some(-2);
        let mut u = BatchUpdate::new(1);
        u.added = vec![(1, p)];
        let e = s.update(u, &()).unwrap_err().to_string();
        assert!(e.contains("penalty_last_n") && e.contains("index 1"), "{e}");
        assert_eq!(s.active(), 0);
    }

    /// The ids a fixed multiplicative hash put at the start of every table (the smallest
    /// `t * 0x9E3779B9`): counted, they no longer form one long probe run.
    #[test]
    fn chosen_ids_do_not_pile_up() {
        let mut ids: Vec<i32> = (0..32_000).collect();
        ids.sort_by_key(|&t| (t as u32).wrapping_mul(0x9E37_79B9));
        let mut c = Counts::with_capacity(8192);
        for &t in &ids[..8192] {
            c.add(t);
        }
        let mask = c.cells.len() - 1;
        let longest = ids[..8192]
            .iter()
            .map(|&t| (c.find(t) + c.cells.len() - c.home(t)) & mask)
            .max()
            .unwrap();
        assert!(longest < 256, "a probe run of {longest} cells");
    }

    #[test]
    fn counts_match_a_hash_map() {
        let mut c = Counts::default();
        let mut m = std::collections::HashMap::<i32, u32>::new();
        let mut x: u64 = 3;
        for _ in 0..200_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let t = ((x >> 33) % 300) as i32 * 7;
            if (x >> 20) % 3 == 0 {
                c.sub(t);
                if let Some(v) = m.get_mut(&t) {
                    *v -= 1;
                    if *v == 0 {
                        m.remove(&t);
                    }
                }
            } else {
                c.add(t);
                *m.entry(t).or_insert(0) += 1;
            }
            assert_eq!(c.get(t), m.get(&t).copied().unwrap_or(0));
        }
        let mut all: Vec<_> = c.iter().collect();
        all.sort_unstable();
        let mut want: Vec<_> = m.into_iter().collect();
        want.sort_unstable();
        assert_eq!(all, want);
    }

    #[test]
    fn validation() {
        let out = SharedHistory::default();
        let mut s = PenaltiesState::new(4, 10, 8);
        for (rep, field) in [
            (0.0, "repetition_penalty"),
            (f64::NAN, "repetition_penalty"),
        ] {
            let mut u = BatchUpdate::new(1);
            u.added = vec![(0, params(rep, &out, vec![]))];
            assert!(s.update(u, &()).unwrap_err().to_string().contains(field));
        }
        let mut u = BatchUpdate::new(1);
        u.added = vec![(0, params(1.5, &out, vec![10]))];
        assert!(s
            .update(u, &())
            .unwrap_err()
            .to_string()
            .contains("prompt_tok_ids"));
        assert_eq!(s.active(), 0);
        assert_eq!(s.repetition().to_vec(4), vec![1.0; 4]); // nothing was written
    }
}

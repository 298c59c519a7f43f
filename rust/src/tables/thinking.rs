//! Reasoning ("thinking") token budget: after `budget` thinking tokens, force the end-of-thinking
//! token sequence.
//!
//! Reproduces vLLM 0.25.1's `ThinkingBudgetStateHolder` (`vllm/v1/sample/thinking_budget_state.py`)
//! for non-speculative decoding, except its SWAP bug: batch moves use [`SlotTable`] semantics
//! (a SWAP with one side empty moves the state; a UNIDIRECTIONAL move discards the destination's
//! stale state). The rules are in `docs/semantics.md` ("Thinking budget"); in short:
//!
//! * **Prompt.** If the prompt's last start marker begins after its last end marker, the request
//!   starts inside thinking, with the prompt tokens after that marker already counted.
//! * **Markers in the output** are searched only until one is found, then never again until a
//!   forced end completes: the recorded position is the last occurrence among the tokens that
//!   arrived in the step where the first one appeared.
//! * **Thinking tokens** are those after the start marker (the marker itself is not counted).
//!   When the count reaches `budget` (vLLM: `think_count + 0 + 1 > budget`), `end_ids[0]` is
//!   forced; each later step whose output grew forces the next end token, whatever the model
//!   emitted (only the first forced token is checked: if it did not come out, the row goes back to
//!   thinking). After the last end token the block is over, and any later start marker is
//!   force-closed at once (vLLM issue #43708). After a *natural* end nothing is forced again.
//! * **Forcing** sets one logit, `logits[row, end_ids[j]] = 1e9`; nothing else is masked.
//!
//! The work per step is proportional to the tokens that arrived since the last step: each
//! marker is matched incrementally (Knuth-Morris-Pratt state carried between steps), never by
//! rescanning the output. A request whose thinking ended naturally costs nothing afterwards.
//!
//! Async placeholders (`-1`) are treated as "not generated yet": a step only consumes the output
//! up to its first negative id. vLLM runs this state after the placeholders are replaced, so
//! call [`ThinkingState::step`] after that replacement to match it exactly.

use crate::arena::{HasBuffers, Staged};
use crate::batch::BatchUpdate;
use crate::error::{Error, Result};
use crate::fields::Example as E;
use crate::fields::{FieldKind, FieldSpec, Fields, Range};
use crate::history::HistoryId;
use crate::history::TokenHistory;
use crate::limits::check_config_token;
use crate::processor::{
    self, Admission, HostApply, MapsRows, ReadsHistory, StatusSink, StepContext, Table,
};
use crate::sparse::{Padding, SparseRows};
use crate::table::SlotTable;
use crate::tables::triples::{TripleState, TripleTable};
use crate::tables::Build;

/// The model's reasoning delimiters (vLLM `ReasoningConfig.reasoning_{start,end}_token_ids`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThinkingConfig {
    pub start_ids: Vec<i64>,
    /// Forced, one token per step, when the budget runs out. Empty disables every request.
    pub end_ids: Vec<i64>,
}

/// The request fields the thinking budget reads; a budget (even −1) makes the prompt read.
pub const FIELDS: &[FieldSpec] = &[FieldSpec::new("thinking_token_budget", FieldKind::OptInt)
    .range(Range::int_at_least(-1).note("(None or -1: unlimited)"))
    .examples(&[E::Int(16)])];

/// One added request's parameters.
pub struct ThinkingParams<H> {
    /// `SamplingParams.thinking_token_budget`: `None` or `-1` = not tracked, else `>= 0`.
    pub budget: Option<i64>,
    /// Prompt token ids; `None` for prompt-embeds requests (never inside thinking at start).
    pub prompt: Option<Vec<i64>>,
    /// The request's live output list.
    pub output: H,
}

/// A token sequence with its Knuth-Morris-Pratt failure table.
#[derive(Clone, Debug)]
struct Marker {
    ids: Vec<i64>,
    fail: Vec<usize>,
}

impl Marker {
    fn new(ids: &[i64]) -> Self {
        let mut fail = vec![0; ids.len()];
        let mut k = 0;
        for i in 1..ids.len() {
            while k > 0 && ids[i] != ids[k] {
                k = fail[k - 1];
            }
            if ids[i] == ids[k] {
                k += 1;
            }
            fail[i] = k;
        }
        Marker {
            ids: ids.to_vec(),
            fail,
        }
    }

    fn len(&self) -> usize {
        self.ids.len()
    }

    /// Start index of the last occurrence in `seq` (vLLM `_find_last_sequence_index`), by the
    /// incremental search: O(len(seq)) whatever the tokens, where comparing every window costs
    /// up to the marker's length at each position of a prompt made of its own tokens.
    fn last_in(&self, seq: &[i64]) -> Option<usize> {
        self.feed(&mut Scan::default(), seq)
    }

    /// Feeds `tokens` (which sit at output positions `scan.pos..`) to the incremental search and
    /// returns the start of the last occurrence completed among them. Occurrences that began
    /// before the scan's floor are impossible: the match state was reset there.
    fn feed(&self, scan: &mut Scan, tokens: &[i64]) -> Option<usize> {
        let k = self.ids.len();
        let mut last = None;
        if k == 0 {
            scan.pos += tokens.len();
            return None;
        }
        let mut q = scan.q;
        for (i, &t) in tokens.iter().enumerate() {
            while q > 0 && self.ids[q] != t {
                q = self.fail[q - 1];
            }
            if self.ids[q] == t {
                q += 1;
            }
            if q == k {
                last = Some(scan.pos + i + 1 - k);
                q = self.fail[k - 1];
            }
        }
        scan.q = q;
        scan.pos += tokens.len();
        last
    }
}

/// Incremental search position for one marker: output tokens `[.., pos)` have been fed, and `q`
/// tokens of the marker are matched at the end of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Scan {
    pos: usize,
    q: usize,
}

impl Scan {
    fn at(pos: usize) -> Self {
        Scan { pos, q: 0 }
    }
}

/// Where the open (or last) thinking block began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    /// No start marker recorded since the scan offset: not thinking.
    None,
    /// The prompt ends inside thinking (vLLM `continue_thinking`).
    Prompt,
    /// Start marker recorded at this output position.
    At(usize),
}

/// One tracked request's budget state.
#[derive(Clone)]
pub struct Entry<H> {
    output: H,
    budget: i64,
    /// With `Start::Prompt`: the thinking tokens vLLM attributes to the prompt when it counts,
    /// `len(prompt) - (start_thinking + len(start))` = tokens after the marker - (len(start) - 1).
    prompt_think: i64,
    start: Start,
    start_scan: Scan,
    /// End marker recorded at this output position (searched while `None`).
    end_at: Option<usize>,
    end_scan: Scan,
    /// Output tokens consumed so far (the effective length at the last step).
    read: usize,
    /// Last position of `end_ids[0]` among the consumed tokens at or after `end0_floor`.
    last_end0: Option<usize>,
    /// The `last_end0` tracker only knows positions from here on (moves after a shrink).
    end0_floor: usize,
    /// Output length at which the last forced end completed (vLLM `scan_offset`); 0 if none.
    scan_offset: usize,
    /// Forcing `end_ids[j]` (vLLM `in_end` with `end_count == j`).
    walk: Option<usize>,
    /// vLLM `prev_output_length`: the walk advances only on steps where the output grew past it.
    prev_len: usize,
    /// Thinking ended naturally: nothing can ever be forced again, so steps skip the entry.
    done: bool,
}

/// Per-step scratch and the fixed per-model data, borrowed by entries while they step.
struct Ctx<'a, S: ?Sized> {
    start: &'a Marker,
    end: &'a Marker,
    buf: &'a mut Vec<i64>,
    /// Where the outputs' tokens live.
    store: &'a S,
    /// Set when some output ended in an async placeholder.
    placeholders: bool,
}

impl<H: TokenHistory> Entry<H> {
    fn new(budget: i64, prompt: Option<&[i64]>, output: H, start: &Marker, end: &Marker) -> Self {
        let mut e = Entry {
            output,
            budget,
            prompt_think: 0,
            start: Start::None,
            start_scan: Scan::default(),
            end_at: None,
            end_scan: Scan::default(),
            read: 0,
            last_end0: None,
            end0_floor: 0,
            scan_offset: 0,
            walk: None,
            prev_len: 0,
            done: false,
        };
        if let Some(p) = prompt {
            let last_start = start.last_in(p);
            let last_end = end.last_in(p);
            // `None < Some(_)` matches vLLM's -1 for "not found".
            if last_start > last_end {
                let ls = last_start.unwrap_or(0);
                let ks = start.len() as i64;
                let think_in_prompt = p.len() as i64 - (ls as i64 + ks);
                e.start = Start::Prompt;
                e.prompt_think = think_in_prompt - (ks - 1);
                if budget - think_in_prompt <= 0 {
                    e.walk = Some(0); // exhausted within the prompt: force the first token
                }
            }
        }
        // Without a start marker a request can only think from the prompt.
        e.done = start.len() == 0 && e.start == Start::None;
        e
    }

    /// (inside thinking, thinking tokens) at output length `len`, from the recorded markers.
    fn think_count(&self, len: usize, ks: usize) -> (bool, i64) {
        match self.start {
            Start::None => (false, 0),
            Start::Prompt => match self.end_at {
                Some(_) => (false, 0),
                None => (true, len as i64 + self.prompt_think),
            },
            Start::At(s) => match self.end_at {
                Some(e) if s <= e => (false, 0),
                _ => (true, len as i64 - (s + ks) as i64),
            },
        }
    }

    /// Output tokens were removed (vLLM deletes tokens after a KV-load failure): forget what
    /// was consumed past `len`, as vLLM's searches would (they resume `len(marker) - 1` back).
    fn rewind(&mut self, len: usize, ks: usize, ke: usize) {
        self.read = len;
        let offset = self.scan_offset;
        let floor = |k: usize| Scan::at(offset.max(len.saturating_sub(k.saturating_sub(1))));
        if self.start == Start::None && self.start_scan.pos > len {
            self.start_scan = floor(ks);
        }
        if self.end_at.is_none() && self.end_scan.pos > len {
            self.end_scan = floor(ke);
        }
        if self.last_end0.is_some_and(|x| x >= len) || self.end0_floor > len {
            self.last_end0 = None;
            self.end0_floor = len;
        }
    }

    /// Whether `end_ids[0]` occurs at output positions `[from, self.read)`.
    fn end0_since(&self, from: usize, end0: i64, buf: &mut Vec<i64>, store: &H::Store) -> bool {
        if from >= self.end0_floor {
            return self.last_end0.is_some_and(|x| x >= from);
        }
        // Only after a shrink: read the range again.
        buf.clear();
        self.output.read_from(store, from, buf);
        buf.truncate(self.read.saturating_sub(from));
        buf.contains(&end0)
    }

    /// One engine step; returns the index into `end_ids` of the token to force, if any.
    fn step(&mut self, cx: &mut Ctx<'_, H::Store>) -> Option<usize> {
        let (ks, ke) = (cx.start.len(), cx.end.len());
        if self.done {
            return None;
        }
        let raw_len = self.output.len(cx.store);
        // Tokens replaced below what was consumed (the list was truncated and regrew, perhaps
        // to the same length): consume them again.
        let rewritten = self.output.rewritten_from(cx.store).min(raw_len);
        if rewritten < self.read {
            self.rewind(rewritten, ks, ke);
        }
        // Read what the searches have not seen yet, once. Tokens before `read` were consumed
        // earlier; if some of them vanished meanwhile, rewind and read again.
        let (lo, len) = loop {
            let mut lo = self.read;
            if self.start == Start::None {
                lo = lo.min(self.start_scan.pos);
            }
            if self.end_at.is_none() {
                lo = lo.min(self.end_scan.pos);
            }
            cx.buf.clear();
            self.output.read_from(cx.store, lo, cx.buf);
            // Async placeholders end the usable output.
            if let Some(i) = cx.buf.iter().position(|&t| t < 0) {
                cx.buf.truncate(i);
                cx.placeholders = true;
            }
            let len = lo + cx.buf.len();
            if len >= self.read {
                break (lo, len);
            }
            self.rewind(len, ks, ke);
        };
        let end0 = cx.end.ids[0];
        for i in self.read.max(lo)..len {
            if cx.buf[i - lo] == end0 {
                self.last_end0 = Some(i);
            }
        }
        self.read = len;

        // 1. Start marker (vLLM 260-282); a new block after a forced end is closed at once.
        if self.start == Start::None {
            let from = self.start_scan.pos;
            // A scan can sit past the usable output when the list shrank below the point where
            // a forced end completed: then there is nothing new to search yet.
            let fresh = cx.buf.get(from.saturating_sub(lo)..).unwrap_or(&[]);
            if let Some(s) = cx.start.feed(&mut self.start_scan, fresh) {
                self.start = Start::At(s);
                if self.scan_offset > 0 {
                    // Re-entry (vLLM 268-279): no end search on this step.
                    self.walk = Some(0);
                    return Some(0);
                }
            }
        }
        // 2. End marker (vLLM 283-293).
        if self.end_at.is_none() {
            let from = self.end_scan.pos;
            let fresh = cx.buf.get(from.saturating_sub(lo)..).unwrap_or(&[]);
            self.end_at = cx.end.feed(&mut self.end_scan, fresh);
        }
        // 3. Not thinking (vLLM 295-296).
        if self.start == Start::None {
            return None;
        }
        // 4. Forced-end walk (vLLM 325-352, 370-379, 452-483).
        if let Some(j) = self.walk {
            if len == 0 || len <= self.prev_len {
                return Some(j); // nothing new: force the same token again
            }
            let since = self.prev_len;
            self.prev_len = len;
            if j == 0 && !self.end0_since(since, end0, cx.buf, cx.store) {
                self.walk = None; // the forced token did not come out: back to thinking
            } else if j + 1 >= ke {
                // Forced end complete: scan only what comes next.
                self.walk = None;
                self.scan_offset = len;
                self.start = Start::None;
                self.start_scan = Scan::at(len);
                self.end_at = None;
                self.end_scan = Scan::at(len);
                return None;
            } else {
                self.walk = Some(j + 1);
                return Some(j + 1);
            }
        }
        // 5. Over budget? (vLLM 381-450: think_count + len(spec) + 1 > budget, spec empty.)
        self.prev_len = len;
        let (inside, count) = self.think_count(len, ks);
        if inside && count + 1 > self.budget {
            self.walk = Some(0);
            return Some(0);
        }
        if !inside {
            // Natural end: the markers are never searched again (only a forced end resets
            // them), so this request can never be forced again.
            self.done = true;
        }
        None
    }
}

/// The logit written to force a token (vLLM `_apply_forcing_to_logits`).
pub const FORCE_LOGIT: f32 = 1e9;

impl<H> HasBuffers for ThinkingState<H> {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        self.triples
            .visit_as(["thinking.rows", "thinking.cols", "thinking.vals"], f);
    }
}

/// Thinking-budget state of every slot of the persistent batch.
pub struct ThinkingState<H> {
    table: SlotTable<Entry<H>>,
    start: Marker,
    end: Marker,
    forced: Vec<(usize, i64)>,
    /// `forced` as (row, token, 1e9) triples for the device, rewritten only when they change.
    triples: SparseRows<f32>,
    buf: Vec<i64>,
    placeholders: bool,
    /// The draft replay's saved entries and forced tokens (a draft may end thinking, or
    /// start the forced end, for good).
    saved: Vec<(usize, Option<Entry<H>>)>,
    saved_forced: Vec<(usize, i64)>,
}

impl<H: TokenHistory> ThinkingState<H> {
    /// `capacity` = max_num_seqs. Marker ids must lie in `[0, vocab_size)`.
    pub fn new(capacity: usize, vocab_size: usize, config: ThinkingConfig) -> Result<Self> {
        for (field, ids) in [
            ("reasoning_start_token_ids", &config.start_ids),
            ("reasoning_end_token_ids", &config.end_ids),
        ] {
            for &t in ids {
                check_config_token(field, t, vocab_size)?;
            }
        }
        Ok(ThinkingState {
            table: SlotTable::new(capacity),
            start: Marker::new(&config.start_ids),
            end: Marker::new(&config.end_ids),
            forced: Vec::with_capacity(capacity),
            triples: SparseRows::try_new(capacity, "max_num_seqs")?,
            buf: Vec::new(),
            placeholders: false,
            saved: Vec::new(),
            saved_forced: Vec::new(),
        })
    }

    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Requests with a thinking budget (vLLM `has_tracked_requests`).
    pub fn active(&self) -> usize {
        self.table.active()
    }

    /// Checks one request; `None` when it is not tracked.
    pub fn check(&self, index: usize, p: ThinkingParams<H>) -> Result<Option<Entry<H>>> {
        let budget = match p.budget {
            None => return Ok(None),
            Some(b) => match FIELDS[0].checked_int(index, b, None)? {
                -1 => return Ok(None),
                b => b,
            },
        };
        Ok(Some(Entry::new(
            budget,
            p.prompt.as_deref(),
            p.output,
            &self.start,
            &self.end,
        )))
    }

    /// Applies a batch change: everything is validated first, so a rejected update changes
    /// nothing. Returns whether any slot's state changed. The forced list is cleared: call
    /// [`step`](Self::step) next.
    pub fn update(&mut self, update: BatchUpdate<ThinkingParams<H>>) -> Result<bool> {
        update.validate(self.capacity())?;
        let update = update.try_map_added(|i, p| self.check(i, p))?;
        Ok(self.commit(update))
    }

    /// Applies an update whose entries were already checked (see [`update`](Self::update)).
    pub fn commit(&mut self, update: BatchUpdate<Option<Entry<H>>>) -> bool {
        self.forced.clear();
        self.table.apply_validated(update)
    }

    /// Rewrites the device triples from `forced` if they changed; returns whether they did.
    pub fn sync_triples(&mut self) -> bool {
        let same = self.forced.len() == self.triples.len()
            && self.forced.iter().enumerate().all(|(i, &(row, tok))| {
                self.triples.rows().get(i) as usize == row
                    && self.triples.cols().get(i) as i64 == tok
            });
        if same {
            return false;
        }
        let triples = self
            .forced
            .iter()
            .map(|&(row, tok)| (row, tok as i32, FORCE_LOGIT));
        self.triples.rebuild(triples, Padding::RepeatFirst);
        true
    }

    /// The forced (row, token, 1e9) triples as last synced.
    pub fn triples(&self) -> &SparseRows<f32> {
        &self.triples
    }

    /// One engine step: reads the new output tokens of every tracked request in rows
    /// `< batch_size`, advances its state, and records the tokens to force. Returns how many
    /// rows are forced. Call it once per step, after the step's update (if any) and after async
    /// placeholders were replaced.
    pub fn step(&mut self, batch_size: usize, store: &H::Store) -> usize {
        self.forced.clear();
        self.placeholders = false;
        if self.table.active() == 0 || self.end.len() == 0 {
            return 0; // an empty end list disables the budget (vLLM 253-257)
        }
        let mut cx = Ctx {
            start: &self.start,
            end: &self.end,
            buf: &mut self.buf,
            store,
            placeholders: false,
        };
        for (row, e) in self.table.iter_mut() {
            if row >= batch_size {
                break;
            }
            if let Some(j) = e.step(&mut cx) {
                self.forced.push((row, cx.end.ids[j]));
            }
        }
        self.placeholders = cx.placeholders;
        self.forced.len()
    }

    /// Steps again only the rows whose output grew past what the last step could read (an
    /// async placeholder was filled in since), keeping the other rows' forced tokens. Returns
    /// how many rows are forced. This is what the caller runs before applying when
    /// [`saw_placeholders`](crate::processor::ReadsHistory::saw_placeholders) is set.
    pub fn restep(&mut self, batch_size: usize, store: &H::Store) -> usize {
        let previous = std::mem::take(&mut self.forced);
        self.placeholders = false;
        if self.table.active() == 0 || self.end.len() == 0 {
            return 0;
        }
        let mut cx = Ctx {
            start: &self.start,
            end: &self.end,
            buf: &mut self.buf,
            store,
            placeholders: false,
        };
        for (row, e) in self.table.iter_mut() {
            if row >= batch_size {
                break;
            }
            let grew = e.output.token_at(store, e.read).is_some_and(|t| t >= 0);
            if grew {
                if let Some(j) = e.step(&mut cx) {
                    self.forced.push((row, cx.end.ids[j]));
                }
            } else if let Some(&kept) = previous.iter().find(|(r, _)| *r == row) {
                self.forced.push(kept);
            }
        }
        self.placeholders = cx.placeholders;
        self.forced.len()
    }

    /// The `(row, token)` pairs whose logit is set to 1e9 this step, in row order.
    pub fn forced(&self) -> &[(usize, i64)] {
        &self.forced
    }
}

/// Thinking in a pipeline.
pub type ThinkingTable = TripleTable<ThinkingState<HistoryId>>;

impl Table for ThinkingTable {
    fn name(&self) -> &str {
        ThinkingState::NAME
    }

    fn check(&self, index: usize, fields: &mut Fields, a: Admission) -> Result<processor::Entry> {
        let p = ThinkingParams {
            budget: fields.opt_int(&FIELDS[0]),
            prompt: fields.prompt.clone(),
            output: a.history,
        };
        Ok(processor::entry(self.state.check(index, p)?))
    }

    fn commit(&mut self, update: BatchUpdate<processor::Entry>, ctx: &StepContext<'_>) {
        let s = &mut self.state;
        s.commit(processor::unbox(update));
        s.step(ctx.batch_size, ctx.store);
        s.sync_triples();
    }

    fn step(&mut self, ctx: &StepContext<'_>) {
        let s = &mut self.state;
        s.step(ctx.batch_size, ctx.store);
        s.sync_triples();
    }

    fn status(&self, out: &mut StatusSink<'_>) {
        self.status_into(out);
    }

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

impl ReadsHistory for ThinkingTable {
    /// The outputs this table reads at its next step (a request whose thinking ended
    /// naturally reads nothing any more).
    fn readers(&self, f: &mut dyn FnMut(&HistoryId)) {
        for (_, e) in self.state.table.iter().filter(|(_, e)| !e.done) {
            f(&e.output);
        }
    }

    fn wants_prompt(&self, fields: &Fields) -> bool {
        fields.is_set(&FIELDS[0])
    }

    /// Whether the last step stopped at an async placeholder in some output. A step that sees
    /// no new token leaves the state as it was, so the caller may step again once the engine
    /// has filled the placeholders in (as vLLM, whose holder runs after that).
    fn saw_placeholders(&self) -> bool {
        self.state.placeholders
    }

    fn restep(&mut self, ctx: &StepContext<'_>) {
        let s = &mut self.state;
        if s.placeholders {
            s.restep(ctx.batch_size, ctx.store);
            s.sync_triples();
        }
    }

    /// Keeps every entry and the forced tokens. Every entry, not only the drafted slots':
    /// vLLM's machine counts steps too (a block re-entered after a forced end searches for its
    /// end from the next step on), so the replay's steps move requests whose output did not
    /// grow.
    fn draft_save(&mut self, _slots: &[usize]) {
        let s = &mut self.state;
        s.saved.clear();
        for (slot, e) in s.table.iter() {
            s.saved.push((slot, Some(e.clone())));
        }
        s.saved_forced.clone_from(&s.forced);
    }

    /// Puts back what [`draft_save`](ReadsHistory::draft_save) kept, with the triples.
    fn draft_restore(&mut self, _ctx: &StepContext<'_>) {
        let s = &mut self.state;
        for (slot, e) in s.saved.drain(..) {
            s.table.replace(slot, e);
        }
        std::mem::swap(&mut s.forced, &mut s.saved_forced);
        s.sync_triples();
    }
}

impl TripleState for ThinkingState<HistoryId> {
    const NAME: &'static str = "thinking";
    const ADDS: bool = false;
    const ROW_BUFFERS: [&'static str; 3] = [
        "rows.thinking.rows",
        "rows.thinking.cols",
        "rows.thinking.vals",
    ];

    fn triples(&self) -> &SparseRows<f32> {
        &self.triples
    }
}

/// Builds the table for a pipeline (the registry's entry).
pub fn build(b: &Build<'_>) -> Result<Box<dyn Table>> {
    let Some(t) = b.cfg.thinking.clone() else {
        return Err(Error::Config {
            field: "thinking",
            message: "the thinking budget needs the reasoning start and end ids".into(),
        });
    };
    let state = ThinkingState::new(b.capacity, b.vocab_size, t)?;
    Ok(Box::new(ThinkingTable::try_new(
        state,
        b.row_space(1),
        None,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Move;
    use crate::history::SharedHistory;

    const S: i64 = 1; // <think>
    const E: i64 = 2; // </think>

    fn cfg(start: &[i64], end: &[i64]) -> ThinkingConfig {
        ThinkingConfig {
            start_ids: start.to_vec(),
            end_ids: end.to_vec(),
        }
    }

    fn params(
        budget: Option<i64>,
        prompt: Option<&[i64]>,
        out: &SharedHistory,
    ) -> ThinkingParams<SharedHistory> {
        ThinkingParams {
            budget,
            prompt: prompt.map(<[i64]>::to_vec),
            output: out.clone(),
        }
    }

    fn state(start: &[i64], end: &[i64]) -> ThinkingState<SharedHistory> {
        ThinkingState::new(8, 100, cfg(start, end)).unwrap()
    }

    fn add(
        s: &mut ThinkingState<SharedHistory>,
        bs: usize,
        added: Vec<(usize, ThinkingParams<SharedHistory>)>,
    ) {
        let mut u = BatchUpdate::new(bs);
        u.added = added;
        s.update(u).unwrap();
    }

    fn push(h: &SharedHistory, t: i64) {
        h.write().unwrap().push(t);
    }

    /// Drives one request at row 0 with a model that emits `script` tokens but always obeys a
    /// forced token (consuming nothing from the script that step). Returns the forced token per
    /// step (`None` = free) and the final output.
    fn drive(
        s: &mut ThinkingState<SharedHistory>,
        out: &SharedHistory,
        script: &[i64],
        steps: usize,
    ) -> Vec<Option<i64>> {
        let mut script = script.iter().copied();
        let mut forced = Vec::new();
        for _ in 0..steps {
            s.step(1, &());
            let f = s.forced().first().map(|&(r, t)| {
                assert_eq!(r, 0);
                t
            });
            forced.push(f);
            match f {
                Some(t) => push(out, t),
                None => push(out, script.next().unwrap_or(50)),
            }
        }
        forced
    }

    #[test]
    fn budget_counts_tokens_after_the_start_marker() {
        let mut s = state(&[S], &[E]);
        let out = SharedHistory::default();
        add(&mut s, 1, vec![(0, params(Some(3), Some(&[7, 8]), &out))]);
        // 9 9 <think> a b c -> forced </think>, then free again.
        let f = drive(&mut s, &out, &[9, 9, S, 10, 11, 12, 13, 14, 15], 9);
        assert_eq!(
            f,
            vec![None, None, None, None, None, None, Some(E), None, None]
        );
        assert_eq!(*out.read().unwrap(), vec![9, 9, S, 10, 11, 12, E, 13, 14]);
    }

    #[test]
    fn budget_zero_forces_right_after_the_start_marker() {
        let mut s = state(&[S], &[E]);
        let out = SharedHistory::default();
        add(&mut s, 1, vec![(0, params(Some(0), None, &out))]);
        let f = drive(&mut s, &out, &[S, 10, 11], 4);
        assert_eq!(f, vec![None, Some(E), None, None]);
    }

    #[test]
    fn multi_token_markers_across_steps() {
        // start = [3, 4], end = [5, 6]; the start marker arrives over two steps.
        let mut s = state(&[3, 4], &[5, 6]);
        let out = SharedHistory::default();
        add(&mut s, 1, vec![(0, params(Some(2), None, &out))]);
        let f = drive(&mut s, &out, &[3, 3, 4, 10, 11, 12, 13], 9);
        // output: 3 3 4 10 11 | 5 6 | 12 13
        assert_eq!(
            f,
            vec![None, None, None, None, None, Some(5), Some(6), None, None]
        );
        assert_eq!(*out.read().unwrap(), vec![3, 3, 4, 10, 11, 5, 6, 12, 13]);
    }

    #[test]
    fn forced_walk_advances_whatever_comes_out_after_the_first_token() {
        let mut s = state(&[S], &[5, 6, 7]);
        let out = SharedHistory::default();
        add(&mut s, 1, vec![(0, params(Some(1), None, &out))]);
        for t in [S, 10] {
            s.step(1, &());
            assert!(s.forced().is_empty());
            push(&out, t);
        }
        s.step(1, &());
        assert_eq!(s.forced(), &[(0, 5)]);
        push(&out, 5);
        s.step(1, &());
        assert_eq!(s.forced(), &[(0, 6)]);
        push(&out, 99); // the model ignored the forced 6: vLLM does not check it
        s.step(1, &());
        assert_eq!(s.forced(), &[(0, 7)]);
        // a step in which the output did not grow forces the same token again
        s.step(1, &());
        assert_eq!(s.forced(), &[(0, 7)]);
        push(&out, 7);
        s.step(1, &());
        assert!(s.forced().is_empty()); // walk complete
    }

    #[test]
    fn first_forced_token_not_emitted_goes_back_to_thinking() {
        let mut s = state(&[S], &[5, 6]);
        let out = SharedHistory::default();
        add(&mut s, 1, vec![(0, params(Some(1), None, &out))]);
        for t in [S, 10] {
            s.step(1, &());
            push(&out, t);
        }
        s.step(1, &());
        assert_eq!(s.forced(), &[(0, 5)]);
        push(&out, 11); // not 5
        s.step(1, &());
        assert_eq!(s.forced(), &[(0, 5)]); // re-forced from the start of the walk
        push(&out, 5);
        s.step(1, &());
        assert_eq!(s.forced(), &[(0, 6)]);
    }

    #[test]
    fn natural_end_before_budget_is_never_forced_again() {
        let mut s = state(&[S], &[E]);
        let out = SharedHistory::default();
        add(&mut s, 1, vec![(0, params(Some(3), None, &out))]);
        // <think> a </think> ... <think> (ignored: markers are not searched after a natural end)
        let mut script = vec![S, 10, E, 11, S];
        script.extend([12; 20]);
        let f = drive(&mut s, &out, &script, 25);
        assert!(f.iter().all(Option::is_none));
    }

    #[test]
    fn reentry_after_a_forced_end_is_closed_at_once() {
        let mut s = state(&[S], &[E]);
        let out = SharedHistory::default();
        add(&mut s, 1, vec![(0, params(Some(1), None, &out))]);
        let f = drive(&mut s, &out, &[S, 10, 11, 12, S, 13, 14], 10);
        // S 10 | E | 11 12 S | E | 13 14 ..
        assert_eq!(
            f,
            vec![
                None,
                None,
                Some(E),
                None,
                None,
                None,
                Some(E),
                None,
                None,
                None
            ]
        );
    }

    #[test]
    fn prompt_already_inside_thinking() {
        let mut s = state(&[S], &[E]);
        let out = SharedHistory::default();
        // prompt: ... <think> x y  -> 2 thinking tokens already, budget 4
        add(
            &mut s,
            1,
            vec![(0, params(Some(4), Some(&[E, 9, S, 20, 21]), &out))],
        );
        let f = drive(&mut s, &out, &[10, 11, 12], 5);
        assert_eq!(f, vec![None, None, Some(E), None, None]);

        // exhausted within the prompt: the very first token is forced
        let mut s = state(&[S], &[E]);
        let out = SharedHistory::default();
        add(
            &mut s,
            1,
            vec![(0, params(Some(2), Some(&[S, 20, 21]), &out))],
        );
        let f = drive(&mut s, &out, &[10, 11], 3);
        assert_eq!(f, vec![Some(E), None, None]);

        // the prompt's thinking section was closed: nothing to do
        let mut s = state(&[S], &[E]);
        let out = SharedHistory::default();
        add(
            &mut s,
            1,
            vec![(0, params(Some(0), Some(&[S, 20, E]), &out))],
        );
        let f = drive(&mut s, &out, &[10, 11], 3);
        assert!(f.iter().all(Option::is_none));
    }

    #[test]
    fn prompt_inside_thinking_with_multi_token_start_counts_like_vllm() {
        // vLLM quirk Q1: after init it counts len(start) - 1 fewer prompt tokens.
        let mut s = state(&[3, 4], &[E]);
        let out = SharedHistory::default();
        // 1 thinking token in the prompt, budget 3: exact would force after 2 more tokens,
        // vLLM forces after 3.
        add(
            &mut s,
            1,
            vec![(0, params(Some(3), Some(&[3, 4, 20]), &out))],
        );
        let f = drive(&mut s, &out, &[10, 11, 12, 13], 5);
        assert_eq!(f, vec![None, None, None, Some(E), None]);
    }

    #[test]
    fn end_marker_before_start_hides_the_natural_end() {
        // vLLM quirk Q2: the end marker is recorded once (here before the start), so the later
        // natural end is not seen and the budget still applies.
        let mut s = state(&[S], &[E]);
        let out = SharedHistory::default();
        add(&mut s, 1, vec![(0, params(Some(3), None, &out))]);
        let f = drive(&mut s, &out, &[E, S, 10, E, 11, 12, 13], 8);
        assert_eq!(f[..6], [None, None, None, None, None, Some(E)]);
    }

    #[test]
    fn empty_end_list_disables_and_empty_start_list_never_starts() {
        let mut s = state(&[S], &[]);
        let out = SharedHistory::default();
        add(&mut s, 1, vec![(0, params(Some(0), Some(&[S]), &out))]);
        assert_eq!(s.active(), 1);
        let f = drive(&mut s, &out, &[S, 10], 4);
        assert!(f.iter().all(Option::is_none));

        let mut s = state(&[], &[E]);
        let out = SharedHistory::default();
        add(&mut s, 1, vec![(0, params(Some(0), Some(&[S]), &out))]);
        let f = drive(&mut s, &out, &[S, 10], 4);
        assert!(f.iter().all(Option::is_none));
    }

    #[test]
    fn several_markers_in_one_step_record_the_last() {
        // vLLM records the last occurrence among the tokens of the step that found the first.
        let mut s = state(&[S], &[E]);
        let out = SharedHistory::default();
        add(&mut s, 1, vec![(0, params(Some(2), None, &out))]);
        out.write().unwrap().extend([S, 10, 11, S]);
        s.step(1, &());
        assert!(s.forced().is_empty()); // counted from the second <think>: 0 tokens
        push(&out, 12);
        s.step(1, &());
        assert!(s.forced().is_empty());
        push(&out, 13);
        s.step(1, &());
        assert_eq!(s.forced(), &[(0, E)]);
    }

    #[test]
    fn async_placeholders_are_not_consumed() {
        let mut s = state(&[S, 3], &[E]);
        let out = SharedHistory::default();
        add(&mut s, 1, vec![(0, params(Some(0), None, &out))]);
        out.write().unwrap().extend([S, -1]);
        s.step(1, &());
        assert!(s.forced().is_empty());
        out.write().unwrap()[1] = 3; // the placeholder is resolved to the marker's 2nd token
        s.step(1, &());
        assert_eq!(s.forced(), &[(0, E)]);
    }

    #[test]
    fn untracked_rows_and_rows_past_batch_size() {
        let mut s = state(&[S], &[E]);
        let (a, b, c) = (
            SharedHistory::default(),
            SharedHistory::default(),
            SharedHistory::default(),
        );
        add(
            &mut s,
            3,
            vec![
                (0, params(None, None, &a)),
                (1, params(Some(-1), None, &b)),
                (2, params(Some(0), Some(&[S]), &c)),
            ],
        );
        assert_eq!(s.active(), 1);
        assert_eq!(s.step(2, &()), 0); // row 2 is not in the batch
        assert_eq!(s.step(3, &()), 1);
        assert_eq!(s.forced(), &[(2, E)]);
    }

    #[test]
    fn swap_with_one_side_empty_moves_the_state() {
        let mut s = state(&[S], &[E]);
        let (a, b) = (SharedHistory::default(), SharedHistory::default());
        add(
            &mut s,
            2,
            vec![
                (0, params(Some(0), Some(&[S]), &a)),
                (1, params(None, None, &b)),
            ],
        );
        let mut u = BatchUpdate::new(2);
        u.moved = vec![Move::swap(0, 1)];
        assert!(s.update(u).unwrap());
        assert_eq!(s.active(), 1); // vLLM 0.25.1 would hold it at both rows
        s.step(2, &());
        assert_eq!(s.forced(), &[(1, E)]);
        // and back
        let mut u = BatchUpdate::new(2);
        u.moved = vec![Move::swap(1, 0)];
        s.update(u).unwrap();
        s.step(2, &());
        assert_eq!(s.forced(), &[(0, E)]);
    }

    #[test]
    fn unidirectional_move_discards_the_destination() {
        let mut s = state(&[S], &[E]);
        let (a, b) = (SharedHistory::default(), SharedHistory::default());
        // row 0: a finished request (stale state, forcing), row 2: an untracked request
        add(
            &mut s,
            3,
            vec![
                (0, params(Some(0), Some(&[S]), &a)),
                (2, params(None, None, &b)),
            ],
        );
        s.step(3, &());
        assert_eq!(s.forced(), &[(0, E)]);
        // condense: the untracked request moves 2 -> 0; row 0's stale state must go
        let mut u = BatchUpdate::new(1);
        u.moved = vec![Move::unidirectional(2, 0)];
        assert!(s.update(u).unwrap());
        assert_eq!(s.active(), 0);
        assert_eq!(s.step(1, &()), 0);

        // a tracked request moving onto an occupied row replaces it
        let mut s = state(&[S], &[E]);
        let (a, b) = (SharedHistory::default(), SharedHistory::default());
        add(
            &mut s,
            3,
            vec![
                (0, params(Some(5), Some(&[S]), &a)),
                (2, params(Some(0), Some(&[S]), &b)),
            ],
        );
        let mut u = BatchUpdate::new(1);
        u.moved = vec![Move::unidirectional(2, 0)];
        s.update(u).unwrap();
        assert_eq!(s.active(), 1);
        s.step(1, &());
        assert_eq!(s.forced(), &[(0, E)]);
    }

    #[test]
    fn rejected_update_changes_nothing() {
        let mut s = state(&[S], &[E]);
        let (a, b) = (SharedHistory::default(), SharedHistory::default());
        add(&mut s, 1, vec![(0, params(Some(0), Some(&[S]), &a))]);
        let mut u = BatchUpdate::new(2);
        u.added = vec![(0, params(None, None, &a)), (1, params(Some(-2), None, &b))];
        let err = s.update(u).unwrap_err();
        assert!(err.to_string().contains("thinking_token_budget"), "{err}");
        assert_eq!(s.active(), 1);
        s.step(1, &());
        assert_eq!(s.forced(), &[(0, E)]);
        // out-of-range index
        let mut u = BatchUpdate::new(1);
        u.removed = vec![8];
        assert!(s.update(u).is_err());
        assert_eq!(s.active(), 1);
    }

    #[test]
    fn config_ids_must_be_in_vocab() {
        assert!(ThinkingState::<SharedHistory>::new(4, 10, cfg(&[1], &[10])).is_err());
        assert!(ThinkingState::<SharedHistory>::new(4, 10, cfg(&[-1], &[2])).is_err());
        assert!(ThinkingState::<SharedHistory>::new(4, 10, cfg(&[], &[])).is_ok());
    }

    #[test]
    fn removed_output_tokens_are_rescanned() {
        let mut s = state(&[3, 4], &[E]);
        let out = SharedHistory::default();
        add(&mut s, 1, vec![(0, params(Some(0), None, &out))]);
        out.write().unwrap().extend([3, 9]);
        s.step(1, &());
        out.write().unwrap().truncate(1); // KV-load failure drops the 9
        s.step(1, &());
        push(&out, 4); // now 3 4: the start marker
        s.step(1, &());
        assert_eq!(s.forced(), &[(0, E)]);
    }

    #[test]
    fn kmp_finds_overlapping_and_self_overlapping_markers() {
        let m = Marker::new(&[1, 1, 2, 1, 1, 3]);
        let seq = [1, 1, 2, 1, 1, 2, 1, 1, 3, 0];
        let mut scan = Scan::default();
        // fed one token at a time, the occurrence at 3 completes at token 8
        let mut found = None;
        for chunk in seq.chunks(1) {
            if let Some(p) = m.feed(&mut scan, chunk) {
                found.get_or_insert(p);
            }
        }
        assert_eq!(found, Some(3));
        assert_eq!(m.last_in(&seq), Some(3));
        let m = Marker::new(&[7, 7]);
        let mut scan = Scan::default();
        assert_eq!(m.feed(&mut scan, &[7, 7, 7]), Some(1));
    }

    #[test]
    fn last_in_is_the_last_window_that_equals_the_marker() {
        let mut rng = 9u64;
        for case in 0..300 {
            let mut next = |m: u64| {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((rng >> 33) % m) as i64
            };
            let marker: Vec<i64> = (0..case % 5).map(|_| next(2)).collect();
            let seq: Vec<i64> = (0..case % 23).map(|_| next(2)).collect();
            let want = if marker.is_empty() || seq.len() < marker.len() {
                None
            } else {
                seq.windows(marker.len())
                    .rposition(|w| w == marker.as_slice())
            };
            assert_eq!(
                Marker::new(&marker).last_in(&seq),
                want,
                "{marker:?} in {seq:?}"
            );
        }
    }

    // ------------------------------------------------------------------------------------
    // Equivalence with a naive, rescanning model (a transcription of reference_thinking.py).

    struct Naive {
        tracked: bool,
        budget: i64,
        start: Vec<i64>,
        end: Vec<i64>,
        cont: bool,
        prompt_think: i64,
        scan_offset: usize,
        start_pos: Option<isize>, // -2: in the prompt
        end_pos: Option<usize>,
        walk: Option<usize>,
        prev_len: usize,
    }

    fn last_occ(seq: &[i64], pat: &[i64], lo: usize) -> Option<usize> {
        if pat.is_empty() || seq.len() < pat.len() {
            return None;
        }
        (lo..=seq.len() - pat.len())
            .rev()
            .find(|&i| seq[i..i + pat.len()] == *pat)
    }

    impl Naive {
        fn new(prompt: Option<&[i64]>, budget: Option<i64>, start: &[i64], end: &[i64]) -> Self {
            let tracked = !matches!(budget, None | Some(-1));
            let budget = budget.unwrap_or(-1);
            let mut n = Naive {
                tracked,
                budget,
                start: start.to_vec(),
                end: end.to_vec(),
                cont: false,
                prompt_think: 0,
                scan_offset: 0,
                start_pos: None,
                end_pos: None,
                walk: None,
                prev_len: 0,
            };
            if let Some(p) = prompt {
                let ls = last_occ(p, start, 0).map_or(-1, |x| x as i64);
                let le = last_occ(p, end, 0).map_or(-1, |x| x as i64);
                if ls > le {
                    let ks = start.len() as i64;
                    let tip = p.len() as i64 - (ls + ks);
                    n.cont = true;
                    n.prompt_think = tip - (ks - 1);
                    n.start_pos = Some(-2);
                    if tracked && budget - tip <= 0 {
                        n.walk = Some(0);
                    }
                }
            }
            n
        }

        fn step(&mut self, output: &[i64]) -> Option<i64> {
            let out: Vec<i64> = output.iter().copied().take_while(|&t| t >= 0).collect();
            if !self.tracked || self.end.is_empty() {
                return None;
            }
            let l = out.len();
            let o = self.scan_offset;
            if self.start_pos.is_none() {
                if let Some(s) = last_occ(&out, &self.start, o) {
                    self.start_pos = Some(s as isize);
                    if o > 0 {
                        self.walk = Some(0);
                        return Some(self.end[0]);
                    }
                }
            }
            if self.end_pos.is_none() {
                self.end_pos = last_occ(&out, &self.end, o);
            }
            let sp = self.start_pos?;
            if let Some(j) = self.walk {
                if l == 0 || l <= self.prev_len {
                    return Some(self.end[j]);
                }
                let newt = &out[self.prev_len.min(l)..l];
                self.prev_len = l;
                if j == 0 && !newt.contains(&self.end[0]) {
                    self.walk = None;
                } else if j + 1 >= self.end.len() {
                    self.walk = None;
                    self.scan_offset = l;
                    self.start_pos = None;
                    self.end_pos = None;
                    self.cont = false;
                    return None;
                } else {
                    self.walk = Some(j + 1);
                    return Some(self.end[j + 1]);
                }
            }
            self.prev_len = l;
            let (inside, count) = if self.cont {
                (self.end_pos.is_none(), l as i64 + self.prompt_think)
            } else {
                let s = sp as usize;
                match self.end_pos {
                    Some(e) if s <= e => (false, 0),
                    _ => (true, l as i64 - (s + self.start.len()) as i64),
                }
            };
            if inside && count + 1 > self.budget {
                self.walk = Some(0);
                return Some(self.end[0]);
            }
            None
        }
    }

    /// xorshift64*: deterministic, dependency-free.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn chance(&mut self, p: f64) -> bool {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
        }
        fn ids(&mut self, vocab: u64, lo: u64, hi: u64) -> Vec<i64> {
            let n = lo + self.below(hi - lo + 1);
            (0..n).map(|_| self.below(vocab) as i64).collect()
        }
    }

    #[test]
    fn matches_naive_rescanning_model_on_random_streams() {
        let (mut steps, mut forced_steps) = (0, 0);
        for seed in 1..=4000u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let vocab = 2 + rng.below(5);
            let min_start = u64::from(!rng.chance(0.05));
            let start = rng.ids(vocab, min_start, 3);
            let min_end = u64::from(!rng.chance(0.05));
            let end = rng.ids(vocab, min_end, 3);
            let budget = [
                None,
                Some(-1),
                Some(0),
                Some(1),
                Some(2),
                Some(3),
                Some(5),
                Some(8),
            ][rng.below(8) as usize];
            let prompt = if rng.chance(0.9) {
                let mut p = rng.ids(vocab, 0, 6);
                if rng.chance(0.5) {
                    p.extend(&start);
                    p.extend(rng.ids(vocab, 0, 4));
                }
                Some(p)
            } else {
                None
            };
            let vocab_ok = 16;
            let mut s: ThinkingState<SharedHistory> =
                ThinkingState::new(1, vocab_ok, cfg(&start, &end)).unwrap();
            let out = SharedHistory::default();
            add(
                &mut s,
                1,
                vec![(0, params(budget, prompt.as_deref(), &out))],
            );
            let mut naive = Naive::new(prompt.as_deref(), budget, &start, &end);
            let mut pending: Vec<i64> = Vec::new();
            for _ in 0..(10 + rng.below(70)) {
                s.step(1, &());
                let got = s.forced().first().map(|&(_, t)| t);
                let snapshot = out.read().unwrap().clone();
                let want = naive.step(&snapshot);
                assert_eq!(got, want, "seed {seed} output {snapshot:?}");
                steps += 1;
                forced_steps += usize::from(got.is_some());
                // the model: usually obeys, sometimes emits markers, random chunking,
                // occasional -1 placeholders resolved on the next step
                {
                    let mut o = out.write().unwrap();
                    if let Some(last) = o.last_mut() {
                        if *last == -1 {
                            *last = rng.below(vocab) as i64;
                        }
                    }
                }
                match want {
                    Some(t) if rng.chance(0.9) => pending.push(t),
                    _ => {
                        let x = rng.below(10);
                        if x == 0 {
                            pending.extend(&start);
                        } else if x == 1 {
                            pending.extend(&end);
                        } else {
                            pending.push(rng.below(vocab) as i64);
                        }
                    }
                }
                let r = rng.below(10);
                let n = if r == 0 {
                    0
                } else if r < 3 {
                    pending.len()
                } else {
                    1
                };
                let mut o = out.write().unwrap();
                o.extend(pending.drain(..n.min(pending.len())));
                if rng.chance(0.05) {
                    o.push(-1);
                }
            }
        }
        assert!(
            steps > 100_000 && forced_steps > 20_000,
            "{steps} {forced_steps}"
        );
    }
}

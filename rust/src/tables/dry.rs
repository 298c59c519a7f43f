//! DRY ("don't repeat yourself", llama.cpp `llama_sampler_dry_apply`, from koboldcpp #982): a
//! token that would extend a repetition of the sequence's own suffix is penalised, growing
//! exponentially with the repetition's length. Over the last `N = min(len, window)` tokens of
//! the sequence (the prompt, then the output): nothing while `N <= allowed_length`; the
//! repetition may not reach back past the most recent sequence breaker (`rep_limit`), and
//! nothing is penalised while `rep_limit < allowed_length`; for every earlier position `j` whose
//! match length `z(j)` (the longest suffix of the window that also ends at `j`, capped at
//! `rep_limit`) is at least `allowed_length`, the token after `j` gets the largest such length
//! `len`, and its logit loses `multiplier * base^(len - allowed_length)` (the exponent clamped
//! as llama.cpp does). A single-token breaker is never penalised.
//!
//! llama.cpp recomputes every match length each step (a reverse Z-algorithm, O(N)). Here each
//! request keeps, incrementally, an index of the positions of every `allowed_length`-gram in
//! the window, the positions whose match length is at least `allowed_length` (the candidates:
//! exactly the earlier occurrences of the last `allowed_length` tokens) with their lengths, and
//! the most recent breaker occurrence. A new token costs the candidates of the new suffix, not
//! the window: a step costs the same at any length for ordinary text, and at most O(N) (one
//! token repeated: every position is a candidate). A new request (or a rewritten output) indexes
//! its window at once: the match lengths by llama.cpp's Z-algorithm (`dry_matches.rs`) and the
//! breakers by one automaton (`dry_breakers.rs`), O(N) whatever the tokens; replaying the window
//! token by token would cost O(N) per token there, O(N²) in all.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::arena::{HasBuffers, Staged};
use crate::batch::BatchUpdate;
use crate::error::{Error, Result};
use crate::fields::Example as E;
use crate::fields::{FieldKind, FieldSpec, Fields, Range};
use crate::history::{HistoryId, TokenHistory};
use crate::limits::check_token;
use crate::processor::{
    self, Admission, HostApply, MapsRows, ReadsHistory, StatusSink, StepContext, Table,
};
use crate::sparse::{resize_touches_active, Padding, SparseRows};
use crate::table::SlotTable;
use crate::tables::dry_breakers::{Breakers, State, ROOT};
use crate::tables::dry_matches::suffix_matches;
use crate::tables::triples::{TripleState, TripleTable};
use crate::tables::Build;

/// Per-request caps (engine-config names) and their defaults: the longest window
/// (`dry_penalty_last_n = -1` takes it), the most breakers and the longest breaker read.
pub const CAPS: &[(&str, usize)] = &[
    ("max_dry_penalty_last_n", 8192),
    ("max_dry_sequence_breakers", 512),
    ("max_dry_sequence_breaker_len", 64),
];

/// A breaker's tail (after its head token) is cut to this many tokens, as llama.cpp does.
pub const MAX_BREAKER_TAIL: usize = 20;

/// llama.cpp's approximate `ln(f32::MAX)`, for the exponent clamp.
const FLOAT_MAX_LOG: f32 = 88.722_84;

/// The request fields DRY reads (`dry_multiplier` 0: off).
pub const FIELDS: &[FieldSpec] = &[
    FieldSpec::new("dry_multiplier", FieldKind::Float { neutral: 0.0 })
        .range(Range::at_least(0.0).note("(0: off)"))
        .examples(&[E::Float(0.8), E::Float(2.0)])
        .bad(&[E::Float(-1.0)]),
    FieldSpec::new("dry_base", FieldKind::Float { neutral: 1.75 })
        .range(Range::at_least(1.0))
        .tunes()
        .examples(&[E::Float(2.0), E::Float(1.5)])
        .bad(&[E::Float(0.5)]),
    FieldSpec::new("dry_allowed_length", FieldKind::Int { neutral: 2 })
        .range(Range::int_at_least(1))
        .tunes()
        .examples(&[E::Int(3), E::Int(1)])
        .bad(&[E::Int(0)]),
    FieldSpec::new("dry_penalty_last_n", FieldKind::Int { neutral: -1 })
        .range(
            Range::int_at_least(-1)
                .up_to_cap("max_dry_penalty_last_n")
                .note("(-1: the whole sequence up to the cap; 0: off)"),
        )
        .tunes()
        .examples(&[E::Int(16), E::Int(0), E::Int(4), E::Int(64), E::Int(256)])
        .bad(&[E::Int(-2)]),
    FieldSpec::new(
        "dry_sequence_breakers",
        FieldKind::IdLists {
            lists: "max_dry_sequence_breakers",
            len: "max_dry_sequence_breaker_len",
        },
    )
    .item("breaker")
    .tunes()
    .examples(&[
        E::IdLists(&[&[5]]),
        E::IdLists(&[&[3]]),
        E::IdLists(&[&[4, 5], &[7]]),
    ])
    .bad(&[E::IdLists(&[&[]])]),
];

/// One request's checked parameters.
#[derive(Clone, Debug)]
pub struct DryParams {
    pub multiplier: f32,
    pub base: f32,
    pub allowed: usize,
    /// The window: `dry_penalty_last_n`, or the cap for -1.
    pub window: usize,
    /// Breakers as token sequences (head, then the tail cut to [`MAX_BREAKER_TAIL`]).
    pub breakers: Vec<Vec<i64>>,
}

/// llama.cpp's clamp of the exponent (0: none): `floor(88.7228391 / ln(base))` when
/// `base > 1.000001`, in float32 (`ln` rounded from double, as the reference does).
pub fn max_exponent(base: f32) -> i32 {
    if base > 1.000_001_f32 {
        (FLOAT_MAX_LOG / ((base as f64).ln() as f32)) as i32
    } else {
        0
    }
}

/// The penalty of a repetition of length `len` (llama.cpp's step 4, its float32 and double
/// arithmetic: `multiplier * std::pow(base, exponent)`).
pub fn penalty(multiplier: f32, base: f32, allowed: usize, max_exp: i32, len: usize) -> f32 {
    let mut exp = (len - allowed) as i64;
    if max_exp > 0 && exp > max_exp as i64 {
        exp = max_exp as i64;
    }
    ((multiplier as f64) * (base as f64).powf(exp as f64)) as f32
}

/// One tracked request.
pub struct Entry<H> {
    p: DryParams,
    max_exp: i32,
    output: H,
    /// The breakers' automaton, and its state after the newest token read.
    breakers: Breakers,
    at: State,
    /// Heads of single-token breakers: never penalised.
    single: HashSet<i64>,
    /// The prompt, then the output tokens read so far (async placeholders never).
    seq: Vec<i64>,
    prompt_len: usize,
    /// Nothing before this position was looked at (after a rebuild: the window's start).
    origin: usize,
    /// The `allowed`-grams indexed start at positions `[lo, ..)`.
    lo: usize,
    /// By `allowed`-gram: the positions where it ends, ascending.
    grams: HashMap<Box<[i64]>, VecDeque<usize>>,
    /// The positions `j < last` whose match length is at least `allowed`, ascending, with that
    /// length (uncapped by the window's start, which is applied when read).
    cands: Vec<(usize, u32)>,
    spare: Vec<(usize, u32)>,
    /// The most recent breaker occurrence: its head's position and its longest tail.
    breaker: Option<(usize, usize)>,
    /// The draft replay's undo records, one per token pushed while it is on (`None`: off;
    /// a rebuild drops them, and the state then follows the history back by itself).
    journal: Option<Vec<Pushed>>,
}

/// What one pushed token changed, to take it back (the draft replay).
struct Pushed {
    lo: usize,
    /// The grams the window forgot (the oldest occurrence of each): `(start, end position)`.
    forgotten: Vec<(usize, usize)>,
    /// Whether the new suffix's gram was indexed.
    indexed: bool,
    cands: Vec<(usize, u32)>,
    breaker: Option<(usize, usize)>,
    at: State,
}

impl<H> Entry<H> {
    fn new(mut p: DryParams, prompt: Vec<i64>, output: H) -> Self {
        // The breakers live on as the automaton (and the single-token heads) only.
        let listed = std::mem::take(&mut p.breakers);
        let single = listed
            .iter()
            .filter(|b| b.len() == 1)
            .map(|b| b[0])
            .collect();
        let mut e = Entry {
            max_exp: max_exponent(p.base),
            breakers: Breakers::new(&listed),
            at: ROOT,
            p,
            output,
            single,
            prompt_len: prompt.len(),
            seq: prompt,
            origin: 0,
            lo: 0,
            grams: HashMap::new(),
            cands: Vec::new(),
            spare: Vec::new(),
            breaker: None,
            journal: None,
        };
        e.rebuild(e.seq.len());
        e
    }

    /// The window's first position.
    fn start(&self) -> usize {
        self.origin
            .max(self.seq.len().saturating_sub(self.p.window))
    }

    /// Drops the sequence back to `keep` tokens and indexes its window again (a new request,
    /// or the engine shrank or rewrote an output: rare), in O(window) whatever the tokens: the
    /// state `push` would reach from the window's start, its candidates from the Z-algorithm.
    fn rebuild(&mut self, keep: usize) {
        self.journal = None; // its records no longer apply
        self.seq.truncate(keep);
        let origin = keep.saturating_sub(self.p.window);
        let a = self.p.allowed;
        self.origin = origin;
        self.lo = origin;
        self.grams.clear();
        self.cands.clear();
        self.breaker = None;
        self.at = ROOT;
        // Every `a`-gram of the window, by where it ends, ascending.
        for end in origin + a..=keep {
            let key = &self.seq[end - a..end];
            match self.grams.get_mut(key) {
                Some(q) => q.push_back(end - 1),
                None => {
                    self.grams.insert(Box::from(key), VecDeque::from([end - 1]));
                }
            }
        }
        // The candidates: the earlier positions whose match length (within the window, as
        // `push` counts it from the window's start) is at least `a`.
        let z = suffix_matches(&self.seq[origin..keep]);
        let earlier = z.len().saturating_sub(1);
        for (i, &m) in z[..earlier].iter().enumerate() {
            if m as usize >= a {
                self.cands.push((origin + i, m));
            }
        }
        for last in origin..keep {
            self.note_breaker(last, origin);
        }
    }

    /// Feeds the token at `last` to the breakers' automaton and keeps the most recent breaker
    /// occurrence that ends there (with its head in the window, from `start`): the shortest
    /// breaker ending there has the most recent head; a longer tail at the head already kept
    /// lengthens it (llama.cpp takes the longest tail at the newest head).
    fn note_breaker(&mut self, last: usize, start: usize) {
        if self.breakers.is_empty() {
            return;
        }
        self.at = self.breakers.step(self.at, self.seq[last]);
        let l = self.breakers.shortest(self.at);
        if l == 0 || last + 1 < start + l {
            return; // none ends here, or its head is before the window
        }
        let (head, m) = (last + 1 - l, l - 1);
        self.breaker = match self.breaker {
            Some((h, k)) if h == head => Some((h, k.max(m))),
            Some((h, k)) if h > head => Some((h, k)),
            _ => Some((head, m)),
        };
    }

    fn push(&mut self, t: i64) {
        self.seq.push(t);
        let undo = self.journal.is_some().then(|| Pushed {
            lo: self.lo,
            forgotten: Vec::new(),
            indexed: false,
            cands: Vec::new(),
            breaker: self.breaker,
            at: self.at,
        });
        let undo = self.advance(self.seq.len() - 1, undo);
        if let (Some(j), Some(u)) = (&mut self.journal, undo) {
            j.push(u);
        }
    }

    /// Takes back the tokens pushed since the journal was turned on, newest first (O(their
    /// candidates), where a rebuild would index the whole window again), and turns it off.
    /// Nothing when a rebuild came in between (the state then follows the history back).
    fn undo_pushes(&mut self) {
        let Some(mut journal) = self.journal.take() else {
            return;
        };
        let a = self.p.allowed;
        while let Some(u) = journal.pop() {
            let len = self.seq.len();
            self.breaker = u.breaker;
            self.at = u.at;
            self.cands = u.cands;
            if u.indexed {
                let key = &self.seq[len - a..len];
                let q = self.grams.get_mut(key).expect("indexed by the push");
                q.pop_back();
                if q.is_empty() {
                    self.grams.remove(key);
                }
            }
            for &(s, end) in u.forgotten.iter().rev() {
                let key = &self.seq[s..s + a];
                match self.grams.get_mut(key) {
                    Some(q) => q.push_front(end),
                    None => {
                        self.grams.insert(Box::from(key), VecDeque::from([end]));
                    }
                }
            }
            self.lo = u.lo;
            self.seq.pop();
        }
    }

    /// Takes the token at position `last` (the sequence's last one). With `undo`, records what
    /// it changes there and returns it.
    fn advance(&mut self, last: usize, mut undo: Option<Pushed>) -> Option<Pushed> {
        let a = self.p.allowed;
        let len = last + 1;
        let start = self.origin.max(len.saturating_sub(self.p.window));
        // The grams that start before the window are forgotten (the oldest occurrence of each).
        while self.lo < start {
            let s = self.lo;
            if s + a <= last {
                let key = &self.seq[s..s + a];
                if let Some(q) = self.grams.get_mut(key) {
                    let end = q.pop_front();
                    if q.is_empty() {
                        self.grams.remove(key);
                    }
                    if let (Some(u), Some(end)) = (&mut undo, end) {
                        u.forgotten.push((s, end));
                    }
                }
            }
            self.lo += 1;
        }
        // The candidates of the new suffix: the earlier ends of its last `a` tokens; each
        // extends the candidate before it by one, or starts at `a`.
        self.spare.clear();
        if len >= start + a {
            let key = &self.seq[len - a..len];
            if !self.grams.contains_key(key) {
                self.grams.insert(Box::from(key), VecDeque::new());
            }
            let q = self.grams.get_mut(key).expect("inserted above");
            let old = &self.cands;
            let mut k = 0;
            for &j in q.iter() {
                while k < old.len() && old[k].0 + 1 < j {
                    k += 1;
                }
                let z = match old.get(k) {
                    Some(&(i, z)) if i + 1 == j => z + 1,
                    _ => a as u32,
                };
                self.spare.push((j, z));
            }
            q.push_back(last);
            if let Some(u) = &mut undo {
                u.indexed = true;
            }
        }
        std::mem::swap(&mut self.cands, &mut self.spare);
        if let Some(u) = &mut undo {
            u.cands.clone_from(&self.spare); // the candidates before this token
        }
        self.note_breaker(last, start);
        undo
    }

    /// Appends this request's `(token, penalty)` pairs (tokens below `vocab`) to `out`.
    fn penalties(&self, vocab: i64, scratch: &mut Scratch, out: &mut Vec<(i64, f32)>) {
        let a = self.p.allowed;
        let len = self.seq.len();
        let start = self.start();
        let n = len - start;
        if n <= a {
            return;
        }
        let last = len - 1;
        let rep_limit = match self.breaker {
            Some((h, m)) if h >= start => last - h - m,
            _ => n,
        };
        if rep_limit < a {
            return;
        }
        // Runs of candidates followed by the same token (all of them in a periodic stretch)
        // are reduced here before one write to the scratch.
        let mut run: Option<(i64, usize)> = None;
        for &(j, z) in &self.cands {
            let l = (z as usize).min(j + 1 - start).min(rep_limit);
            let t = self.seq[j + 1];
            match &mut run {
                Some((u, m)) if *u == t => *m = (*m).max(l),
                _ => {
                    if let Some((u, m)) = run {
                        scratch.keep_max(u, m);
                    }
                    run = (t < vocab).then_some((t, l));
                }
            }
        }
        if let Some((u, m)) = run {
            scratch.keep_max(u, m);
        }
        scratch.drain(|t, l| {
            if !self.single.contains(&t) {
                let p = penalty(self.p.multiplier, self.p.base, a, self.max_exp, l);
                out.push((t, p));
            }
        });
    }
}

/// The largest repeat length per token, for one row: a table indexed by token id (a step reads
/// every candidate, up to the whole window, so a hash per candidate would dominate it), with
/// the tokens it holds; negative ids (never in vLLM's vocabulary) in a map.
#[derive(Default)]
pub struct Scratch {
    best: Vec<u32>,
    held: Vec<i64>,
    negative: HashMap<i64, usize>,
}

impl Scratch {
    /// Keeps `len` (>= 1) for `t` if it is the largest so far.
    fn keep_max(&mut self, t: i64, len: usize) {
        if t < 0 {
            let b = self.negative.entry(t).or_insert(0);
            *b = (*b).max(len);
            return;
        }
        let i = t as usize;
        if i >= self.best.len() {
            self.best.resize(i + 1, 0); // grows to the largest id seen, below the vocabulary
        }
        let b = &mut self.best[i];
        if *b == 0 {
            self.held.push(t);
        }
        *b = (*b).max(len as u32);
    }

    /// Each token held with its largest length; empties the scratch.
    fn drain(&mut self, mut f: impl FnMut(i64, usize)) {
        for t in self.held.drain(..) {
            let b = std::mem::take(&mut self.best[t as usize]);
            f(t, b as usize);
        }
        for (t, l) in self.negative.drain() {
            f(t, l);
        }
    }
}

pub struct DryState<H> {
    table: SlotTable<Entry<H>>,
    triples: SparseRows<f32>,
    vocab_size: usize,
    max_window: usize,
    batch_size: usize,
    placeholders: bool,
    /// Scratch, reused every step.
    tail: Vec<i64>,
    best: Scratch,
    row: Vec<(i64, f32)>,
    out: Vec<(usize, i32, f32)>,
}

impl<H: TokenHistory> DryState<H> {
    /// Sizes: `max_window` the longest window (a row penalises fewer distinct tokens).
    pub fn try_new(capacity: usize, vocab_size: usize, max_window: usize) -> Result<Self> {
        let per_row = max_window.min(vocab_size).max(1);
        Ok(DryState {
            table: SlotTable::new(capacity),
            triples: SparseRows::try_new(capacity * per_row, "max_dry_penalty_last_n")?,
            vocab_size,
            max_window,
            batch_size: 0,
            placeholders: false,
            tail: Vec::new(),
            best: Scratch::default(),
            row: Vec::new(),
            out: Vec::new(),
        })
    }

    pub fn active(&self) -> usize {
        self.table.active()
    }

    pub fn triples(&self) -> &SparseRows<f32> {
        &self.triples
    }

    /// Checks one request's fields (as read: multiplier, base, allowed length, window,
    /// breakers). Off (`None`) when the multiplier or the window is 0.
    #[allow(clippy::too_many_arguments)]
    pub fn check(
        &self,
        index: usize,
        multiplier: f64,
        base: f64,
        allowed: i64,
        last_n: i64,
        breakers: Vec<Vec<i64>>,
        prompt: Option<&[i64]>,
        output: H,
    ) -> Result<Option<Entry<H>>> {
        let m32 = FIELDS[0].checked(index, multiplier)? as f32;
        let b32 = FIELDS[1].checked(index, base)? as f32;
        FIELDS[2].checked_int(index, allowed, None)?;
        FIELDS[3].checked_int(index, last_n, Some(self.max_window))?;
        let mut cut = Vec::with_capacity(breakers.len());
        for b in breakers {
            if b.is_empty() {
                return Err(Error::invalid(
                    index,
                    "dry_sequence_breakers",
                    "a sequence breaker is empty",
                ));
            }
            for &t in &b {
                check_token(index, "dry_sequence_breakers", t, self.vocab_size)?;
            }
            let keep = b.len().min(MAX_BREAKER_TAIL + 1);
            cut.push(b[..keep].to_vec());
        }
        let window = if last_n == -1 {
            self.max_window
        } else {
            last_n as usize
        };
        if m32 == 0.0 || window == 0 || allowed as u64 >= window as u64 {
            // Off, or never on: the window never holds more than `allowed_length` tokens.
            return Ok(None);
        }
        let p = DryParams {
            multiplier: m32,
            base: b32,
            allowed: allowed as usize,
            window,
            breakers: cut,
        };
        Ok(Some(Entry::new(p, prompt.unwrap_or(&[]).to_vec(), output)))
    }

    /// Applies a validated update, then the step's work.
    pub fn commit(&mut self, update: BatchUpdate<Option<Entry<H>>>, store: &H::Store) {
        let new_bs = update.batch_size;
        let mut changed = self.table.apply_validated(update);
        changed |= resize_touches_active(|i| self.table.get(i).is_some(), self.batch_size, new_bs);
        self.batch_size = new_bs;
        self.step(changed, store);
    }

    /// A step without a batch change: the new output tokens, then the penalties.
    pub fn update_none(&mut self, store: &H::Store) {
        self.step(false, store);
    }

    fn step(&mut self, changed: bool, store: &H::Store) {
        self.placeholders = false;
        if self.table.active() == 0 && !changed {
            return;
        }
        let (vocab, bs) = (self.vocab_size as i64, self.batch_size);
        let tail = &mut self.tail;
        let out = &mut self.out;
        out.clear();
        for (row, e) in self.table.iter_mut() {
            // Keep the output prefix the engine's list still holds.
            let len = e.output.len(store);
            let read = e.seq.len() - e.prompt_len;
            let keep = e.output.kept_prefix(store, &e.seq[e.prompt_len..]);
            if keep < read {
                e.rebuild(e.prompt_len + keep);
            }
            if len > keep {
                tail.clear();
                e.output.read_from(store, keep, tail);
                for &t in tail.iter() {
                    if t < 0 {
                        // An async placeholder: read on from here once the engine filled it.
                        self.placeholders = true;
                        break;
                    }
                    e.push(t);
                }
            }
            if row < bs {
                self.row.clear();
                e.penalties(vocab, &mut self.best, &mut self.row);
                self.row.sort_unstable_by_key(|&(t, _)| t);
                out.extend(self.row.iter().map(|&(t, p)| (row, t as i32, -p)));
            }
        }
        self.triples
            .rebuild_if_changed(out, Padding::FirstWithValue(-0.0));
    }
}

impl<H> HasBuffers for DryState<H> {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        self.triples
            .visit_as(["dry.rows", "dry.cols", "dry.vals"], f);
    }
}

/// DRY in a pipeline.
pub type DryTable = TripleTable<DryState<HistoryId>>;

impl Table for DryTable {
    fn name(&self) -> &str {
        DryState::NAME
    }

    fn check(&self, index: usize, fields: &mut Fields, a: Admission) -> Result<processor::Entry> {
        let multiplier = fields.float(&FIELDS[0]);
        let base = fields.float(&FIELDS[1]);
        let allowed = fields.int(&FIELDS[2]);
        let last_n = fields.int(&FIELDS[3]);
        let breakers = fields.take_id_lists(&FIELDS[4]);
        let entry = self.state.check(
            index,
            multiplier,
            base,
            allowed,
            last_n,
            breakers,
            fields.prompt.as_deref(),
            a.history,
        )?;
        Ok(processor::entry(entry))
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

impl ReadsHistory for DryTable {
    fn readers(&self, f: &mut dyn FnMut(&HistoryId)) {
        for (_, e) in self.state.table.iter() {
            f(&e.output);
        }
    }

    fn wants_prompt(&self, fields: &Fields) -> bool {
        fields.is_set(&FIELDS[0])
    }

    fn saw_placeholders(&self) -> bool {
        self.state.placeholders
    }

    /// The drafted slots record what each pushed token changes.
    fn draft_save(&mut self, slots: &[usize]) {
        for &s in slots {
            if let Some(e) = self.state.table.get_mut(s) {
                e.journal = Some(Vec::new());
            }
        }
    }

    /// Takes the drafts back from the drafted slots (their histories are back as committed),
    /// then the penalties of every row as at the step.
    fn draft_restore(&mut self, ctx: &StepContext<'_>) {
        for (_, e) in self.state.table.iter_mut() {
            e.undo_pushes();
        }
        DryState::step(&mut self.state, true, ctx.store);
    }
}

impl TripleState for DryState<HistoryId> {
    const NAME: &'static str = "dry";
    const ADDS: bool = true;
    const ROW_BUFFERS: [&'static str; 3] = ["rows.dry.rows", "rows.dry.cols", "rows.dry.vals"];
    const PADDING: Padding<f32> = Padding::FirstWithValue(-0.0);

    fn triples(&self) -> &SparseRows<f32> {
        &self.triples
    }
}

/// Builds the table for a pipeline (the registry's entry).
pub fn build(b: &Build<'_>) -> Result<Box<dyn Table>> {
    let window = b.cap("max_dry_penalty_last_n")?;
    let per_row = window.min(b.vocab_size).max(1);
    let state = DryState::try_new(b.capacity, b.vocab_size, window)?;
    Ok(Box::new(DryTable::try_new(
        state,
        b.row_space(per_row),
        None,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::SharedHistory;
    use std::sync::{Arc, RwLock};

    /// llama.cpp's `llama_sampler_dry_apply` on the last `window` tokens, transcribed (steps 1
    /// to 3, with its reverse Z-algorithm): token -> largest repeat length.
    fn llama_dry(
        seq: &[i64],
        window: usize,
        allowed: usize,
        breakers: &[Vec<i64>],
    ) -> Vec<(i64, usize)> {
        let w = &seq[seq.len().saturating_sub(window)..];
        let n = w.len();
        let rat = |i: usize| w[n - 1 - i];
        if n <= allowed {
            return Vec::new();
        }
        let mut rep_limit = n;
        for i in 0..n {
            let mut longest: i64 = -1;
            for b in breakers.iter().filter(|b| b[0] == rat(i)) {
                let tail = &b[1..];
                let sl = tail.len();
                if sl as i64 > longest && sl <= i && (0..sl).all(|o| tail[o] == rat(i - o - 1)) {
                    longest = sl as i64;
                }
            }
            if longest >= 0 {
                rep_limit = i - longest as usize;
                break;
            }
        }
        if rep_limit < allowed {
            return Vec::new();
        }
        let mut count = vec![0usize; n];
        let last = n - 1;
        let (mut rt, mut lt) = (0usize, 0usize);
        for k in 1..n {
            if k > rt {
                let mut m = 0;
                while m + k < n && rat(m) == rat(m + k) {
                    m += 1;
                }
                count[last - k] = m.min(rep_limit);
                if m > 0 {
                    lt = k;
                    rt = k + m - 1;
                }
            } else {
                let p = k - lt;
                let right = rt - k + 1;
                if count[last - p] < right {
                    count[last - k] = count[last - p].min(rep_limit);
                } else {
                    let mut i = rt + 1;
                    while i < n && rat(i) == rat(i - k) {
                        i += 1;
                    }
                    count[last - k] = (i - k).min(rep_limit);
                    lt = k;
                    rt = i - 1;
                }
            }
        }
        let mut best: HashMap<i64, usize> = HashMap::new();
        for (i, &c) in count.iter().enumerate().take(n - 1) {
            if c >= allowed {
                let t = rat(n - 2 - i);
                let e = best.entry(t).or_insert(0);
                *e = (*e).max(c);
            }
        }
        let single: HashSet<i64> = breakers
            .iter()
            .filter(|b| b.len() == 1)
            .map(|b| b[0])
            .collect();
        let mut out: Vec<(i64, usize)> = best
            .into_iter()
            .filter(|(t, _)| !single.contains(t))
            .collect();
        out.sort_unstable();
        out
    }

    fn lengths(e: &Entry<SharedHistory>) -> Vec<(i64, usize)> {
        // Invert the penalty (base 2, multiplier 1: penalty = 2^(len - allowed)).
        let mut best = Scratch::default();
        let mut out = Vec::new();
        e.penalties(1 << 40, &mut best, &mut out);
        let mut v: Vec<(i64, usize)> = out
            .into_iter()
            .map(|(t, p)| (t, p.log2().round() as usize + e.p.allowed))
            .collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn the_worked_example() {
        // a b c c b c y a b c: Z 0 0 3 1 0 2 0 0 0 0; c gets 3, b 1 (< 2: no), y 2.
        let seq = vec![1, 2, 3, 3, 2, 3, 9, 1, 2, 3];
        let want = llama_dry(&seq, 64, 2, &[]);
        assert_eq!(want, vec![(3, 3), (9, 2)]);
        let s: DryState<SharedHistory> = DryState::try_new(1, 16, 64).unwrap();
        let out: SharedHistory = Arc::new(RwLock::new(Vec::new()));
        let e = s
            .check(0, 1.0, 2.0, 2, -1, vec![], Some(&seq), out)
            .unwrap()
            .unwrap();
        assert_eq!(lengths(&e), want);
    }

    #[test]
    fn follows_llama_cpp_token_by_token() {
        let mut rng = 11u64;
        let mut next = |m: u64| {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((rng >> 33) % m) as i64
        };
        for case in 0..60 {
            let allowed = 1 + case % 4;
            let window = [5usize, 9, 16, 64][case / 4 % 4];
            let alphabet = 2 + (case % 3) as u64;
            let breakers: Vec<Vec<i64>> = match case % 5 {
                0 => vec![],
                1 => vec![vec![0]],
                2 => vec![vec![0, 1]],
                3 => vec![vec![1, 0, 1], vec![1], vec![2, 2]],
                _ => vec![vec![0, 1, 2], vec![0, 1]],
            };
            let s: DryState<SharedHistory> = DryState::try_new(1, 16, 64).unwrap();
            let out: SharedHistory = Arc::new(RwLock::new(Vec::new()));
            let mut e = s
                .check(
                    0,
                    1.0,
                    2.0,
                    allowed as i64,
                    window as i64,
                    breakers.clone(),
                    None,
                    out,
                )
                .unwrap()
                .unwrap();
            let mut seq = Vec::new();
            for step in 0..150 {
                let t = next(alphabet);
                seq.push(t);
                e.push(t);
                if step % 41 == 40 {
                    seq.truncate(seq.len() - 3);
                    e.rebuild(seq.len());
                }
                assert_eq!(
                    lengths(&e),
                    llama_dry(&seq, window, allowed, &breakers),
                    "case {case} step {step} seq {seq:?}"
                );
            }
        }
    }

    /// Adversarial windows admitted at once (the Z-algorithm path) and then stepped: one token
    /// repeated, two alternating, a period of three, long breakers made of the repeated token;
    /// the window sliding past the prompt. Each step equals llama.cpp's.
    #[test]
    fn admits_repetitive_windows_as_llama_cpp() {
        let patterns: [&[i64]; 4] = [&[5], &[5, 6], &[5, 6, 7], &[5, 5, 6]];
        let breaker_sets: [Vec<Vec<i64>>; 3] = [
            vec![],
            vec![vec![5; 21], vec![5; 4], vec![6, 5, 5]],
            vec![vec![7, 5], vec![6]],
        ];
        for (pi, pat) in patterns.iter().enumerate() {
            for (bi, breakers) in breaker_sets.iter().enumerate() {
                for &(prompt_len, window, allowed) in &[
                    (0usize, 16usize, 2usize),
                    (40, 16, 2),
                    (40, 64, 1),
                    (97, 64, 3),
                    (3, 8, 2),
                ] {
                    let gen = |i: usize| pat[i % pat.len()];
                    let mut seq: Vec<i64> = (0..prompt_len).map(gen).collect();
                    let s: DryState<SharedHistory> = DryState::try_new(1, 16, 64).unwrap();
                    let out: SharedHistory = Arc::new(RwLock::new(Vec::new()));
                    let mut e = s
                        .check(
                            0,
                            1.0,
                            2.0,
                            allowed as i64,
                            window as i64,
                            breakers.clone(),
                            Some(&seq),
                            out,
                        )
                        .unwrap()
                        .unwrap();
                    for step in 0..80 {
                        let case =
                            format!("pattern {pi} breakers {bi} prompt {prompt_len} step {step}");
                        assert_eq!(
                            lengths(&e),
                            llama_dry(&seq, window, allowed, breakers),
                            "{case}"
                        );
                        // Mostly the pattern, now and then a break in it.
                        let t = if step % 29 == 28 { 9 } else { gen(seq.len()) };
                        seq.push(t);
                        e.push(t);
                    }
                }
            }
        }
    }

    #[test]
    fn the_exponent_clamp_and_the_penalty() {
        assert_eq!(max_exponent(1.0), 0);
        assert_eq!(max_exponent(1.75), 158);
        assert_eq!(penalty(0.8, 1.75, 2, 158, 2), 0.8);
        assert_eq!(penalty(1.0, 1.5, 2, 3, 9), 1.5f32 * 1.5 * 1.5);
    }

    #[test]
    fn bad_fields_are_refused() {
        let s: DryState<SharedHistory> = DryState::try_new(1, 16, 64).unwrap();
        let out: SharedHistory = Arc::new(RwLock::new(Vec::new()));
        let err = |r: Result<Option<Entry<SharedHistory>>>| match r {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted"),
        };
        let e = err(s.check(3, -1.0, 1.75, 2, -1, vec![], None, out.clone()));
        assert!(e.contains("index 3") && e.contains("dry_multiplier"), "{e}");
        assert!(err(s.check(0, 1.0, 0.5, 2, -1, vec![], None, out.clone())).contains("dry_base"));
        assert!(err(s.check(0, 1.0, 1.75, 0, -1, vec![], None, out.clone()))
            .contains("dry_allowed_length"));
        assert!(err(s.check(0, 1.0, 1.75, 2, 65, vec![], None, out.clone()))
            .contains("dry_penalty_last_n"));
        assert!(err(s.check(0, 1.0, 1.75, 2, -2, vec![], None, out.clone()))
            .contains("dry_penalty_last_n"));
        assert!(
            err(s.check(0, 1.0, 1.75, 2, -1, vec![vec![]], None, out.clone()))
                .contains("dry_sequence_breakers")
        );
        assert!(
            err(s.check(0, 1.0, 1.75, 2, -1, vec![vec![16]], None, out.clone()))
                .contains("dry_sequence_breakers")
        );
        assert!(s
            .check(0, 0.0, 1.75, 2, -1, vec![], None, out.clone())
            .unwrap()
            .is_none());
        assert!(s
            .check(0, 1.0, 1.75, 2, 0, vec![], None, out)
            .unwrap()
            .is_none());
    }
}

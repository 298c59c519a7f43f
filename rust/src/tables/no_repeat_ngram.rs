//! No-repeat-ngram (HF transformers' `no_repeat_ngram_size`): a request with size `n` never
//! repeats an `n`-gram of its sequence, the prompt included. Each step, the tokens that followed
//! an earlier occurrence of the sequence's last `n − 1` tokens are banned (`n = 1` bans every
//! token seen); nothing is banned while the sequence is shorter than `n − 1`.
//!
//! HF rebuilds its n-gram map from the whole sequence every step. Here each request keeps the map
//! and updates it with the step's new tokens only, so a step costs the same at any length. The
//! map covers the last `max_no_repeat_ngram_window` tokens (an engine cap, 2,048 by default):
//! on a longer sequence the n-grams that start before that window are forgotten, which bounds
//! both the map and a row's bans. Up to that length the bans are exactly HF's.
//!
//! DeepSeek-OCR's rule (its `NGramPerReqLogitsProcessor`, vLLM PR #57540) is three more
//! per-request fields, each off by default (then the bans are HF's, bit for bit):
//! - `no_repeat_ngram_output_only`: the sequence is the output alone (the prompt is not read);
//! - `no_repeat_ngram_window` (0: the engine's `max_no_repeat_ngram_window`; else 1 to it):
//!   only n-grams that lie inside the sequence's last `w` tokens count;
//! - `no_repeat_ngram_whitelist`: token ids never banned.
//!
//! With all three set this is DeepSeek-OCR's rule exactly for `n >= 2`. For `n = 1` it bans
//! every token of the window (HF's meaning of a 1-gram); DeepSeek's code bans nothing there
//! (its prefix `output_ids[-0:]` is the whole output, which no 0-token prefix equals).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::OnceLock;

use crate::arena::{HasBuffers, Staged};
use crate::batch::BatchUpdate;
use crate::error::{Error, Result};
use crate::fields::Example as E;
use crate::fields::{FieldKind, FieldSpec, Fields, Range};
use crate::history::{HistoryId, TokenHistory};
use crate::processor::{
    self, Admission, HostApply, MapsRows, ReadsHistory, StatusSink, StepContext, Table,
};
use crate::sparse::{resize_touches_active, Padding, SparseRows};
use crate::table::SlotTable;
use crate::tables::triples::{TripleState, TripleTable};
use crate::tables::Build;

/// Per-request caps (engine-config names) and their defaults.
pub const CAPS: &[(&str, usize)] = &[
    ("max_no_repeat_ngram_size", 128),
    ("max_no_repeat_ngram_window", 2048),
    ("max_no_repeat_ngram_whitelist", 1024),
];

/// The request fields no-repeat-ngram reads (size 0: off; the others as in the module's doc).
pub const FIELDS: &[FieldSpec] = &[
    FieldSpec::new("no_repeat_ngram_size", FieldKind::Int { neutral: 0 })
        .range(
            Range::int_at_least(0)
                .up_to_cap("max_no_repeat_ngram_size")
                .note("(0: off)"),
        )
        .examples(&[E::Int(2), E::Int(1), E::Int(3)])
        .bad(&[E::Int(-1), E::Float(1.5), E::Str("2"), E::PowerOfTwo(70)]),
    FieldSpec::new("no_repeat_ngram_window", FieldKind::Int { neutral: 0 })
        .range(
            Range::int_at_least(0)
                .up_to_cap("max_no_repeat_ngram_window")
                .note("(0: the cap)"),
        )
        .tunes()
        .examples(&[E::Int(4), E::Int(16), E::Int(128)])
        .bad(&[E::Int(-1)]),
    FieldSpec::new("no_repeat_ngram_output_only", FieldKind::Bool)
        .tunes()
        .examples(&[E::Bool(true)]),
    FieldSpec::new(
        "no_repeat_ngram_whitelist",
        FieldKind::Ids {
            cap: "max_no_repeat_ngram_whitelist",
            factor: 1,
        },
    )
    .tunes()
    .examples(&[E::Ids(&[3]), E::Ids(&[1, 2])])
    .bad(&[E::Ids(&[-1])]),
];

/// One request's no-repeat-ngram settings beyond its size (all off: HF's rule).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Mode {
    /// `no_repeat_ngram_window` (0: the engine's window).
    pub window: i64,
    pub output_only: bool,
    pub whitelist: Vec<i64>,
}

/// The tokens that followed one `(n − 1)`-gram, with their counts. A gram can have up to a
/// window of distinct followers (`x r1 x r2 x r3 …`), so past [`SCAN`] of them a map finds one:
/// a search through the list would make counting a window quadratic in it.
#[derive(Default)]
struct Followers {
    list: Vec<(i64, u32)>,
    /// Token -> its place in `list`, once `list` has grown past [`SCAN`].
    at: Option<HashMap<i64, usize>>,
}

/// The followers a gram searches in its list before it keeps a map.
const SCAN: usize = 8;

impl Followers {
    fn find(&self, t: i64) -> Option<usize> {
        match &self.at {
            Some(at) => at.get(&t).copied(),
            None => self.list.iter().position(|&(x, _)| x == t),
        }
    }

    fn add(&mut self, t: i64) {
        if let Some(f) = self.find(t) {
            self.list[f].1 += 1;
            return;
        }
        self.list.push((t, 1));
        match &mut self.at {
            Some(at) => {
                at.insert(t, self.list.len() - 1);
            }
            None if self.list.len() > SCAN => {
                self.at = Some(
                    self.list
                        .iter()
                        .enumerate()
                        .map(|(k, &(x, _))| (x, k))
                        .collect(),
                );
            }
            None => {}
        }
    }

    fn sub(&mut self, t: i64) {
        let Some(f) = self.find(t) else {
            return;
        };
        self.list[f].1 -= 1;
        if self.list[f].1 > 0 {
            return;
        }
        self.list.swap_remove(f);
        if let Some(at) = &mut self.at {
            at.remove(&t);
            if let Some(&(moved, _)) = self.list.get(f) {
                at.insert(moved, f);
            }
        }
    }
}

/// One `(n − 1)`-gram seen in the window, and how often each token followed it there.
struct Gram {
    /// Where one occurrence starts in the sequence (the key's tokens, for comparing).
    start: usize,
    followers: Followers,
}

/// One tracked request.
pub struct Entry<H> {
    n: usize,
    /// The tokens the n-grams are taken from (the request's window, at most the engine's).
    window: usize,
    /// Token ids never banned (sorted, distinct).
    whitelist: Vec<i64>,
    output: H,
    /// The prompt, then the output tokens read so far (async placeholders never).
    seq: Vec<i64>,
    prompt_len: usize,
    /// The n-grams counted end at positions `[lo, seq.len())`.
    lo: usize,
    /// By hash of the `(n − 1)`-gram: the grams with that hash (compared by their tokens).
    grams: HashMap<u64, Vec<Gram>, BuildHasherDefault<IdHasher>>,
    /// The draft replay's undo records, one per token pushed while it is on (`None`: off):
    /// the window's start before the token, and whether its n-gram was a new gram.
    /// A truncation drops them (the state then follows the history back by itself).
    journal: Option<Vec<(usize, bool)>>,
}

impl<H> Entry<H> {
    fn new(n: usize, prompt: Vec<i64>, output: H, window: usize, whitelist: Vec<i64>) -> Self {
        let mut e = Entry {
            n,
            window,
            whitelist,
            output,
            prompt_len: prompt.len(),
            seq: Vec::new(),
            lo: 0,
            grams: HashMap::default(),
            journal: None,
        };
        for t in prompt {
            e.push(t, window);
        }
        e
    }

    /// SipHash with keys drawn once per process: with fixed keys a prompt could be made of
    /// grams whose hashes share the map's bucket bits (found offline), each insert then
    /// probing past all the others.
    fn key_hash(tokens: &[i64]) -> u64 {
        static KEYS: OnceLock<RandomState> = OnceLock::new();
        KEYS.get_or_init(RandomState::new).hash_one(tokens)
    }

    /// Counts (`delta` = +1) or uncounts (−1) the n-gram that ends at position `j`; returns
    /// whether its `(n − 1)`-gram was new (a gram entry was made for it).
    fn count(&mut self, j: usize, delta: i32) -> bool {
        let n = self.n;
        let key = &self.seq[j + 1 - n..j];
        let next = self.seq[j];
        let bucket = self.grams.entry(Self::key_hash(key)).or_default();
        let seq = &self.seq;
        let (k, new) = match bucket
            .iter()
            .position(|g| seq[g.start..g.start + n - 1] == *key)
        {
            Some(k) => (k, false),
            None => {
                bucket.push(Gram {
                    start: j + 1 - n,
                    followers: Followers::default(),
                });
                (bucket.len() - 1, true)
            }
        };
        let followers = &mut bucket[k].followers;
        if delta > 0 {
            followers.add(next);
        } else {
            followers.sub(next);
        }
        new
    }

    /// Appends a token and slides the window over the last `window` tokens.
    fn push(&mut self, t: i64, window: usize) {
        self.seq.push(t);
        let len = self.seq.len();
        let n = self.n;
        let new = len >= n && self.count(len - 1, 1);
        if let Some(j) = &mut self.journal {
            j.push((self.lo, new));
        }
        // The n-grams that start before the window's first token are forgotten.
        let lo = (len.saturating_sub(window) + n - 1).max(self.lo);
        for j in self.lo.max(n - 1)..lo.min(len) {
            self.count(j, -1);
        }
        self.lo = lo;
    }

    /// Takes back the tokens pushed since the journal was turned on, newest first (O(n) per
    /// token, where a truncation counts the whole window again), and turns it off.
    fn undo_pushes(&mut self) {
        let Some(mut journal) = self.journal.take() else {
            return;
        };
        let n = self.n;
        while let Some((lo, new)) = journal.pop() {
            let len = self.seq.len();
            for j in (lo.max(n - 1)..self.lo.min(len)).rev() {
                self.count(j, 1); // the n-grams the window forgot
            }
            if len >= n {
                self.count(len - 1, -1);
                if new {
                    // Its gram was made by this token: the last of its bucket, now empty.
                    let hash = Self::key_hash(&self.seq[len - n..len - 1]);
                    if let Some(bucket) = self.grams.get_mut(&hash) {
                        bucket.pop();
                        if bucket.is_empty() {
                            self.grams.remove(&hash);
                        }
                    }
                }
            }
            self.lo = lo;
            self.seq.pop();
        }
    }

    /// Drops the sequence back to `keep` tokens and counts its window again (the engine
    /// shrank or rewrote an output: rare).
    fn truncate(&mut self, keep: usize, window: usize) {
        self.journal = None; // its records no longer apply
        let tokens: Vec<i64> = self.seq.drain(..keep).collect();
        self.seq.clear();
        self.lo = 0;
        self.grams.clear();
        for t in tokens {
            self.push(t, window);
        }
    }

    /// The tokens banned next: the followers of the sequence's last `n − 1` tokens.
    fn banned(&self, window: usize) -> &[(i64, u32)] {
        let n = self.n;
        let len = self.seq.len();
        // HF: nothing while the (windowed) sequence is shorter than n − 1.
        if len.min(window) + 1 < n {
            return &[];
        }
        let key = &self.seq[len + 1 - n..];
        let seq = &self.seq;
        self.grams
            .get(&Self::key_hash(key))
            .and_then(|b| b.iter().find(|g| seq[g.start..g.start + n - 1] == *key))
            .map_or(&[], |g| g.followers.list.as_slice())
    }
}

pub struct NoRepeatNGramState<H> {
    table: SlotTable<Entry<H>>,
    triples: SparseRows<f32>,
    vocab_size: usize,
    max_n: usize,
    window: usize,
    batch_size: usize,
    placeholders: bool,
    /// Scratch, reused every step.
    tail: Vec<i64>,
    banned: Vec<(usize, i32, f32)>,
}

impl<H: TokenHistory> NoRepeatNGramState<H> {
    /// Sizes: `max_n` the largest n, `window` the tokens the n-grams are taken from.
    pub fn try_new(
        capacity: usize,
        vocab_size: usize,
        max_n: usize,
        window: usize,
    ) -> Result<Self> {
        let per_row = window.min(vocab_size).max(1);
        Ok(NoRepeatNGramState {
            table: SlotTable::new(capacity),
            triples: SparseRows::try_new(capacity * per_row, "max_no_repeat_ngram_window")?,
            vocab_size,
            max_n,
            window,
            batch_size: 0,
            placeholders: false,
            tail: Vec::new(),
            banned: Vec::new(),
        })
    }

    pub fn active(&self) -> usize {
        self.table.active()
    }

    pub fn triples(&self) -> &SparseRows<f32> {
        &self.triples
    }

    /// Checks one request's size: 0 (off) to the cap. The map starts from the prompt.
    pub fn check(
        &self,
        index: usize,
        n: i64,
        prompt: Option<&[i64]>,
        output: H,
    ) -> Result<Option<Entry<H>>> {
        self.check_mode(index, n, prompt, output, Mode::default())
    }

    /// As [`check`](Self::check), with the request's window, output-only flag and whitelist.
    pub fn check_mode(
        &self,
        index: usize,
        n: i64,
        prompt: Option<&[i64]>,
        output: H,
        mode: Mode,
    ) -> Result<Option<Entry<H>>> {
        FIELDS[0].checked_int(index, n, Some(self.max_n))?;
        FIELDS[1].checked_int(index, mode.window, Some(self.window))?;
        let mut whitelist = mode.whitelist;
        for &t in &whitelist {
            if t < 0 || t as u64 >= self.vocab_size as u64 {
                return Err(Error::invalid(
                    index,
                    "no_repeat_ngram_whitelist",
                    format!("token id {t} outside [0, {})", self.vocab_size),
                ));
            }
        }
        if n == 0 {
            return Ok(None);
        }
        whitelist.sort_unstable();
        whitelist.dedup();
        let window = match mode.window {
            0 => self.window,
            w => w as usize,
        };
        let prompt = match (mode.output_only, prompt) {
            (false, Some(p)) => p.to_vec(),
            _ => Vec::new(),
        };
        Ok(Some(Entry::new(
            n as usize, prompt, output, window, whitelist,
        )))
    }

    /// Applies a validated update, then the step's work.
    pub fn commit(&mut self, update: BatchUpdate<Option<Entry<H>>>, store: &H::Store) {
        let new_bs = update.batch_size;
        let mut changed = self.table.apply_validated(update);
        changed |= resize_touches_active(|i| self.table.get(i).is_some(), self.batch_size, new_bs);
        self.batch_size = new_bs;
        self.step(changed, store);
    }

    /// A step without a batch change: the new output tokens, then the bans.
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
        let banned = &mut self.banned;
        banned.clear();
        for (row, e) in self.table.iter_mut() {
            // Keep the output prefix the engine's list still holds.
            let len = e.output.len(store);
            let read = e.seq.len() - e.prompt_len;
            let keep = e.output.kept_prefix(store, &e.seq[e.prompt_len..]);
            let window = e.window;
            if keep < read {
                e.truncate(e.prompt_len + keep, window);
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
                    e.push(t, window);
                }
            }
            if row < bs {
                for &(t, _) in e.banned(window) {
                    if t < vocab && e.whitelist.binary_search(&t).is_err() {
                        banned.push((row, t as i32, f32::NEG_INFINITY));
                    }
                }
            }
        }
        self.triples
            .rebuild_if_changed(banned, Padding::RepeatFirst);
    }
}

impl<H> HasBuffers for NoRepeatNGramState<H> {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        self.triples.visit_as(
            [
                "no_repeat_ngram.rows",
                "no_repeat_ngram.cols",
                "no_repeat_ngram.vals",
            ],
            f,
        );
    }
}

/// No-repeat-ngram in a pipeline.
pub type NoRepeatNGramTable = TripleTable<NoRepeatNGramState<HistoryId>>;

impl Table for NoRepeatNGramTable {
    fn name(&self) -> &str {
        NoRepeatNGramState::NAME
    }

    fn check(&self, index: usize, fields: &mut Fields, a: Admission) -> Result<processor::Entry> {
        let n = fields.int(&FIELDS[0]);
        let mode = Mode {
            window: fields.int(&FIELDS[1]),
            output_only: fields.bool(&FIELDS[2]),
            whitelist: fields.take_ids(&FIELDS[3]).unwrap_or_default(),
        };
        let prompt = fields.prompt.as_deref();
        let entry = self.state.check_mode(index, n, prompt, a.history, mode)?;
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

impl ReadsHistory for NoRepeatNGramTable {
    fn readers(&self, f: &mut dyn FnMut(&HistoryId)) {
        for (_, e) in self.state.table.iter() {
            f(&e.output);
        }
    }

    fn wants_prompt(&self, fields: &Fields) -> bool {
        fields.is_set(&FIELDS[0]) && !fields.bool(&FIELDS[2])
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
    /// then the bans of every row as at the step.
    fn draft_restore(&mut self, ctx: &StepContext<'_>) {
        for (_, e) in self.state.table.iter_mut() {
            e.undo_pushes();
        }
        NoRepeatNGramState::step(&mut self.state, true, ctx.store);
    }
}

impl TripleState for NoRepeatNGramState<HistoryId> {
    const NAME: &'static str = "no_repeat_ngram";
    const ADDS: bool = false;
    const ROW_BUFFERS: [&'static str; 3] = [
        "rows.no_repeat_ngram.rows",
        "rows.no_repeat_ngram.cols",
        "rows.no_repeat_ngram.vals",
    ];

    fn triples(&self) -> &SparseRows<f32> {
        &self.triples
    }
}

/// Builds the table for a pipeline (the registry's entry).
pub fn build(b: &Build<'_>) -> Result<Box<dyn Table>> {
    let max_n = b.cfg.cap("max_no_repeat_ngram_size");
    let window = b.cap("max_no_repeat_ngram_window")?;
    let per_row = window.min(b.vocab_size).max(1);
    let state = NoRepeatNGramState::try_new(b.capacity, b.vocab_size, max_n, window)?;
    Ok(Box::new(NoRepeatNGramTable::try_new(
        state,
        b.row_space(per_row),
        None,
    )?))
}

/// Hashes of token ids are already well mixed (SipHash, `key_hash`); the map's own hasher
/// passes them through.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::SharedHistory;
    use std::sync::{Arc, RwLock};

    /// HF's `_get_ngrams` + `_calc_banned_ngram_tokens` on one sequence, written plainly.
    fn hf_banned(seq: &[i64], n: usize) -> Vec<i64> {
        if seq.len() + 1 < n {
            return Vec::new();
        }
        let key = &seq[seq.len() + 1 - n..];
        let mut out: Vec<i64> = seq
            .windows(n)
            .filter(|w| &w[..n - 1] == key)
            .map(|w| w[n - 1])
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    fn state(window: usize) -> NoRepeatNGramState<SharedHistory> {
        NoRepeatNGramState::try_new(4, 64, 16, window).unwrap()
    }

    fn bans(s: &NoRepeatNGramState<SharedHistory>, row: usize) -> Vec<i64> {
        let mut out: Vec<i64> = s
            .triples()
            .triples()
            .into_iter()
            .filter(|&(r, _, _)| r as usize == row)
            .map(|(_, t, _)| t as i64)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    #[test]
    fn follows_hf_step_by_step_with_the_prompt() {
        let mut rng = 7u64;
        for n in 1..6 {
            let mut s = state(4096);
            let out: SharedHistory = Arc::new(RwLock::new(Vec::new()));
            let prompt = vec![1, 2, 3, 1, 2];
            let mut u = BatchUpdate::new(1);
            u.added = vec![(0, s.check(0, n as i64, Some(&prompt), out.clone()).unwrap())];
            s.commit(u, &());
            let mut seq = prompt.clone();
            for _ in 0..200 {
                assert_eq!(bans(&s, 0), hf_banned(&seq, n), "n={n} seq={seq:?}");
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let t = ((rng >> 33) % 5) as i64;
                out.write().unwrap().push(t);
                seq.push(t);
                s.update_none(&());
            }
        }
    }

    #[test]
    fn the_window_keeps_the_last_tokens() {
        let (n, window) = (3, 16);
        let mut s = state(window);
        let out: SharedHistory = Arc::new(RwLock::new(Vec::new()));
        let mut u = BatchUpdate::new(1);
        u.added = vec![(0, s.check(0, n as i64, None, out.clone()).unwrap())];
        s.commit(u, &());
        let mut seq = Vec::new();
        let mut rng = 3u64;
        for step in 0..300 {
            let tail = &seq[seq.len().saturating_sub(window)..];
            assert_eq!(bans(&s, 0), hf_banned(tail, n), "step {step}");
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let t = ((rng >> 33) % 4) as i64;
            out.write().unwrap().push(t);
            seq.push(t);
            if step % 37 == 36 {
                // The engine drops two tokens (rejected drafts): read back from there.
                out.write().unwrap().truncate(seq.len() - 2);
                seq.truncate(seq.len() - 2);
            }
            s.update_none(&());
        }
    }

    /// One token followed by many distinct ones (`0 r1 0 r2 …`): the gram `[0]` keeps more
    /// followers than [`SCAN`] (its map), which the sliding window and truncations take away.
    #[test]
    fn many_followers_of_one_gram() {
        for (n, window) in [(2, 60), (2, 4096), (3, 50)] {
            let mut s = state(window);
            let out: SharedHistory = Arc::new(RwLock::new(Vec::new()));
            let prompt: Vec<i64> = (1..30).flat_map(|r| [0, r]).collect();
            let mut u = BatchUpdate::new(1);
            u.added = vec![(0, s.check(0, n as i64, Some(&prompt), out.clone()).unwrap())];
            s.commit(u, &());
            let mut seq = prompt.clone();
            let mut rng = 5u64;
            for step in 0..400 {
                let tail = &seq[seq.len().saturating_sub(window)..];
                assert_eq!(
                    bans(&s, 0),
                    hf_banned(tail, n),
                    "n {n} window {window} step {step}"
                );
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let t = if step % 2 == 0 {
                    0
                } else {
                    1 + ((rng >> 33) % 40) as i64
                };
                out.write().unwrap().push(t);
                seq.push(t);
                if step % 53 == 52 {
                    let mut o = out.write().unwrap();
                    let keep = o.len() - 3;
                    o.truncate(keep);
                    seq.truncate(seq.len() - 3);
                }
                s.update_none(&());
            }
        }
    }

    /// DeepSeek-OCR's `NoRepeatNGramLogitsProcessor.__call__` on one output, written plainly.
    fn deepseek_banned(out: &[i64], n: usize, window: usize, whitelist: &[i64]) -> Vec<i64> {
        if out.len() < n {
            return Vec::new();
        }
        let prefix = &out[out.len() - (n - 1)..];
        let start = out.len().saturating_sub(window);
        let mut banned: Vec<i64> = (start..out.len() + 1 - n)
            .filter(|&i| &out[i..i + n - 1] == prefix)
            .map(|i| out[i + n - 1])
            .filter(|t| !whitelist.contains(t))
            .collect();
        banned.sort_unstable();
        banned.dedup();
        banned
    }

    #[test]
    fn output_only_window_and_whitelist_follow_deepseek_ocr() {
        let mut rng = 5u64;
        let mut next = |m: u64| {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 33) % m
        };
        for (n, window) in [(2, 4), (2, 100), (3, 3), (3, 7), (4, 16), (5, 2), (3, 16)] {
            let mut s = state(16);
            let out: SharedHistory = Arc::new(RwLock::new(Vec::new()));
            let whitelist = vec![1];
            let mode = Mode {
                window: window.min(16) as i64,
                output_only: true,
                whitelist: whitelist.clone(),
            };
            let prompt = vec![0, 1, 2, 0, 1];
            let e = s.check_mode(0, n as i64, Some(&prompt), out.clone(), mode);
            let mut u = BatchUpdate::new(1);
            u.added = vec![(0, e.unwrap())];
            s.commit(u, &());
            for step in 0..300 {
                let v = out.read().unwrap().clone();
                let want = deepseek_banned(&v, n, window.min(16), &whitelist);
                assert_eq!(bans(&s, 0), want, "n={n} w={window} step {step} {v:?}");
                {
                    let mut w = out.write().unwrap();
                    if step % 41 == 40 {
                        let k = w.len() - 3;
                        w.truncate(k); // rejected drafts
                    }
                    w.push(next(3) as i64);
                }
                s.update_none(&());
            }
        }
    }

    #[test]
    fn bad_modes_are_refused() {
        let s = state(8);
        let out: SharedHistory = Arc::new(RwLock::new(Vec::new()));
        for (mode, field) in [
            (
                Mode {
                    window: 9,
                    ..Mode::default()
                },
                "no_repeat_ngram_window",
            ),
            (
                Mode {
                    window: -1,
                    ..Mode::default()
                },
                "no_repeat_ngram_window",
            ),
            (
                Mode {
                    whitelist: vec![64],
                    ..Mode::default()
                },
                "no_repeat_ngram_whitelist",
            ),
            (
                Mode {
                    whitelist: vec![-1],
                    ..Mode::default()
                },
                "no_repeat_ngram_whitelist",
            ),
        ] {
            let e = match s.check_mode(2, 3, None, out.clone(), mode) {
                Err(e) => e.to_string(),
                Ok(_) => panic!("accepted"),
            };
            assert!(e.contains("index 2") && e.contains(field), "{e}");
        }
    }

    #[test]
    fn bad_sizes_are_refused_and_zero_is_off() {
        let s = state(64);
        let out: SharedHistory = Arc::new(RwLock::new(Vec::new()));
        assert!(s.check(3, -1, None, out.clone()).is_err());
        let e = match s.check(3, 17, None, out.clone()) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a size above the cap was accepted"),
        };
        assert!(
            e.contains("index 3") && e.contains("no_repeat_ngram_size"),
            "{e}"
        );
        assert!(s.check(0, 0, None, out).unwrap().is_none());
    }
}

//! Bad words: ban a word's last token when the output already ends with the rest of it.
//!
//! A single-token word is always banned; a longer word bans its last token only when the output
//! ends with its prefix, and is skipped while it is longer than the output plus one (vLLM
//! `bad_words.py`). Matching runs here over the tail of each live output list, once per step;
//! the result is a set of (row, token) pairs written to −inf.

use crate::arena::{HasBuffers, Staged};
use crate::batch::BatchUpdate;
use crate::error::{Error, Result};
use crate::fields::Example as E;
use crate::fields::{FieldKind, FieldSpec, Fields};
use crate::history::HistoryId;
use crate::history::TokenHistory;
use crate::limits::check_token;
use crate::processor::{
    self, Admission, HostApply, MapsRows, ReadsHistory, StatusSink, StepContext, Table,
};
use crate::sparse::{
    draft_offsets, rebuild_draft_rows, resize_touches_active, Padding, SparseRows,
};
use crate::table::SlotTable;
use crate::tables::triples::{TripleState, TripleTable};
use crate::tables::Build;

/// Per-request caps (engine-config names) and their defaults.
pub const CAPS: &[(&str, usize)] = &[("max_bad_words", 128), ("max_bad_word_len", 64)];

/// The request fields bad words read.
pub const FIELDS: &[FieldSpec] = &[FieldSpec::new(
    "bad_words",
    FieldKind::IdLists {
        lists: "max_bad_words",
        len: "max_bad_word_len",
    },
)
.from_attr("bad_words_token_ids")
.item("word")
.examples(&[E::IdLists(&[&[5], &[6, 7]])])];

pub struct BadWordsParams<H> {
    pub words: Vec<Vec<i64>>,
    pub output: H,
}

/// One tracked request (checked words and its output handle).
pub struct Entry<H> {
    words: Vec<Vec<i32>>,
    /// Longest prefix among the words: how much of the output tail matching needs.
    max_prefix: usize,
    output: H,
}

pub struct BadWordsState<H> {
    table: SlotTable<Entry<H>>,
    triples: SparseRows<f32>,
    vocab_size: usize,
    max_words: usize,
    max_word_len: usize,
    batch_size: usize,
    /// Slots with at least one multi-token word: their bans depend on the output.
    dynamic: usize,
    /// Some output tail ended in an async placeholder at the last match.
    placeholders: bool,
    tail: Vec<i64>,
    /// Scratch: this step's banned pairs.
    banned: Vec<(usize, i32, f32)>,
}

impl<H: TokenHistory> BadWordsState<H> {
    /// Caps: `max_words` words per request, each at most `max_word_len` tokens.
    pub fn new(capacity: usize, vocab_size: usize, max_words: usize, max_word_len: usize) -> Self {
        Self::try_new(capacity, vocab_size, max_words, max_word_len)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`new`](Self::new); a failed allocation is an error.
    pub fn try_new(
        capacity: usize,
        vocab_size: usize,
        max_words: usize,
        max_word_len: usize,
    ) -> Result<Self> {
        Ok(BadWordsState {
            table: SlotTable::new(capacity),
            triples: SparseRows::try_new(capacity * max_words, "max_bad_words")?,
            vocab_size,
            max_words,
            max_word_len,
            batch_size: 0,
            dynamic: 0,
            placeholders: false,
            tail: Vec::new(),
            banned: Vec::new(),
        })
    }

    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    pub fn active(&self) -> usize {
        self.table.active()
    }

    pub fn triples(&self) -> &SparseRows<f32> {
        &self.triples
    }

    pub fn check(&self, index: usize, p: BadWordsParams<H>) -> Result<Option<Entry<H>>> {
        if p.words.len() > self.max_words {
            return Err(Error::TooManyEntries {
                index,
                field: "bad_words",
                count: p.words.len(),
                cap: self.max_words,
            });
        }
        if p.words.is_empty() {
            return Ok(None);
        }
        let mut words = Vec::with_capacity(p.words.len());
        for w in p.words {
            if w.is_empty() {
                return Err(Error::invalid(index, "bad_words", "a bad word is empty"));
            }
            if w.len() > self.max_word_len {
                return Err(Error::TooManyEntries {
                    index,
                    field: "bad_words",
                    count: w.len(),
                    cap: self.max_word_len,
                });
            }
            let mut word = Vec::with_capacity(w.len());
            for t in w {
                word.push(check_token(index, "bad_words", t, self.vocab_size)?);
            }
            words.push(word);
        }
        let max_prefix = words.iter().map(|w| w.len() - 1).max().unwrap_or(0);
        Ok(Some(Entry {
            words,
            max_prefix,
            output: p.output,
        }))
    }

    /// Applies a batch change (validated first) and re-matches. Returns whether the banned
    /// pairs changed (were rebuilt).
    pub fn update(
        &mut self,
        update: BatchUpdate<BadWordsParams<H>>,
        store: &H::Store,
    ) -> Result<bool> {
        update.validate(self.capacity())?;
        let update = update.try_map_added(|i, p| self.check(i, p))?;
        Ok(self.commit(update, store))
    }

    /// Applies an update whose entries were already checked, and re-matches. Returns whether
    /// the banned pairs changed.
    pub fn commit(&mut self, update: BatchUpdate<Option<Entry<H>>>, store: &H::Store) -> bool {
        let new_bs = update.batch_size;
        let mut changed = self.table.apply_validated(update);
        changed |= resize_touches_active(|i| self.table.get(i).is_some(), self.batch_size, new_bs);
        self.batch_size = new_bs;
        if changed {
            self.dynamic = self.table.iter().filter(|(_, e)| e.max_prefix > 0).count();
        }
        self.step(changed, store)
    }

    /// A step without a batch change: re-match the words that depend on the output.
    pub fn update_none(&mut self, store: &H::Store) -> bool {
        self.step(false, store)
    }

    /// Speculative decoding (vLLM `apply_bad_words_with_drafts`): request `r` owns
    /// `num_draft[r]` consecutive logits rows; row `j` of it sees the output followed by the
    /// first `j` draft tokens `drafts[r][..j]`. Writes the banned (row, token, −inf) triples
    /// into `out` and returns how many logits rows the layout has.
    pub fn spec_decode_triples(
        &self,
        num_draft: &[usize],
        drafts: &[Vec<i64>],
        out: &mut SparseRows<f32>,
        store: &H::Store,
    ) -> Result<usize> {
        let (offsets, total) = draft_offsets(num_draft)?;
        let mut banned = Vec::new();
        let mut past: Vec<i64> = Vec::new();
        for (req, e) in self.table.iter() {
            if req >= num_draft.len() {
                break;
            }
            let draft = drafts.get(req).map(Vec::as_slice).unwrap_or(&[]);
            past.clear();
            e.output.read_tail(store, e.max_prefix, &mut past);
            let out_len = e.output.len(store);
            for j in 0..num_draft[req] {
                if j > 0 {
                    past.push(draft.get(j - 1).copied().unwrap_or(-1));
                }
                Self::match_words(&e.words, &past, out_len + j, offsets[req] + j, &mut banned);
                if banned.len() > out.capacity() {
                    break; // rejected below, before anything grows further
                }
            }
        }
        rebuild_draft_rows(out, banned)?;
        Ok(total)
    }

    /// Pushes the banned tokens for one logits row whose history ends with `tail` and has
    /// `history_len` tokens in all.
    fn match_words(
        words: &[Vec<i32>],
        tail: &[i64],
        history_len: usize,
        row: usize,
        banned: &mut Vec<(usize, i32, f32)>,
    ) {
        for w in words {
            let prefix = w.len() - 1;
            if w.len() > history_len + 1 {
                continue;
            }
            let matches = prefix == 0
                || (tail.len() >= prefix
                    && tail[tail.len() - prefix..]
                        .iter()
                        .zip(&w[..prefix])
                        .all(|(&a, &b)| a == b as i64));
            if matches {
                banned.push((row, w[prefix], f32::NEG_INFINITY));
            }
        }
    }

    fn step(&mut self, changed: bool, store: &H::Store) -> bool {
        self.placeholders = false;
        if !changed && self.dynamic == 0 {
            return false;
        }
        let bs = self.batch_size;
        let tail = &mut self.tail;
        let banned = &mut self.banned;
        banned.clear();
        for (row, e) in self.table.iter() {
            if row >= bs {
                break;
            }
            tail.clear();
            let out_len = e.output.len(store);
            if e.max_prefix > 0 {
                e.output.read_tail(store, e.max_prefix, tail);
                self.placeholders |= tail.iter().any(|&t| t < 0);
            }
            Self::match_words(&e.words, tail, out_len, row, banned);
        }
        // Only the triples that differ are written (most rows' bans last many steps).
        self.triples.assign(banned, Padding::RepeatFirst)
    }
}

impl<H> HasBuffers for BadWordsState<H> {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        self.triples
            .visit_as(["bad_words.rows", "bad_words.cols", "bad_words.vals"], f);
    }
}

/// BadWords in a pipeline.
pub type BadWordsTable = TripleTable<BadWordsState<HistoryId>>;

impl Table for BadWordsTable {
    fn name(&self) -> &str {
        BadWordsState::NAME
    }

    fn check(&self, index: usize, fields: &mut Fields, a: Admission) -> Result<processor::Entry> {
        let p = BadWordsParams {
            words: fields.take_id_lists(&FIELDS[0]),
            output: a.history,
        };
        Ok(processor::entry(self.state.check(index, p)?))
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

/// The draft replay steps bad words like any step and steps it once more to come back (the
/// defaults): its matches follow the histories.
impl ReadsHistory for BadWordsTable {
    /// The outputs this table reads at its next step: those with a multi-token word (a
    /// single-token word is banned whatever the output).
    fn readers(&self, f: &mut dyn FnMut(&HistoryId)) {
        for (_, e) in self.state.table.iter().filter(|(_, e)| e.max_prefix > 0) {
            f(&e.output);
        }
    }

    /// Whether the last match saw an async placeholder (-1) in an output tail: the engine
    /// fills those in before sampling, so the caller should match again then.
    fn saw_placeholders(&self) -> bool {
        self.state.placeholders
    }
}

impl TripleState for BadWordsState<HistoryId> {
    const NAME: &'static str = "bad_words";
    const ADDS: bool = false;
    const ROW_BUFFERS: [&'static str; 3] = [
        "rows.bad_words.rows",
        "rows.bad_words.cols",
        "rows.bad_words.vals",
    ];
    const DRAFT_BUFFERS: [&'static str; 3] = [
        "spec.bad_words.rows",
        "spec.bad_words.cols",
        "spec.bad_words.vals",
    ];

    fn triples(&self) -> &SparseRows<f32> {
        &self.triples
    }
}

/// Builds the table for a pipeline (the registry's entry).
pub fn build(b: &Build<'_>) -> Result<Box<dyn Table>> {
    let w = b.cap("max_bad_words")?;
    let l = b.cfg.cap("max_bad_word_len");
    if l == 0 || l > crate::limits::MAX_ELEMENTS {
        return Err(Error::TooLarge {
            field: "max_bad_word_len",
            value: l,
            max: crate::limits::MAX_ELEMENTS,
        });
    }
    let state = BadWordsState::try_new(b.capacity, b.vocab_size, w, l)?;
    Ok(Box::new(BadWordsTable::try_new(
        state,
        b.row_space(w),
        b.drafts(w),
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::SharedHistory;

    #[test]
    fn bans_by_prefix() {
        let out = SharedHistory::default();
        let mut s = BadWordsState::new(2, 20, 4, 4);
        let mut u = BatchUpdate::new(1);
        u.added = vec![(
            0,
            BadWordsParams {
                words: vec![vec![5], vec![1, 2, 3], vec![9, 9]],
                output: out.clone(),
            },
        )];
        assert!(s.update(u, &()).unwrap());
        // Output empty: [1,2,3] is longer than output+1 -> skipped; [9,9] too.
        assert_eq!(s.triples().triples(), vec![(0, 5, f32::NEG_INFINITY)]);
        out.write().unwrap().extend([1, 2]);
        assert!(s.update_none(&()));
        assert_eq!(
            s.triples()
                .triples()
                .iter()
                .map(|t| t.1)
                .collect::<Vec<_>>(),
            vec![5, 3]
        );
        out.write().unwrap().push(9);
        assert!(s.update_none(&()));
        assert_eq!(
            s.triples()
                .triples()
                .iter()
                .map(|t| t.1)
                .collect::<Vec<_>>(),
            vec![5, 9]
        );
        assert!(!s.update_none(&()));
    }

    #[test]
    fn rejects_empty_and_out_of_vocab() {
        let out = SharedHistory::default();
        let mut s = BadWordsState::new(2, 20, 4, 4);
        for words in [vec![vec![]], vec![vec![1, 20]]] {
            let mut u = BatchUpdate::new(1);
            u.added = vec![(
                0,
                BadWordsParams {
                    words,
                    output: out.clone(),
                },
            )];
            let e = s.update(u, &()).unwrap_err().to_string();
            assert!(e.contains("bad_words") && e.contains("index 0"), "{e}");
        }
        assert_eq!(s.active(), 0);
    }
}

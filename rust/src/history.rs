//! Access to a request's output tokens.
//!
//! Tables that read outputs (MinTokens, penalties, bad words, the thinking budget) keep a
//! handle per request and read through it with a *store*: the handle says which history, the
//! store holds it. The pipeline owns one [`HistoryStore`] for all its tables, so each step reads
//! plain memory, without a lock or a Python call per access; the handle is a [`HistoryId`].
//! Self-contained handles (a [`SharedHistory`], for tests and benches) use the unit store.

use std::sync::{Arc, RwLock};

pub trait TokenHistory {
    /// Where the tokens of this kind of handle live.
    type Store: ?Sized;

    /// Current number of output tokens (async placeholders included).
    fn len(&self, store: &Self::Store) -> usize;

    fn is_empty(&self, store: &Self::Store) -> bool {
        self.len(store) == 0
    }

    /// Appends tokens `[start, len)` to `out` (ids as i64: async placeholders are -1).
    fn read_from(&self, store: &Self::Store, start: usize, out: &mut Vec<i64>);

    /// The token at position `i`, if the history is that long.
    fn token_at(&self, store: &Self::Store, i: usize) -> Option<i64> {
        let mut one = Vec::new();
        self.read_from(store, i, &mut one);
        one.first().copied()
    }

    /// The first position whose token the last sync replaced (the engine truncated the list and
    /// regrew it, possibly to the same length); `usize::MAX` when nothing was replaced.
    fn rewritten_from(&self, _store: &Self::Store) -> usize {
        usize::MAX
    }

    /// How much of `seen` (the output tokens a table read before, oldest first) the history
    /// still holds as they were: the engine may have shrunk or rewritten its tail. Usually one
    /// token is compared.
    fn kept_prefix(&self, store: &Self::Store, seen: &[i64]) -> usize {
        let mut keep = seen
            .len()
            .min(self.len(store))
            .min(self.rewritten_from(store));
        while keep > 0 && self.token_at(store, keep - 1) != Some(seen[keep - 1]) {
            keep -= 1;
        }
        keep
    }

    /// Appends the last `n` tokens (fewer if the history is shorter) to `out`.
    fn read_tail(&self, store: &Self::Store, n: usize, out: &mut Vec<i64>) {
        let len = self.len(store);
        self.read_from(store, len.saturating_sub(n), out);
    }
}

/// A history shared between an engine and its processors, for Rust tests and benches.
pub type SharedHistory = Arc<RwLock<Vec<i64>>>;

impl TokenHistory for SharedHistory {
    type Store = ();

    fn len(&self, _: &()) -> usize {
        self.read().map(|v| v.len()).unwrap_or(0)
    }

    fn token_at(&self, _: &(), i: usize) -> Option<i64> {
        self.read().ok().and_then(|v| v.get(i).copied())
    }

    fn read_from(&self, _: &(), start: usize, out: &mut Vec<i64>) {
        if let Ok(v) = self.read() {
            if start < v.len() {
                out.extend_from_slice(&v[start..]);
            }
        }
    }
}

/// Where a list-fed history's tokens come from: the engine's live output list, which it
/// appends to every step (and, rarely, shrinks or rewrites at the tail).
pub trait HistorySource {
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The token at position `i < len` (−1 for an async placeholder); `None` for anything
    /// that is neither a token id nor a placeholder.
    fn token_at(&self, i: usize) -> Option<i64>;

    /// Brings a copy up to date ([`sync_history`]); a source may override it to set up its
    /// access once per history rather than once per token.
    fn sync_into(&self, tokens: &mut Vec<i64>, unresolved: &mut usize) -> SyncResult
    where
        Self: Sized,
    {
        sync_history(self, tokens, unresolved)
    }
}

impl HistorySource for SharedHistory {
    fn len(&self) -> usize {
        self.read().map(|v| v.len()).unwrap_or(0)
    }

    fn token_at(&self, i: usize) -> Option<i64> {
        self.read()
            .ok()
            .and_then(|v| v.get(i).copied())
            .filter(|&t| t >= -1)
    }
}

/// What a sync replaced (`Ok(first replaced position)`, `usize::MAX` if the copy only grew),
/// or the bad entry it stopped at (the copy then holds what came before it).
pub type SyncResult = std::result::Result<usize, BadEntry>;

/// An output-list entry no engine writes: at `pos`, neither a token id nor an async placeholder
/// (`after: None`), or a token after the placeholder at `after` (placeholders are only ever a
/// suffix: the engine appends one per step in flight and fills it in before it appends more).
/// `rewritten`: what the sync replaced in the copy before it stopped there (as `Ok`'s value),
/// for the caller to keep marked: the next sync compares against the copy as it is now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadEntry {
    pub pos: usize,
    pub after: Option<usize>,
    pub rewritten: usize,
}

impl std::fmt::Display for BadEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.after {
            None => write!(
                f,
                "position {} holds neither a token id nor an async placeholder (-1)",
                self.pos
            ),
            Some(first) => f.write_str(&token_after_placeholder(self.pos, first)),
        }
    }
}

/// The message for a token at `pos` after the async placeholder at `first`.
pub fn token_after_placeholder(pos: usize, first: usize) -> String {
    format!(
        "position {pos} holds a token after the async placeholder (-1) at position {first}: \
         placeholders are only ever a suffix of the output"
    )
}

/// Brings a copy of a source up to date, reading as little as possible. The copy keeps its
/// prefix up to the first position where it still held an async placeholder (`*unresolved`),
/// stepping back further while the source's token at the prefix's end differs (the engine
/// dropped or replaced tokens there); the rest is read again. Then `*unresolved` is the first
/// placeholder of the new copy (`usize::MAX`: none). One or two tokens are read per request and
/// step in the usual case, however long the output. Returns the first position whose token
/// was replaced (`usize::MAX` if the copy only grew).
///
/// The prefix is trusted by its last token: a list rewritten in the middle with its tail
/// unchanged is not noticed (engines only append, fill placeholders and truncate). A token read
/// after a placeholder is a [`BadEntry`] (placeholders are only ever a suffix).
pub fn sync_history(
    src: &impl HistorySource,
    tokens: &mut Vec<i64>,
    unresolved: &mut usize,
) -> SyncResult {
    let n = src.len();
    let mut keep = tokens.len().min(n).min(*unresolved);
    while keep > 0 && src.token_at(keep - 1) != Some(tokens[keep - 1]) {
        keep -= 1;
    }
    if keep == tokens.len() && keep == n {
        return Ok(usize::MAX);
    }
    let rewritten = if keep < tokens.len() {
        keep
    } else {
        usize::MAX
    };
    tokens.truncate(keep);
    *unresolved = usize::MAX;
    for i in keep..n {
        let Some(t) = src.token_at(i) else {
            return Err(BadEntry {
                pos: i,
                after: None,
                rewritten,
            });
        };
        if t < 0 {
            if *unresolved == usize::MAX {
                *unresolved = i;
            }
        } else if *unresolved != usize::MAX {
            // The kept prefix holds no placeholder (it ends at the first one at most).
            return Err(BadEntry {
                pos: i,
                after: Some(*unresolved),
                rewritten,
            });
        }
        tokens.push(t);
    }
    Ok(rewritten)
}

/// A request's history in a pipeline's [`HistoryStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryId(u32);

impl HistoryId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl TokenHistory for HistoryId {
    type Store = HistoryStore;

    #[inline]
    fn len(&self, store: &HistoryStore) -> usize {
        store.tokens(*self).len()
    }

    #[inline]
    fn token_at(&self, store: &HistoryStore, i: usize) -> Option<i64> {
        store.tokens(*self).get(i).copied()
    }

    #[inline]
    fn read_from(&self, store: &HistoryStore, start: usize, out: &mut Vec<i64>) {
        let t = store.tokens(*self);
        if start < t.len() {
            out.extend_from_slice(&t[start..]);
        }
    }

    #[inline]
    fn rewritten_from(&self, store: &HistoryStore) -> usize {
        store
            .rewritten
            .get(self.index())
            .copied()
            .unwrap_or(usize::MAX)
    }
}

/// Tokens a new history has room for before it first grows.
const MIN_HISTORY: usize = 64;

/// Most tokens of room a freed history keeps for reuse (32 KiB).
pub const KEPT_HISTORY: usize = 4096;

/// The output histories of a pipeline's requests, by id. Ids are recycled; a request keeps its
/// id while it moves between slots, so moves never copy tokens.
#[derive(Default)]
pub struct HistoryStore {
    slots: Vec<Vec<i64>>,
    free: Vec<u32>,
    /// By id: what the last sync replaced (see [`TokenHistory::rewritten_from`]).
    rewritten: Vec<usize>,
    any_rewritten: bool,
}

impl HistoryStore {
    #[inline]
    pub fn tokens(&self, id: HistoryId) -> &[i64] {
        &self.slots[id.index()]
    }

    #[inline]
    pub fn tokens_mut(&mut self, id: HistoryId) -> &mut Vec<i64> {
        &mut self.slots[id.index()]
    }

    /// Stores a new request's history; returns its id (a freed one first, whose memory is
    /// reused: a step's new tokens then rarely grow a history).
    pub fn install(&mut self, mut tokens: Vec<i64>) -> HistoryId {
        match self.free.pop() {
            Some(i) => {
                let slot = &mut self.slots[i as usize];
                if tokens.len() <= slot.capacity() {
                    slot.extend_from_slice(&tokens);
                } else {
                    *slot = tokens;
                }
                HistoryId(i)
            }
            None => {
                tokens.reserve(MIN_HISTORY);
                self.slots.push(tokens);
                HistoryId((self.slots.len() - 1) as u32)
            }
        }
    }

    /// Frees a history no table refers to any more (its memory is kept for the next one,
    /// up to [`KEPT_HISTORY`] tokens).
    pub fn release(&mut self, id: HistoryId) {
        let slot = &mut self.slots[id.index()];
        if slot.capacity() > KEPT_HISTORY {
            *slot = Vec::with_capacity(MIN_HISTORY);
        } else {
            slot.clear();
        }
        self.set_rewritten(id, usize::MAX);
        self.free.push(id.0);
    }

    /// Records what a sync replaced in history `id` (`usize::MAX`: nothing).
    pub fn set_rewritten(&mut self, id: HistoryId, from: usize) {
        let i = id.index();
        if i >= self.rewritten.len() {
            if from == usize::MAX {
                return;
            }
            self.rewritten.resize(i + 1, usize::MAX);
        }
        self.rewritten[i] = from;
        self.any_rewritten |= from != usize::MAX;
    }

    /// As [`set_rewritten`](Self::set_rewritten), keeping an earlier mark of the same
    /// history that no table has read yet (the lower position).
    pub fn mark_rewritten(&mut self, id: HistoryId, from: usize) {
        let current = self
            .rewritten
            .get(id.index())
            .copied()
            .unwrap_or(usize::MAX);
        self.set_rewritten(id, from.min(current));
    }

    /// Forgets what the last syncs replaced, once the tables have read past it (each
    /// replacement is consumed by exactly one step).
    pub fn clear_rewritten(&mut self) {
        if std::mem::take(&mut self.any_rewritten) {
            self.rewritten.fill(usize::MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_reads_only_what_changed() {
        let src: SharedHistory = Arc::new(RwLock::new(vec![1, 2, -1]));
        let (mut copy, mut unresolved) = (Vec::new(), usize::MAX);
        sync_history(&src, &mut copy, &mut unresolved).unwrap();
        assert_eq!((copy.clone(), unresolved), (vec![1, 2, -1], 2));
        src.write().unwrap()[2] = 7; // placeholder filled in
        src.write().unwrap().push(8);
        sync_history(&src, &mut copy, &mut unresolved).unwrap();
        assert_eq!((copy.clone(), unresolved), (vec![1, 2, 7, 8], usize::MAX));
        {
            let mut v = src.write().unwrap(); // shrink and regrow to the same length
            v.truncate(2);
            v.extend([5, 6]);
        }
        sync_history(&src, &mut copy, &mut unresolved).unwrap();
        assert_eq!(copy, vec![1, 2, 5, 6]);
        src.write().unwrap().truncate(1);
        sync_history(&src, &mut copy, &mut unresolved).unwrap();
        assert_eq!(copy, vec![1]);
        src.write().unwrap().extend([4, -7]);
        assert_eq!(
            sync_history(&src, &mut copy, &mut unresolved),
            Err(BadEntry {
                pos: 2,
                after: None,
                rewritten: usize::MAX
            })
        );
    }

    #[test]
    fn a_token_after_a_placeholder_is_a_bad_entry() {
        let src: SharedHistory = Arc::new(RwLock::new(vec![1, -1]));
        let (mut copy, mut unresolved) = (Vec::new(), usize::MAX);
        sync_history(&src, &mut copy, &mut unresolved).unwrap();
        src.write().unwrap().extend([-1, 3]);
        let e = sync_history(&src, &mut copy, &mut unresolved).unwrap_err();
        assert_eq!(
            e,
            BadEntry {
                pos: 3,
                after: Some(1),
                rewritten: 1
            }
        );
        assert!(e.to_string().contains("position 3"), "{e}");
        // Filled in, it reads on.
        src.write().unwrap()[1] = 2;
        src.write().unwrap()[2] = 2;
        sync_history(&src, &mut copy, &mut unresolved).unwrap();
        assert_eq!((copy, unresolved), (vec![1, 2, 2, 3], usize::MAX));
    }

    #[test]
    fn ids_are_recycled() {
        let mut s = HistoryStore::default();
        let a = s.install(vec![1, 2]);
        let b = s.install(vec![]);
        assert_ne!(a, b);
        s.release(a);
        assert_eq!(s.install(vec![5]), a);
        assert_eq!(s.tokens(a), &[5]);
        assert_eq!(a.len(&s), 1);
        assert_eq!(s.tokens(b), &[] as &[i64]);
    }
}

//! Access to a request's live output-token list.
//!
//! The engine appends to each request's output list every step; processors keep a handle to it
//! and re-read it (its length for min_tokens, its new tail for penalties and bad words). The core
//! is generic over the handle so it stays free of Python: the bindings implement this trait for
//! a Python list, tests for a shared `Vec`.

use std::sync::{Arc, RwLock};

pub trait TokenHistory {
    /// Current number of generated tokens.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends tokens `[start, len)` to `out` (ids as i64: async placeholders are -1).
    fn read_from(&self, start: usize, out: &mut Vec<i64>);

    /// The token at position `i`, if the history is that long.
    fn token_at(&self, i: usize) -> Option<i64> {
        let mut one = Vec::new();
        self.read_from(i, &mut one);
        one.first().copied()
    }

    /// Appends one token to a history the pipeline owns (the token feed); `false` for a
    /// history that only the engine writes (a live output list).
    fn push(&self, _token: i64) -> bool {
        false
    }

    /// Whether [`push`](Self::push) appends (the history is owned by the pipeline).
    fn can_push(&self) -> bool {
        false
    }

    /// Appends the last `n` tokens (fewer if the history is shorter) to `out`.
    fn read_tail(&self, n: usize, out: &mut Vec<i64>) {
        let len = self.len();
        self.read_from(len.saturating_sub(n), out);
    }
}

/// A history shared between an engine and its processors, for Rust tests and benches.
pub type SharedHistory = Arc<RwLock<Vec<i64>>>;

impl TokenHistory for SharedHistory {
    fn len(&self) -> usize {
        self.read().map(|v| v.len()).unwrap_or(0)
    }

    fn token_at(&self, i: usize) -> Option<i64> {
        self.read().ok().and_then(|v| v.get(i).copied())
    }

    fn can_push(&self) -> bool {
        true
    }

    fn push(&self, token: i64) -> bool {
        match self.write() {
            Ok(mut v) => {
                v.push(token);
                true
            }
            Err(_) => false,
        }
    }

    fn read_from(&self, start: usize, out: &mut Vec<i64>) {
        if let Ok(v) = self.read() {
            if start < v.len() {
                out.extend_from_slice(&v[start..]);
            }
        }
    }
}

//! `TokenHistory` for the bindings: a live Python output list (the list feed) or a history the
//! pipeline owns and appends sampled tokens to (the token feed).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyList};

use super::errors::bad_value;
use super::update::AddedEntry;
use crate::history::{SharedHistory, TokenHistory};

#[derive(Clone)]
pub enum PyHistory {
    /// The engine's live list, re-read every step (vLLM's way).
    Live(Arc<Py<PyList>>),
    /// Tokens fed by the caller; seeded from the list's content when the request was added.
    Fed(SharedHistory),
}

impl PyHistory {
    /// The history of an added request. `output_tok_ids` must be a `list` (the live list the
    /// engine appends to); with the token feed its current content is copied and the list is
    /// not read again. An async placeholder (−1) ends the copied prefix.
    pub fn of(e: &AddedEntry<'_>, token_feed: bool) -> PyResult<Self> {
        let list = e.output_tok_ids.cast::<PyList>().map_err(|_| {
            bad_value(
                e.index,
                "output_tok_ids",
                "expected the live output list (a list)",
            )
        })?;
        if !token_feed {
            return Ok(PyHistory::Live(Arc::new(list.clone().unbind())));
        }
        let mut tokens = Vec::with_capacity(list.len());
        for item in list.iter() {
            let t = token_of(&item);
            if t < 0 {
                break;
            }
            tokens.push(t);
        }
        Ok(PyHistory::Fed(Arc::new(std::sync::RwLock::new(tokens))))
    }
}

/// A list entry as a token id: ints as themselves (bools and other types, which no engine
/// writes, read as a placeholder −1, as do ints outside int64).
fn token_of(item: &Bound<'_, PyAny>) -> i64 {
    if item.is_instance_of::<PyBool>() {
        return -1;
    }
    item.extract::<i64>().unwrap_or(-1)
}

/// Runs `f` with the interpreter token. Histories are read only from inside `Pipeline`'s
/// methods, which run attached; `Python::attach` would also drain PyO3's deferred-reference
/// pool on every call (the main cost of a history read), so when CPython confirms that this
/// thread holds the GIL the token is made directly.
#[inline]
fn attached<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> R {
    #[cfg(not(feature = "abi3"))]
    {
        // SAFETY: PyGILState_Check only reads the current thread's state.
        if unsafe { pyo3::ffi::PyGILState_Check() } == 1 {
            // SAFETY: this thread holds the GIL (checked just above) for the whole call of `f`,
            // and `f` is generic over the token's lifetime, so nothing derived from it escapes.
            return f(unsafe { Python::assume_attached() });
        }
    }
    Python::attach(f)
}

impl TokenHistory for PyHistory {
    fn len(&self) -> usize {
        match self {
            PyHistory::Live(list) => attached(|py| list.bind(py).len()),
            PyHistory::Fed(h) => h.len(),
        }
    }

    fn token_at(&self, i: usize) -> Option<i64> {
        match self {
            PyHistory::Live(list) => attached(|py| {
                let list = list.bind(py);
                if i >= list.len() {
                    return None;
                }
                Some(list.get_item(i).map(|x| token_of(&x)).unwrap_or(-1))
            }),
            PyHistory::Fed(h) => h.token_at(i),
        }
    }

    fn read_from(&self, start: usize, out: &mut Vec<i64>) {
        match self {
            PyHistory::Live(list) => attached(|py| {
                let list = list.bind(py);
                for i in start..list.len() {
                    // A non-int entry is treated as an async placeholder (-1), never a crash.
                    out.push(list.get_item(i).map(|x| token_of(&x)).unwrap_or(-1));
                }
            }),
            PyHistory::Fed(h) => h.read_from(start, out),
        }
    }

    fn push(&self, token: i64) -> bool {
        match self {
            PyHistory::Live(_) => false,
            PyHistory::Fed(h) => h.push(token),
        }
    }

    fn can_push(&self) -> bool {
        matches!(self, PyHistory::Fed(_))
    }
}

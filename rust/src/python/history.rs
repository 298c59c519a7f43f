//! Output histories from Python: the engine's live output list as a `HistorySource` (the list
//! feed), or a copy of its content at add time (the token feed).

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyList};

use super::errors::{bad_value, is_interrupt};
use super::update::AddedEntry;
use crate::history::{sync_history, HistorySource, SyncResult};
use crate::pipeline::Output;

/// The engine's live output list; the pipeline re-reads its new tail every step.
pub struct PyListSource(Py<PyList>);

/// A new request's output: the list's content, and (list feed) the list itself to re-read.
/// `output_tok_ids` must be a `list`. With the token feed only the content up to the first
/// async placeholder (−1) is taken; later tokens come from the feed.
pub fn output_of(e: &AddedEntry<'_>, token_feed: bool) -> PyResult<Output<PyListSource>> {
    let list = e.output_tok_ids.cast::<PyList>().map_err(|_| {
        bad_value(
            e.index,
            "output_tok_ids",
            "expected the live output list (a list)",
        )
    })?;
    let mut tokens = Vec::new();
    for (pos, item) in list.iter().enumerate() {
        if !item.is_instance_of::<PyInt>() {
            // An int-like entry's `__index__` may raise an interrupt: it propagates.
            if let Err(e) = item.extract::<i64>() {
                if is_interrupt(&e) {
                    return Err(e);
                }
            }
        }
        let t = token_of(&item).ok_or_else(|| {
            bad_value(
                e.index,
                "output_tok_ids",
                format!("position {pos} holds neither a token id nor an async placeholder (-1)"),
            )
        })?;
        if token_feed && t < 0 {
            break;
        }
        tokens.push(t);
    }
    let source = (!token_feed).then(|| PyListSource(list.clone().unbind()));
    Ok(Output { tokens, source })
}

/// A list entry as a token id (−1: an async placeholder); `None` for anything else: a bool,
/// a float, None, an int below −1 or beyond int64, which no engine writes.
fn token_of(item: &Bound<'_, PyAny>) -> Option<i64> {
    if item.is_instance_of::<PyBool>() {
        return None;
    }
    item.extract::<i64>().ok().filter(|&t| t >= -1)
}

/// Runs `f` with the interpreter token. Sources are read only from inside `Pipeline`'s
/// methods, which run attached; `Python::attach` would also drain PyO3's deferred-reference
/// pool on every call (the main cost of a read), so when CPython confirms that this thread
/// holds the GIL the token is made directly.
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

impl HistorySource for PyListSource {
    fn len(&self) -> usize {
        attached(|py| BoundList(self.0.bind(py)).len())
    }

    fn token_at(&self, i: usize) -> Option<i64> {
        attached(|py| BoundList(self.0.bind(py)).token_at(i))
    }

    fn sync_into(&self, tokens: &mut Vec<i64>, unresolved: &mut usize) -> SyncResult {
        // One attach for the whole sync, not one per token.
        attached(|py| sync_history(&BoundList(self.0.bind(py)), tokens, unresolved))
    }
}

/// The list while attached.
struct BoundList<'a, 'py>(&'a Bound<'py, PyList>);

impl HistorySource for BoundList<'_, '_> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn token_at(&self, i: usize) -> Option<i64> {
        // An entry that vanished meanwhile reads as a placeholder: the next sync looks again.
        self.0.get_item(i).map_or(Some(-1), |x| token_of(&x))
    }
}

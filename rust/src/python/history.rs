//! Output histories from Python: the engine's live output list as a `HistorySource` (the list
//! feed), or a copy of its content at add time (the token feed).

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyList};

use super::errors::bad_value;
use super::update::AddedEntry;
use crate::history::{sync_history, HistorySource};
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
    let mut tokens = Vec::with_capacity(list.len());
    for item in list.iter() {
        let t = token_of(&item);
        if token_feed && t < 0 {
            break;
        }
        tokens.push(t);
    }
    let source = (!token_feed).then(|| PyListSource(list.clone().unbind()));
    Ok(Output { tokens, source })
}

/// A list entry as a token id: ints as themselves; anything else (bools, floats, None, ints
/// outside int64, which no engine writes) reads as an async placeholder (−1).
fn token_of(item: &Bound<'_, PyAny>) -> i64 {
    if item.is_instance_of::<PyBool>() {
        return -1;
    }
    item.extract::<i64>().unwrap_or(-1)
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

    fn token_at(&self, i: usize) -> i64 {
        attached(|py| BoundList(self.0.bind(py)).token_at(i))
    }

    fn sync_into(&self, tokens: &mut Vec<i64>, unresolved: &mut usize) -> usize {
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

    fn token_at(&self, i: usize) -> i64 {
        self.0.get_item(i).map(|x| token_of(&x)).unwrap_or(-1)
    }
}

//! Output histories from Python: the engine's live output list as a `HistorySource` (the list
//! feed), or a copy of its content at add time (the token feed).

use pyo3::prelude::*;

use crate::error::Error;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyInt, PyList, PyType};

use super::update::AddedEntry;
use crate::history::{sync_history, HistorySource, SyncResult};
use crate::pipeline::Output;

/// The engine's live output list; the pipeline re-reads its new tail every step.
pub struct PyListSource(Py<PyList>);

/// A new request's output: the list's content, and (list feed) the list itself to re-read.
/// `output_tok_ids` must be a `list`. Async placeholders (−1) are only ever a suffix (the
/// engine appends one per step in flight and fills it in later): a token after one is refused,
/// as is anything that is neither a token id nor a placeholder. With the token feed only the
/// content up to the first placeholder is taken; later tokens come from the feed.
pub fn output_of(e: &AddedEntry<'_>, token_feed: bool) -> PyResult<Output<PyListSource>> {
    let list = e.output_tok_ids.cast::<PyList>().map_err(|_| {
        PyErr::from(Error::invalid(
            e.index,
            "output_tok_ids",
            "expected the live output list (a list)",
        ))
    })?;
    let mut tokens = Vec::new();
    let mut placeholder = None;
    for (pos, item) in list.iter().enumerate() {
        let t = token_of(&item).ok_or_else(|| {
            PyErr::from(Error::invalid(
                e.index,
                "output_tok_ids",
                format!("position {pos} holds neither a token id nor an async placeholder (-1)"),
            ))
        })?;
        match placeholder {
            None if t < 0 => placeholder = Some(pos),
            Some(first) if t >= 0 => {
                return Err(PyErr::from(Error::invalid(
                    e.index,
                    "output_tok_ids",
                    crate::history::token_after_placeholder(pos, first),
                )))
            }
            _ => {}
        }
        if !(token_feed && placeholder.is_some()) {
            tokens.push(t);
        }
    }
    let source = (!token_feed).then(|| PyListSource(list.clone().unbind()));
    Ok(Output { tokens, source })
}

/// A list entry as a token id (−1: an async placeholder); `None` for anything else: a bool,
/// a float, None, an int below −1 or beyond int64, which no engine writes.
fn token_of(item: &Bound<'_, PyAny>) -> Option<i64> {
    match int_item(item) {
        Ok(t) => Some(t).filter(|&t| t >= -1),
        Err(_) => None,
    }
}

/// Why an item is not an int (see [`int_item`]).
pub enum NotInt {
    /// Not an int at all (a bool, a float, a str, None, a tensor...): its description.
    Kind(String),
    /// An int beyond int64: its value.
    Range(String),
}

impl std::fmt::Display for NotInt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotInt::Kind(what) => write!(f, "expected an int, got {what}"),
            NotInt::Range(v) => write!(f, "{v} is outside the int64 range"),
        }
    }
}

/// `numpy.integer`, once (`None` without numpy).
fn numpy_integer(py: Python<'_>) -> Option<&Bound<'_, PyType>> {
    static NP_INTEGER: PyOnceLock<Option<Py<PyType>>> = PyOnceLock::new();
    NP_INTEGER
        .get_or_init(py, || numpy_type(py, "integer"))
        .as_ref()
        .map(|t| t.bind(py))
}

/// An item of a token or slot sequence from the caller: a Python int (not a bool) or a numpy
/// integer scalar, as an `i64`. Nothing of the caller's runs (no `__index__` of theirs), so
/// nothing can raise or lie: a 0-d tensor, a float or an object with `__index__` is not an
/// int here.
pub fn int_item(item: &Bound<'_, PyAny>) -> Result<i64, NotInt> {
    let is_int = if item.is_instance_of::<PyInt>() {
        !item.is_instance_of::<PyBool>()
    } else {
        numpy_integer(item.py()).is_some_and(|t| item.is_instance(t).unwrap_or(false))
    };
    if !is_int {
        return Err(NotInt::Kind(describe(item)));
    }
    item.extract::<i64>().map_err(|_| {
        NotInt::Range(
            item.str()
                .map(|s| s.to_string())
                .unwrap_or_else(|_| "the int".into()),
        )
    })
}

/// A caller's object for a message, running none of its code: the `repr` of a plain value
/// (an int, a float, a str, a bool, None, a numpy scalar), else its type's name.
pub fn describe(obj: &Bound<'_, PyAny>) -> String {
    let py = obj.py();
    let plain = obj.is_none()
        || obj.is_exact_instance_of::<PyInt>()
        || obj.is_exact_instance_of::<PyBool>()
        || obj.is_exact_instance_of::<pyo3::types::PyFloat>()
        || obj.is_exact_instance_of::<pyo3::types::PyString>()
        || numpy_generic(py).is_some_and(|t| obj.is_instance(t).unwrap_or(false));
    if plain {
        if let Ok(r) = obj.repr() {
            let r = r.to_string();
            if r.len() <= 80 {
                return r;
            }
        }
    }
    let name = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into());
    format!("a {name}")
}

/// `numpy.generic` (every numpy scalar), once (`None` without numpy).
fn numpy_generic(py: Python<'_>) -> Option<&Bound<'_, PyType>> {
    static NP_GENERIC: PyOnceLock<Option<Py<PyType>>> = PyOnceLock::new();
    NP_GENERIC
        .get_or_init(py, || numpy_type(py, "generic"))
        .as_ref()
        .map(|t| t.bind(py))
}

fn numpy_type(py: Python<'_>, name: &str) -> Option<Py<PyType>> {
    py.import("numpy")
        .and_then(|m| m.getattr(name))
        .and_then(|t| Ok(t.cast_into::<PyType>()?.unbind()))
        .ok()
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

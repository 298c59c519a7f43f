//! The one place core errors become Python exceptions.
//!
//! Bad input (every variant but one) is a `ValueError` whose message names the request's batch
//! index and the field; reading `removed` before registering more removals is vLLM's
//! `RuntimeError`.

use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::PyErr;

use crate::error::Error;

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        match e {
            Error::RemovedAfterRead | Error::Protocol(_) => PyRuntimeError::new_err(e.to_string()),
            Error::OutOfMemory { .. } => PyMemoryError::new_err(e.to_string()),
            _ => PyValueError::new_err(e.to_string()),
        }
    }
}

/// A `ValueError` for a Python value of the wrong type or shape, naming request and field.
pub fn bad_value(index: usize, field: &str, detail: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!(
        "request at index {index}: field '{field}': {detail}"
    ))
}

/// A `ValueError` for a malformed batch-update structure (not tied to one request).
pub fn bad_update(field: &str, detail: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("batch update: field '{field}': {detail}"))
}

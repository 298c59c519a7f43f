//! The one place core errors become Python exceptions.
//!
//! Each [`ErrorKind`] is its own class in `logitsproc_rs.errors` (imported once), a subclass of
//! the builtin a caller already catches: a bad request, a malformed update, a bad setting or a
//! size beyond the tables is a `ValueError`, a misuse of the step protocol (vLLM's
//! `removed_append` after `removed` was read, too) a `RuntimeError`, a refused allocation a
//! `MemoryError`. The request's batch index, the field, the detail and a custom column's name
//! are attributes (`index`, `field`, `detail`, `column`; `processor` is derived from `field` in
//! Python), so no caller parses the message; the message itself is the core's `Display`.

use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};
use pyo3::PyErr;

use crate::error::{Error, ErrorKind};

/// The exception classes of `logitsproc_rs.errors`, one per [`ErrorKind`].
static CLASSES: PyOnceLock<[Py<PyType>; 6]> = PyOnceLock::new();

fn classes(py: Python<'_>) -> PyResult<&[Py<PyType>; 6]> {
    CLASSES.get_or_try_init(py, || {
        let m = py.import("logitsproc_rs.errors")?;
        let class = |name: &str| -> PyResult<Py<PyType>> {
            Ok(m.getattr(name)?.cast_into::<PyType>()?.unbind())
        };
        Ok([
            class("RequestError")?,
            class("BatchUpdateError")?,
            class("ConfigError")?,
            class("SizeError")?,
            class("ProtocolError")?,
            class("AllocationError")?,
        ])
    })
}

/// The parts of an exception; `None` attributes are left at the class's default (`None`).
struct Parts<'a> {
    kind: ErrorKind,
    message: String,
    index: Option<usize>,
    field: Option<&'a str>,
    detail: Option<String>,
    column: Option<&'a str>,
}

impl Parts<'_> {
    fn into_err(self) -> PyErr {
        Python::attach(|py| {
            self.typed(py).unwrap_or_else(|_| {
                // Only without the Python package (never in a build of it): the builtin.
                match self.kind {
                    ErrorKind::Protocol => PyRuntimeError::new_err(self.message),
                    ErrorKind::Allocation => PyMemoryError::new_err(self.message),
                    _ => PyValueError::new_err(self.message),
                }
            })
        })
    }

    fn typed(&self, py: Python<'_>) -> PyResult<PyErr> {
        let slot = match self.kind {
            ErrorKind::Request => 0,
            ErrorKind::BatchUpdate => 1,
            ErrorKind::Config => 2,
            ErrorKind::Size => 3,
            ErrorKind::Protocol => 4,
            ErrorKind::Allocation => 5,
        };
        let class = &classes(py)?[slot];
        let kwargs = PyDict::new(py);
        kwargs.set_item("index", self.index)?;
        kwargs.set_item("field", self.field)?;
        kwargs.set_item("detail", self.detail.as_deref())?;
        kwargs.set_item("column", self.column)?;
        let e = class.bind(py).call((&self.message,), Some(&kwargs))?;
        Ok(PyErr::from_value(e))
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        Parts {
            kind: e.kind(),
            message: e.to_string(),
            index: e.index(),
            field: e.field(),
            detail: e.detail(),
            column: e.column(),
        }
        .into_err()
    }
}

/// Whether `e` is an interrupt rather than an error: a `BaseException` that is not an
/// `Exception` (`KeyboardInterrupt`, `SystemExit`, `GeneratorExit`) raised by user code (a
/// reader, `__len__`, `__iter__`, `__index__`, `__float__`, `__repr__`...). Those propagate as
/// themselves, never turned into a `ValueError`.
pub fn is_interrupt(e: &PyErr) -> bool {
    Python::attach(|py| !e.is_instance_of::<pyo3::exceptions::PyException>(py))
}

/// `e` itself when it is an interrupt ([`is_interrupt`]), else `refuse(e)`: the one way user
/// code's exceptions become our errors.
pub fn unless_interrupt(e: PyErr, refuse: impl FnOnce(PyErr) -> PyErr) -> PyErr {
    if is_interrupt(&e) {
        e
    } else {
        refuse(e)
    }
}

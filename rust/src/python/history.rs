//! `TokenHistory` for a Python list: the live output list vLLM hands over in `added`.

use pyo3::prelude::*;
use pyo3::types::PyList;

use super::errors::bad_value;
use super::update::AddedEntry;
use crate::history::TokenHistory;

pub struct PyTokenList(pub Py<PyList>);

impl PyTokenList {
    /// The live output list of an added request (`output_tok_ids`, which must be a `list`).
    pub fn of(e: &AddedEntry<'_>) -> PyResult<Self> {
        let list = e.output_tok_ids.cast::<PyList>().map_err(|_| {
            bad_value(
                e.index,
                "output_tok_ids",
                "expected the live output list (a list)",
            )
        })?;
        Ok(PyTokenList(list.clone().unbind()))
    }
}

impl TokenHistory for PyTokenList {
    fn len(&self) -> usize {
        // Tables are only driven from Python methods, which hold the GIL, so attaching is a
        // cheap re-entrant check; PyList's length is then a field read.
        Python::attach(|py| self.0.bind(py).len())
    }

    fn token_at(&self, i: usize) -> Option<i64> {
        Python::attach(|py| {
            let list = self.0.bind(py);
            if i >= list.len() {
                return None;
            }
            Some(list.get_item(i).ok()?.extract::<i64>().unwrap_or(-1))
        })
    }

    fn read_from(&self, start: usize, out: &mut Vec<i64>) {
        Python::attach(|py| {
            let list = self.0.bind(py);
            for i in start..list.len() {
                // A non-int entry is treated as an async placeholder (-1), never a crash.
                let v = list
                    .get_item(i)
                    .ok()
                    .and_then(|x| x.extract::<i64>().ok())
                    .unwrap_or(-1);
                out.push(v);
            }
        })
    }
}

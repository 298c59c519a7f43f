//! Binding for [`crate::logit_bias::LogitBiasState`].

use pyo3::prelude::*;

use crate::limits::check_sizes;
use pyo3::types::PyDict;

use super::buffer::HostBufferView;
use super::errors::bad_value;
use super::update::{extract_as, parse_update};
use crate::logit_bias;

#[pyclass(module = "logitsproc_rs._core")]
pub struct LogitBiasState {
    inner: logit_bias::LogitBiasState,
}

#[pymethods]
impl LogitBiasState {
    #[new]
    fn new(capacity: usize, vocab_size: usize, max_entries: usize) -> PyResult<Self> {
        check_sizes(capacity, vocab_size, &[max_entries])?;
        Ok(LogitBiasState {
            inner: logit_bias::LogitBiasState::new(capacity, vocab_size, max_entries),
        })
    }

    /// Applies a batch update (reads each added request's `params.logit_bias`, a dict or None).
    /// Returns True when the (row, token, bias) triples were rebuilt.
    fn update(&mut self, batch_update: &Bound<'_, PyAny>) -> PyResult<bool> {
        let cap = self.inner.max_entries();
        let update = parse_update(batch_update, |e| {
            let lb = param!(e, "logit_bias")?;
            if lb.is_none() {
                return Ok(Vec::new());
            }
            let dict = lb
                .cast::<PyDict>()
                .map_err(|_| bad_value(e.index, "logit_bias", "expected a dict or None"))?;
            if dict.len() > cap {
                // Reject before extracting a huge dict; the core reports the same error.
                return Ok(vec![(0, 0.0); dict.len()]);
            }
            let mut out = Vec::with_capacity(dict.len());
            for (k, v) in dict.iter() {
                out.push((
                    extract_as::<i64>(e.index, "logit_bias", &k, "int token ids")?,
                    extract_as::<f64>(e.index, "logit_bias", &v, "float biases")?,
                ));
            }
            Ok(out)
        })?;
        Ok(self.inner.update(update)?)
    }

    fn rows(&self) -> HostBufferView {
        HostBufferView::i32(self.inner.triples().rows())
    }

    fn cols(&self) -> HostBufferView {
        HostBufferView::i32(self.inner.triples().cols())
    }

    fn vals(&self) -> HostBufferView {
        HostBufferView::f32(self.inner.triples().vals())
    }

    /// Number of valid triples.
    #[getter]
    fn len(&self) -> usize {
        self.inner.triples().len()
    }

    /// Valid triples plus no-op padding (a power of two): the prefix to view and apply.
    #[getter]
    fn padded_len(&self) -> usize {
        self.inner.triples().padded_len()
    }

    /// Requests with a non-empty bias.
    #[getter]
    fn active(&self) -> usize {
        self.inner.active()
    }

    #[getter]
    fn max_entries(&self) -> usize {
        self.inner.max_entries()
    }
}

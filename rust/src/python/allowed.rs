//! Binding for [`crate::allowed::AllowedState`].

use pyo3::prelude::*;

use crate::limits::check_sizes;

use super::buffer::HostBufferView;
use super::update::{parse_update, token_ids};
use crate::allowed;

#[pyclass(module = "logitsproc_rs._core")]
pub struct AllowedTokenIdsState {
    inner: allowed::AllowedState,
}

#[pymethods]
impl AllowedTokenIdsState {
    #[new]
    fn new(capacity: usize, vocab_size: usize, max_ids: usize) -> PyResult<Self> {
        check_sizes(capacity, vocab_size, &[max_ids])?;
        Ok(AllowedTokenIdsState {
            inner: allowed::AllowedState::new(capacity, vocab_size, max_ids),
        })
    }

    /// Applies a batch update (reads each added request's `params.allowed_token_ids`, a list or
    /// None). Returns True when the exported pairs and rows changed.
    fn update(&mut self, batch_update: &Bound<'_, PyAny>) -> PyResult<bool> {
        let update = parse_update(batch_update, |e| {
            let ids = param!(e, "allowed_token_ids")?;
            if ids.is_none() {
                return Ok(None);
            }
            token_ids(e.index, "allowed_token_ids", &ids).map(Some)
        })?;
        Ok(self.inner.update(update)?)
    }

    fn rows(&self) -> HostBufferView {
        HostBufferView::i32(self.inner.pairs().rows())
    }

    fn cols(&self) -> HostBufferView {
        HostBufferView::i32(self.inner.pairs().cols())
    }

    /// Restricted rows, padded by repeating the first (prefix `padded_rows`).
    fn restricted_rows(&self) -> HostBufferView {
        HostBufferView::i64(self.inner.rows())
    }

    #[getter]
    fn len(&self) -> usize {
        self.inner.pairs().len()
    }

    #[getter]
    fn padded_len(&self) -> usize {
        self.inner.pairs().padded_len()
    }

    #[getter]
    fn n_rows(&self) -> usize {
        self.inner.n_rows()
    }

    #[getter]
    fn padded_rows(&self) -> usize {
        self.inner.padded_rows()
    }

    #[getter]
    fn active(&self) -> usize {
        self.inner.active()
    }
}

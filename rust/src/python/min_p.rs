//! Binding for [`crate::min_p::MinPState`].

use pyo3::prelude::*;

use crate::limits::check_sizes;

use super::buffer::{logits_rows, HostBufferView};
use super::update::parse_update;
use crate::min_p;

#[pyclass(module = "logitsproc_rs._core")]
pub struct MinPState {
    inner: min_p::MinPState,
}

#[pymethods]
impl MinPState {
    #[new]
    fn new(capacity: usize) -> PyResult<Self> {
        check_sizes(capacity, 1, &[])?;
        Ok(MinPState {
            inner: min_p::MinPState::new(capacity),
        })
    }

    /// Applies a batch update (reads each added request's `params.min_p`). Returns True when
    /// the device copy of `ln(min_p)[:batch_size]` must be refreshed.
    fn update(&mut self, batch_update: &Bound<'_, PyAny>) -> PyResult<bool> {
        let update = parse_update(batch_update, |e| float_param!(e, "min_p", 0.0))?;
        Ok(self.inner.update(update)?.needs_copy)
    }

    /// MinP applied by Rust directly on float32 CPU logits (only rows with a min_p are
    /// touched). The caller passes `tensor.data_ptr()` after checking dtype float32, device CPU,
    /// unit column stride and shape `[batch_size, vocab]`.
    fn unsafe_apply_cpu(
        &self,
        py: Python<'_>,
        ptr: usize,
        rows: usize,
        vocab: usize,
        row_stride: usize,
    ) -> PyResult<()> {
        if rows > self.inner.batch_size() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "logits have more rows than the batch",
            ));
        }
        // SAFETY: the Python caller checked the tensor (see the docstring).
        let logits = unsafe { logits_rows(ptr, rows, vocab, row_stride)? };
        let inner = &self.inner;
        py.detach(|| inner.apply_to_rows(logits, rows, vocab, row_stride));
        Ok(())
    }

    /// The per-slot `ln(min_p)` buffer (float32, −inf where unset).
    fn log_min_p(&self) -> HostBufferView {
        HostBufferView::f32(self.inner.log_min_p())
    }

    /// Stored min_p of one slot (float32 rounded).
    fn get(&self, index: usize) -> Option<f32> {
        self.inner.get(index)
    }

    #[getter]
    fn count(&self) -> usize {
        self.inner.count()
    }

    #[getter]
    fn batch_size(&self) -> usize {
        self.inner.batch_size()
    }

    #[getter]
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
}

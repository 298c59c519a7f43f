//! Binding for [`crate::min_tokens::MinTokensState`] over live Python output lists.

use pyo3::prelude::*;

use crate::limits::check_sizes;

use super::buffer::HostBufferView;
use super::history::PyTokenList;
use super::update::{extract_as, parse_update};
use crate::min_tokens::{self, MinTokensParams};
use crate::sparse::SparseRows;

#[pyclass(module = "logitsproc_rs._core")]
pub struct MinTokensState {
    inner: min_tokens::MinTokensState<PyTokenList>,
    spec: SparseRows<f32>,
}

#[pymethods]
impl MinTokensState {
    /// `spec_tokens`: draft tokens per request under speculative decoding (0 when off); sizes
    /// the buffers of `spec_decode`.
    #[new]
    #[pyo3(signature = (capacity, vocab_size, max_stop_ids, spec_tokens=0))]
    fn new(
        capacity: usize,
        vocab_size: usize,
        max_stop_ids: usize,
        spec_tokens: usize,
    ) -> PyResult<Self> {
        check_sizes(capacity, vocab_size, &[max_stop_ids, spec_tokens])?;
        Ok(MinTokensState {
            inner: min_tokens::MinTokensState::new(capacity, vocab_size, max_stop_ids),
            spec: SparseRows::new(capacity * max_stop_ids * spec_tokens.max(1)),
        })
    }

    /// Builds the draft-row triples (see the core's `spec_decode_triples`) into `spec_*()`;
    /// returns (logits rows of the layout, padded triple count).
    fn spec_decode(&mut self, num_draft_tokens: Vec<usize>) -> PyResult<(usize, usize)> {
        let rows = self
            .inner
            .spec_decode_triples(&num_draft_tokens, &mut self.spec)?;
        Ok((rows, self.spec.padded_len()))
    }

    fn spec_rows(&self) -> HostBufferView {
        HostBufferView::i32(self.spec.rows())
    }

    fn spec_cols(&self) -> HostBufferView {
        HostBufferView::i32(self.spec.cols())
    }

    fn spec_vals(&self) -> HostBufferView {
        HostBufferView::f32(self.spec.vals())
    }

    /// Applies a batch update, or (with None) only re-checks the output lengths. Reads each
    /// added request's `params.min_tokens` and `params.all_stop_token_ids`, and keeps its live
    /// output list. Returns True when the (row, token) triples were rebuilt.
    #[pyo3(signature = (batch_update))]
    fn update(&mut self, batch_update: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let Some(bu) = batch_update else {
            return Ok(self.inner.update_none());
        };
        let update = parse_update(bu, |e| {
            let min = param!(e, "min_tokens")?;
            let min_tokens = if min.is_none() {
                0
            } else {
                extract_as::<i64>(e.index, "min_tokens", &min, "an int")?
            };
            let output = PyTokenList::of(e)?;
            let mut stop_token_ids = Vec::new();
            if min_tokens > 0 {
                let stop = param!(e, "all_stop_token_ids")?;
                if !stop.is_none() {
                    for t in stop.try_iter()? {
                        stop_token_ids.push(extract_as::<i64>(
                            e.index,
                            "stop_token_ids",
                            &t?,
                            "int token ids",
                        )?);
                    }
                }
            }
            Ok(MinTokensParams {
                min_tokens,
                stop_token_ids,
                output,
            })
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

    #[getter]
    fn len(&self) -> usize {
        self.inner.triples().len()
    }

    /// Valid triples plus no-op padding (a power of two): the prefix to view and apply.
    #[getter]
    fn padded_len(&self) -> usize {
        self.inner.triples().padded_len()
    }

    /// Requests still below their min_tokens.
    #[getter]
    fn active(&self) -> usize {
        self.inner.active()
    }
}

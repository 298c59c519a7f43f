//! Binding for [`crate::penalties::PenaltiesState`] over live Python output lists.

use pyo3::prelude::*;

use crate::limits::check_sizes;

use super::buffer::{logits_rows, HostBufferView};
use super::history::PyTokenList;
use super::update::{parse_update, token_ids};
use crate::penalties::{self, PenaltyParams};

#[pyclass(module = "logitsproc_rs._core")]
pub struct PenaltiesState {
    inner: penalties::PenaltiesState<PyTokenList>,
    vocab_size: usize,
}

#[pymethods]
impl PenaltiesState {
    #[new]
    fn new(capacity: usize, vocab_size: usize, ops_capacity: usize) -> PyResult<Self> {
        check_sizes(capacity, vocab_size, &[])?;
        check_sizes(ops_capacity, vocab_size, &[])?;
        Ok(PenaltiesState {
            inner: penalties::PenaltiesState::new(capacity, vocab_size, ops_capacity),
            vocab_size,
        })
    }

    /// Applies a batch update (or, with None, only counts new output tokens). Reads each added
    /// request's repetition/frequency/presence penalties and prompt ids, keeps its live output
    /// list. Afterwards: `n_copies` row copies and `next_chunk()` additions are pending.
    #[pyo3(signature = (batch_update))]
    fn update(&mut self, batch_update: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let Some(bu) = batch_update else {
            self.inner.update_none();
            return Ok(());
        };
        let update = parse_update(bu, |e| {
            let repetition_penalty = float_param!(e, "repetition_penalty", 1.0)?;
            let frequency_penalty = float_param!(e, "frequency_penalty", 0.0)?;
            let presence_penalty = float_param!(e, "presence_penalty", 0.0)?;
            let neutral =
                repetition_penalty == 1.0 && frequency_penalty == 0.0 && presence_penalty == 0.0;
            let prompt = if neutral || e.prompt_tok_ids.is_none() {
                None
            } else {
                Some(token_ids(e.index, "prompt_tok_ids", &e.prompt_tok_ids)?)
            };
            let output = PyTokenList::of(e)?;
            Ok(PenaltyParams {
                repetition_penalty,
                frequency_penalty,
                presence_penalty,
                prompt,
                output,
            })
        })?;
        Ok(self.inner.update(update)?)
    }

    /// Moves the next chunk of (row, token, delta) additions into `ops_*()`; returns its padded
    /// length (0 when none are left).
    fn next_chunk(&mut self) -> usize {
        self.inner.next_chunk()
    }

    /// Penalties applied by Rust directly on float32 CPU logits, touching only the tokens each
    /// tracked request has seen. The caller passes `tensor.data_ptr()` after checking dtype
    /// float32, device CPU, unit column stride and shape `[batch_size, vocab]`.
    fn unsafe_apply_cpu(
        &self,
        py: Python<'_>,
        ptr: usize,
        rows: usize,
        vocab: usize,
        row_stride: usize,
    ) -> PyResult<()> {
        if vocab > self.vocab_size {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "logits are wider than the vocabulary",
            ));
        }
        // SAFETY: the Python caller checked the tensor (see the docstring).
        let logits = unsafe { logits_rows(ptr, rows, vocab, row_stride)? };
        let inner = &self.inner;
        py.detach(|| inner.apply_to_rows(logits, rows, vocab, row_stride));
        Ok(())
    }

    /// Whether the last count stopped at an async placeholder (count again before applying).
    #[getter]
    fn saw_placeholders(&self) -> bool {
        self.inner.saw_placeholders()
    }

    /// True once after the per-slot penalty values changed.
    fn take_values_changed(&mut self) -> bool {
        self.inner.take_values_changed()
    }

    fn repetition(&self) -> HostBufferView {
        HostBufferView::f32(self.inner.repetition())
    }

    fn frequency(&self) -> HostBufferView {
        HostBufferView::f32(self.inner.frequency())
    }

    fn presence(&self) -> HostBufferView {
        HostBufferView::f32(self.inner.presence())
    }

    fn copy_dst(&self) -> HostBufferView {
        HostBufferView::i64(self.inner.copy_dst())
    }

    fn copy_src(&self) -> HostBufferView {
        HostBufferView::i64(self.inner.copy_src())
    }

    fn ops_rows(&self) -> HostBufferView {
        HostBufferView::i32(self.inner.ops().rows())
    }

    fn ops_cols(&self) -> HostBufferView {
        HostBufferView::i32(self.inner.ops().cols())
    }

    fn ops_vals(&self) -> HostBufferView {
        HostBufferView::i32(self.inner.ops().vals())
    }

    /// Output tokens counted so far for one slot (None if untracked).
    fn counted(&self, index: usize) -> Option<Vec<i32>> {
        self.inner.counted(index).map(<[i32]>::to_vec)
    }

    #[getter]
    fn n_copies(&self) -> usize {
        self.inner.n_copies()
    }

    #[getter]
    fn zero_row(&self) -> usize {
        self.inner.zero_row()
    }

    #[getter]
    fn active(&self) -> usize {
        self.inner.active()
    }

    #[getter]
    fn batch_size(&self) -> usize {
        self.inner.batch_size()
    }

    #[getter]
    fn prompt_flag(&self) -> i32 {
        penalties::PROMPT_FLAG
    }
}

//! Binding for [`crate::bad_words::BadWordsState`] over live Python output lists.

use pyo3::prelude::*;

use crate::limits::check_sizes;

use super::buffer::HostBufferView;
use super::errors::bad_value;
use super::history::PyTokenList;
use super::update::{parse_update, token_ids};
use crate::bad_words::{self, BadWordsParams};
use crate::sparse::SparseRows;

#[pyclass(module = "logitsproc_rs._core")]
pub struct BadWordsState {
    inner: bad_words::BadWordsState<PyTokenList>,
    spec: SparseRows<f32>,
}

#[pymethods]
impl BadWordsState {
    /// `spec_tokens`: draft tokens per request under speculative decoding (0 when off).
    #[new]
    #[pyo3(signature = (capacity, vocab_size, max_words, max_word_len, spec_tokens=0))]
    fn new(
        capacity: usize,
        vocab_size: usize,
        max_words: usize,
        max_word_len: usize,
        spec_tokens: usize,
    ) -> PyResult<Self> {
        check_sizes(capacity, vocab_size, &[max_words, spec_tokens])?;
        check_sizes(capacity, vocab_size, &[max_word_len])?;
        Ok(BadWordsState {
            inner: bad_words::BadWordsState::new(capacity, vocab_size, max_words, max_word_len),
            spec: SparseRows::new(capacity * max_words * spec_tokens.max(1)),
        })
    }

    /// Builds the draft-row bans into `spec_*()`: request r owns `num_draft_tokens[r]` rows,
    /// row j seeing the output plus `spec_token_ids[r][:j]`. Returns (logits rows, padded
    /// triple count).
    fn spec_decode(
        &mut self,
        num_draft_tokens: Vec<usize>,
        spec_token_ids: Vec<Vec<i64>>,
    ) -> PyResult<(usize, usize)> {
        let rows =
            self.inner
                .spec_decode_triples(&num_draft_tokens, &spec_token_ids, &mut self.spec)?;
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

    /// Applies a batch update (or, with None, re-matches against the grown outputs). Reads each
    /// added request's `params.bad_words_token_ids` (list of token-id lists, or None). Returns
    /// True when the banned (row, token) pairs changed.
    #[pyo3(signature = (batch_update))]
    fn update(&mut self, batch_update: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let Some(bu) = batch_update else {
            return Ok(self.inner.update_none());
        };
        let update = parse_update(bu, |e| {
            let words_obj = param!(e, "bad_words_token_ids")?;
            let mut words = Vec::new();
            if !words_obj.is_none() {
                for w in words_obj.try_iter().map_err(|_| {
                    bad_value(e.index, "bad_words", "expected a list of token-id lists")
                })? {
                    words.push(token_ids(e.index, "bad_words", &w?)?);
                }
            }
            let output = PyTokenList::of(e)?;
            Ok(BadWordsParams { words, output })
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

    #[getter]
    fn padded_len(&self) -> usize {
        self.inner.triples().padded_len()
    }

    #[getter]
    fn active(&self) -> usize {
        self.inner.active()
    }

    /// Whether the last pass saw an async placeholder (-1) in an output: run it again (update
    /// with None) once the engine has filled the placeholders in, before applying.
    #[getter]
    fn saw_placeholders(&self) -> bool {
        self.inner.saw_placeholders()
    }
}

//! Binding for [`crate::thinking::ThinkingState`] over live Python output lists.

use pyo3::prelude::*;

use crate::limits::check_sizes;

use super::buffer::HostBufferView;
use super::errors::bad_value;
use super::history::PyTokenList;
use super::update::{extract_as, parse_update, token_ids};
use crate::sparse::{Padding, SparseRows};
use crate::thinking::{self, ThinkingConfig, ThinkingParams};

#[pyclass(module = "logitsproc_rs._core")]
pub struct ThinkingState {
    inner: thinking::ThinkingState<PyTokenList>,
    forced: SparseRows<f32>,
    batch_size: usize,
}

/// The logit written to force a token (vLLM `_apply_forcing_to_logits`).
const FORCE_LOGIT: f32 = 1e9;

impl ThinkingState {
    fn rebuild_forced(&mut self) -> usize {
        let forced = self.inner.forced();
        self.forced.rebuild(
            forced
                .iter()
                .map(|&(row, tok)| (row, tok as i32, FORCE_LOGIT)),
            Padding::RepeatFirst,
        );
        self.forced.padded_len()
    }
}

#[pymethods]
impl ThinkingState {
    #[new]
    fn new(
        capacity: usize,
        vocab_size: usize,
        start_ids: Vec<i64>,
        end_ids: Vec<i64>,
    ) -> PyResult<Self> {
        check_sizes(capacity, vocab_size, &[])?;
        let config = ThinkingConfig { start_ids, end_ids };
        Ok(ThinkingState {
            inner: thinking::ThinkingState::new(capacity, vocab_size, config)?,
            forced: SparseRows::new(capacity),
            batch_size: 0,
        })
    }

    /// Applies a batch update (if any), then advances every tracked request over its new output
    /// tokens. Reads each added request's `params.thinking_token_budget` and prompt ids, keeps
    /// its live output list. Returns the padded length of the forced (row, token, 1e9) triples.
    #[pyo3(signature = (batch_update))]
    fn update(&mut self, batch_update: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
        if let Some(bu) = batch_update {
            let update = parse_update(bu, |e| {
                let b = param!(e, "thinking_token_budget")?;
                let budget = if b.is_none() {
                    None
                } else {
                    if b.is_instance_of::<pyo3::types::PyBool>() {
                        return Err(bad_value(
                            e.index,
                            "thinking_token_budget",
                            "expected an int, got a bool",
                        ));
                    }
                    Some(extract_as::<i64>(
                        e.index,
                        "thinking_token_budget",
                        &b,
                        "an int",
                    )?)
                };
                let prompt = if budget.is_none() || e.prompt_tok_ids.is_none() {
                    None
                } else {
                    Some(token_ids(e.index, "prompt_tok_ids", &e.prompt_tok_ids)?)
                };
                let output = PyTokenList::of(e)?;
                Ok(ThinkingParams {
                    budget,
                    prompt,
                    output,
                })
            })?;
            let batch_size = update.batch_size;
            self.inner.update(update)?;
            self.batch_size = batch_size;
        }
        self.inner.step(self.batch_size);
        let forced = self.inner.forced();
        self.forced.rebuild(
            forced
                .iter()
                .map(|&(row, tok)| (row, tok as i32, FORCE_LOGIT)),
            Padding::RepeatFirst,
        );
        Ok(self.forced.padded_len())
    }

    /// Before applying, when `saw_placeholders`: steps again the rows whose placeholder was
    /// filled in since `update`. Returns the padded length of the forced triples.
    fn restep(&mut self) -> usize {
        self.inner.restep(self.batch_size);
        self.rebuild_forced()
    }

    fn rows(&self) -> HostBufferView {
        HostBufferView::i32(self.forced.rows())
    }

    fn cols(&self) -> HostBufferView {
        HostBufferView::i32(self.forced.cols())
    }

    fn vals(&self) -> HostBufferView {
        HostBufferView::f32(self.forced.vals())
    }

    /// The (row, token) pairs forced this step.
    fn forced(&self) -> Vec<(usize, i64)> {
        self.inner.forced().to_vec()
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

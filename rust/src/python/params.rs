//! Reading one added request's parameters, once, into the core's `RequestParams`.
//!
//! Only the fields some table of the pipeline needs are read; a missing attribute reads as
//! unset (duck-typed params), a wrong type is a `ValueError` naming the request and field.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList};

use super::errors::{bad_column, bad_value};
use super::history::{output_of, PyListSource};
use super::update::{bounded_ints, extract_as, token_ids, AddedEntry};
use crate::columns::{ColumnKind, ColumnValue};
use crate::pipeline::RequestParams;

/// Which fields the pipeline's tables read, and how to read the declared columns.
pub struct Reader {
    pub min_p: bool,
    pub logit_bias: Option<usize>,
    pub min_tokens: Option<usize>,
    pub penalties: bool,
    pub bad_words: Option<usize>,
    /// Most tokens in one bad word (read no further).
    pub bad_word_len: usize,
    pub allowed: Option<usize>,
    pub thinking: bool,
    pub token_feed: bool,
    /// Per column: its kind, and a callable `params -> value | None`.
    pub columns: Vec<(String, ColumnKind, Py<PyAny>)>,
}

/// An int that is not a bool (`True` is no count).
fn int_of(index: usize, field: &'static str, v: &Bound<'_, PyAny>) -> PyResult<i64> {
    if v.is_instance_of::<PyBool>() {
        return Err(bad_value(index, field, "expected an int, got a bool"));
    }
    extract_as::<i64>(index, field, v, "an int")
}

/// Token ids up to a per-request cap: a list longer than the cap is refused before reading
/// it, anything else is read no further than the cap (an endless iterator is an error).
fn bounded_ids(
    index: usize,
    field: &'static str,
    obj: &Bound<'_, PyAny>,
    cap: usize,
) -> PyResult<Vec<i64>> {
    if let Ok(list) = obj.cast_exact::<PyList>() {
        if list.len() > cap {
            return Err(bad_value(
                index,
                field,
                format!("{} entries exceed the per-request cap of {cap}", list.len()),
            ));
        }
    }
    bounded_ints(index, field, obj, cap)
}

impl Reader {
    pub fn read(&self, e: &AddedEntry<'_>) -> PyResult<RequestParams<PyListSource>> {
        let mut p = RequestParams::neutral(output_of(e, self.token_feed)?);
        if self.min_p {
            p.min_p = float_param!(e, "min_p", 0.0)?;
        }
        if let Some(cap) = self.logit_bias {
            p.logit_bias = read_logit_bias(e, cap)?;
        }
        if let Some(cap) = self.min_tokens {
            let min = param!(e, "min_tokens")?;
            if !min.is_none() {
                p.min_tokens = int_of(e.index, "min_tokens", &min)?;
            }
            if p.min_tokens > 0 {
                let stop = param!(e, "all_stop_token_ids")?;
                if !stop.is_none() {
                    p.stop_token_ids = bounded_ids(e.index, "stop_token_ids", &stop, cap)?;
                }
            }
        }
        if self.penalties {
            p.repetition_penalty = float_param!(e, "repetition_penalty", 1.0)?;
            p.frequency_penalty = float_param!(e, "frequency_penalty", 0.0)?;
            p.presence_penalty = float_param!(e, "presence_penalty", 0.0)?;
        }
        if let Some(cap) = self.bad_words {
            let words = param!(e, "bad_words_token_ids")?;
            if !words.is_none() {
                let iter = words.try_iter().map_err(|_| {
                    bad_value(e.index, "bad_words", "expected a list of token-id lists")
                })?;
                for w in iter {
                    if p.bad_words.len() == cap {
                        return Err(bad_value(
                            e.index,
                            "bad_words",
                            format!("more words than the per-request cap of {cap}"),
                        ));
                    }
                    p.bad_words
                        .push(bounded_ids(e.index, "bad_words", &w?, self.bad_word_len)?);
                }
            }
        }
        if let Some(cap) = self.allowed {
            let ids = param!(e, "allowed_token_ids")?;
            if !ids.is_none() {
                // Duplicates are allowed in the list; the cap applies to the distinct ids,
                // so read a bounded multiple.
                p.allowed_token_ids = Some(bounded_ids(
                    e.index,
                    "allowed_token_ids",
                    &ids,
                    cap.saturating_mul(4),
                )?);
            }
        }
        if self.thinking {
            let b = param!(e, "thinking_token_budget")?;
            if !b.is_none() {
                p.thinking_budget = Some(int_of(e.index, "thinking_token_budget", &b)?);
            }
        }
        let wants_prompt = (self.penalties
            && (p.repetition_penalty != 1.0
                || p.frequency_penalty != 0.0
                || p.presence_penalty != 0.0))
            || p.thinking_budget.is_some();
        if wants_prompt && !e.prompt_tok_ids.is_none() {
            p.prompt = Some(token_ids(e.index, "prompt_tok_ids", &e.prompt_tok_ids)?);
        }
        for (name, kind, reader) in &self.columns {
            let v = reader
                .bind(e.params.py())
                .call1((&e.params,))
                .map_err(|err| {
                    bad_column(
                        e.index,
                        name,
                        format!("reading it from the params raised {err}"),
                    )
                })?;
            p.columns.push(column_value(e.index, name, kind, &v)?);
        }
        Ok(p)
    }
}

fn read_logit_bias(e: &AddedEntry<'_>, cap: usize) -> PyResult<Vec<(i64, f64)>> {
    let lb = param!(e, "logit_bias")?;
    if lb.is_none() {
        return Ok(Vec::new());
    }
    let dict = lb
        .cast::<PyDict>()
        .map_err(|_| bad_value(e.index, "logit_bias", "expected a dict or None"))?;
    if dict.len() > cap {
        return Err(bad_value(
            e.index,
            "logit_bias",
            format!("{} entries exceed the per-request cap of {cap}", dict.len()),
        ));
    }
    // A snapshot of the items: a dict mutated while being read cannot disturb the loop.
    let items = dict.items();
    let mut out = Vec::with_capacity(items.len());
    for item in items.iter() {
        let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item.extract()?;
        // Int keys only (vLLM's contract); our SamplingParams turns JSON digit-string keys
        // into ints before they reach the core.
        let token = int_of(e.index, "logit_bias", &k)?;
        if v.is_instance_of::<PyBool>() {
            return Err(bad_value(
                e.index,
                "logit_bias",
                "a bias must be a float, got a bool",
            ));
        }
        out.push((
            token,
            extract_as::<f64>(e.index, "logit_bias", &v, "float biases")?,
        ));
    }
    Ok(out)
}

fn column_value(
    index: usize,
    name: &str,
    kind: &ColumnKind,
    v: &Bound<'_, PyAny>,
) -> PyResult<ColumnValue> {
    if v.is_none() {
        return Ok(ColumnValue::Unset);
    }
    let bad = |what: &str| {
        bad_column(
            index,
            name,
            format!(
                "expected {what}, got {}",
                v.repr().map(|r| r.to_string()).unwrap_or_default()
            ),
        )
    };
    if v.is_instance_of::<PyBool>() {
        return Err(bad("a number, not a bool"));
    }
    Ok(match kind {
        ColumnKind::Float { .. } => {
            if !(v.is_instance_of::<PyFloat>() || v.is_instance_of::<PyInt>()) {
                return Err(bad("a float"));
            }
            ColumnValue::Float(v.extract::<f64>().map_err(|_| bad("a float"))?)
        }
        ColumnKind::Int { .. } => ColumnValue::Int(v.extract::<i64>().map_err(|_| bad("an int"))?),
        ColumnKind::Array { width, .. } => {
            let n = v.len().map_err(|_| bad("a sequence of floats"))?;
            if n != *width {
                return Err(bad(&format!("{width} floats")));
            }
            let mut out = Vec::with_capacity(n);
            for x in v.try_iter()? {
                out.push(x?.extract::<f64>().map_err(|_| bad("floats"))?);
            }
            ColumnValue::Array(out)
        }
        ColumnKind::Tokens { max_len } => {
            ColumnValue::Tokens(bounded_ids(index, "column", v, *max_len)?)
        }
    })
}

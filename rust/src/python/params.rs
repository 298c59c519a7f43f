//! Reading one added request's parameters, once, into the core's `RequestParams`.
//!
//! Only the fields some table of the pipeline needs are read; a missing attribute reads as
//! unset (duck-typed params), a wrong type is a `ValueError` naming the request and field.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString};

use super::errors::{bad_column, bad_value};
use super::history::{describe, output_of, PyListSource};
use super::update::{bounded_ints, extract_as, param_named, token_ids, AddedEntry};
use crate::fields::{FieldKind, FieldSpec, Fields, Value};
use crate::pipeline::{Pipeline, PipelineConfig, RequestParams};
use crate::tables::columns::{ColumnKind, ColumnValue};

/// One field the pipeline's tables read, with its attribute name interned once and its caps
/// resolved.
struct FieldReader {
    spec: FieldSpec,
    attr: Py<PyString>,
    /// The read bound: `Ids`' cap × factor, `IdLists`' lists, `Bias`' entries.
    cap: usize,
    /// `IdLists`: most ids in one list.
    len: usize,
}

/// How the fields the pipeline's tables declare are read from a request's params, and how
/// to read the declared columns.
pub struct Reader {
    fields: Vec<FieldReader>,
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
    pub fn new(
        py: Python<'_>,
        fields: &[FieldSpec],
        cfg: &PipelineConfig,
        token_feed: bool,
        columns: Vec<(String, ColumnKind, Py<PyAny>)>,
    ) -> Self {
        let fields = fields
            .iter()
            .map(|spec| {
                let (cap, len) = match &spec.kind {
                    FieldKind::Ids { cap, factor } => (cfg.cap(cap).saturating_mul(*factor), 0),
                    FieldKind::IdLists { lists, len } => (cfg.cap(lists), cfg.cap(len)),
                    FieldKind::Bias { cap } => (cfg.cap(cap), 0),
                    _ => (0, 0),
                };
                FieldReader {
                    spec: spec.clone(),
                    attr: PyString::intern(py, spec.attr).unbind(),
                    cap,
                    len,
                }
            })
            .collect();
        Reader {
            fields,
            token_feed,
            columns,
        }
    }

    pub fn read(
        &self,
        pipeline: &Pipeline<PyListSource>,
        e: &AddedEntry<'_>,
    ) -> PyResult<RequestParams<PyListSource>> {
        let py = e.params.py();
        let mut p = RequestParams::neutral(output_of(e, self.token_feed)?);
        p.fields = Fields::with_capacity(self.fields.len());
        for f in &self.fields {
            if let Some(gate) = f.spec.when_positive {
                if !matches!(p.get(gate), Some(Value::Int(n)) if *n > 0) {
                    continue;
                }
            }
            let v = param_named(e.index, &e.params, f.spec.attr, f.attr.bind(py))?;
            let index = e.index;
            let name = f.spec.name;
            let value = match &f.spec.kind {
                FieldKind::Float { neutral } => Value::Float(if v.is_none() {
                    *neutral
                } else {
                    extract_as::<f64>(index, f.spec.attr, &v, "a float")?
                }),
                FieldKind::Int { neutral } => Value::Int(if v.is_none() {
                    *neutral
                } else {
                    int_of(index, name, &v)?
                }),
                FieldKind::OptInt => Value::OptInt(
                    (!v.is_none())
                        .then(|| int_of(index, name, &v))
                        .transpose()?,
                ),
                FieldKind::Bool => Value::Bool(if v.is_none() {
                    false
                } else if v.is_instance_of::<PyBool>() {
                    v.is_truthy()?
                } else {
                    return Err(bad_value(
                        index,
                        name,
                        format!("expected a bool, got {}", describe(&v)),
                    ));
                }),
                FieldKind::Ids { .. } => Value::Ids(
                    (!v.is_none())
                        .then(|| bounded_ids(index, name, &v, f.cap))
                        .transpose()?,
                ),
                FieldKind::IdLists { .. } => Value::IdLists(read_id_lists(index, name, &v, f)?),
                FieldKind::Bias { .. } => Value::Bias(read_bias(index, name, &v, f.cap)?),
            };
            p.push(name, value);
        }
        if pipeline.wants_prompt(&p.fields) && !e.prompt_tok_ids.is_none() {
            p.prompt = Some(token_ids(e.index, "prompt_tok_ids", &e.prompt_tok_ids)?);
        }
        for (name, kind, reader) in &self.columns {
            let v = reader.bind(py).call1((&e.params,)).map_err(|err| {
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

/// Lists of token ids (bad words): at most `f.cap` lists of at most `f.len` ids.
fn read_id_lists(
    index: usize,
    field: &'static str,
    v: &Bound<'_, PyAny>,
    f: &FieldReader,
) -> PyResult<Vec<Vec<i64>>> {
    let mut out = Vec::new();
    if v.is_none() {
        return Ok(out);
    }
    let iter = v
        .try_iter()
        .map_err(|_| bad_value(index, field, "expected a list of token-id lists"))?;
    for w in iter {
        if out.len() == f.cap {
            return Err(bad_value(
                index,
                field,
                format!("more words than the per-request cap of {}", f.cap),
            ));
        }
        out.push(bounded_ids(index, field, &w?, f.len)?);
    }
    Ok(out)
}

fn read_bias(
    index: usize,
    field: &'static str,
    lb: &Bound<'_, PyAny>,
    cap: usize,
) -> PyResult<Vec<(i64, f64)>> {
    if lb.is_none() {
        return Ok(Vec::new());
    }
    let dict = lb
        .cast::<PyDict>()
        .map_err(|_| bad_value(index, field, "expected a dict or None"))?;
    if dict.len() > cap {
        return Err(bad_value(
            index,
            field,
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
        let token = int_of(index, field, &k)?;
        if v.is_instance_of::<PyBool>() {
            return Err(bad_value(
                index,
                field,
                "a bias must be a float, got a bool",
            ));
        }
        out.push((token, extract_as::<f64>(index, field, &v, "float biases")?));
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

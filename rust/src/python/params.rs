//! Reading one added request's parameters, once, into the core's `RequestParams`.
//!
//! Only the fields some table of the pipeline needs are read; a missing attribute reads as
//! unset (duck-typed params), a wrong type is a `ValueError` naming the request and field.

use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;

use crate::error::Error;
use pyo3::types::{
    PyBool, PyBytes, PyComplex, PyDict, PyFloat, PyFrozenSet, PyInt, PyList, PyMapping, PySet,
    PyString, PyTuple,
};

use super::errors::{is_interrupt, unless_interrupt};
use super::history::{describe, output_of, PyListSource};
use super::update::{bounded_ints, extract_as, param_named, token_ids, try_describe, AddedEntry};
use crate::fields::{ColumnValue, FieldKind, FieldSpec, Fields, IntValue, Value};
use crate::pipeline::{Pipeline, PipelineConfig, RequestParams};
use crate::tables::columns::ColumnKind;
use crate::tables::Builtin;

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

/// A field of a table the pipeline does not have, that switches that table's processor on
/// (see `FieldSpec::tunes`): a request that sets it is refused, never run without it.
struct Guard {
    spec: FieldSpec,
    attr: Py<PyString>,
    /// How to get the processor (the error says it).
    hint: String,
}

/// How the fields the pipeline's tables declare are read from a request's params, and how
/// to read the declared columns.
pub struct Reader {
    fields: Vec<FieldReader>,
    guards: Vec<Guard>,
    /// `"seed"`, read when a table of the pipeline keeps its requests' seeds
    /// (`FloatParams::seeds`: XTC's own draws).
    seed: Option<Py<PyString>>,
    pub token_feed: bool,
    /// Per column: its kind, and a callable `params -> value | None`.
    pub columns: Vec<(String, ColumnKind, Py<PyAny>)>,
}

/// An int that is not a bool (`True` is no count).
fn int_of(index: usize, field: &'static str, v: &Bound<'_, PyAny>) -> PyResult<IntValue> {
    if is_bool(v)? {
        return Err(PyErr::from(Error::invalid(
            index,
            field,
            "expected an int, got a bool",
        )));
    }
    number_as::<IntValue>(index, field, v, "an int")
}

/// A float field's value, through the one reader of a real number ([`number`]); a value
/// it refuses is a `RequestError` naming the request and field.
fn float_of(index: usize, field: &'static str, v: &Bound<'_, PyAny>) -> PyResult<f64> {
    number(v)?.map_err(|refused| Error::invalid(index, field, refused).into())
}

/// The one reader of a real number (a float field, a float column or an array column's item):
/// an int or a float (numpy's scalars, a one-element tensor too: anything `float()` takes),
/// never a bool in disguise (Python's or numpy's: `True` is no probability), a complex number,
/// a str or bytes, nor an int too large for a float. `Ok(Err(text))`: what the value is
/// refused for, in the one wording (`must be a number, got True`); an interrupt raised by the
/// value's own conversion or `__repr__` (`KeyboardInterrupt`: not an `Exception`) propagates
/// as it is.
fn number(v: &Bound<'_, PyAny>) -> PyResult<Result<f64, String>> {
    let refused = || -> PyResult<Result<f64, String>> {
        Ok(Err(format!("must be a number, got {}", try_describe(v)?)))
    };
    if is_bool(v)?
        || is_complex(v)?
        || v.is_instance_of::<PyString>()
        || v.is_instance_of::<PyBytes>()
    {
        return refused();
    }
    match v.extract::<f64>() {
        Ok(x) => Ok(Ok(x)),
        Err(e) if is_interrupt(&e) => Err(e),
        Err(_) => refused(),
    }
}

/// A bool in disguise in a numeric field: Python's, numpy's (`numpy.bool`, which is no `int`
/// subclass but converts to one), a 0-d bool tensor or array (`float()` and `__index__` take
/// each as 0 / 1). Plain ints and floats answer at once; the rest is [`bool_like`].
fn is_bool(v: &Bound<'_, PyAny>) -> PyResult<bool> {
    if v.is_instance_of::<PyBool>() {
        return Ok(true);
    }
    if v.is_instance_of::<PyFloat>() || v.is_instance_of::<PyInt>() {
        return Ok(false);
    }
    bool_like(v)
}

/// A complex number (Python's, numpy's, a complex tensor or array), which `float()` may take
/// by dropping its imaginary part (numpy's does; a 0-d tensor does when it is 0).
fn is_complex(v: &Bound<'_, PyAny>) -> PyResult<bool> {
    if v.is_instance_of::<PyFloat>() || v.is_instance_of::<PyInt>() {
        return Ok(false);
    }
    if v.is_instance_of::<PyComplex>() {
        return Ok(true);
    }
    Ok(dtype_name(v)?.is_some_and(|d| d.starts_with("complex") || d.starts_with("torch.complex")))
}

/// `str(v.dtype)` when `v` has one (a numpy scalar or array, a tensor); an interrupt raised
/// while reading it propagates, any other error reads as none.
fn dtype_name(v: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    let py = v.py();
    match v.getattr(pyo3::intern!(py, "dtype")) {
        Ok(dtype) => match dtype.str() {
            Ok(s) => Ok(s.to_str().ok().map(str::to_owned)),
            Err(e) if is_interrupt(&e) => Err(e),
            Err(_) => Ok(None),
        },
        Err(e) if is_interrupt(&e) => Err(e),
        Err(_) => Ok(None),
    }
}

/// `extract_as` for a number: a conversion that fails is a `ValueError` naming the request
/// and field (an int too large for a float included), but an interrupt raised by the value's
/// own conversion (`KeyboardInterrupt`, `SystemExit`: not an `Exception`) propagates as it is.
fn number_as<'py, T: for<'a> FromPyObject<'a, 'py>>(
    index: usize,
    field: &'static str,
    v: &Bound<'py, PyAny>,
    expected: &str,
) -> PyResult<T> {
    let read: PyResult<T> = v.extract::<T>().map_err(Into::into);
    match read {
        Ok(x) => Ok(x),
        Err(e) if is_interrupt(&e) => Err(e),
        Err(_) => extract_as::<T>(index, field, v, expected),
    }
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
            return Err(PyErr::from(Error::invalid(
                index,
                field,
                format!("{} entries exceed the per-request cap of {cap}", list.len()),
            )));
        }
    }
    bounded_ints(index, field, obj, cap)
}

impl Reader {
    /// `refuse`: `(table, hint)` for each table the pipeline does not have whose fields a
    /// request must not set (`hint`: how to get its processor).
    pub fn new(
        py: Python<'_>,
        fields: &[FieldSpec],
        cfg: &PipelineConfig,
        token_feed: bool,
        columns: Vec<(String, ColumnKind, Py<PyAny>)>,
        refuse: &[(&'static Builtin, String)],
    ) -> Self {
        let guards = refuse
            .iter()
            .flat_map(|(table, hint)| {
                table
                    .fields
                    .iter()
                    .filter(|f| !f.tunes)
                    .map(move |spec| Guard {
                        spec: spec.clone(),
                        attr: PyString::intern(py, spec.attr).unbind(),
                        hint: format!(
                            "it is set, but this pipeline has no {} table to apply it: {hint}",
                            table.name
                        ),
                    })
            })
            .collect();
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
        let keeps_seeds = crate::tables::BUILTINS.iter().any(|b| {
            cfg.tables.iter().any(|t| t == b.name)
                && b.float_params.is_some_and(|f| f.seeds.is_some())
        });
        Reader {
            fields,
            guards,
            seed: keeps_seeds.then(|| PyString::intern(py, "seed").unbind()),
            token_feed,
            columns,
        }
    }

    /// Refuses a request that sets a field of a table the pipeline lacks (a `ValueError`
    /// naming the request and field, and how to get the processor). Only the switching
    /// fields are read, and only as far as needed to tell neutral from set.
    fn guard(&self, e: &AddedEntry<'_>) -> PyResult<()> {
        let py = e.params.py();
        for g in &self.guards {
            let v = param_named(e.index, &e.params, g.spec.attr, g.attr.bind(py))?;
            if v.is_none() {
                continue;
            }
            let set = match &g.spec.kind {
                FieldKind::Float { neutral } => float_of(e.index, g.spec.attr, &v)? != *neutral,
                FieldKind::Int { neutral } => int_of(e.index, g.spec.name, &v)? != *neutral,
                FieldKind::OptInt => true,
                FieldKind::Bool => !v.is_instance_of::<PyBool>() || v.is_truthy()?,
                // A built-in container is set when it holds something (its length runs no
                // caller code); any other value is set.
                FieldKind::Ids { .. } | FieldKind::IdLists { .. } | FieldKind::Bias { .. } => {
                    if let Ok(l) = v.cast_exact::<PyList>() {
                        !l.is_empty()
                    } else if let Ok(t) = v.cast_exact::<PyTuple>() {
                        !t.is_empty()
                    } else if let Ok(d) = v.cast_exact::<PyDict>() {
                        !d.is_empty()
                    } else if let Ok(s) = v.cast_exact::<PySet>() {
                        !s.is_empty()
                    } else {
                        true
                    }
                }
            };
            if set {
                return Err(PyErr::from(Error::invalid(
                    e.index,
                    g.spec.attr,
                    g.hint.clone(),
                )));
            }
        }
        Ok(())
    }

    pub fn read(
        &self,
        pipeline: &Pipeline<PyListSource>,
        e: &AddedEntry<'_>,
    ) -> PyResult<RequestParams<PyListSource>> {
        let py = e.params.py();
        self.guard(e)?;
        let mut p = RequestParams::neutral(output_of(e, self.token_feed)?);
        p.fields = Fields::with_capacity(self.fields.len());
        for f in &self.fields {
            // A gated field is read (and so capped) whether or not its gate is on, and given
            // to its table only while it is.
            let gated_off = f
                .spec
                .when_positive
                .is_some_and(|gate| !matches!(p.get(gate), Some(Value::Int(n)) if *n > 0));
            let v = param_named(e.index, &e.params, f.spec.attr, f.attr.bind(py))?;
            let index = e.index;
            let name = f.spec.name;
            let value = match &f.spec.kind {
                FieldKind::Float { neutral } => Value::Float(if v.is_none() {
                    *neutral
                } else {
                    float_of(index, f.spec.attr, &v)?
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
                    return Err(PyErr::from(Error::invalid(
                        index,
                        name,
                        format!("expected a bool, got {}", describe(&v)),
                    )));
                }),
                FieldKind::Ids { .. } => Value::Ids(
                    (!v.is_none())
                        .then(|| bounded_ids(index, name, &v, f.cap))
                        .transpose()?,
                ),
                FieldKind::IdLists { .. } => Value::IdLists(read_id_lists(index, name, &v, f)?),
                FieldKind::Bias { .. } => Value::Bias(read_bias(index, name, &v, f.cap)?),
            };
            if !gated_off {
                p.push(name, value);
            }
        }
        if let Some(attr) = &self.seed {
            p.fields.seed = seed_of(&e.params, attr.bind(py))?;
        }
        if pipeline.wants_prompt(&p.fields) && !e.prompt_tok_ids.is_none() {
            p.prompt = Some(token_ids(e.index, "prompt_tok_ids", &e.prompt_tok_ids)?);
        }
        for (name, kind, reader) in &self.columns {
            let v = reader.bind(py).call1((&e.params,)).map_err(|err| {
                unless_interrupt(err, |err| {
                    let refused = PyErr::from(Error::invalid_column(
                        e.index,
                        name,
                        format!("reading it from the params raised {err}"),
                    ));
                    refused.set_cause(py, Some(err));
                    refused
                })
            })?;
            p.columns.push(column_value(e.index, name, kind, &v)?);
        }
        Ok(p)
    }
}

/// A request's `seed` as Python's `int(seed) & (2**64 - 1)`, or `None` when it has none (or
/// one `int` does not take: the front ends check seeds, this only keys a draw).
fn seed_of(params: &Bound<'_, PyAny>, attr: &Bound<'_, PyString>) -> PyResult<Option<u64>> {
    let py = params.py();
    let v = match params.getattr(attr) {
        Ok(v) => v,
        Err(e) if is_interrupt(&e) => return Err(e),
        Err(_) => return Ok(None),
    };
    if v.is_none() {
        return Ok(None);
    }
    let int = match py.get_type::<pyo3::types::PyInt>().call1((&v,)) {
        Ok(i) => i,
        Err(e) if is_interrupt(&e) => return Err(e),
        Err(_) => return Ok(None),
    };
    Ok(int
        .call_method1("__and__", (u64::MAX,))?
        .extract::<u64>()
        .ok())
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
    let iter = v.try_iter().map_err(|e| {
        unless_interrupt(e, |_| {
            PyErr::from(Error::invalid(
                index,
                field,
                "expected a list of token-id lists",
            ))
        })
    })?;
    for w in iter {
        if out.len() == f.cap {
            return Err(PyErr::from(Error::invalid(
                index,
                field,
                format!(
                    "more {}s than the per-request cap of {}",
                    f.spec.item, f.cap
                ),
            )));
        }
        let w = w.map_err(|e| {
            unless_interrupt(e, |e| {
                PyErr::from(Error::invalid(
                    index,
                    field,
                    format!("reading it raised {e}"),
                ))
            })
        })?;
        out.push(bounded_ids(index, field, &w, f.len)?);
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
        .map_err(|_| PyErr::from(Error::invalid(index, field, "expected a dict or None")))?;
    if dict.len() > cap {
        return Err(PyErr::from(Error::invalid(
            index,
            field,
            format!("{} entries exceed the per-request cap of {cap}", dict.len()),
        )));
    }
    // A snapshot of the items: a dict mutated while being read cannot disturb the loop.
    let items = dict.items();
    let mut out = Vec::with_capacity(items.len());
    for item in items.iter() {
        let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item.extract()?;
        // Int keys only (vLLM's contract); our SamplingParams turns JSON digit-string keys
        // into ints before they reach the core.
        let token = int_of(index, field, &k)?;
        out.push((token, float_of(index, field, &v)?));
    }
    Ok(out)
}

/// Most values one array column or token list holds: the lengths are int32 on the device.
pub const MAX_COLUMN_WIDTH: usize = i32::MAX as usize;

/// A column's default as declared: exact for an int column (a float would round 2**53 + 1).
#[derive(FromPyObject, Clone, Copy, Debug)]
pub enum ColumnDefault {
    Int(i64),
    Float(f64),
}

/// A column declaration from Python: `(name, kind, width, default, reader)` with kind one of
/// "float", "int", "array", "tokens" (width: the array width or the most tokens; 1 for the
/// others).
pub type ColumnDecl = (String, String, usize, ColumnDefault, Py<PyAny>);

/// The kind of a declared column, its width and default checked (the Python side checks them
/// first, with the same rules).
pub fn column_kind(
    name: &str,
    kind: &str,
    width: usize,
    default: ColumnDefault,
) -> PyResult<ColumnKind> {
    let bad = |m: String| PyErr::from(Error::invalid_declaration(name, m));
    let float_default = || -> PyResult<f32> {
        let d = match default {
            ColumnDefault::Float(d) => d,
            ColumnDefault::Int(d) => d as f64,
        };
        let x = d as f32;
        if !x.is_finite() {
            return Err(bad(format!("default {d} is not a finite float32")));
        }
        Ok(x)
    };
    let check_width = |one: bool| -> PyResult<()> {
        if one && width != 1 {
            return Err(bad(format!("a {kind} column has width 1, got {width}")));
        }
        if !(1..=MAX_COLUMN_WIDTH).contains(&width) {
            return Err(bad(format!(
                "width must be in [1, {MAX_COLUMN_WIDTH}], got {width}"
            )));
        }
        Ok(())
    };
    Ok(match kind {
        "float" => {
            check_width(true)?;
            ColumnKind::Float {
                default: float_default()?,
            }
        }
        "int" => {
            check_width(true)?;
            match default {
                ColumnDefault::Int(default) => ColumnKind::Int { default },
                ColumnDefault::Float(d) => {
                    return Err(bad(format!(
                        "an int column needs an int default within int64, got {d}"
                    )))
                }
            }
        }
        "array" => {
            check_width(false)?;
            ColumnKind::Array {
                width,
                default: float_default()?,
            }
        }
        "tokens" => {
            check_width(false)?;
            ColumnKind::Tokens { max_len: width }
        }
        other => return Err(bad(format!("unknown kind {other:?}"))),
    })
}

/// A bad value of a column: a `RequestError` naming request, column and (for an item of a
/// sequence) its position; an interrupt raised by the value's `__repr__` instead propagates.
fn refused(
    index: usize,
    name: &str,
    item: Option<usize>,
    what: &str,
    v: &Bound<'_, PyAny>,
) -> PyErr {
    let shown = match try_describe(v) {
        Ok(shown) => shown,
        Err(interrupt) => return interrupt,
    };
    let at = item.map(|k| format!("item {k}: ")).unwrap_or_default();
    PyErr::from(Error::invalid_column(
        index,
        name,
        format!("{at}expected {what}, got {shown}"),
    ))
}

/// Whether `v` is a bool in disguise: Python's, numpy's `bool_`, a bool tensor or array (all of
/// which `float()` and often `__index__` would take as 0 / 1). Only for values that are not
/// a plain int or float.
fn bool_like(v: &Bound<'_, PyAny>) -> PyResult<bool> {
    if v.is_instance_of::<PyBool>() {
        return Ok(true);
    }
    Ok(matches!(
        dtype_name(v)?.as_deref(),
        Some("bool" | "torch.bool")
    ))
}

/// A column's real number ([`number`]); a value it refuses is a `RequestError` naming the
/// request, the column and the item.
fn real(index: usize, name: &str, item: Option<usize>, v: &Bound<'_, PyAny>) -> PyResult<f64> {
    number(v)?.map_err(|refused| {
        let at = item.map(|k| format!("item {k}: ")).unwrap_or_default();
        Error::invalid_column(index, name, format!("{at}{refused}")).into()
    })
}

/// An int64: an int, or anything with `__index__` that is not a bool in disguise (numpy ints,
/// a one-element int tensor). Out of range is refused, never wrapped or saturated.
fn integer(index: usize, name: &str, item: Option<usize>, v: &Bound<'_, PyAny>) -> PyResult<i64> {
    let py = v.py();
    if is_bool(v)? {
        return Err(refused(index, name, item, "an int, not a bool", v));
    }
    v.extract::<i64>().map_err(|e| {
        unless_interrupt(e, |e| {
            if e.is_instance_of::<PyOverflowError>(py) {
                refused(index, name, item, "an int within int64", v)
            } else {
                refused(index, name, item, "an int", v)
            }
        })
    })
}

/// Reads at most `max` items of a sequence value (never trusting `__len__`: an endless or
/// lying iterable ends in an error after `max + 1` items), each through `item`; `bound` names
/// `max` in the error ("width", "cap"). No str or bytes, no mapping (a dict would be read by
/// its keys) or set (no order), and no value whose `__len__` raises (a broken sequence).
fn bounded_items<T>(
    index: usize,
    name: &str,
    v: &Bound<'_, PyAny>,
    max: usize,
    what: &str,
    bound: &str,
    mut item: impl FnMut(usize, &Bound<'_, PyAny>) -> PyResult<T>,
) -> PyResult<Vec<T>> {
    if v.is_instance_of::<PyString>() || v.is_instance_of::<PyBytes>() {
        let not = if v.is_instance_of::<PyString>() {
            "str"
        } else {
            "bytes"
        };
        let expected = format!("a sequence of {what}, not a {not}");
        return Err(refused(index, name, None, &expected, v));
    }
    let py = v.py();
    let unordered = v.is_instance_of::<PyDict>()
        || v.is_instance_of::<PySet>()
        || v.is_instance_of::<PyFrozenSet>()
        || v.cast::<PyMapping>().is_ok();
    if unordered {
        let expected = format!("a sequence of {what} in order, not a mapping or a set");
        return Err(refused(index, name, None, &expected, v));
    }
    let has_len = v
        .get_type()
        .hasattr(pyo3::intern!(py, "__len__"))
        .unwrap_or(false);
    if has_len {
        if let Err(e) = v.len() {
            return Err(unless_interrupt(e, |e| {
                PyErr::from(Error::invalid_column(
                    index,
                    name,
                    format!("its __len__ raised {e}"),
                ))
            }));
        }
    }
    let iter = v.try_iter().map_err(|e| {
        unless_interrupt(e, |e| {
            if e.is_instance_of::<PyTypeError>(py) {
                refused(index, name, None, &format!("a sequence of {what}"), v)
            } else {
                PyErr::from(Error::invalid_column(
                    index,
                    name,
                    format!("reading it raised {e}"),
                ))
            }
        })
    })?;
    let mut out = Vec::new();
    for (k, x) in iter.enumerate() {
        if k == max {
            return Err(PyErr::from(Error::invalid_column(
                index,
                name,
                format!("more {what} than the {bound} of {max}"),
            )));
        }
        let x = x.map_err(|e| {
            unless_interrupt(e, |e| {
                PyErr::from(Error::invalid_column(
                    index,
                    name,
                    format!("reading it raised {e}"),
                ))
            })
        })?;
        let value = item(k, &x)?;
        out.try_reserve(1).map_err(|_| {
            PyErr::from(Error::RequestOutOfMemory {
                index,
                field: "column",
            })
        })?;
        out.push(value);
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
    Ok(match kind {
        ColumnKind::Float { .. } => ColumnValue::Float(real(index, name, None, v)?),
        ColumnKind::Int { .. } => ColumnValue::Int(integer(index, name, None, v)?),
        ColumnKind::Array { width, .. } => {
            let what = "floats";
            let out = bounded_items(index, name, v, *width, what, "width", |k, x| {
                real(index, name, Some(k), x)
            })?;
            if out.len() != *width {
                return Err(PyErr::from(Error::invalid_column(
                    index,
                    name,
                    format!("expected {width} values, got {}", out.len()),
                )));
            }
            ColumnValue::Array(out)
        }
        ColumnKind::Tokens { max_len } => ColumnValue::Tokens(bounded_items(
            index,
            name,
            v,
            *max_len,
            "token ids",
            "cap",
            |k, x| integer(index, name, Some(k), x),
        )?),
    })
}

//! PyO3 bindings: wiring only. One class per pipeline (`Pipeline`) and one for exported host
//! buffers (`HostBufferView`); parsing of vLLM-shaped Python objects lives in `update.rs` and
//! `params.rs`, error mapping in `errors.rs`.

mod buffer;
mod errors;
mod history;
mod params;
mod pipeline;
mod sampling;
mod update;

use pyo3::prelude::*;

#[pymodule]
mod _core {
    #[pymodule_export]
    use super::buffer::HostBufferView;
    #[pymodule_export]
    use super::pipeline::Pipeline;
    #[pymodule_export]
    use super::sampling::{
        exponential_draws, gumbel_noise, top_p_margin, unsafe_exponential_race,
        unsafe_fused_exponential, unsafe_fused_gumbel, unsafe_gumbel_race, unsafe_mask_top_k_top_p,
        unsafe_sorted_values,
    };

    use pyo3::prelude::*;

    /// The built-in tables, from the core's registry: `(name, caps, fields, history)` per
    /// table in reading order, with `caps` as `(engine-config name, default)`, `fields` as
    /// `(name, SamplingParams attribute, kind, neutral value, tunes, caps, item,
    /// (off_at_most, examples, bad))` and `history` whether
    /// its requests' output histories are read every step.
    #[pyfunction]
    fn registry(py: Python<'_>) -> PyResult<Vec<Bound<'_, pyo3::types::PyTuple>>> {
        use crate::fields::FieldKind;
        crate::tables::BUILTINS
            .iter()
            .map(|b| {
                let fields = b
                    .fields
                    .iter()
                    .map(|f| {
                        let (kind, neutral) = match &f.kind {
                            FieldKind::Float { neutral } => {
                                ("float", neutral.into_pyobject(py)?.into_any())
                            }
                            FieldKind::Int { neutral } => {
                                ("int", neutral.into_pyobject(py)?.into_any())
                            }
                            FieldKind::OptInt => ("opt_int", py.None().into_bound(py)),
                            FieldKind::Bool => {
                                ("bool", false.into_pyobject(py)?.to_owned().into_any())
                            }
                            FieldKind::Ids { .. } => ("ids", py.None().into_bound(py)),
                            FieldKind::IdLists { .. } => ("id_lists", py.None().into_bound(py)),
                            FieldKind::Bias { .. } => ("bias", py.None().into_bound(py)),
                        };
                        let value = |x: f64| -> PyResult<Bound<'_, PyAny>> {
                            Ok(if kind == "float" {
                                x.into_pyobject(py)?.into_any()
                            } else {
                                (x as i64).into_pyobject(py)?.into_any()
                            })
                        };
                        let off_at_most = f.off_at_most.map(value).transpose()?;
                        let examples = examples_of(py, f.examples)?;
                        let bad = examples_of(py, f.bad)?;
                        (
                            f.name,
                            f.attr,
                            kind,
                            neutral,
                            f.tunes,
                            f.caps(),
                            f.item,
                            (off_at_most, examples, bad),
                        )
                            .into_pyobject(py)
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                (b.name, b.caps.to_vec(), fields, b.history).into_pyobject(py)
            })
            .collect()
    }

    /// A field's example values (`FieldSpec::examples`, `::bad`) as Python values.
    fn examples_of<'py>(
        py: Python<'py>,
        examples: &[crate::fields::Example],
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        use crate::fields::Example;
        examples
            .iter()
            .map(|e| -> PyResult<Bound<'py, PyAny>> {
                Ok(match *e {
                    Example::Float(x) => x.into_pyobject(py)?.into_any(),
                    Example::Int(n) => n.into_pyobject(py)?.into_any(),
                    Example::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
                    Example::Unset => py.None().into_bound(py),
                    Example::Str(t) => t.into_pyobject(py)?.into_any(),
                    Example::PowerOfTwo(n) => 2u8.into_pyobject(py)?.pow(n, py.None())?,
                    Example::Ids(ids) => ids.into_pyobject(py)?.into_any(),
                    Example::IdLists(lists) => lists
                        .iter()
                        .map(|l| l.to_vec())
                        .collect::<Vec<_>>()
                        .into_pyobject(py)?
                        .into_any(),
                    Example::Bias(b) => b
                        .iter()
                        .copied()
                        .collect::<std::collections::HashMap<i64, f64>>()
                        .into_pyobject(py)?
                        .into_any(),
                })
            })
            .collect()
    }

    /// `value` as the core reads an int from the caller (`history::int_item`: a Python int
    /// that is no bool, or a numpy integer scalar, within int64), else `None`. Runs none of the
    /// caller's code (no `__index__`): every surface reads ints by this one rule.
    #[pyfunction]
    fn int_item(value: &Bound<'_, PyAny>) -> Option<i64> {
        super::history::int_item(value).ok()
    }

    /// What the core says of `value` in field `name`'s declared range: `None` inside it (or
    /// for a field without one), else the refusal ("must be in [0, 1], got 2"). An int field
    /// takes an int (`int_item`'s rule), a float field a number; `caps` (engine-config name
    /// -> value) checks a range's cap end, which is skipped when its cap is not given. The
    /// front ends check ranges with this, so each range and its message are declared once.
    #[pyfunction]
    #[pyo3(signature = (name, value, caps = None))]
    fn field_range_error(
        name: &str,
        value: &Bound<'_, PyAny>,
        caps: Option<std::collections::HashMap<String, u64>>,
    ) -> PyResult<Option<String>> {
        let Some(range) = crate::tables::BUILTINS
            .iter()
            .flat_map(|b| b.fields)
            .find(|f| f.name == name || f.attr == name)
            .and_then(|f| f.range)
        else {
            return Ok(None);
        };
        if range.int {
            let x = super::history::int_item(value).map_err(|_| {
                pyo3::exceptions::PyTypeError::new_err(format!(
                    "{name} is an int field: its value must be an int within int64"
                ))
            })?;
            let cap = range.cap().and_then(|c| caps.as_ref()?.get(c).copied());
            Ok(range.int_error(x, cap))
        } else {
            Ok(range.float_error(value.extract::<f64>()?))
        }
    }

    /// `(fingerprint, objects)` of a batch update's structure (see `update::fingerprint`):
    /// the step protocol compares it between the processors of one step; hold `objects`
    /// while comparing.
    #[pyfunction]
    fn update_fingerprint<'py>(
        batch_update: &Bound<'py, PyAny>,
    ) -> PyResult<(u64, Bound<'py, pyo3::types::PyTuple>)> {
        let (h, held) = super::update::fingerprint(batch_update)?;
        Ok((h, pyo3::types::PyTuple::new(batch_update.py(), held)?))
    }

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add("PAGE_SIZE", crate::buffer::PAGE_SIZE)?;
        m.add("SECTION_ALIGN", crate::arena::SECTION_ALIGN)?;
        m.add("INT_FIELD_RANGE", crate::fields::INT_RANGE)?;
        Ok(())
    }
}

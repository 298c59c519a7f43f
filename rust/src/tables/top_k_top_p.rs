//! The kept top-k / top-p (ours, opt-in): vLLM 0.25.1's own top-k then top-p kept set, applied
//! by an argmax-invariant processor from fields in our namespace (`kept_top_k`,
//! `kept_top_p`), so that vLLM's sampler sees no top-k / top-p of its own and skips its sort.
//! Two float32 per slot on the generic float-parameter table; the apply
//! (`logitsproc_rs.sampler.mask_top_k_top_p_`) is in `builtin/top_k_top_p.py`.
//!
//! vLLM's ranges and what is off: `top_k` -1 or 0 is off, at least 1 is on (one at or above
//! the vocabulary keeps every token, as vLLM's `InputBatch` stores `vocab_size`); `top_p` in
//! (0, 1], 1 (as the float32 vLLM stores) is off. The fields are not vLLM's `top_k` / `top_p`
//! attributes: those are our `SamplingParams`' own sampler fields (`Sampler`'s tail).

use crate::error::Result;
use crate::fields::Example as E;
use crate::fields::{FieldKind, FieldSpec, Range};
use crate::processor::Table;
use crate::tables::float_params::{self, FloatParams, Values};
use crate::tables::Build;

/// The request fields it reads: `kept_top_k` (an int; 0 or -1 off) and `kept_top_p` (1 off).
pub const FIELDS: &[FieldSpec] = &[
    FieldSpec::new("kept_top_k", FieldKind::Int { neutral: 0 })
        .range(Range::int_at_least(-1).note("(0 or -1: off)"))
        .off_at_most(0.0)
        .examples(&[
            E::Int(5),
            E::Int(-1),
            E::Int(1),
            E::Int(3),
            E::Int(10),
            E::Int(1_000_000),
            E::Int(40),
        ])
        .bad(&[E::Int(-2), E::Float(2.5)]),
    FieldSpec::new("kept_top_p", FieldKind::Float { neutral: 1.0 })
        .range(Range::closed(0.0, 1.0).open_lo().note("(1: off)"))
        .examples(&[E::Float(0.9), E::Float(0.3), E::Float(0.8), E::Float(0.95)])
        .bad(&[E::Float(0.0), E::Float(1.5)]),
];

/// Its declaration on the generic float-parameter table.
pub static SPEC: FloatParams = FloatParams {
    name: "top_k_top_p",
    fields: FIELDS,
    buffers: &["top_k_top_p.top_k", "top_k_top_p.top_p"],
    seeds: None,
    check,
};

/// The largest `top_k` stored: a float32 holds every int up to it exactly, and any `top_k` at
/// or above the vocabulary keeps every token (the apply clamps to the vocabulary).
pub const MAX_STORED_TOP_K: i64 = 1 << 24;

/// `kept_top_k` an int >= -1 (-1 and 0: off, stored as 0: its `off_at_most`; above [`MAX_STORED_TOP_K`] stored
/// as it); `kept_top_p` in (0, 1], stored as float32 (1: off). Off when both are.
pub fn check(index: usize, v: &[f64]) -> Result<Option<Values>> {
    let k = FIELDS[0].checked_int(index, v[0] as i64, None)?;
    let p = FIELDS[1].checked(index, v[1])? as f32;
    // -1 is 0 (off at most 0, its declaration).
    let k = (FIELDS[0].canonical(k as f64) as i64).min(MAX_STORED_TOP_K) as f32;
    Ok((k > 0.0 || p < 1.0).then(|| float_params::values(&[k, p])))
}

/// Builds the table for a pipeline (the registry's entry).
pub fn build(b: &Build<'_>) -> Result<Box<dyn Table>> {
    float_params::build(&SPEC, b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::{Fields, Value};
    use crate::processor::Table;
    use crate::tables::float_params::{values, FloatParamsTable};

    #[test]
    fn on_off_and_ranges() {
        let on = |k: f32, p: f32| Ok(Some(values(&[k, p])));
        assert_eq!(check(0, &[0.0, 1.0]), Ok(None));
        assert_eq!(check(0, &[-1.0, 1.0]), Ok(None)); // -1: off, as vLLM
        assert_eq!(check(0, &[5.0, 1.0]), on(5.0, 1.0));
        assert_eq!(check(0, &[-1.0, 0.5]), on(0.0, 0.5));
        assert_eq!(check(0, &[3.0, 0.9]), on(3.0, 0.9));
        assert_eq!(check(0, &[1e12, 1.0]), on(MAX_STORED_TOP_K as f32, 1.0));
        assert_eq!(check(0, &[0.0, 1.0 - 1e-12]), Ok(None)); // float32 1: off
        let bad: [(f64, f64, &str); 6] = [
            (-2.0, 1.0, "kept_top_k"),
            (0.0, 0.0, "kept_top_p"),
            (0.0, -0.1, "kept_top_p"),
            (0.0, 1.5, "kept_top_p"),
            (0.0, f64::NAN, "kept_top_p"),
            (0.0, f64::INFINITY, "kept_top_p"),
        ];
        for (k, p, field) in bad {
            let err = check(3, &[k, p]).unwrap_err().to_string();
            assert!(err.contains("index 3") && err.contains(field), "{err}");
        }
    }

    /// Read from a request's fields, the int is checked as the int it is: the error shows it
    /// exactly, even where a float would round it.
    #[test]
    fn the_int_field_is_read_and_checked_as_an_int() {
        let t = FloatParamsTable::try_new(&SPEC, 2).unwrap();
        let mut fields = Fields::with_capacity(2);
        fields.set("kept_top_k", Value::Int(-9_007_199_254_740_993));
        let err = t.check_fields(1, &fields).unwrap_err().to_string();
        assert!(err.contains("got -9007199254740993"), "{err}");
        let mut fields = Fields::with_capacity(2);
        fields.set("kept_top_k", Value::Int(7));
        assert_eq!(t.check_fields(0, &fields), Ok(Some(values(&[7.0, 1.0]))));
        assert_eq!(t.name(), "top_k_top_p");
        assert_eq!(SPEC.neutrals()[..2], [0.0, 1.0]);
    }
}

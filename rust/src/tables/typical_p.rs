//! typical-p (HF `TypicalLogitsWarper`, min_tokens_to_keep 1): keep the tokens whose
//! surprisal is closest to the entropy, up to mass `typical_p`. One float32 per slot on the
//! generic float-parameter table; the apply is in `builtin/typical_p.py`.

use crate::error::Result;
use crate::fields::Example as E;
use crate::fields::{FieldKind, FieldSpec, Range};
use crate::processor::Table;
use crate::tables::float_params::{self, FloatParams, Values};
use crate::tables::Build;

/// The request field it reads (`typical_p`; 1.0 is off).
pub const FIELDS: &[FieldSpec] = &[
    FieldSpec::new("typical_p", FieldKind::Float { neutral: 1.0 })
        .range(Range::closed(0.0, 1.0).open_lo().note("(1: off)"))
        .examples(&[E::Float(0.5), E::Float(0.2), E::Float(0.9)])
        .bad(&[E::Float(0.0), E::Float(1.5), E::Float(f64::NAN)]),
];

/// Its declaration on the generic float-parameter table.
pub static SPEC: FloatParams = FloatParams {
    name: "typical_p",
    fields: FIELDS,
    buffers: &["typical_p.value"],
    seeds: None,
    check,
};

/// HF's range: in (0, 1]; 1 is off (HF's `generate` adds no warper then).
pub fn check(index: usize, v: &[f64]) -> Result<Option<Values>> {
    let mass = FIELDS[0].checked(index, v[0])?;
    let stored = mass as f32;
    Ok((stored < 1.0).then(|| float_params::values(&[stored])))
}

/// Builds the table for a pipeline (the registry's entry).
pub fn build(b: &Build<'_>) -> Result<Box<dyn Table>> {
    float_params::build(&SPEC, b)
}

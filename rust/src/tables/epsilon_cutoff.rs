//! epsilon sampling (HF `EpsilonLogitsWarper`, min_tokens_to_keep 1): mask tokens whose
//! probability is below `epsilon_cutoff`, never the top one. One float32 per slot on the
//! generic float-parameter table; the apply is in `builtin/epsilon_cutoff.py`.

use crate::error::Result;
use crate::fields::Example as E;
use crate::fields::{FieldKind, FieldSpec, Range};
use crate::processor::Table;
use crate::tables::float_params::{self, FloatParams, Values};
use crate::tables::Build;

/// The request field it reads (`epsilon_cutoff`; 0.0 is off).
pub const FIELDS: &[FieldSpec] =
    &[
        FieldSpec::new("epsilon_cutoff", FieldKind::Float { neutral: 0.0 })
            .range(CUTOFF)
            .examples(&[E::Float(0.01), E::Float(0.1), E::Float(0.5), E::Float(3e-4)])
            .bad(&[E::Float(1.0), E::Float(-0.1), E::Float(f64::NAN)]),
    ];

/// A cutoff's range, shared with eta: HF's.
pub const CUTOFF: Range = Range::closed(0.0, 1.0).open_hi().note("(0: off)");

/// Its declaration on the generic float-parameter table.
pub static SPEC: FloatParams = FloatParams {
    name: "epsilon_cutoff",
    fields: FIELDS,
    buffers: &["epsilon_cutoff.value"],
    seeds: None,
    check,
};

/// HF's range: in [0, 1); 0 is off (HF's `generate` adds no warper then).
pub fn check(index: usize, v: &[f64]) -> Result<Option<Values>> {
    cutoff(index, &FIELDS[0], v[0])
}

/// A cutoff in [0, 1), 0 off: shared with eta.
pub fn cutoff(index: usize, field: &FieldSpec, eps: f64) -> Result<Option<Values>> {
    let stored = field.checked(index, eps)? as f32;
    Ok((stored > 0.0).then(|| float_params::values(&[stored])))
}

/// Builds the table for a pipeline (the registry's entry).
pub fn build(b: &Build<'_>) -> Result<Box<dyn Table>> {
    float_params::build(&SPEC, b)
}

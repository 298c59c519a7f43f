//! eta sampling (HF `EtaLogitsWarper`, min_tokens_to_keep 1): mask tokens whose probability
//! is below `min(eta, sqrt(eta) * exp(-entropy))`, never the top one. One float32 per slot on
//! the generic float-parameter table; the apply is in `builtin/eta_cutoff.py`.

use crate::error::Result;
use crate::fields::Example as E;
use crate::fields::{FieldKind, FieldSpec};
use crate::processor::Table;
use crate::tables::float_params::{self, FloatParams, Values};
use crate::tables::Build;

/// The request field it reads (`eta_cutoff`; 0.0 is off).
pub const FIELDS: &[FieldSpec] = &[
    FieldSpec::new("eta_cutoff", FieldKind::Float { neutral: 0.0 })
        .range(super::epsilon_cutoff::CUTOFF)
        .examples(&[
            E::Float(0.01),
            E::Float(0.2),
            E::Float(0.5),
            E::Float(0.9),
            E::Float(1e-3),
        ])
        .bad(&[E::Float(1.0), E::Float(-0.5), E::Str("0.1")]),
];

/// Its declaration on the generic float-parameter table.
pub static SPEC: FloatParams = FloatParams {
    name: "eta_cutoff",
    fields: FIELDS,
    buffers: &["eta_cutoff.value"],
    seeds: None,
    check,
};

/// HF's range: in [0, 1); 0 is off (HF's `generate` adds no warper then).
pub fn check(index: usize, v: &[f64]) -> Result<Option<Values>> {
    super::epsilon_cutoff::cutoff(index, &FIELDS[0], v[0])
}

/// Builds the table for a pipeline (the registry's entry).
pub fn build(b: &Build<'_>) -> Result<Box<dyn Table>> {
    float_params::build(&SPEC, b)
}

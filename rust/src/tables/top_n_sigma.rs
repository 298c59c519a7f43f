//! top-n-sigma (llama.cpp `llama_sampler_top_n_sigma_apply`, arXiv 2411.07641): over a row's
//! logits other than -inf, mask every logit below `max - n * sigma` (population std). One float32
//! per slot on the generic float-parameter table; the apply is in `builtin/top_n_sigma.py`.

use crate::error::Result;
use crate::fields::Example as E;
use crate::fields::{FieldKind, FieldSpec, Range};
use crate::processor::Table;
use crate::tables::float_params::{self, FloatParams, Values};
use crate::tables::Build;

/// The request field it reads (`top_n_sigma`; 0.0 is off).
pub const FIELDS: &[FieldSpec] =
    &[
        FieldSpec::new("top_n_sigma", FieldKind::Float { neutral: 0.0 })
            .range(Range::finite().note("(<= 0: off)"))
            .off_at_most(0.0)
            .examples(&[E::Float(1.0), E::Float(-1.0), E::Float(0.5), E::Float(2.0)])
            .bad(&[E::Float(f64::NAN), E::Float(f64::INFINITY), E::Str("1")]),
    ];

/// Its declaration on the generic float-parameter table.
pub static SPEC: FloatParams = FloatParams {
    name: "top_n_sigma",
    fields: FIELDS,
    buffers: &["top_n_sigma.value"],
    seeds: None,
    check,
};

/// A finite number; n <= 0 is off (llama.cpp), stored as the neutral 0.
pub fn check(index: usize, v: &[f64]) -> Result<Option<Values>> {
    let stored = FIELDS[0].checked(index, v[0])? as f32;
    Ok((stored > 0.0).then(|| float_params::values(&[stored])))
}

/// Builds the table for a pipeline (the registry's entry).
pub fn build(b: &Build<'_>) -> Result<Box<dyn Table>> {
    float_params::build(&SPEC, b)
}

//! XTC, "exclude top choices" (llama.cpp `llama_sampler_xtc_apply`, text-generation-webui PR
//! #6335): with probability `xtc_probability` per step, among the tokens whose probability is
//! at least `xtc_threshold`, remove all but the least probable one. Two float32 per slot on the
//! generic float-parameter table, with the seed of each seeded request that has it on (and a
//! serial naming that request); the draw and the mask are in `builtin/xtc.py`.
//!
//! Off (the slot holds the neutral values and is not counted) when `xtc_probability` is 0 or
//! `xtc_threshold` is above 0.5 (llama.cpp: at most one token can then qualify), compared as
//! the stored float32 values.

use crate::error::Result;
use crate::fields::Example as E;
use crate::fields::{FieldKind, FieldSpec, Range};
use crate::processor::Table;
use crate::tables::float_params::{self, FloatParams, Values};
use crate::tables::Build;

/// The request fields it reads: `xtc_probability` (0.0 is off) and `xtc_threshold` (0.1 by
/// default, as llama.cpp's and text-generation-webui's; above 0.5 is off).
pub const FIELDS: &[FieldSpec] = &[
    FieldSpec::new("xtc_probability", FieldKind::Float { neutral: 0.0 })
        .range(Range::closed(0.0, 1.0).note("(0: off)"))
        .examples(&[E::Float(0.5), E::Float(1.0)])
        .bad(&[E::Float(1.5), E::Float(-0.1)]),
    // A threshold of 0 (or below) would make every token qualify, -inf ones included.
    FieldSpec::new("xtc_threshold", FieldKind::Float { neutral: 0.1 })
        .tunes()
        .range(Range::closed(0.0, 1.0).open_lo().note("(> 0.5: off)"))
        .examples(&[
            E::Float(0.3),
            E::Float(0.02),
            E::Float(0.05),
            E::Float(0.6),
            E::Float(0.2),
        ])
        .bad(&[E::Float(0.0), E::Float(f64::NAN)]),
];

/// Its declaration on the generic float-parameter table.
pub static SPEC: FloatParams = FloatParams {
    name: "xtc",
    fields: FIELDS,
    buffers: &["xtc.probability", "xtc.threshold"],
    // A seeded request draws from a generator of its own (`builtin/xtc.py`), keyed by the
    // serial the table gives it: the slot bookkeeping is the table's.
    seeds: Some(["xtc.serial", "xtc.seed"]),
    check,
};

/// The largest threshold that is on (llama.cpp: `threshold > 0.5` is off).
pub const THRESHOLD_OFF_ABOVE: f32 = 0.5;

/// `xtc_probability` in [0, 1] (0: off); `xtc_threshold` in (0, 1] (> 0.5: off). A threshold
/// of 0 (or below) would make every token qualify, -inf ones included, and is refused.
pub fn check(index: usize, v: &[f64]) -> Result<Option<Values>> {
    let probability = FIELDS[0].checked(index, v[0])?;
    let threshold = FIELDS[1].checked(index, v[1])?;
    let (p, t) = (probability as f32, threshold as f32);
    // A positive threshold below float32's smallest subnormal rounds to 0: keep it positive.
    let t = if t == 0.0 { f32::from_bits(1) } else { t };
    Ok((p > 0.0 && t <= THRESHOLD_OFF_ABOVE).then(|| float_params::values(&[p, t])))
}

/// Builds the table for a pipeline (the registry's entry).
pub fn build(b: &Build<'_>) -> Result<Box<dyn Table>> {
    float_params::build(&SPEC, b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{BatchUpdate, Move};
    use crate::tables::float_params::{values, FloatParamsTable};

    #[test]
    fn on_off_and_ranges() {
        let on = |p: f32, t: f32| Ok(Some(values(&[p, t])));
        assert_eq!(check(0, &[0.5, 0.1]), on(0.5, 0.1));
        assert_eq!(check(0, &[1.0, 0.5]), on(1.0, 0.5));
        assert_eq!(check(0, &[0.0, 0.1]), Ok(None)); // probability 0: off
        assert_eq!(check(0, &[0.5, 0.51]), Ok(None)); // threshold > 0.5: off
        assert_eq!(check(0, &[0.5, 1.0]), Ok(None));
        assert_eq!(check(0, &[1e-50, 0.1]), Ok(None)); // rounds to float32 0: off
        assert_eq!(check(0, &[0.5, 1e-50]), on(0.5, f32::from_bits(1)));
        let bad: [(f64, f64, &str); 8] = [
            (f64::NAN, 0.1, "xtc_probability"),
            (-0.1, 0.1, "xtc_probability"),
            (1.5, 0.1, "xtc_probability"),
            (f64::INFINITY, 0.1, "xtc_probability"),
            (0.5, f64::NAN, "xtc_threshold"),
            (0.5, 0.0, "xtc_threshold"),
            (0.5, -0.2, "xtc_threshold"),
            (0.5, 1.5, "xtc_threshold"),
        ];
        for (p, t, field) in bad {
            let err = check(3, &[p, t]).unwrap_err().to_string();
            assert!(err.contains("index 3") && err.contains(field), "{err}");
        }
    }

    /// A seeded request that is on keeps its seed under a serial of its own, which moves and
    /// swaps with its values; one that is off, or has no seed, keeps none.
    #[test]
    fn seeds_move_with_their_request() {
        let mut t = FloatParamsTable::try_new(&SPEC, 4).unwrap();
        // As the table's `check` makes an entry: the values if on, with the request's seed.
        let entry = |p: f64, seed: Option<u64>| check(0, &[p, 0.1]).unwrap().map(|v| (v, seed));
        let mut u = BatchUpdate::new(3);
        u.added = vec![
            (0, entry(0.5, Some(7))),
            (1, entry(0.0, Some(8))),
            (2, entry(0.5, None)),
        ];
        t.commit_seeded(u);
        assert_eq!(
            (t.seeded(0), t.seeded(1), t.seeded(2)),
            (Some((1, 7)), None, None)
        );
        let mut u = BatchUpdate::new(3);
        u.moved = vec![Move::swap(0, 2)];
        t.update(u).unwrap();
        assert_eq!((t.seeded(0), t.seeded(2)), (None, Some((1, 7))));
        // The same seed again, in the slot it left: a new request, a new serial.
        let mut u = BatchUpdate::new(3);
        u.added = vec![(0, entry(1.0, Some(7)))];
        u.removed = vec![2];
        t.commit_seeded(u);
        assert_eq!((t.seeded(0), t.seeded(2)), (Some((2, 7)), None));
        assert_eq!(t.seeded(9), None);
    }

    #[test]
    fn two_fields_move_together() {
        let mut t = FloatParamsTable::try_new(&SPEC, 4).unwrap();
        let mut u = BatchUpdate::new(3);
        u.added = vec![
            (0, vec![0.5, 0.2]),
            (1, vec![0.0, 0.1]),
            (2, vec![1.0, 0.3]),
        ];
        t.update(u).unwrap();
        assert_eq!(t.count(), 2);
        let mut u = BatchUpdate::new(3);
        u.moved = vec![Move::swap(0, 1)];
        t.update(u).unwrap();
        assert_eq!(
            (t.get(0), t.get(1)),
            (Some(vec![0.0, 0.1]), Some(vec![0.5, 0.2]))
        );
        let mut u = BatchUpdate::new(2);
        u.removed = vec![1];
        u.moved = vec![Move::unidirectional(2, 1)];
        t.update(u).unwrap();
        assert_eq!((t.count(), t.get(1)), (1, Some(vec![1.0, 0.3])));
        assert_eq!(t.get(2), Some(vec![0.0, 0.1]));
    }
}

//! The generic table of per-request float parameters: one float32 per field per slot, dense,
//! with the count of slots whose request sets it (MinP's bookkeeping, declared rather than
//! written again). A processor built on it is a [`FloatParams`] declaration: its name, its
//! float fields (with their neutral values), one arena buffer per field, and its range check.
//!
//! Used by top-n-sigma, typical-p, epsilon, eta, XTC and the kept top-k / top-p
//! (`top_n_sigma.rs`, `typical_p.rs`, `epsilon_cutoff.rs`, `eta_cutoff.rs`, `xtc.rs`,
//! `top_k_top_p.rs`). An `Int` field (top-k) is read as an int, checked against its declared
//! int range here, and handed to the declaration's check as an `f64` (exact: it is in range);
//! the declaration stores it as a float32 like the others. A slot whose request is neutral holds every field's
//! neutral value (as float32), so a dense device view needs no "unset" marker; the status count
//! (`"<name>"`) says whether any row is active, so an apply can skip all work without a sync.
//! Added, removed, moved and swapped exactly like MinP: an empty slot is the neutral request.
//! Stable slots read the dense buffers through the row map (`Pipeline.dense`), as MinP does.

use crate::arena::{HasBuffers, Staged};
use crate::batch::{BatchUpdate, SlotOps};
use crate::buffer::HostBuffer;
use crate::error::Result;
use crate::fields::{FieldKind, FieldSpec, Fields};
use crate::processor::{entry, unbox, Admission, Entry, StatusSink, StepContext, Table};
use crate::tables::Build;

/// The most float fields one declaration may have (XTC will have two).
pub const MAX_FIELDS: usize = 4;

/// One request's checked values, in field order (entries past the declaration's fields are
/// unused).
pub type Values = [f32; MAX_FIELDS];

/// A processor's declaration on the generic table.
pub struct FloatParams {
    /// The table's (and its status count's) name.
    pub name: &'static str,
    /// Its request fields: `FieldKind::Float` or `FieldKind::Int`, at most [`MAX_FIELDS`].
    pub fields: &'static [FieldSpec],
    /// The arena buffer of each field, in field order (`"<name>.<field>"`).
    pub buffers: &'static [&'static str],
    /// The two int64 arena buffers of a declaration that keeps its requests' seeds (XTC, for
    /// its own draws in Python): per slot, a serial given to each added request that is on
    /// and has a seed (unique in the table; 0: none) and that seed (mod 2**64, as int64
    /// bits). They move with the slot's values, so the view keys its generators by serial
    /// and keeps no slot bookkeeping of its own. `None` for the others.
    pub seeds: Option<[&'static str; 2]>,
    /// Checks one request's values (read in field order; unset reads as neutral): an
    /// `Error::invalid` naming the index and the field, `Ok(None)` for a request that is
    /// neutral (the slot holds the neutral values and is not counted), else the values to
    /// store.
    pub check: fn(usize, &[f64]) -> Result<Option<Values>>,
}

impl FloatParams {
    /// The neutral value of field `k`, as stored.
    pub fn neutral(&self, k: usize) -> f32 {
        match self.fields[k].kind {
            FieldKind::Float { neutral } => neutral as f32,
            FieldKind::Int { neutral } => neutral as f32,
            _ => panic!(
                "{}: field {} is not a float or an int",
                self.name, self.fields[k].name
            ),
        }
    }

    /// The neutral values, as stored.
    pub fn neutrals(&self) -> Values {
        let mut out = [0.0; MAX_FIELDS];
        for (k, v) in out.iter_mut().enumerate().take(self.fields.len()) {
            *v = self.neutral(k);
        }
        out
    }
}

/// A seeded request's `(serial, seed)` (see [`FloatParams::seeds`]).
pub type Seeded = (i64, i64);

/// What one slot holds: its values and, for a declaration with seeds, its request's.
pub type Slot = (Values, Option<Seeded>);

/// The dense per-slot state of one declaration.
pub struct FloatParamsTable {
    spec: &'static FloatParams,
    /// One buffer per field, `capacity` long, neutral where a slot is not set.
    buffers: Vec<HostBuffer<f32>>,
    /// `(serial, seed)` buffers (0 where no seeded request is), with `seeds`.
    seeds: Option<[HostBuffer<i64>; 2]>,
    /// The serial the next seeded request gets.
    next_serial: i64,
    /// Whether each slot holds a non-neutral request.
    set: Vec<bool>,
    count: usize,
}

impl FloatParamsTable {
    pub fn try_new(spec: &'static FloatParams, capacity: usize) -> Result<Self> {
        assert!(
            !spec.fields.is_empty()
                && spec.fields.len() <= MAX_FIELDS
                && spec.buffers.len() == spec.fields.len(),
            "{}: one buffer per float field, at most {MAX_FIELDS}",
            spec.name
        );
        let buffers = (0..spec.fields.len())
            .map(|k| HostBuffer::try_new(capacity, spec.neutral(k), "max_num_seqs"))
            .collect::<Result<Vec<_>>>()?;
        let seeds = match spec.seeds {
            Some(_) => Some([
                HostBuffer::try_new(capacity, 0, "max_num_seqs")?,
                HostBuffer::try_new(capacity, 0, "max_num_seqs")?,
            ]),
            None => None,
        };
        Ok(FloatParamsTable {
            spec,
            buffers,
            seeds,
            next_serial: 1,
            set: vec![false; capacity],
            count: 0,
        })
    }

    pub fn capacity(&self) -> usize {
        self.set.len()
    }

    /// Slots holding a non-neutral request.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The stored values of slot `index` (neutral when unset), `None` outside the table.
    pub fn get(&self, index: usize) -> Option<Vec<f32>> {
        (index < self.capacity()).then(|| self.buffers.iter().map(|b| b.get(index)).collect())
    }

    /// The `(serial, seed)` of slot `index`'s seeded request, if it holds one.
    pub fn seeded(&self, index: usize) -> Option<Seeded> {
        let [serial, seed] = self.seeds.as_ref()?;
        (index < self.capacity() && serial.get(index) != 0)
            .then(|| (serial.get(index), seed.get(index)))
    }

    /// Checks one request's values, read in field order from `fields` (an int field against
    /// its declared range first, as the int it is, so its error shows the value as sent).
    pub fn check_fields(&self, index: usize, fields: &Fields) -> Result<Option<Values>> {
        let mut raw = [0.0f64; MAX_FIELDS];
        for (k, f) in self.spec.fields.iter().enumerate() {
            raw[k] = match f.kind {
                FieldKind::Int { .. } => f.checked_int(index, fields.int(f), None)? as f64,
                _ => fields.float(f),
            };
        }
        (self.spec.check)(index, &raw[..self.spec.fields.len()])
    }

    /// Validates the update and every added request's values, then applies it (tests).
    pub fn update(&mut self, update: BatchUpdate<Vec<f64>>) -> Result<()> {
        update.validate(self.capacity())?;
        let spec = self.spec;
        let update = update.try_map_added(|i, v| (spec.check)(i, &v))?;
        self.commit(update);
        Ok(())
    }

    /// Applies an update whose values were already checked (no seeds).
    pub fn commit(&mut self, update: BatchUpdate<Option<Values>>) {
        update.replay(self, |v| v.map(|v| (v, None)));
    }

    /// Applies an update of checked values with each added request's seed (kept, with a
    /// new serial, where the declaration keeps seeds and the request is on).
    pub fn commit_seeded(&mut self, update: BatchUpdate<Option<(Values, Option<u64>)>>) {
        let mut next = self.next_serial;
        let keeps = self.seeds.is_some();
        update.replay(self, |e| {
            e.map(|(v, seed)| {
                let seeded = seed.filter(|_| keeps).map(|s| {
                    next += 1;
                    (next - 1, s as i64)
                });
                (v, seeded)
            })
        });
        self.next_serial = next;
    }

    fn read(&self, index: usize) -> Option<Slot> {
        if !self.set[index] {
            return None;
        }
        let mut out = [0.0; MAX_FIELDS];
        for (k, b) in self.buffers.iter().enumerate() {
            out[k] = b.get(index);
        }
        Some((out, self.seeded(index)))
    }

    fn write(&mut self, index: usize, slot: Option<Slot>) {
        if slot.is_none() && !self.set[index] {
            return; // already neutral: nothing to write (or to upload)
        }
        let values = slot.map(|s| s.0);
        let v = values.unwrap_or_else(|| self.spec.neutrals());
        for (k, b) in self.buffers.iter_mut().enumerate() {
            if b.get(index).to_bits() != v[k].to_bits() {
                b.set(index, v[k]);
            }
        }
        if let Some(bufs) = self.seeds.as_mut() {
            let (serial, seed) = slot.and_then(|s| s.1).unwrap_or((0, 0));
            for (b, x) in bufs.iter_mut().zip([serial, seed]) {
                if b.get(index) != x {
                    b.set(index, x);
                }
            }
        }
        let is_set = values.is_some();
        self.count = self.count + usize::from(is_set) - usize::from(self.set[index]);
        self.set[index] = is_set;
    }
}

impl SlotOps for FloatParamsTable {
    type Value = Slot;

    fn put(&mut self, index: usize, value: Option<Slot>) {
        self.write(index, value);
    }

    fn take(&mut self, index: usize) -> Option<Slot> {
        let v = self.read(index);
        self.write(index, None);
        v
    }

    fn swap(&mut self, a: usize, b: usize) {
        let (va, vb) = (self.read(a), self.read(b));
        self.write(a, vb);
        self.write(b, va);
    }
}

impl HasBuffers for FloatParamsTable {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        for (name, b) in self.spec.buffers.iter().zip(self.buffers.iter_mut()) {
            f(name, b);
        }
        if let (Some(names), Some(bufs)) = (self.spec.seeds, self.seeds.as_mut()) {
            for (name, b) in names.into_iter().zip(bufs.iter_mut()) {
                f(name, b);
            }
        }
    }
}

impl Table for FloatParamsTable {
    fn name(&self) -> &str {
        self.spec.name
    }

    fn check(&self, index: usize, fields: &mut Fields, _: Admission) -> Result<Entry> {
        let seed = fields.seed;
        Ok(entry(self.check_fields(index, fields)?.map(|v| (v, seed))))
    }

    fn commit(&mut self, update: BatchUpdate<Entry>, _: &StepContext<'_>) {
        self.commit_seeded(unbox::<(Values, Option<u64>)>(update));
    }

    fn active(&self) -> Option<usize> {
        Some(self.count)
    }

    fn status(&self, out: &mut StatusSink<'_>) {
        out(self.spec.name, self.count);
    }
}

/// Builds a declaration's table for a pipeline (each declaration's registry `build`).
pub fn build(spec: &'static FloatParams, b: &Build<'_>) -> Result<Box<dyn Table>> {
    Ok(Box::new(FloatParamsTable::try_new(spec, b.capacity)?))
}

/// One value per field, the first `values.len()` entries set.
pub fn values(values: &[f32]) -> Values {
    let mut out = [0.0; MAX_FIELDS];
    out[..values.len()].copy_from_slice(values);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Move;
    use crate::error::Error;

    const FIELDS: &[FieldSpec] = &[
        FieldSpec::new("t_a", FieldKind::Float { neutral: 1.0 }),
        FieldSpec::new("t_b", FieldKind::Float { neutral: 0.0 }),
    ];

    fn check(index: usize, v: &[f64]) -> Result<Option<Values>> {
        if !(0.0..=1.0).contains(&v[0]) {
            return Err(Error::invalid(index, "t_a", "must be in [0, 1]"));
        }
        Ok((v[0] != 1.0 || v[1] != 0.0).then(|| values(&[v[0] as f32, v[1] as f32])))
    }

    static SPEC: FloatParams = FloatParams {
        name: "t",
        fields: FIELDS,
        buffers: &["t.a", "t.b"],
        seeds: None,
        check,
    };

    #[test]
    fn counts_moves_swaps_and_removes_like_min_p() {
        let mut t = FloatParamsTable::try_new(&SPEC, 4).unwrap();
        assert_eq!(t.get(0), Some(vec![1.0, 0.0]));
        let mut u = BatchUpdate::new(3);
        u.added = vec![
            (0, vec![0.5, 0.0]),
            (1, vec![1.0, 0.0]),
            (2, vec![1.0, 2.0]),
        ];
        t.update(u).unwrap();
        assert_eq!(t.count(), 2);
        let mut u = BatchUpdate::new(3);
        u.moved = vec![Move::swap(0, 1)];
        t.update(u).unwrap();
        assert_eq!(
            (t.get(0), t.get(1)),
            (Some(vec![1.0, 0.0]), Some(vec![0.5, 0.0]))
        );
        assert_eq!(t.count(), 2);
        let mut u = BatchUpdate::new(2);
        u.moved = vec![Move::unidirectional(2, 0)];
        t.update(u).unwrap();
        assert_eq!(
            (t.get(0), t.get(2)),
            (Some(vec![1.0, 2.0]), Some(vec![1.0, 0.0]))
        );
        assert_eq!(t.count(), 2);
        let mut u = BatchUpdate::new(2);
        u.removed = vec![1];
        t.update(u).unwrap();
        assert_eq!((t.count(), t.get(1)), (1, Some(vec![1.0, 0.0])));
        assert_eq!(t.get(4), None);
    }

    #[test]
    fn a_bad_value_names_index_and_field_and_changes_nothing() {
        let mut t = FloatParamsTable::try_new(&SPEC, 4).unwrap();
        let mut u = BatchUpdate::new(2);
        u.added = vec![(0, vec![0.5, 0.0]), (1, vec![2.0, 0.0])];
        let err = t.update(u).unwrap_err().to_string();
        assert!(err.contains("index 1") && err.contains("t_a"), "{err}");
        assert_eq!((t.count(), t.get(0)), (0, Some(vec![1.0, 0.0])));
    }

    #[test]
    fn the_four_declarations_check_their_ranges() {
        use crate::tables::{epsilon_cutoff, eta_cutoff, top_n_sigma, typical_p};
        let on = |v: f32| Ok(Some(values(&[v])));
        assert_eq!((top_n_sigma::SPEC.check)(0, &[1.5]), on(1.5));
        assert_eq!((top_n_sigma::SPEC.check)(0, &[0.0]), Ok(None));
        assert_eq!((top_n_sigma::SPEC.check)(0, &[-3.0]), Ok(None)); // <= 0: off
        assert_eq!((typical_p::SPEC.check)(0, &[0.5]), on(0.5));
        assert_eq!((typical_p::SPEC.check)(0, &[1.0]), Ok(None));
        for spec in [&epsilon_cutoff::SPEC, &eta_cutoff::SPEC] {
            assert_eq!((spec.check)(0, &[0.01]), on(0.01));
            assert_eq!((spec.check)(0, &[0.0]), Ok(None));
        }
        let bad: [(&FloatParams, f64); 9] = [
            (&top_n_sigma::SPEC, f64::NAN),
            (&top_n_sigma::SPEC, f64::INFINITY),
            (&top_n_sigma::SPEC, 1e39),
            (&typical_p::SPEC, 0.0),
            (&typical_p::SPEC, 1.5),
            (&epsilon_cutoff::SPEC, 1.0),
            (&epsilon_cutoff::SPEC, -0.1),
            (&eta_cutoff::SPEC, f64::NAN),
            (&eta_cutoff::SPEC, 1.0),
        ];
        for (spec, v) in bad {
            let err = (spec.check)(2, &[v]).unwrap_err().to_string();
            assert!(err.contains("index 2") && err.contains(spec.name), "{err}");
        }
    }
}

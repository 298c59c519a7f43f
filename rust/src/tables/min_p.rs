//! MinP state: one float32 per slot, plus the count of slots with min_p != 0.
//!
//! The exported buffer holds `ln(min_p)` (−inf for "no min_p"), because apply works in logit
//! space: keep a token iff `logit >= max_logit + ln(min_p)`, the same set as vLLM's
//! `p >= min_p * p_max` without a softmax. The raw float32 values are kept too, so the
//! bookkeeping (count, what changed) matches vLLM's float32 comparisons exactly.

use crate::arena::{HasBuffers, Staged};
use crate::batch::{BatchUpdate, SlotOps};
use crate::buffer::HostBuffer;
use crate::error::Result;
use crate::fields::Example as E;
use crate::fields::{FieldKind, FieldSpec, Fields, Range};
use crate::processor::{
    entry, unbox, Admission, Entry, HostApply, HostData, HostLogits, StatusSink, StepContext, Table,
};
use crate::tables::Build;

/// The request fields MinP reads.
pub const FIELDS: &[FieldSpec] = &[FieldSpec::new("min_p", FieldKind::Float { neutral: 0.0 })
    .range(Range::closed(0.0, 1.0))
    .examples(&[E::Float(0.1)])];

pub struct MinPState {
    values: Vec<f32>,
    log_min_p: HostBuffer<f32>,
    count: usize,
    batch_size: usize,
}

/// What a MinP update means for the device copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MinPUpdate {
    /// Some row in `[0, batch_size)` changed, or the batch size did: re-copy the prefix.
    pub needs_copy: bool,
}

impl MinPState {
    pub fn new(capacity: usize) -> Self {
        Self::try_new(capacity).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`new`](Self::new); a failed allocation is an error.
    pub fn try_new(capacity: usize) -> Result<Self> {
        Ok(MinPState {
            values: vec![0.0; capacity],
            log_min_p: HostBuffer::try_new(capacity, f32::NEG_INFINITY, "max_num_seqs")?,
            count: 0,
            batch_size: 0,
        })
    }

    pub fn capacity(&self) -> usize {
        self.values.len()
    }

    /// Slots with a non-zero min_p.
    pub fn count(&self) -> usize {
        self.count
    }

    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    pub fn get(&self, index: usize) -> Option<f32> {
        self.values.get(index).copied()
    }

    /// The per-slot `ln(min_p)` buffer Python views.
    pub fn log_min_p(&self) -> &HostBuffer<f32> {
        &self.log_min_p
    }

    /// Applies MinP in place to float32 logits on the host (rows `0..rows`, row `r` at
    /// `r * row_stride`): in each row with a min_p, every logit below `max + ln(min_p)` becomes
    /// −inf. Same arithmetic as the device form (`amax`, one float32 add, strict `<`); a row
    /// holding a NaN has a NaN maximum there too and is left alone.
    /// With `row_to_slot`, logits row `r` takes the state of slot `row_to_slot[r]` (the
    /// stable-slot front-end); without, row `r` is slot `r`.
    pub fn apply_to_rows(
        &self,
        logits: &mut [f32],
        rows: usize,
        vocab: usize,
        row_stride: usize,
        row_to_slot: Option<&[usize]>,
    ) {
        assert!(
            row_to_slot.map_or(rows <= self.batch_size, |m| m.len() >= rows)
                && (rows == 0 || (rows - 1) * row_stride + vocab <= logits.len())
        );
        for row in 0..rows {
            let slot = row_to_slot.map_or(row, |m| m[row]);
            let log_min_p = self.log_min_p.get(slot);
            if log_min_p == f32::NEG_INFINITY {
                continue;
            }
            let line = &mut logits[row * row_stride..row * row_stride + vocab];
            let max = row_max(line);
            if max == f32::INFINITY {
                // vLLM's softmax of such a row is NaN and masks nothing: leave it alone.
                continue;
            }
            let threshold = max + log_min_p;
            for x in line.iter_mut() {
                if *x < threshold {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// Checks one request's min_p: a number in [0, 1].
    pub fn check(index: usize, min_p: f64) -> Result<f32> {
        Ok(FIELDS[0].checked(index, min_p)? as f32)
    }

    fn write(&mut self, index: usize, value: f32) -> bool {
        let old = self.values[index];
        if old == value {
            return false;
        }
        self.count = self.count + usize::from(value != 0.0) - usize::from(old != 0.0);
        self.values[index] = value;
        self.log_min_p.set(index, value.ln());
        true
    }

    /// Validates the update and every added min_p, then applies added, removed, moved.
    pub fn update(&mut self, update: BatchUpdate<f64>) -> Result<MinPUpdate> {
        update.validate(self.capacity())?;
        let update = update.try_map_added(Self::check)?;
        Ok(self.commit(update))
    }

    /// Applies an update whose indices and values were already checked.
    pub fn commit(&mut self, update: BatchUpdate<f32>) -> MinPUpdate {
        let batch_size = update.batch_size;
        let mut ops = MinPOps {
            state: self,
            changed: false,
        };
        update.replay(&mut ops, Some);
        let changed = ops.changed;
        let resized = batch_size != self.batch_size;
        self.batch_size = batch_size;
        MinPUpdate {
            needs_copy: self.count > 0 && (changed || resized),
        }
    }
}

impl HasBuffers for MinPState {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        f("min_p.log_min_p", &mut self.log_min_p);
    }
}

impl Table for MinPState {
    fn name(&self) -> &str {
        "min_p"
    }

    fn check(&self, index: usize, fields: &mut Fields, _: Admission) -> Result<Entry> {
        // Kept as given, −0.0 included (the stored float32 is vLLM's).
        Ok(entry(Some(Self::check(index, fields.float(&FIELDS[0]))?)))
    }

    fn commit(&mut self, update: BatchUpdate<Entry>, _: &StepContext<'_>) {
        MinPState::commit(self, unbox::<f32>(update).map_added(|v| v.unwrap_or(0.0)));
    }

    fn active(&self) -> Option<usize> {
        Some(self.count)
    }

    fn status(&self, out: &mut StatusSink<'_>) {
        out("min_p", self.count);
    }

    fn host(&self) -> Option<&dyn HostApply> {
        Some(self)
    }
}

impl HostApply for MinPState {
    fn apply_host(&self, l: &mut HostLogits<'_>) -> std::result::Result<(), &'static str> {
        match &mut l.data {
            HostData::F32(data) => {
                self.apply_to_rows(data, l.rows, l.vocab, l.row_stride, l.row_to_slot);
                Ok(())
            }
            HostData::F64(_) => Err("applies on float32 logits only"),
        }
    }
}

/// MinP's dense values under the table rule: an empty slot holds 0 ("no min_p").
struct MinPOps<'a> {
    state: &'a mut MinPState,
    changed: bool,
}

impl SlotOps for MinPOps<'_> {
    type Value = f32;

    fn put(&mut self, index: usize, value: Option<f32>) {
        self.changed |= self.state.write(index, value.unwrap_or(0.0));
    }

    fn take(&mut self, index: usize) -> Option<f32> {
        let v = self.state.values[index];
        self.changed |= self.state.write(index, 0.0);
        Some(v)
    }

    fn swap(&mut self, a: usize, b: usize) {
        let (va, vb) = (self.state.values[a], self.state.values[b]);
        self.changed |= self.state.write(a, vb);
        self.changed |= self.state.write(b, va);
    }
}

/// The maximum of a row as torch's `amax` gives it: NaN if the row holds a NaN. Written over
/// fixed-width lanes so the compiler vectorises it (a `break` on NaN would not).
fn row_max(line: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut maxes = [f32::NEG_INFINITY; LANES];
    let mut nan = [false; LANES];
    let chunks = line.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for i in 0..LANES {
            let x = chunk[i];
            maxes[i] = if x > maxes[i] { x } else { maxes[i] };
            nan[i] |= x.is_nan();
        }
    }
    let mut max = f32::NEG_INFINITY;
    let mut any_nan = nan.iter().any(|&b| b);
    for &m in &maxes {
        max = if m > max { m } else { max };
    }
    for &x in tail {
        max = if x > max { x } else { max };
        any_nan |= x.is_nan();
    }
    if any_nan {
        f32::NAN
    } else {
        max
    }
}

/// Builds the table for a pipeline (the registry's entry).
pub fn build(b: &Build<'_>) -> Result<Box<dyn Table>> {
    Ok(Box::new(MinPState::try_new(b.capacity)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Move;

    #[test]
    fn counts_and_moves() {
        let mut s = MinPState::new(4);
        let mut u = BatchUpdate::new(3);
        u.added = vec![(0, 0.1), (1, 0.0), (2, 0.5)];
        assert!(s.update(u).unwrap().needs_copy);
        assert_eq!(s.count(), 2);
        let mut u = BatchUpdate::new(2);
        u.moved = vec![Move::unidirectional(2, 0)];
        s.update(u).unwrap();
        assert_eq!((s.get(0), s.get(2), s.count()), (Some(0.5), Some(0.0), 1));
        assert_eq!(s.log_min_p().get(2), f32::NEG_INFINITY);
        assert_eq!(s.log_min_p().get(0), 0.5f32.ln());
    }

    #[test]
    fn row_max_matches_amax() {
        let mut v: Vec<f32> = (0..37).map(|i| ((i * 7919) % 101) as f32 - 50.0).collect();
        assert_eq!(row_max(&v), 50.0);
        v[36] = 99.0;
        assert_eq!(row_max(&v), 99.0);
        v[3] = f32::NAN;
        assert!(row_max(&v).is_nan());
        assert_eq!(row_max(&[f32::NEG_INFINITY; 5]), f32::NEG_INFINITY);
    }

    #[test]
    fn rejects_bad_min_p_without_change() {
        let mut s = MinPState::new(4);
        let mut u = BatchUpdate::new(2);
        u.added = vec![(0, 0.3), (1, f64::NAN)];
        let err = s.update(u).unwrap_err();
        assert!(err.to_string().contains("index 1"));
        assert!(err.to_string().contains("min_p"));
        assert_eq!(s.count(), 0);
        assert_eq!(s.get(0), Some(0.0));
    }
}

//! Per-request columns declared by custom processors: the core does the bookkeeping.
//!
//! A processor author declares columns (a float or an int per request, a small fixed-size
//! float array, a bounded token list) and how to read them from a request's parameters; the
//! pipeline keeps them per slot with the same add/remove/move rule as every built-in table,
//! records what changed, and uploads it with everything else. Each column is dense,
//! `[capacity, width]`, so its device view lines up with the logits' rows.

use crate::arena::{HasBuffers, Staged};
use crate::batch::{BatchUpdate, SlotOps};
use crate::buffer::HostBuffer;
use crate::error::{Error, Result};
use crate::fields::{ColumnValue, Fields};
use crate::limits::check_token;
use crate::processor::{self, Admission, StatusSink, StepContext, Table};

/// What one column holds per request.
#[derive(Clone, Debug, PartialEq)]
pub enum ColumnKind {
    /// One float32; `default` for requests that do not set it.
    Float { default: f32 },
    /// One int64.
    Int { default: i64 },
    /// `width` float32s.
    Array { width: usize, default: f32 },
    /// Up to `max_len` token ids, padded with −1; a second buffer holds the lengths.
    Tokens { max_len: usize },
}

/// A declared column: its name (for error messages) and kind.
#[derive(Clone, Debug, PartialEq)]
pub struct ColumnSpec {
    pub name: String,
    pub kind: ColumnKind,
}

/// A checked row of a column, ready to write.
#[derive(Clone, Debug, PartialEq)]
pub enum Row {
    F32(Vec<f32>),
    I64(i64),
    Tokens(Vec<i32>),
}

enum Storage {
    F32(HostBuffer<f32>),
    I64(HostBuffer<i64>),
    Tokens {
        ids: HostBuffer<i32>,
        lens: HostBuffer<i32>,
    },
}

/// The per-slot storage of one column.
pub struct Column {
    spec: ColumnSpec,
    storage: Storage,
    /// Whether each slot holds a non-default value.
    set: Vec<bool>,
    active: usize,
    vocab_size: usize,
}

impl Column {
    pub fn new(spec: ColumnSpec, capacity: usize, vocab_size: usize) -> Result<Self> {
        let field = "column";
        let width = spec.width();
        let len = capacity.checked_mul(width).ok_or(Error::TooLarge {
            field,
            value: width,
            max: usize::MAX / capacity.max(1),
        })?;
        let storage = match spec.kind {
            ColumnKind::Float { default } => {
                Storage::F32(HostBuffer::try_new(len, default, field)?)
            }
            ColumnKind::Array { default, .. } => {
                Storage::F32(HostBuffer::try_new(len, default, field)?)
            }
            ColumnKind::Int { default } => Storage::I64(HostBuffer::try_new(len, default, field)?),
            ColumnKind::Tokens { .. } => Storage::Tokens {
                ids: HostBuffer::try_new(len, -1, field)?,
                lens: HostBuffer::try_new(capacity, 0, field)?,
            },
        };
        Ok(Column {
            spec,
            storage,
            set: vec![false; capacity],
            active: 0,
            vocab_size,
        })
    }

    pub fn spec(&self) -> &ColumnSpec {
        &self.spec
    }

    /// Slots holding a non-default value.
    pub fn active(&self) -> usize {
        self.active
    }

    /// Checks one request's value for this column.
    pub fn check(&self, index: usize, value: ColumnValue) -> Result<Option<Row>> {
        let name = &self.spec.name;
        let bad = |message: String| Error::InvalidColumn {
            index,
            column: name.clone(),
            message,
        };
        // `item`: the position of a bad value inside a sequence.
        let finite = |v: f64, item: Option<usize>| -> Result<f32> {
            let x = v as f32;
            if x.is_finite() {
                Ok(x)
            } else {
                let at = item.map(|k| format!("item {k}: ")).unwrap_or_default();
                Err(bad(format!("{at}{v:?} is not a finite float32")))
            }
        };
        Ok(match (&self.spec.kind, value) {
            (_, ColumnValue::Unset) => None,
            (ColumnKind::Float { .. }, ColumnValue::Float(v)) => {
                Some(Row::F32(vec![finite(v, None)?]))
            }
            (ColumnKind::Float { .. }, ColumnValue::Int(v)) => {
                Some(Row::F32(vec![finite(v as f64, None)?]))
            }
            (ColumnKind::Int { .. }, ColumnValue::Int(v)) => Some(Row::I64(v)),
            (ColumnKind::Array { width, .. }, ColumnValue::Array(vs)) => {
                if vs.len() != *width {
                    return Err(bad(format!("expected {width} values, got {}", vs.len())));
                }
                let mut out = Vec::with_capacity(vs.len());
                for (k, v) in vs.into_iter().enumerate() {
                    out.push(finite(v, Some(k))?);
                }
                Some(Row::F32(out))
            }
            (ColumnKind::Tokens { max_len }, ColumnValue::Tokens(ids)) => {
                if ids.len() > *max_len {
                    return Err(bad(format!(
                        "{} token ids exceed the cap of {max_len}",
                        ids.len()
                    )));
                }
                let mut out = Vec::with_capacity(ids.len());
                for (k, t) in ids.into_iter().enumerate() {
                    match check_token(index, "column", t, self.vocab_size) {
                        Ok(t) => out.push(t),
                        Err(_) => {
                            return Err(bad(format!(
                                "item {k}: token id {t} outside [0, {})",
                                self.vocab_size
                            )))
                        }
                    }
                }
                Some(Row::Tokens(out))
            }
            (kind, v) => return Err(bad(format!("a {kind:?} column cannot hold {v:?}"))),
        })
    }

    /// Applies an update whose rows were already checked.
    pub fn commit(&mut self, update: BatchUpdate<Option<Row>>) {
        update.replay(self, |row| row);
    }

    fn write(&mut self, index: usize, row: Option<Row>) {
        let width = self.spec.width();
        let base = index * width;
        let is_set = row.is_some();
        match (&mut self.storage, &self.spec.kind, row) {
            (Storage::F32(b), _, Some(Row::F32(vs))) => {
                for (k, v) in vs.into_iter().enumerate() {
                    b.set(base + k, v);
                }
            }
            (Storage::F32(b), ColumnKind::Float { default }, None) => b.set(base, *default),
            (Storage::F32(b), ColumnKind::Array { default, .. }, None) => {
                b.fill(base, base + width, *default)
            }
            (Storage::I64(b), _, Some(Row::I64(v))) => b.set(base, v),
            (Storage::I64(b), ColumnKind::Int { default }, None) => b.set(base, *default),
            (Storage::Tokens { ids, lens }, _, row) => {
                let toks = match row {
                    Some(Row::Tokens(t)) => t,
                    _ => Vec::new(),
                };
                for (k, &t) in toks.iter().enumerate() {
                    ids.set(base + k, t);
                }
                // Only rewrite the stale tail (a longer previous list), not the whole row.
                let old = lens.get(index) as usize;
                if old > toks.len() {
                    ids.fill(base + toks.len(), base + old, -1);
                }
                lens.set(index, toks.len() as i32);
            }
            _ => unreachable!("rows are checked against the column kind"),
        }
        self.active = self.active + usize::from(is_set) - usize::from(self.set[index]);
        self.set[index] = is_set;
    }

    fn read(&self, index: usize) -> Option<Row> {
        if !self.set[index] {
            return None;
        }
        let width = self.spec.width();
        let base = index * width;
        Some(match &self.storage {
            Storage::F32(b) => Row::F32((base..base + width).map(|i| b.get(i)).collect()),
            Storage::I64(b) => Row::I64(b.get(base)),
            Storage::Tokens { ids, lens } => Row::Tokens(
                (0..lens.get(index) as usize)
                    .map(|k| ids.get(base + k))
                    .collect(),
            ),
        })
    }
}

impl ColumnSpec {
    /// Elements per slot.
    pub fn width(&self) -> usize {
        match self.kind {
            ColumnKind::Float { .. } | ColumnKind::Int { .. } => 1,
            ColumnKind::Array { width, .. } => width,
            ColumnKind::Tokens { max_len } => max_len,
        }
    }
}

impl SlotOps for Column {
    type Value = Row;

    fn put(&mut self, index: usize, value: Option<Row>) {
        if value.is_some() || self.set[index] {
            self.write(index, value);
        }
    }

    fn take(&mut self, index: usize) -> Option<Row> {
        let row = self.read(index);
        if row.is_some() {
            self.write(index, None);
        }
        row
    }

    fn swap(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.take(a), self.take(b));
        self.put(a, rb);
        self.put(b, ra);
    }
}

impl HasBuffers for Column {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        match &mut self.storage {
            Storage::F32(b) => f("column.values", b),
            Storage::I64(b) => f("column.values", b),
            Storage::Tokens { ids, lens } => {
                f("column.values", ids);
                f("column.lengths", lens);
            }
        }
    }
}

/// One declared column in a pipeline: the `position`-th of the request's column values.
pub struct ColumnTable {
    pub column: Column,
    position: usize,
    status_name: String,
}

impl ColumnTable {
    pub fn new(column: Column, position: usize) -> Self {
        ColumnTable {
            column,
            position,
            status_name: format!("column.{position}"),
        }
    }
}

impl HasBuffers for ColumnTable {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        self.column.visit_buffers(f);
    }
}

impl Table for ColumnTable {
    fn name(&self) -> &str {
        &self.column.spec().name
    }

    fn check(&self, index: usize, fields: &mut Fields, _: Admission) -> Result<processor::Entry> {
        let value = fields
            .columns
            .get_mut(self.position)
            .map_or(ColumnValue::Unset, |v| {
                std::mem::replace(v, ColumnValue::Unset)
            });
        Ok(processor::entry(self.column.check(index, value)?))
    }

    fn commit(&mut self, update: BatchUpdate<processor::Entry>, _: &StepContext<'_>) {
        self.column.commit(processor::unbox(update));
    }

    fn status(&self, out: &mut StatusSink<'_>) {
        out(&self.status_name, self.column.active());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Move;

    fn spec(kind: ColumnKind) -> ColumnSpec {
        ColumnSpec {
            name: "c".into(),
            kind,
        }
    }

    fn upd(
        bs: usize,
        added: Vec<(usize, Option<Row>)>,
        moved: Vec<Move>,
    ) -> BatchUpdate<Option<Row>> {
        let mut u = BatchUpdate::new(bs);
        u.added = added;
        u.moved = moved;
        u
    }

    #[test]
    fn float_column_moves_and_defaults() {
        let mut c = Column::new(spec(ColumnKind::Float { default: 1.0 }), 4, 10).unwrap();
        let row = c.check(0, ColumnValue::Float(2.5)).unwrap();
        c.commit(upd(2, vec![(0, row), (1, None)], vec![]));
        assert_eq!(c.active(), 1);
        c.commit(upd(2, vec![], vec![Move::swap(0, 1)]));
        assert_eq!(c.read(1), Some(Row::F32(vec![2.5])));
        c.commit(upd(1, vec![], vec![Move::unidirectional(1, 0)]));
        assert_eq!(c.read(0), Some(Row::F32(vec![2.5])));
        assert_eq!(c.read(1), None);
        let Storage::F32(b) = &c.storage else {
            panic!()
        };
        assert_eq!(b.to_vec(2), vec![2.5, 1.0]);
    }

    #[test]
    fn token_column_pads_and_checks() {
        let mut c = Column::new(spec(ColumnKind::Tokens { max_len: 3 }), 2, 10).unwrap();
        assert!(c.check(0, ColumnValue::Tokens(vec![1, 2, 3, 4])).is_err());
        assert!(c.check(0, ColumnValue::Tokens(vec![10])).is_err());
        assert!(c.check(0, ColumnValue::Float(1.0)).is_err());
        let row = c.check(0, ColumnValue::Tokens(vec![4, 5])).unwrap();
        c.commit(upd(2, vec![(0, row)], vec![Move::swap(0, 1)]));
        let Storage::Tokens { ids, lens } = &c.storage else {
            panic!()
        };
        assert_eq!(ids.to_vec(6), vec![-1, -1, -1, 4, 5, -1]);
        assert_eq!(lens.to_vec(2), vec![0, 2]);
    }

    #[test]
    fn errors_name_the_column_and_the_item() {
        let c = Column::new(spec(ColumnKind::Tokens { max_len: 3 }), 2, 10).unwrap();
        for (value, detail) in [
            (vec![1, 2, 3, 4], "'c': 4 token ids exceed the cap of 3"),
            (vec![1, 10], "'c': item 1: token id 10 outside [0, 10)"),
            (vec![-1], "'c': item 0: token id -1 outside [0, 10)"),
        ] {
            let e = c.check(4, ColumnValue::Tokens(value)).unwrap_err();
            assert_eq!(
                (e.index(), e.field(), e.column()),
                (Some(4), Some("column"), Some("c"))
            );
            assert_eq!(e.detail().as_deref(), Some(detail));
        }
        let a = Column::new(
            spec(ColumnKind::Array {
                width: 2,
                default: 0.0,
            }),
            2,
            10,
        )
        .unwrap();
        let e = a.check(1, ColumnValue::Array(vec![0.5, 1e39])).unwrap_err();
        assert_eq!(e.column(), Some("c"));
        assert_eq!(
            e.detail().as_deref(),
            Some("'c': item 1: 1e39 is not a finite float32")
        );
    }
}

//! The description of one step's batch change, and the builder that an engine fills.
//!
//! Mirrors vLLM 0.25.1 `interface.py` / `state.py`: requests are `added` into slots (reusing the
//! lowest freed slot first), `removed` slots are the ones left empty, and `moved` lists condense
//! moves (UNIDIRECTIONAL, from -> to) and reorder swaps (SWAP). The payload type `A` of an added
//! entry is whatever one table needs from a request (a min_p value, a bias list, ...).

use crate::error::{Error, Result};

/// How a moved request travels between two slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MoveDirectionality {
    /// One-way move `from -> to`; the destination's old state is discarded, the source emptied.
    Unidirectional,
    /// Two-way exchange `from <-> to`, also when only one side holds state.
    Swap,
}

/// One entry of `BatchUpdate.moved`: `(index1, index2, directionality)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Move {
    pub from: usize,
    pub to: usize,
    pub dir: MoveDirectionality,
}

impl Move {
    pub fn unidirectional(from: usize, to: usize) -> Self {
        Move {
            from,
            to,
            dir: MoveDirectionality::Unidirectional,
        }
    }

    pub fn swap(a: usize, b: usize) -> Self {
        Move {
            from: a,
            to: b,
            dir: MoveDirectionality::Swap,
        }
    }
}

/// One step's batch change. `batch_size` is the row count after the change.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchUpdate<A> {
    pub batch_size: usize,
    pub removed: Vec<usize>,
    pub added: Vec<(usize, A)>,
    pub moved: Vec<Move>,
}

impl<A> BatchUpdate<A> {
    pub fn new(batch_size: usize) -> Self {
        BatchUpdate {
            batch_size,
            removed: Vec::new(),
            added: Vec::new(),
            moved: Vec::new(),
        }
    }

    /// Checks every index against `capacity` and rejects an index added twice. Tables call this
    /// before touching any slot, so a rejected update changes nothing.
    pub fn validate(&self, capacity: usize) -> Result<()> {
        if self.batch_size > capacity {
            return Err(Error::BatchTooLarge {
                batch_size: self.batch_size,
                capacity,
            });
        }
        let in_range = |index: usize, field: &'static str| {
            if index < capacity {
                Ok(())
            } else {
                Err(Error::IndexOutOfRange {
                    index,
                    field,
                    capacity,
                })
            }
        };
        for &index in &self.removed {
            in_range(index, "removed")?;
        }
        // Duplicate adds: a pairwise scan for the usual handful, a bitmap for big updates.
        if self.added.len() <= 16 {
            for (i, (index, _)) in self.added.iter().enumerate() {
                in_range(*index, "added")?;
                if self.added[..i].iter().any(|(other, _)| other == index) {
                    return Err(Error::DuplicateAdd { index: *index });
                }
            }
        } else {
            let mut seen = vec![false; capacity];
            for (index, _) in &self.added {
                in_range(*index, "added")?;
                if std::mem::replace(&mut seen[*index], true) {
                    return Err(Error::DuplicateAdd { index: *index });
                }
            }
        }
        for m in &self.moved {
            in_range(m.from, "moved")?;
            in_range(m.to, "moved")?;
            if m.from == m.to {
                return Err(Error::invalid(
                    m.from,
                    "moved",
                    "a move from a slot to itself (index1 == index2)",
                ));
            }
        }
        Ok(())
    }

    /// The same update with each added payload mapped (validated) into another type.
    pub fn try_map_added<B>(
        self,
        mut f: impl FnMut(usize, A) -> Result<B>,
    ) -> Result<BatchUpdate<B>> {
        let added = self
            .added
            .into_iter()
            .map(|(index, a)| f(index, a).map(|b| (index, b)))
            .collect::<Result<Vec<_>>>()?;
        Ok(BatchUpdate {
            batch_size: self.batch_size,
            removed: self.removed,
            added,
            moved: self.moved,
        })
    }

    /// The same update with each added payload mapped into another type.
    pub fn map_added<B>(self, mut f: impl FnMut(A) -> B) -> BatchUpdate<B> {
        BatchUpdate {
            batch_size: self.batch_size,
            removed: self.removed,
            added: self.added.into_iter().map(|(i, a)| (i, f(a))).collect(),
            moved: self.moved,
        }
    }

    /// Replays the update on `store` as elementary slot operations, in vLLM's order: added
    /// (`value` maps the payload; `None` clears the slot), removed (cleared), then moved (a
    /// UNIDIRECTIONAL move takes the source's state, leaving it empty, and overwrites the
    /// destination; a SWAP exchanges the two). This is the one place the move rule lives.
    pub fn replay<S: SlotOps>(self, store: &mut S, mut value: impl FnMut(A) -> Option<S::Value>) {
        for (index, a) in self.added {
            store.put(index, value(a));
        }
        replay_rest(&self.removed, &self.moved, store);
    }

    /// As [`replay`](Self::replay), reading the payloads by reference.
    pub fn replay_ref<S: SlotOps>(
        &self,
        store: &mut S,
        mut value: impl FnMut(&A) -> Option<S::Value>,
    ) {
        for (index, a) in &self.added {
            store.put(*index, value(a));
        }
        replay_rest(&self.removed, &self.moved, store);
    }

    /// True when the update adds, removes or moves nothing.
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && self.added.is_empty() && self.moved.is_empty()
    }
}

/// Per-slot storage that a [`BatchUpdate`] can be replayed on.
pub trait SlotOps {
    type Value;
    /// Overwrites slot `index` (`None` empties it).
    fn put(&mut self, index: usize, value: Option<Self::Value>);
    /// Empties slot `index`, returning what it held.
    fn take(&mut self, index: usize) -> Option<Self::Value>;
    /// Exchanges two slots (also when one or both are empty).
    fn swap(&mut self, a: usize, b: usize);
}

fn replay_rest<S: SlotOps>(removed: &[usize], moved: &[Move], store: &mut S) {
    for &index in removed {
        store.put(index, None);
    }
    for m in moved {
        match m.dir {
            MoveDirectionality::Swap => store.swap(m.from, m.to),
            MoveDirectionality::Unidirectional => {
                let v = store.take(m.from);
                store.put(m.to, v);
            }
        }
    }
}

/// Collects one step's changes, with vLLM's rules for removed slots.
///
/// All removals are registered first; once `removed()`, `peek_removed()` or `pop_removed()`
/// has been read, `removed_append` fails. `removed` reads sorted descending, so popping from its
/// end hands out the lowest freed slot first.
#[derive(Debug)]
pub struct BatchUpdateBuilder<A> {
    removed: Vec<usize>,
    removed_sorted: bool,
    pub added: Vec<(usize, A)>,
    pub moved: Vec<Move>,
    batch_changed: bool,
}

impl<A> Default for BatchUpdateBuilder<A> {
    fn default() -> Self {
        BatchUpdateBuilder {
            removed: Vec::new(),
            removed_sorted: false,
            added: Vec::new(),
            moved: Vec::new(),
            batch_changed: false,
        }
    }
}

impl<A> BatchUpdateBuilder<A> {
    pub fn new() -> Self {
        Self::default()
    }

    fn ensure_removed_sorted(&mut self) {
        if !self.removed_sorted {
            self.removed.sort_unstable_by(|a, b| b.cmp(a));
            self.removed_sorted = true;
        }
    }

    /// The removed slots, sorted descending. Reading them closes registration of removals.
    pub fn removed(&mut self) -> &[usize] {
        self.ensure_removed_sorted();
        &self.removed
    }

    pub fn removed_append(&mut self, index: usize) -> Result<()> {
        if self.removed_sorted {
            return Err(Error::RemovedAfterRead);
        }
        self.removed.push(index);
        self.batch_changed = true;
        Ok(())
    }

    pub fn has_removed(&self) -> bool {
        !self.removed.is_empty()
    }

    /// The lowest removed slot, without taking it.
    pub fn peek_removed(&mut self) -> Option<usize> {
        if self.removed.is_empty() {
            return None;
        }
        self.ensure_removed_sorted();
        self.removed.last().copied()
    }

    /// Takes the lowest removed slot (for reuse by an added request or a condense move).
    pub fn pop_removed(&mut self) -> Option<usize> {
        if self.removed.is_empty() {
            return None;
        }
        self.ensure_removed_sorted();
        self.removed.pop()
    }

    /// Marks the batch as changed without an add/remove/move (vLLM's pooling path).
    pub fn mark_changed(&mut self) {
        self.batch_changed = true;
    }

    /// Clears everything; returns whether the batch had changed.
    pub fn reset(&mut self) -> bool {
        self.removed_sorted = false;
        self.removed.clear();
        self.added.clear();
        self.moved.clear();
        std::mem::take(&mut self.batch_changed)
    }

    /// Hands the step's change out and starts the next step. `None` when nothing was added,
    /// removed or moved (even if `mark_changed` was called), as in vLLM.
    pub fn get_and_reset(&mut self, batch_size: usize) -> Option<BatchUpdate<A>> {
        self.removed_sorted = false;
        self.batch_changed = false;
        if self.removed.is_empty() && self.moved.is_empty() && self.added.is_empty() {
            return None;
        }
        Some(BatchUpdate {
            batch_size,
            removed: std::mem::take(&mut self.removed),
            added: std::mem::take(&mut self.added),
            moved: std::mem::take(&mut self.moved),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_reads_descending_and_pops_lowest() {
        let mut b: BatchUpdateBuilder<()> = BatchUpdateBuilder::new();
        for i in [5, 1, 9, 3] {
            b.removed_append(i).unwrap();
        }
        assert_eq!(b.removed(), &[9, 5, 3, 1]);
        assert_eq!(b.peek_removed(), Some(1));
        assert_eq!(b.pop_removed(), Some(1));
        assert_eq!(b.pop_removed(), Some(3));
        assert_eq!(b.removed_append(7), Err(Error::RemovedAfterRead));
    }

    #[test]
    fn get_and_reset_none_when_unchanged() {
        let mut b: BatchUpdateBuilder<u8> = BatchUpdateBuilder::new();
        b.mark_changed();
        assert!(b.get_and_reset(4).is_none());
        b.added.push((0, 1));
        let u = b.get_and_reset(4).unwrap();
        assert_eq!(u.added, vec![(0, 1)]);
        assert!(b.get_and_reset(4).is_none());
        // Registration reopens after a reset.
        b.removed_append(2).unwrap();
        let _ = b.removed();
        assert!(b.get_and_reset(3).is_some());
        b.removed_append(1).unwrap();
    }

    #[test]
    fn validate_rejects_bad_indices() {
        let mut u: BatchUpdate<()> = BatchUpdate::new(4);
        u.added = vec![(1, ()), (1, ())];
        assert_eq!(u.validate(8), Err(Error::DuplicateAdd { index: 1 }));
        let mut u: BatchUpdate<()> = BatchUpdate::new(9);
        assert!(matches!(u.validate(8), Err(Error::BatchTooLarge { .. })));
        u.batch_size = 2;
        u.moved.push(Move::swap(0, 8));
        assert!(matches!(
            u.validate(8),
            Err(Error::IndexOutOfRange { index: 8, .. })
        ));
    }
}

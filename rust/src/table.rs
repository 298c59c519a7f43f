//! Generic per-slot storage with vLLM's batch-update semantics.
//!
//! A `SlotTable<T>` holds at most one state per slot of the persistent batch. Applying a
//! [`BatchUpdate`] follows vLLM 0.25.1's `process_dict_updates`: added (a `None` payload clears
//! the slot), then removed, then moved. A UNIDIRECTIONAL move discards the destination's stale
//! state and empties the source; a SWAP exchanges the two slots even when only one holds state.
//! The return value says whether any slot's state changed, so callers rebuild only when needed.

use crate::batch::{BatchUpdate, SlotOps};
use crate::error::Result;

#[derive(Clone, Debug)]
pub struct SlotTable<T> {
    slots: Vec<Option<T>>,
    active: usize,
}

impl<T> SlotTable<T> {
    pub fn new(capacity: usize) -> Self {
        SlotTable {
            slots: (0..capacity).map(|_| None).collect(),
            active: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Number of slots holding state.
    pub fn active(&self) -> usize {
        self.active
    }

    pub fn get(&self, index: usize) -> Option<&T> {
        self.slots.get(index).and_then(Option::as_ref)
    }

    pub fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        self.slots.get_mut(index).and_then(Option::as_mut)
    }

    /// Slots holding state, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|v| (i, v)))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (usize, &mut T)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| s.as_mut().map(|v| (i, v)))
    }

    /// Overwrites slot `index`, returning what it held.
    pub fn replace(&mut self, index: usize, value: Option<T>) -> Option<T> {
        self.set(index, value)
    }

    /// Exchanges two slots.
    pub fn swap(&mut self, a: usize, b: usize) {
        self.slots.swap(a, b);
    }

    fn set(&mut self, index: usize, value: Option<T>) -> Option<T> {
        let old = std::mem::replace(&mut self.slots[index], value);
        self.active =
            self.active + usize::from(self.slots[index].is_some()) - usize::from(old.is_some());
        old
    }

    fn take(&mut self, index: usize) -> Option<T> {
        self.set(index, None)
    }

    /// Validates the whole update, then applies it. Returns whether any state changed.
    pub fn apply(&mut self, update: BatchUpdate<Option<T>>) -> Result<bool> {
        update.validate(self.capacity())?;
        Ok(self.apply_validated(update))
    }

    /// Applies an update already checked with [`BatchUpdate::validate`] against this capacity.
    pub fn apply_validated(&mut self, update: BatchUpdate<Option<T>>) -> bool {
        let mut tracked = Tracked {
            table: self,
            changed: false,
            touched: None,
        };
        update.replay(&mut tracked, |state| state);
        tracked.changed
    }

    /// As [`apply_validated`](Self::apply_validated), also appending to `touched` every slot an
    /// operation reached (a slot may appear more than once): the only slots whose state may
    /// differ afterwards.
    pub fn apply_validated_touching(
        &mut self,
        update: BatchUpdate<Option<T>>,
        touched: &mut Vec<usize>,
    ) -> bool {
        let mut tracked = Tracked {
            table: self,
            changed: false,
            touched: Some(touched),
        };
        update.replay(&mut tracked, |state| state);
        tracked.changed
    }

    /// Drops every state for which `keep` returns false; returns whether any was dropped.
    pub fn retain(&mut self, keep: impl FnMut(usize, &T) -> bool) -> bool {
        let before = self.active;
        self.retain_into(keep, |_| {});
        self.active != before
    }

    /// As [`retain`](Self::retain), calling `dropped` with each slot it empties.
    pub fn retain_into(
        &mut self,
        mut keep: impl FnMut(usize, &T) -> bool,
        mut dropped: impl FnMut(usize),
    ) {
        for i in 0..self.slots.len() {
            if let Some(v) = &self.slots[i] {
                if !keep(i, v) {
                    self.take(i);
                    dropped(i);
                }
            }
        }
    }
}

/// A table being replayed on, noting whether any slot's state changed.
struct Tracked<'a, T> {
    table: &'a mut SlotTable<T>,
    changed: bool,
    touched: Option<&'a mut Vec<usize>>,
}

impl<T> Tracked<'_, T> {
    #[inline]
    fn touch(&mut self, index: usize) {
        if let Some(t) = &mut self.touched {
            t.push(index);
        }
    }
}

impl<T> SlotOps for Tracked<'_, T> {
    type Value = T;

    fn put(&mut self, index: usize, value: Option<T>) {
        self.touch(index);
        let new = value.is_some();
        let old = self.table.set(index, value).is_some();
        self.changed |= old || new;
    }

    fn take(&mut self, index: usize) -> Option<T> {
        self.touch(index);
        let v = self.table.take(index);
        self.changed |= v.is_some();
        v
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.touch(a);
        self.touch(b);
        let slots = &mut self.table.slots;
        self.changed |= slots[a].is_some() || slots[b].is_some();
        slots.swap(a, b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Move;

    fn upd(bs: usize) -> BatchUpdate<Option<u32>> {
        BatchUpdate::new(bs)
    }

    #[test]
    fn add_remove_move_swap() {
        let mut t = SlotTable::new(4);
        let mut u = upd(3);
        u.added = vec![(0, Some(10)), (1, None), (2, Some(12))];
        assert!(t.apply(u).unwrap());
        assert_eq!(t.active(), 2);

        // UNI 2 -> 0 discards 0's stale state and empties 2.
        let mut u = upd(2);
        u.moved = vec![Move::unidirectional(2, 0)];
        assert!(t.apply(u).unwrap());
        assert_eq!(t.get(0), Some(&12));
        assert_eq!(t.get(2), None);
        assert_eq!(t.active(), 1);

        // SWAP with one side empty moves the state.
        let mut u = upd(2);
        u.moved = vec![Move::swap(0, 1)];
        assert!(t.apply(u).unwrap());
        assert_eq!((t.get(0), t.get(1)), (None, Some(&12)));

        // Nothing relevant: no change.
        let mut u = upd(3);
        u.added = vec![(2, None)];
        u.moved = vec![Move::swap(2, 3)];
        assert!(!t.apply(u).unwrap());
    }

    #[test]
    fn rejected_update_changes_nothing() {
        let mut t = SlotTable::new(2);
        let mut u = upd(1);
        u.added = vec![(0, Some(1)), (5, Some(2))];
        assert!(t.apply(u).is_err());
        assert_eq!(t.active(), 0);
    }
}

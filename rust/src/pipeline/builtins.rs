//! What a front-end asks of particular built-ins beyond the [`Table`](crate::processor::Table)
//! interface: the penalties' device count matrix, and values read back for tests and
//! debugging. Here, in the core, so that the bindings name no table: they call these and
//! convert.

use super::Pipeline;
use crate::history::{HistoryId, HistorySource};
use crate::tables::min_p::MinPState;
use crate::tables::penalties::PenaltiesState;
use crate::tables::thinking::ThinkingTable;

impl<S: HistorySource> Pipeline<S> {
    fn penalties_mut(&mut self) -> Option<&mut PenaltiesState<HistoryId>> {
        self.tables.get_mut::<PenaltiesState<HistoryId>>()
    }

    /// Row copies pending for the penalties' device count matrix, handed out once: a second
    /// call returns 0 until the next update (0 without the penalties).
    pub fn take_penalty_copies(&mut self) -> usize {
        self.penalties_mut().map_or(0, |s| s.take_copies())
    }

    /// Moves the next chunk of the penalties' `(row, token, delta)` count additions into their
    /// ops buffers; returns its padded length (0 when none are left, or without the
    /// penalties).
    pub fn next_penalty_chunk(&mut self) -> usize {
        self.penalties_mut().map_or(0, |s| s.next_chunk())
    }

    /// The output tokens the penalties counted for `slot` (`None`: untracked, or no
    /// penalties).
    pub fn penalties_counted(&self, slot: usize) -> Option<&[i32]> {
        self.tables
            .get::<PenaltiesState<HistoryId>>()?
            .counted(slot)
    }

    /// The stored float32 min_p of `slot` (`None`: outside the table, or no MinP).
    pub fn min_p(&self, slot: usize) -> Option<f32> {
        self.tables.get::<MinPState>()?.get(slot)
    }

    /// The `(row, token)` pairs the thinking budget forces this step (none without it).
    pub fn thinking_forced(&self) -> &[(usize, i64)] {
        self.tables
            .get::<ThinkingTable>()
            .map_or(&[], |t| t.state.forced())
    }
}

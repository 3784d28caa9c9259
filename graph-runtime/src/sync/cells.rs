//! The cells of the driver <-> actor handoff: an execution's input and its output, each in
//! the cell of its execution's index (modulo the executions in flight), with no lock.
//!
//! Whose turn it is follows from the handoff's epochs (see `exec::handoff::Slot`): the driver puts
//! an input before the `go` advance that starts its step, and takes an output after the
//! `done` advance that ends it. The first cell sits inline, on the cache line of the epoch
//! next to it, so that with one execution in flight (the default) a value crosses between
//! cores with that epoch's line and no other (the handoff round trip with the value in
//! the counter's line, `BENCHMARKS.md#floors`). A `Mutex<VecDeque>` each way would add to
//! every round trip: the lock and unlock are read-modify-writes of a line both sides
//! write, and the buffer is one more line.
//!
//! Correct: `put`, `fill` and `take` are unsafe, and their callers order each against
//! every other access to the same cell through the handoff's epochs (an advance is a
//! release, the wait that sees it an acquire), so no two accesses to a cell overlap; the
//! loom models (`loom_tests.rs`) check those orders.

use super::prims::UnsafeCell;

/// A fixed number of cells, indexed modulo that number, each holding a value or none.
pub(crate) struct Cells<T> {
    first: UnsafeCell<Option<T>>,
    rest: Box<[UnsafeCell<Option<T>>]>,
}

// SAFETY: `Cells` moves `T`s between threads (hence `T: Send`) and never hands out a
// reference to one; every access to a cell goes through `put` or `take`, whose callers
// order it before or after every other access to that cell.
unsafe impl<T: Send> Sync for Cells<T> {}

impl<T> Cells<T> {
    /// `n` empty cells (at least one).
    pub(crate) fn new(n: usize) -> Self {
        Self {
            first: UnsafeCell::new(None),
            rest: (1..n).map(|_| UnsafeCell::new(None)).collect(),
        }
    }

    fn cell(&self, index: u64) -> &UnsafeCell<Option<T>> {
        // Below the number of cells, a `usize`.
        match (index % (1 + self.rest.len() as u64)) as usize {
            0 => &self.first,
            i => &self.rest[i - 1],
        }
    }

    /// Puts `value` in the cell of `index`, dropping the value it held, if any.
    ///
    /// # Safety
    ///
    /// Every other access to that cell (a `put` or a `take` of an index equal to this one
    /// modulo the number of cells) happens-before or happens-after this one.
    pub(crate) unsafe fn put(&self, index: u64, value: T) {
        // SAFETY: no other access to the cell overlaps this one (the contract), so this is
        // the only reference to its value while it lives.
        self.cell(index)
            .with_mut(|cell| unsafe { *cell = Some(value) });
    }

    /// Empties the cell of `index` (dropping the value it held, if any) and lets `write`
    /// fill it in place: a large value (a step's output, a whole bucket's tensors) is then
    /// written where it stays, not moved in from a temporary.
    ///
    /// # Safety
    ///
    /// As for [`Cells::put`], for the whole call of `write` too.
    #[inline]
    pub(crate) unsafe fn fill(&self, index: u64, write: impl FnOnce(&mut Option<T>)) {
        self.cell(index).with_mut(|cell| {
            // SAFETY: as in `put`, for the whole call of `write` too (the contract).
            let cell = unsafe { &mut *cell };
            *cell = None;
            write(cell);
        });
    }

    /// Takes the value of the cell of `index`, leaving it empty.
    ///
    /// # Safety
    ///
    /// As for [`Cells::put`].
    pub(crate) unsafe fn take(&self, index: u64) -> Option<T> {
        // SAFETY: as in `put`.
        self.cell(index).with_mut(|cell| unsafe { (*cell).take() })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn each_index_has_its_cell_modulo_their_number() {
        let cells = Cells::new(3);
        // SAFETY: one thread makes every call below, so every access is ordered.
        unsafe {
            for i in 0..3 {
                cells.put(i, i);
            }
            assert_eq!(cells.take(4), Some(1));
            assert_eq!(cells.take(1), None);
            cells.put(5, 50);
            assert_eq!(cells.take(2), Some(50));
            assert_eq!(cells.take(3), Some(0));
        }
        let one = Cells::new(0);
        // SAFETY: as above.
        unsafe {
            one.put(7, "a");
            assert_eq!(one.take(0), Some("a"));
        }
    }

    #[test]
    fn a_value_put_over_another_or_left_in_its_cell_is_dropped() {
        let value = std::sync::Arc::new(());
        let cells = Cells::new(2);
        // SAFETY: one thread.
        unsafe {
            cells.put(0, value.clone());
            cells.put(1, value.clone());
            cells.put(2, value.clone());
        }
        assert_eq!(std::sync::Arc::strong_count(&value), 3);
        drop(cells);
        assert_eq!(std::sync::Arc::strong_count(&value), 1);
    }
}

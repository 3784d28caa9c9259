//! Spin-then-park synchronization: the driver <-> actor handoff, the collective barrier and
//! the slots of cross-actor edges.
//!
//! Fast: when the waiter and the thread it waits for each have a core, a spinning waiter
//! sees the other side's write one cache-line transfer after it is made (the handoff round
//! trip of `BENCHMARKS.md#floors`), while waking a parked thread takes a system call on
//! each side, orders of magnitude more. So waiters spin briefly before they park; when the
//! threads outnumber the cores, the thread waited for may have no core, so they yield at
//! once and then park instead of burning the core it needs (`epoch.rs`, `budget`).
//!
//! Correct: every wait is for a counter that only moves forward ([`Epoch`], a
//! [`Barrier`]'s arrivals) to pass the value the waiter saw, so a waiter that comes late
//! finds it passed rather than missing a wake-up; a parking waiter and the advance meet in
//! read-modify-writes of one word, so no wake is lost (see [`Epoch`]); an abort moves every
//! wait to an error instead of leaving it to hang. [`Cells`] hold the handoff's values,
//! each accessed only on the side whose turn the epochs say it is; the loom models
//! (`loom_tests.rs`) check these interleavings.
//!
//! `epoch.rs` holds the waits and `cells.rs` the values; neither imports the other.

mod cells;
mod epoch;
#[cfg(any(feature = "mpi", all(test, loom)))]
mod jobs;

pub(crate) use cells::Cells;
pub(crate) use epoch::{actor_ended, actor_started, briefly, crowded, Barrier, Epoch, Interrupted};
#[cfg(any(feature = "mpi", all(test, loom)))]
pub(crate) use jobs::Jobs;

#[cfg(loom)]
pub(crate) mod prims {
    pub(crate) use loom::cell::UnsafeCell;
    pub(crate) use loom::hint::spin_loop;
    pub(crate) use loom::sync::atomic::{
        fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize,
    };
    pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
    pub(crate) use loom::thread::yield_now;
}

#[cfg(not(loom))]
pub(crate) mod prims {
    pub(crate) use std::hint::spin_loop;
    pub(crate) use std::sync::atomic::{
        fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize,
    };
    pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
    pub(crate) use std::thread::yield_now;

    /// `std`'s `UnsafeCell` with loom's interface (`with`, `with_mut`), so that code shared
    /// with the loom models has its accesses checked there.
    #[derive(Debug, Default)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests;

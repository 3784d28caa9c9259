use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, SeqCst};

use super::prims::{spin_loop, yield_now, AtomicU64, AtomicUsize, Condvar, Mutex};

/// Spins before yielding; about 2-4 µs on the machines this was tuned on.
#[cfg(not(loom))]
const SPINS: u32 = 2_000;
/// Yields before parking.
#[cfg(not(loom))]
const YIELDS: u32 = 16;
// Under loom every spin is a state to explore: go straight to parking.
#[cfg(loom)]
const SPINS: u32 = 0;
#[cfg(loom)]
const YIELDS: u32 = 0;

/// A counter that one side advances and the other waits on.
///
/// `advance` wakes parked waiters only when there are any, so the fast path is one atomic
/// add. The `sleepers` count and `seq` form a Dekker pair (both `SeqCst`): either the
/// advancer sees a sleeper and notifies under the lock, or the sleeper sees the new `seq`.
pub(crate) struct Epoch {
    seq: AtomicU64,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Epoch {
    pub(crate) fn new() -> Self {
        Self {
            seq: AtomicU64::new(0),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// The current value; what a waiter passes to [`Epoch::wait_past`].
    pub(crate) fn current(&self) -> u64 {
        self.seq.load(Acquire)
    }

    /// Moves to the next value and wakes every waiter (release: what was written before is
    /// visible to whoever sees the new value).
    pub(crate) fn advance(&self) {
        self.seq.fetch_add(1, SeqCst);
        if self.sleepers.load(SeqCst) > 0 {
            // Taking the lock orders this wake after a sleeper's check-then-wait.
            drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()));
            self.cv.notify_all();
        }
    }

    /// Waits until the value differs from `seen`; returns the new value.
    pub(crate) fn wait_past(&self, seen: u64) -> u64 {
        for _ in 0..SPINS {
            let now = self.seq.load(Acquire);
            if now != seen {
                return now;
            }
            spin_loop();
        }
        for _ in 0..YIELDS {
            let now = self.seq.load(Acquire);
            if now != seen {
                return now;
            }
            yield_now();
        }
        self.park_past(seen)
    }

    #[cold]
    fn park_past(&self, seen: u64) -> u64 {
        self.sleepers.fetch_add(1, SeqCst);
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let now = loop {
            let now = self.seq.load(SeqCst);
            if now != seen {
                break now;
            }
            guard = self.cv.wait(guard).unwrap_or_else(|e| e.into_inner());
        };
        drop(guard);
        self.sleepers.fetch_sub(1, Relaxed);
        now
    }
}

/// A reusable barrier for a fixed number of threads, spinning then parking.
pub(crate) struct Barrier {
    parties: usize,
    arrived: AtomicUsize,
    epoch: Epoch,
}

impl Barrier {
    pub(crate) fn new(parties: usize) -> Self {
        Self {
            parties,
            arrived: AtomicUsize::new(0),
            epoch: Epoch::new(),
        }
    }

    /// Waits until all parties have called `wait`. Everything a party wrote before its call
    /// is visible to every party after theirs.
    pub(crate) fn wait(&self) {
        // The epoch cannot move between this load and our arrival: it moves only once
        // every party, us included, has arrived.
        let seen = self.epoch.current();
        if self.arrived.fetch_add(1, AcqRel) + 1 == self.parties {
            // Nobody touches `arrived` again before they see the new epoch.
            self.arrived.store(0, Relaxed);
            self.epoch.advance();
        } else {
            self.epoch.wait_past(seen);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize as StdAtomicUsize;
    use std::sync::Arc;

    #[test]
    fn barrier_separates_rounds() {
        const N: usize = 4;
        const ROUNDS: usize = 2_000;
        let barrier = Arc::new(Barrier::new(N));
        let counter = Arc::new(StdAtomicUsize::new(0));
        let threads: Vec<_> = (0..N)
            .map(|_| {
                let (barrier, counter) = (barrier.clone(), counter.clone());
                std::thread::spawn(move || {
                    for round in 0..ROUNDS {
                        counter.fetch_add(1, Relaxed);
                        barrier.wait();
                        // Everyone has added for this round and nobody for the next one.
                        assert_eq!(counter.load(Relaxed), N * (round + 1));
                        barrier.wait();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn parked_waiter_is_woken() {
        let epoch = Arc::new(Epoch::new());
        let seen = epoch.current();
        let e2 = epoch.clone();
        let t = std::thread::spawn(move || e2.wait_past(seen));
        std::thread::sleep(std::time::Duration::from_millis(50));
        epoch.advance();
        assert_eq!(t.join().unwrap(), seen + 1);
    }
}

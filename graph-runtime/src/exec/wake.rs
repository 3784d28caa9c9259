//! The waker of an async execution: registered by the driver's future, taken and woken by
//! the actor that finishes next.

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::task::Waker;

use crate::sync::prims::{fence, AtomicBool, Mutex};

/// One future's waker, shared by a group's actors.
///
/// The handshake, which loses no wake-up: the driver registers (sets `set`), then checks
/// whether the actors are done; an actor advances its `done` epoch, then calls
/// [`wake`](Self::wake), which checks `set`. A `SeqCst` fence sits between each side's
/// write and its read, so at least one side sees the other's write: the driver sees the
/// advance, or the actor sees the flag and takes the waker (under the mutex). Loom checks
/// it (`loom_a_registered_waker_is_never_lost`).
pub(crate) struct WakeSlot {
    waker: Mutex<Option<Waker>>,
    /// Whether `waker` may hold a waker: lets the actors skip its lock (which they would
    /// otherwise all take at the end of every step) when no future waits.
    set: AtomicBool,
}

impl WakeSlot {
    pub(crate) fn new() -> Self {
        Self {
            waker: Mutex::new(None),
            set: AtomicBool::new(false),
        }
    }

    /// Registers `waker` for the next [`wake`](Self::wake). The caller checks its
    /// condition after this returns. Never blocks for longer than an actor takes to swap
    /// the waker out.
    pub(crate) fn register(&self, waker: &Waker) {
        {
            let mut slot = self.lock();
            match &*slot {
                Some(old) if old.will_wake(waker) => {}
                _ => *slot = Some(waker.clone()),
            }
            self.set.store(true, Relaxed);
        }
        // Pairs with the fence in `wake`: the caller's check of its condition comes after.
        fence(SeqCst);
    }

    /// Wakes the registered waker, if any, once. The caller made its condition true
    /// before.
    pub(crate) fn wake(&self) {
        fence(SeqCst);
        if !self.set.load(Relaxed) {
            return;
        }
        let waker = {
            let mut slot = self.lock();
            self.set.store(false, Relaxed);
            slot.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    fn lock(&self) -> crate::sync::prims::MutexGuard<'_, Option<Waker>> {
        // Only a waker swap happens under the lock; a panic cannot leave it half-done.
        self.waker.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The handshake under every interleaving: a driver that registers and then finds the
/// actor not done is always woken.
#[cfg(all(test, loom))]
mod loom_tests {
    use std::sync::Arc;
    use std::task::Wake;

    use loom::sync::atomic::AtomicUsize;
    use loom::thread;

    use super::*;
    use crate::sync::Epoch;

    struct Flag(AtomicUsize);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Relaxed);
        }
    }

    #[test]
    fn loom_a_registered_waker_is_never_lost() {
        loom::model(|| {
            let slot = Arc::new(WakeSlot::new());
            let done = Arc::new(Epoch::new());
            let woken = Arc::new(Flag(AtomicUsize::new(0)));
            let actor = {
                let (slot, done) = (slot.clone(), done.clone());
                thread::spawn(move || {
                    done.advance();
                    slot.wake();
                })
            };
            let waker = Waker::from(woken.clone());
            slot.register(&waker);
            let saw_done = done.current() > 0;
            actor.join().unwrap();
            assert!(
                saw_done || woken.0.load(Relaxed) == 1,
                "the driver saw the actor not done and was never woken"
            );
        });
    }

    /// A second registration of the same future replaces nothing and still gets one wake.
    #[test]
    fn loom_a_waker_is_woken_once() {
        loom::model(|| {
            let slot = Arc::new(WakeSlot::new());
            let woken = Arc::new(Flag(AtomicUsize::new(0)));
            let waker = Waker::from(woken.clone());
            slot.register(&waker);
            slot.register(&waker);
            let actors: Vec<_> = (0..2)
                .map(|_| {
                    let slot = slot.clone();
                    thread::spawn(move || slot.wake())
                })
                .collect();
            for a in actors {
                a.join().unwrap();
            }
            assert_eq!(woken.0.load(Relaxed), 1);
        });
    }
}

//! A gate that holds actors inside a method until the test opens it: an execution that
//! must still be running when the test looks is held there, not slowed by a sleep.

use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// Shared by the test and its actors (clones are the same gate).
#[derive(Clone, Default)]
pub struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    /// A closed gate.
    pub fn closed() -> Self {
        Self::default()
    }

    /// Lets every held actor through, and every later one until [`Gate::close`].
    pub fn open(&self) {
        let (open, cv) = &*self.0;
        *open.lock().unwrap_or_else(PoisonError::into_inner) = true;
        cv.notify_all();
    }

    /// Holds every actor that reaches the gate from now on.
    pub fn close(&self) {
        *self.0 .0.lock().unwrap_or_else(PoisonError::into_inner) = false;
    }

    /// Waits here while the gate is closed.
    pub fn pass(&self) {
        let (open, cv) = &*self.0;
        let guard = open.lock().unwrap_or_else(PoisonError::into_inner);
        drop(
            cv.wait_while(guard, |open| !*open)
                .unwrap_or_else(PoisonError::into_inner),
        );
    }
}

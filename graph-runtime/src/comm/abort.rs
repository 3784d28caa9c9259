//! Stopping a group from outside: the handle that aborts a communicator's waits, and the
//! census of where each rank was when an execution timed out.

use std::sync::Arc;
use std::time::Duration;

/// Aborts a group's communicator from outside: every blocked and every later
/// [`Communicator::stage`](super::Communicator::stage) call returns
/// [`StageError::Aborted`](super::StageError::Aborted).
///
/// The runtime uses it when an execution times out or an actor thread dies, so that the
/// other ranks stop waiting for a peer that will not come.
///
/// ```
/// use actorgraph::comm::AbortHandle;
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::sync::Arc;
/// let flag = Arc::new(AtomicBool::new(false));
/// let f = flag.clone();
/// let handle = AbortHandle::new(move || f.store(true, Ordering::SeqCst));
/// handle.abort();
/// assert!(flag.load(Ordering::SeqCst));
/// ```
#[derive(Clone)]
pub struct AbortHandle {
    abort: Option<Arc<dyn Fn() + Send + Sync>>,
    census: Option<Arc<Census>>,
}

/// See [`AbortHandle::with_census`].
type Census = dyn Fn(&[RankState], Duration) -> Option<Vec<RankState>> + Send + Sync;

/// Where a rank of a group was when an execution timed out (see
/// [`AbortHandle::census`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankState {
    /// Its step of the execution was over.
    Done,
    /// In its own code: a method (the cause of a timeout).
    InCode,
    /// Waiting for the other ranks in a collective.
    InCollective,
    /// Waiting for a value of another actor, or for room to send one.
    OnEdge,
}

impl AbortHandle {
    /// A handle that runs `abort` when used.
    pub fn new(abort: impl Fn() + Send + Sync + 'static) -> Self {
        Self {
            abort: Some(Arc::new(abort)),
            census: None,
        }
    }

    /// A handle that does nothing, for communicators that cannot block.
    pub fn noop() -> Self {
        Self {
            abort: None,
            census: None,
        }
    }

    /// This handle, with the census of a group whose ranks live in several processes:
    /// `census(mine, timeout)` takes the states of this process's ranks (in rank order)
    /// and returns every rank's, by global rank, or `None` if the other processes did
    /// not answer in time. Every process of the group calls it after the same timeout
    /// (see [`census`](Self::census)).
    pub fn with_census(
        self,
        census: impl Fn(&[RankState], Duration) -> Option<Vec<RankState>> + Send + Sync + 'static,
    ) -> Self {
        Self {
            census: Some(Arc::new(census)),
            ..self
        }
    }

    /// Aborts the communicator.
    pub fn abort(&self) {
        if let Some(f) = &self.abort {
            f();
        }
    }

    /// After an execution of `timeout` timed out: every rank's state, by global rank,
    /// from `mine`, the states of this process's ranks. `None` when the group lives in
    /// this process (`mine` is every rank then) or its other processes did not answer.
    ///
    /// ```
    /// use actorgraph::comm::{AbortHandle, RankState};
    /// use std::time::Duration;
    /// let alone = AbortHandle::noop();
    /// assert_eq!(alone.census(&[RankState::InCode], Duration::ZERO), None);
    /// // A stand-in for a second process whose one rank was waiting in a collective.
    /// let two = AbortHandle::noop().with_census(|mine, _| {
    ///     Some(mine.iter().copied().chain([RankState::InCollective]).collect())
    /// });
    /// let all = two.census(&[RankState::InCode], Duration::ZERO).unwrap();
    /// assert_eq!(all, [RankState::InCode, RankState::InCollective]);
    /// ```
    pub fn census(&self, mine: &[RankState], timeout: Duration) -> Option<Vec<RankState>> {
        self.census.as_ref().and_then(|c| c(mine, timeout))
    }
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AbortHandle")
    }
}

//! What the ranks of a group in one process share during a stage: the [`Board`].
//!
//! Every rank posts its header and inputs on the board, the leader writes the verdict and
//! the results there, and every rank reads what is its own back. The board holds buffers,
//! not pointers into the ranks' memory: each rank reaches them through a lock, and the
//! barrier between the steps orders who writes and who reads, so that no rank waits for a
//! lock on a stage's path (a rank writes its post before the first barrier, the
//! leader reads the posts and writes the results between the two, every rank reads after
//! the second). Nothing here is `unsafe`: the one place where memory is shared without a
//! lock is the leaders' mailboxes between processes (`mpi::shm`), behind a type of their
//! own.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::comm::{Disagreement, SharedBuffers, StageError};
use crate::mpi::wait::Abandoned;
use crate::mpi::wire::Failure;
use crate::sync::Barrier;
use crate::{DType, Error};

/// The meeting place of a group's ranks in one process.
pub(super) struct Board {
    barrier: Barrier,
    /// Each rank's contribution, by local rank.
    posts: Box<[Mutex<Post>]>,
    /// The leader's verdict and results.
    shared: RwLock<Shared>,
    /// The leader's result buffers for each of the process's ranks, by local rank, from
    /// the leader's `exchange_results` to the others'.
    lent: Mutex<Vec<SharedBuffers>>,
}

impl Board {
    /// The board of `ranks` ranks.
    pub(super) fn new(ranks: usize) -> Self {
        Self {
            barrier: Barrier::new(ranks),
            posts: (0..ranks).map(|_| Mutex::default()).collect(),
            shared: RwLock::default(),
            lent: Mutex::new(vec![SharedBuffers::default(); ranks]),
        }
    }

    /// The number of ranks that meet here.
    #[inline]
    pub(super) fn ranks(&self) -> usize {
        self.posts.len()
    }

    /// Waits until every rank of the process has come as often as `local`: everything a
    /// rank wrote on the board before is visible to every rank after. An error once the
    /// group is aborted.
    #[inline]
    pub(super) fn meet(&self, local: usize) -> Result<(), StageError> {
        self.barrier.wait(local).map_err(|_| StageError::Aborted)
    }

    /// Fails every current and future [`Board::meet`].
    pub(super) fn abort(&self) {
        self.barrier.abort();
    }

    /// Rank `local`'s post, to write before the stage's first meeting.
    #[inline]
    pub(super) fn post(&self, local: usize) -> MutexGuard<'_, Post> {
        lock(&self.posts[local])
    }

    /// Every rank's post, by local rank, for the leader between the two meetings.
    pub(super) fn posts(&self) -> Vec<MutexGuard<'_, Post>> {
        self.posts.iter().map(lock).collect()
    }

    /// The verdict and results, for the leader to write between the two meetings.
    #[inline]
    pub(super) fn shared_mut(&self) -> RwLockWriteGuard<'_, Shared> {
        self.shared.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The verdict and results, for every rank to read after the second meeting.
    #[inline]
    pub(super) fn shared(&self) -> RwLockReadGuard<'_, Shared> {
        self.shared.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The leader's `buffers`, for each other rank to take after the next meeting.
    pub(super) fn lend(&self, buffers: &SharedBuffers) {
        let mut lent = lock(&self.lent);
        lent.iter_mut().skip(1).for_each(|e| e.clone_from(buffers));
    }

    /// What the leader lent rank `local` (taken: each rank takes its entry before the next
    /// stage's first meeting, which the leader passes before it lends again).
    pub(super) fn take_lent(&self, local: usize) -> SharedBuffers {
        std::mem::take(&mut lock(&self.lent)[local])
    }
}

/// One rank's contribution to a stage.
#[derive(Default)]
pub(super) struct Post {
    /// Its header and collective (see `wire::encode`).
    pub(super) words: Vec<u64>,
    /// Its packed region of each dtype, as bytes (in `u64`s, aligned for every dtype).
    pub(super) data: [Bytes; DType::COUNT],
    pub(super) failure: Option<Failure>,
}

/// The leader's verdict and results for the stage under way.
#[derive(Default)]
pub(super) struct Shared {
    pub(super) outcome: Outcome,
    /// Every rank's region of each dtype, rank after rank (gathers and reductions), or,
    /// when `by_slot`, laid out as an allgather's output: each value's every rank.
    pub(super) all: [Bytes; DType::COUNT],
    /// `all` holds an allgather's output as it is (see `gather::by_slot`).
    pub(super) by_slot: bool,
    /// The result of each dtype (reductions, broadcasts).
    pub(super) result: [Bytes; DType::COUNT],
    /// The stage's results stay in the leader's regions only: the process's other ranks
    /// view the leader's buffers after it (`exchange_results`), so none is copied here.
    pub(super) lent: bool,
}

/// The verdict of a stage, the same on every process.
#[derive(Clone, Debug, Default)]
pub(super) enum Outcome {
    #[default]
    Ok,
    Disagreed(Disagreement),
    /// A rank failed: the lowest, the first failure that travelled (the root cause), and
    /// whether a rank of this process failed (whose own error is then the root cause).
    Failed {
        rank: usize,
        failure: Option<Failure>,
        here: bool,
    },
    Comm(String),
}

impl Outcome {
    /// The error of each rank of group `group` for this verdict.
    pub(super) fn to_result(&self, group: &'static str) -> Result<(), StageError> {
        match self {
            Outcome::Ok => Ok(()),
            Outcome::Disagreed(d) => Err(StageError::Disagreed(d.clone())),
            Outcome::Failed {
                rank,
                failure,
                here,
            } => Err(match failure {
                Some(f) if !here => StageError::Comm(f.to_error(group)),
                _ => StageError::Disagreed(Disagreement::Failed { rank: *rank }),
            }),
            Outcome::Comm(reason) => Err(StageError::Comm(Error::Backend(format!(
                "MPI stage of group `{group}`: {reason}"
            )))),
        }
    }
}

const ABORTED: &str = "aborted (an execution timed out), its MPI calls given up";

/// The verdict of a stage whose leader gave up waiting.
pub(super) fn aborted(_: Abandoned) -> Outcome {
    Outcome::Comm(ABORTED.into())
}

/// A byte buffer aligned for every element type.
#[derive(Default)]
pub(super) struct Bytes(pub(super) Vec<u64>);

impl Bytes {
    #[inline]
    pub(super) fn bytes(&self, len: usize) -> &[u8] {
        &bytemuck::cast_slice(&self.0)[..len]
    }

    /// The first `len` bytes, grown to hold them (never shrunk: steady state allocates
    /// nothing).
    #[inline]
    pub(super) fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        let words = len.div_ceil(8);
        if self.0.len() < words {
            self.0.resize(words, 0);
        }
        &mut bytemuck::cast_slice_mut(&mut self.0)[..len]
    }
}

/// `m`'s guard, poisoned or not.
#[inline]
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

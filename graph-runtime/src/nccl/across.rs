//! [`Across`]: what a group's header agreement adds when its ranks span processes (the
//! NCCL backend over MPI, features `nccl` and `mpi`). After the barrier of a round, the
//! process's first rank sends every local [`Post`] to the other processes' first ranks and
//! decodes theirs (one `MPI_Allgatherv` of words, `mpi/wire.rs`), so that every rank of
//! every process then decides over the same posts, in global rank order: the same verdict
//! everywhere. A failed rank's error travels with its post, so that the processes without
//! it report the same typed error.
//!
//! This file depends on `post.rs`; `agree.rs` (whose `Board` holds an `Across`) and
//! `mpi.rs` (the backend that makes one at launch) depend on it.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use super::post::Post;
use crate::comm::{Call, Collective, RankState, Status};
use crate::mpi::late::Census;
use crate::mpi::wire::{self, Failure};
use crate::mpi::{all_gather_words_until, GroupLayout, SendComm, World};
use crate::Error;

/// A group's agreement across processes: what a [`Board`](super::agree::Board) adds when
/// its ranks are some of the group's.
pub(super) struct Across {
    group: &'static str,
    /// The number of processes the group spans.
    processes: usize,
    /// The global rank of this process's first rank.
    first: usize,
    /// The group's MPI communicator, used by this process's first rank only.
    leader: Mutex<SendComm>,
    /// Whether the group was aborted: the leader's wait in an exchange gives up, and no
    /// exchange starts again (one given up on is still pending in MPI, where a new
    /// collective would be matched with it).
    aborted: AtomicBool,
    /// The census that names every process's late ranks after a timeout (`mpi/late.rs`),
    /// on a communicator of its own.
    census: Census,
    /// Every rank's post of the round under way, by global rank, and the failure that
    /// travelled from another process (when it is the first failure in rank order).
    decided: RwLock<Decided>,
    /// The error of each local rank's step, until its next stage carries it.
    failures: Box<[Mutex<Option<Failure>>]>,
    // Last: the communicators are freed before MPI may end.
    _world: Arc<World>,
}

#[derive(Default)]
pub(super) struct Decided {
    pub(super) posts: Vec<Post>,
    remote_failure: Option<Failure>,
}

impl std::fmt::Debug for Across {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Across")
            .field("group", &self.group)
            .field("first", &self.first)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Across {
    /// The agreement of `group` across the processes of `layout`, for this process's
    /// `local` ranks; `world` is kept alive as long as its communicators.
    pub(super) fn new(
        group: &'static str,
        layout: GroupLayout,
        local: usize,
        world: Arc<World>,
    ) -> Self {
        Self {
            group,
            processes: layout.counts.len(),
            first: layout.offsets[layout.process],
            leader: Mutex::new(layout.comm),
            aborted: AtomicBool::new(false),
            census: Census::new(layout.census, layout.counts.clone(), layout.process),
            decided: RwLock::default(),
            failures: (0..local).map(|_| Mutex::new(None)).collect(),
            _world: world,
        }
    }

    /// The number of processes the group spans.
    pub(super) fn processes(&self) -> usize {
        self.processes
    }

    /// Keeps local rank `local`'s error, for its next stage to carry.
    pub(super) fn note_failure(&self, local: usize, error: &Error) {
        if let Some(slot) = self.failures.get(local) {
            *lock(slot) = Failure::of(error);
        }
    }

    /// Ends every exchange, under way or later (see
    /// [`Board::abort`](super::agree::Board::abort)).
    pub(super) fn abort(&self) {
        self.aborted.store(true, SeqCst);
    }

    /// After a timeout of `timeout`: every rank's state, by global rank, from `mine`
    /// (this process's), or `None` if the other processes did not answer in time.
    pub(super) fn census(&self, mine: &[RankState], timeout: Duration) -> Option<Vec<RankState>> {
        self.census.take(mine, timeout)
    }

    /// The leader's part of a round: every local post (`local`, in local order) to every
    /// process, and every process's back, decoded into `decided`. A process whose words
    /// do not decode leaves no posts, which every rank takes as calls out of step.
    ///
    /// `false` if the group was aborted before every process's posts came: the MPI wait
    /// polls (`mpi/wait.rs`), so that a timeout is not stuck behind a process whose rank is
    /// late, and what it gave up on stays pending in MPI, its buffers leaked.
    pub(super) fn exchange<'p>(&self, local: impl ExactSizeIterator<Item = &'p Post>) -> bool {
        let n = local.len();
        let mut words = vec![n as u64];
        for (l, post) in local.enumerate() {
            let failure = self.failures.get(l).and_then(|f| lock(f).take());
            // A failure of an earlier execution that no stage carried is stale.
            let failure = failure.filter(|_| post.failed);
            encode_post(post, failure.as_ref(), &mut words);
        }
        let here = self.first..self.first + n;
        let stop = || self.aborted.load(SeqCst);
        if stop() {
            return false;
        }
        let Some(every) = all_gather_words_until(&lock(&self.leader).0, &words, stop) else {
            return false;
        };
        let decoded = decode_posts(&every);
        let mut decided = self.decided.write().unwrap_or_else(PoisonError::into_inner);
        decided.remote_failure = None;
        match decoded {
            Some(posts) => {
                // The first failure in rank order, which every process reports: this
                // process's ranks report it from here when it is theirs.
                let first = posts.iter().position(|(_, f)| f.is_some());
                if let Some(q) = first.filter(|q| !here.contains(q)) {
                    decided.remote_failure = posts[q].1.clone();
                }
                decided.posts = posts.into_iter().map(|(p, _)| p).collect();
            }
            None => decided.posts.clear(),
        }
        true
    }

    /// Every rank's posts of the round, after the leader's exchange.
    pub(super) fn decided(&self) -> std::sync::RwLockReadGuard<'_, Decided> {
        self.decided.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The error of a failed rank of another process, the first in rank order, for a
    /// stage that found a failed rank.
    pub(super) fn remote_failure(&self) -> Option<Error> {
        let decided = self.decided();
        decided
            .remote_failure
            .as_ref()
            .map(|f| f.to_error(self.group))
    }
}

/// The call tags of a post on the wire.
const NO_CALL: u64 = 0;
const STAGE: u64 = 1;
const LAUNCHED: u64 = 2;
const EXCHANGE: u64 = 3;

/// Appends `post` and `failure`: its round (+1, 0: none), its call tag, whether it
/// launched, then its header and collective (`wire::encode`, with their length), then the
/// failure.
fn encode_post(post: &Post, failure: Option<&Failure>, out: &mut Vec<u64>) {
    let (tag, collective) = match post.call {
        None => (NO_CALL, Collective::AllGather),
        Some(Call::Stage(c)) => (STAGE, c),
        Some(Call::Launched) => (LAUNCHED, Collective::AllGather),
        Some(_) => (EXCHANGE, Collective::AllGather),
    };
    out.extend([
        post.round.map_or(0, |r| r.wrapping_add(1)),
        tag,
        u64::from(post.launched),
    ]);
    let at = out.len();
    out.push(0);
    wire::encode(&post.header(), collective, out);
    out[at] = (out.len() - at - 1) as u64;
    Failure::encode(failure, out);
}

/// Every process's posts, in process order: `None` if the words do not decode.
fn decode_posts(mut words: &[u64]) -> Option<Vec<(Post, Option<Failure>)>> {
    let words = &mut words;
    let mut posts = Vec::new();
    while !words.is_empty() {
        let n = wire::take(words)?;
        for _ in 0..n {
            let round = wire::take(words)?;
            let tag = wire::take(words)?;
            let launched = wire::take(words)? != 0;
            let len = wire::take(words)?;
            let header = wire::decode(wire::take_n(words, len)?)?;
            let failure = Failure::decode(words)?;
            let call = match tag {
                NO_CALL => None,
                STAGE => Some(Call::Stage(header.collective)),
                LAUNCHED => Some(Call::Launched),
                _ => Some(Call::ExchangeResults),
            };
            let post = Post {
                round: round.checked_sub(1),
                call,
                launched,
                failed: header.status == Status::Failed,
                slots: header.slots,
                dims: header.dims,
            };
            posts.push((post, failure));
        }
    }
    Some(posts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::SlotDesc;
    use crate::{DType, ReduceOp};

    #[test]
    fn posts_travel_whole() {
        let a = Post {
            round: Some(6),
            call: Some(Call::Stage(Collective::Reduce {
                op: ReduceOp::Max,
                root: 3,
            })),
            launched: false,
            failed: false,
            slots: vec![
                SlotDesc::shaped(DType::F32, &[5, 2]).unwrap(),
                SlotDesc::flat(DType::U8, 3),
            ],
            dims: vec![5, 2],
        };
        let b = Post {
            round: Some(7),
            call: Some(Call::Launched),
            launched: true,
            ..Post::default()
        };
        let failure = Failure::Method {
            rank: 1,
            method: "grad".into(),
            message: "no".into(),
        };
        let mut words = vec![2];
        encode_post(&a, None, &mut words);
        encode_post(&b, Some(&failure), &mut words);
        words.push(1);
        encode_post(&Post::default(), None, &mut words);
        let got = decode_posts(&words).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].0.call, a.call);
        assert_eq!((got[0].0.round, &got[0].0.slots), (a.round, &a.slots));
        assert_eq!(got[0].0.dims, a.dims);
        assert_eq!(got[1].0.call, b.call);
        assert!(got[1].0.launched);
        assert_eq!(got[1].1, Some(failure));
        assert_eq!((got[2].0.call, got[2].0.round), (None, None));
        assert!(decode_posts(&words[..words.len() - 1]).is_none());
    }
}

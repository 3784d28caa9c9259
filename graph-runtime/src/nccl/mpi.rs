//! The NCCL backend across processes (features `nccl` and `mpi`): one NCCL communicator
//! over every GPU of every process, bootstrapped over MPI, as Horovod and DeepSpeed do.
//!
//! - **Launch.** [`Backend::join`] is the MPI backend's (the same fingerprint and layout
//!   checks, the same errors); then every process checks that it has one GPU per actor,
//!   and process 0 makes one `ncclUniqueId` per group and broadcasts them over MPI. Each
//!   rank inits its part of the group's communicator with its global rank and the global
//!   size, once every rank of every process has opened its GPU (an agreement round, so
//!   that none waits in `ncclCommInitRank` for a peer that failed before it).
//! - **Agreement.** A stage's header agreement ([`Board`](super::agree::Board)) first meets
//!   the process's ranks at a barrier, as in one process; then the process's first rank
//!   exchanges every local post with the other processes' first ranks (one
//!   `MPI_Allgatherv`) and, after a second barrier, every rank of every process decides
//!   over every rank's post: the same verdict everywhere. A failed rank's error travels
//!   with its post, so that the processes without it report the same typed error.
//! - **The end stage.** A step whose methods run after its last stage (or a group with no
//!   stage) ends, when the group spans processes, with an empty stage (`SyncPoint::End`):
//!   over NCCL its header agreement only, with no NCCL call, which carries an error there
//!   to every process.
//! - **Timeouts.** The leader's MPI exchange polls its requests (`mpi/wait.rs`) and gives
//!   up when the group is aborted (the driver's deadline), leaving them pending in MPI with
//!   their buffers leaked; every process then takes the MPI backend's census
//!   (`mpi/late.rs`) on a communicator of its own and names every late rank. The group is
//!   broken after it, as in one process.
//! - **Edges.** Those between processes go over MPI point-to-point: the wiring is the MPI
//!   backend's (`mpi/edge.rs`). A GPU tensor crosses through host memory.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use cudarc::nccl::result as nccl;
use cudarc::nccl::sys;

use super::agree::{Board, Post};
use super::{Nccl, NcclComm};
use crate::comm::{Backend, Call, Collective, GraphInfo, RankState, Status, Wiring};
use crate::mpi::late::Census;
use crate::mpi::wire::{self, Failure};
use crate::mpi::{all_gather_words_until, Mpi, SendComm, World};
use crate::Error;

use ::mpi::traits::*;

/// The NCCL backend over the processes of an MPI run: every process's actors of a group,
/// one per GPU of that process, in one NCCL communicator. Made by [`Nccl::over_mpi`]; pass
/// it (or `&` it) to a graph's `launch`.
///
/// Ranks are global, in process order, as on the [`Mpi`] backend: process 0's actors first.
///
/// The failure model is the MPI backend's (see `reference::mpi`): a method error or panic
/// on a rank of one process, in a stage's step or after its last stage, is the same typed
/// error on every process; `execute_timeout` returns the same [`Error::Timeout`] on every
/// process, naming the late ranks of every process, and breaks the group. Edges between
/// processes travel by MPI point-to-point; a GPU tensor on one arrives as a host tensor.
pub struct NcclMpi<'m> {
    mpi: &'m Mpi,
    nccl: Nccl,
    /// Each group's communicator id, from `join` until `group_communicators` takes it.
    ids: Mutex<Vec<(&'static str, sys::ncclUniqueId)>>,
}

impl std::fmt::Debug for NcclMpi<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclMpi")
            .field("process", &self.mpi.process())
            .field("devices", &self.nccl.devices())
            .finish()
    }
}

impl Nccl {
    /// The NCCL backend across the processes of `mpi`: this process's actors of a group
    /// run on its GPUs `devices` (actor `l` of this process on `devices[l]`), and every
    /// process's actors of the group share one NCCL communicator. Run one process per
    /// GPU, or per machine with its GPUs, under `mpirun`.
    ///
    /// The same errors as [`Nccl::new`] for `devices`.
    pub fn over_mpi(
        mpi: &Mpi,
        devices: impl IntoIterator<Item = usize>,
    ) -> Result<NcclMpi<'_>, Error> {
        Ok(NcclMpi {
            mpi,
            nccl: Nccl::new(devices)?,
            ids: Mutex::new(Vec::new()),
        })
    }
}

impl NcclMpi<'_> {
    /// This process's GPUs, one per local actor of a group.
    pub fn devices(&self) -> &[usize] {
        self.nccl.devices()
    }

    /// The MPI backend it runs over.
    pub fn mpi(&self) -> &Mpi {
        self.mpi
    }

    /// After the MPI backend's join: every process has a GPU per actor (the same verdict
    /// everywhere), and process 0's ids, one per group, reach every process.
    fn make_ids(&self, graph: &GraphInfo<'_>) -> Result<(), Error> {
        let world = self.mpi.world();
        // Per process: its GPUs, and the first group it gives another number of actors
        // (+1; 0: none) with that number.
        let gpus = self.nccl.devices().len();
        let bad = graph.groups.iter().enumerate().find(|(_, g)| g.1 != gpus);
        let mine = match bad {
            Some((g, &(_, n))) => [gpus as u64, g as u64 + 1, n as u64],
            None => [gpus as u64, 0, 0],
        };
        let mut all = vec![0u64; 3 * self.mpi.processes()];
        world.0.all_gather_into(&mine[..], &mut all[..]);
        for (process, r) in all.chunks_exact(3).enumerate() {
            let Some(&(group, _)) = r[1]
                .checked_sub(1)
                .and_then(|g| graph.groups.get(g as usize))
            else {
                continue;
            };
            return Err(Error::Backend(format!(
                "process {process} gives group `{group}` {} actor(s) and has {} GPU(s) for the \
                 NCCL backend: give it one GPU per actor",
                r[2], r[0]
            )));
        }
        // Process 0's ids, or the NCCL error it met making them.
        let id_words = std::mem::size_of::<sys::ncclUniqueId>().div_ceil(8);
        let mut words = vec![0u64; 1 + id_words * graph.groups.len()];
        if self.mpi.process() == 0 {
            let (status, ids) = words.split_at_mut(1);
            for chunk in ids.chunks_exact_mut(id_words) {
                match nccl::get_uniqueid() {
                    Ok(id) => write_id(&id, chunk),
                    Err(e) => {
                        status[0] = 1 + e.0 as u64;
                        break;
                    }
                }
            }
        }
        world.0.process_at_rank(0).broadcast_into(&mut words[..]);
        if words[0] != 0 {
            return Err(Error::Gpu {
                call: "ncclGetUniqueId",
                message: format!("failed on process 0 (NCCL result {})", words[0] - 1),
            });
        }
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        ids.clear();
        for (&(group, _), chunk) in graph.groups.iter().zip(words[1..].chunks_exact(id_words)) {
            ids.push((group, read_id(chunk)));
        }
        Ok(())
    }
}

fn write_id(id: &sys::ncclUniqueId, words: &mut [u64]) {
    let mut bytes = vec![0u8; words.len() * 8];
    for (b, &c) in bytes.iter_mut().zip(id.internal.iter()) {
        *b = c as u8;
    }
    for (w, b) in words.iter_mut().zip(bytes.chunks_exact(8)) {
        *w = u64::from_le_bytes(b.try_into().unwrap_or_default());
    }
}

fn read_id(words: &[u64]) -> sys::ncclUniqueId {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut id = sys::ncclUniqueId { internal: [0; 128] };
    for (c, &b) in id.internal.iter_mut().zip(&bytes) {
        *c = b as _;
    }
    id
}

impl Backend for NcclMpi<'_> {
    type Comm = NcclComm;

    /// Refused: the endpoints are made when a graph is launched over it.
    fn communicators(&self, size: usize) -> Result<Vec<NcclComm>, Error> {
        let _ = size;
        Err(Error::Unsupported(
            "the NCCL backend over MPI makes its communicators when a graph is launched over \
             it, not on their own"
                .into(),
        ))
    }

    fn join(&self, graph: &GraphInfo<'_>) -> Result<Vec<usize>, Error> {
        // NCCL moves the data: the leaders' mailboxes would go unused.
        let sizes = self.mpi.join_groups(graph, false)?;
        self.make_ids(graph)?;
        Ok(sizes)
    }

    fn group_communicators(
        &self,
        group: &'static str,
        size: usize,
    ) -> Result<Vec<NcclComm>, Error> {
        let layout = self.mpi.take_group(group, size)?;
        let id = {
            let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
            let at = ids.iter().position(|(g, _)| *g == group).ok_or_else(|| {
                Error::Backend(format!(
                    "group `{group}` was not part of the graph the backend joined last"
                ))
            })?;
            ids.remove(at).1
        };
        let first = layout.offsets[layout.process];
        let total = layout.size();
        let across = Across {
            group,
            processes: layout.counts.len(),
            first,
            leader: Mutex::new(layout.comm),
            aborted: AtomicBool::new(false),
            census: Census::new(layout.census, layout.counts.clone(), layout.process),
            decided: RwLock::default(),
            failures: (0..size).map(|_| Mutex::new(None)).collect(),
            _world: self.mpi.keep_alive(),
        };
        let board = Board::across(size, across);
        Ok(NcclComm::group_of(
            self.nccl.devices(),
            id,
            first,
            total,
            board,
        ))
    }

    fn confirm(&self, launched: Option<&Error>) -> Result<(), Error> {
        self.mpi.confirm(launched)
    }

    /// The MPI backend's: an edge between processes goes over MPI point-to-point, as on
    /// [`Mpi`] (a GPU tensor through host memory; see `reference::mpi`).
    fn wiring(&self) -> Result<Wiring, Error> {
        self.mpi.wiring()
    }
}

impl Backend for &NcclMpi<'_> {
    type Comm = NcclComm;

    fn communicators(&self, size: usize) -> Result<Vec<NcclComm>, Error> {
        (**self).communicators(size)
    }

    fn join(&self, graph: &GraphInfo<'_>) -> Result<Vec<usize>, Error> {
        (**self).join(graph)
    }

    fn group_communicators(
        &self,
        group: &'static str,
        size: usize,
    ) -> Result<Vec<NcclComm>, Error> {
        (**self).group_communicators(group, size)
    }

    fn confirm(&self, launched: Option<&Error>) -> Result<(), Error> {
        (**self).confirm(launched)
    }

    fn wiring(&self) -> Result<Wiring, Error> {
        (**self).wiring()
    }
}

/// A group's agreement across processes: what a [`Board`] adds when its ranks are some of
/// the group's.
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

    /// Ends every exchange, under way or later (see [`Board::abort`]).
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

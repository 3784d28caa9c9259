//! A group's endpoint under MPI: a fused stage in three steps.
//!
//! 1. Every rank of this process posts its header and its packed regions in the
//!    process's shared memory (`Node::posts`), and meets the others at a barrier.
//! 2. The leader (the process's first rank) agrees with the other processes' leaders: one
//!    `MPI_Allgather` of a fixed record per process (failed?, all ranks alike?, a digest
//!    of the header). When every process sent the same digest of alike ranks, every rank
//!    of the group has that header and the verdict is [`agree`] over it; otherwise the
//!    leaders exchange every rank's header (and the error of a failed rank) and run
//!    [`agree`] over them all, which names the same value and the same shapes everywhere.
//!    Then the payload: one nonblocking MPI operation per dtype region, started together
//!    (`MPI_Iallgatherv` of every rank's inputs, or `MPI_Ibcast` of the root's).
//!    Reductions fold every rank's values in rank order, in the element's accumulator,
//!    as [`reduce_reference`](crate::comm::reduce_reference) does: bit for bit the same
//!    on every rank of every process, whatever the MPI library, and for `f16`/`bf16`,
//!    which MPI has no type for, too (MPI only moves bytes).
//! 3. The leader posts the verdict and the results (`Node::shared`); after a second
//!    barrier every rank copies out what is its own.
//!
//! The ranks of a process share buffers behind a lock, not pointers. The leader's MPI
//! waits poll and give up when the group is aborted (`super::wait`, the one `unsafe`
//! call here: a request given up on leaves its buffers to MPI for good).

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use ::mpi::datatype::PartitionMut;
use ::mpi::traits::Communicator as _;
use ::mpi::traits::*;

use super::late::Census;
use super::wait::{self, Abandoned};
use super::wire::{self, Failure, OwnedHeader};
use super::{GroupLayout, SendComm, World};
use crate::comm::reduce::{combine, finish, load, BLOCK};
use crate::comm::{
    agree, AbortHandle, Call, Collective, Communicator, Disagreement, Header, RegionMut, SlotDesc,
    StageError, Status,
};
use crate::element::{for_each_dtype, with_dtype};
use crate::sync::Barrier;
use crate::{DType, Element, Error, ReduceOp};

/// One rank's endpoint of a group launched over [`Mpi`](super::Mpi).
pub struct MpiComm {
    node: Arc<Node>,
    /// This rank's place among the process's ranks of the group (0: the leader).
    local: usize,
    /// Its rank in the whole group.
    rank: usize,
    /// The error of this rank's step in the execution under way, for the other processes.
    failure: Option<Failure>,
}

/// What the ranks of a group in one process share.
struct Node {
    group: &'static str,
    barrier: Barrier,
    posts: Box<[Mutex<Post>]>,
    shared: RwLock<Shared>,
    /// The leader's: the group's MPI communicator and its scratch.
    leader: Mutex<Leader>,
    counts: Vec<usize>,
    offsets: Vec<usize>,
    process: usize,
    size: usize,
    /// Set by the abort handle: the leader gives up the MPI calls under way (see `wait`).
    aborted: AtomicBool,
    census: Census,
    // Last: the communicators in `leader` and `census` are freed before MPI may end.
    _world: Arc<World>,
}

/// One rank's contribution to a stage.
#[derive(Default)]
struct Post {
    /// Its header and collective (see `wire::encode`).
    words: Vec<u64>,
    /// Its packed region of each dtype, as bytes (in `u64`s, aligned for every dtype).
    data: [Bytes; DType::COUNT],
    failure: Option<Failure>,
}

/// The leader's verdict and results for the stage under way.
#[derive(Default)]
struct Shared {
    outcome: Outcome,
    /// Every rank's region of each dtype, rank after rank (gathers and reductions).
    all: [Bytes; DType::COUNT],
    /// The result of each dtype (reductions, broadcasts).
    result: [Bytes; DType::COUNT],
}

#[derive(Clone, Debug, Default)]
enum Outcome {
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

struct Leader {
    comm: SendComm,
    /// This process's ranks' regions of one dtype, back to back (the send buffer).
    send: Bytes,
    headers: Vec<u64>,
}

/// A byte buffer aligned for every element type.
#[derive(Default)]
struct Bytes(Vec<u64>);

impl Bytes {
    fn bytes(&self, len: usize) -> &[u8] {
        &bytemuck::cast_slice(&self.0)[..len]
    }

    /// The first `len` bytes, grown to hold them (never shrunk: steady state allocates
    /// nothing).
    fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        let words = len.div_ceil(8);
        if self.0.len() < words {
            self.0.resize(words, 0);
        }
        &mut bytemuck::cast_slice_mut(&mut self.0)[..len]
    }
}

macro_rules! region_bytes {
    ($($d:ident: $t:ty [$($info:tt)*]),*) => {
        /// A region's elements as bytes.
        fn region_bytes<'r>(r: &'r mut RegionMut<'_>) -> &'r mut [u8] {
            match r {
                $(RegionMut::$d(s) => bytemuck::cast_slice_mut::<$t, u8>(s),)*
            }
        }
    };
}
for_each_dtype!(region_bytes);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl MpiComm {
    /// The endpoints of this process's ranks of a group.
    pub(super) fn group(group: &'static str, layout: GroupLayout, world: Arc<World>) -> Vec<Self> {
        let n = layout.counts[layout.process];
        let first = layout.offsets[layout.process];
        let size = layout.size();
        let node = Arc::new(Node {
            group,
            barrier: Barrier::new(n),
            posts: (0..n).map(|_| Mutex::default()).collect(),
            shared: RwLock::default(),
            leader: Mutex::new(Leader {
                comm: layout.comm,
                send: Bytes::default(),
                headers: Vec::new(),
            }),
            census: Census::new(layout.census, layout.counts.clone(), layout.process),
            counts: layout.counts,
            offsets: layout.offsets,
            process: layout.process,
            size,
            aborted: AtomicBool::new(false),
            _world: world,
        });
        (0..n)
            .map(|local| MpiComm {
                node: Arc::clone(&node),
                local,
                rank: first + local,
                failure: None,
            })
            .collect()
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.node.size
    }

    fn stage(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        regions: &mut [RegionMut<'_>],
        outputs: &mut [RegionMut<'_>],
    ) -> Result<(), StageError> {
        let node = Arc::clone(&self.node);
        let failure = match header.status {
            Status::Failed => self.failure.take(),
            // A failure of an earlier execution that no stage carried is stale.
            Status::Ok => self.failure.take().and(None),
        };
        {
            let mut post = lock(&node.posts[self.local]);
            post.words.clear();
            wire::encode(header, collective, &mut post.words);
            post.failure = failure;
            // A broadcast needs the root's values only.
            let posts_data = collective.root().is_none_or(|root| root == self.rank);
            for r in regions.iter_mut().filter(|_| posts_data) {
                let dtype = r.dtype();
                let src = region_bytes(r);
                post.data[dtype.index()]
                    .bytes_mut(src.len())
                    .copy_from_slice(src);
            }
        }
        node.barrier.wait().map_err(|_| StageError::Aborted)?;
        if self.local == 0 {
            let outcome = node.lead(collective);
            node.shared
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .outcome = outcome;
        }
        node.barrier.wait().map_err(|_| StageError::Aborted)?;
        let shared = node.shared.read().unwrap_or_else(PoisonError::into_inner);
        match &shared.outcome {
            Outcome::Ok => {}
            Outcome::Disagreed(d) => return Err(StageError::Disagreed(d.clone())),
            Outcome::Failed {
                rank,
                failure,
                here,
            } => {
                return Err(match failure {
                    Some(f) if !here => StageError::Comm(f.to_error(node.group)),
                    _ => StageError::Disagreed(Disagreement::Failed { rank: *rank }),
                })
            }
            Outcome::Comm(reason) => {
                return Err(StageError::Comm(Error::Backend(format!(
                    "MPI stage of group `{}`: {reason}",
                    node.group
                ))))
            }
        }
        copy_out(
            &shared,
            header.slots,
            collective,
            self.rank,
            node.size,
            regions,
            outputs,
        );
        Ok(())
    }

    fn abort_handle(&self) -> AbortHandle {
        let node = Arc::clone(&self.node);
        let abort = AbortHandle::new(move || {
            node.aborted.store(true, Release);
            node.barrier.abort();
        });
        if !self.spans_processes() {
            return abort;
        }
        let node = Arc::clone(&self.node);
        abort.with_census(move |mine, timeout| node.census.take(mine, timeout))
    }

    fn spans_processes(&self) -> bool {
        self.node.counts.len() > 1
    }

    fn runs_on_any_thread(&self) -> bool {
        true
    }

    fn note_failure(&mut self, error: &Error) {
        self.failure = Failure::of(error);
    }
}

/// Each dtype's region length in elements, from a header's slots.
fn region_lens(slots: &[SlotDesc]) -> [usize; DType::COUNT] {
    let mut lens = [0; DType::COUNT];
    for s in slots {
        lens[s.dtype.index()] += s.len;
    }
    lens
}

/// The offset, within its dtype's region, of each slot, and its dtype and length.
fn slot_places(slots: &[SlotDesc]) -> impl Iterator<Item = (DType, usize, usize)> + '_ {
    let mut next = [0usize; DType::COUNT];
    slots.iter().map(move |s| {
        let at = next[s.dtype.index()];
        next[s.dtype.index()] += s.len;
        (s.dtype, at, s.len)
    })
}

/// Copies this rank's results out of the leader's buffers.
fn copy_out(
    shared: &Shared,
    slots: &[SlotDesc],
    collective: Collective,
    rank: usize,
    size: usize,
    regions: &mut [RegionMut<'_>],
    outputs: &mut [RegionMut<'_>],
) {
    match collective {
        Collective::AllReduce(_) | Collective::Broadcast { .. } | Collective::Reduce { .. } => {
            for r in regions.iter_mut() {
                let dtype = r.dtype();
                let dst = region_bytes(r);
                dst.copy_from_slice(shared.result[dtype.index()].bytes(dst.len()));
            }
        }
        Collective::AllGather => {
            let lens = region_lens(slots);
            for out in outputs.iter_mut() {
                let (dtype, es) = (out.dtype(), out.dtype().size());
                let region = lens[dtype.index()];
                let all = shared.all[dtype.index()].bytes(size * region * es);
                let dst = region_bytes(out);
                for (_, at, len) in slot_places(slots).filter(|s| s.0 == dtype) {
                    for q in 0..size {
                        let to = (size * at + q * len) * es;
                        let from = (q * region + at) * es;
                        dst[to..to + len * es].copy_from_slice(&all[from..from + len * es]);
                    }
                }
            }
        }
        Collective::ReduceScatter(_) => {
            let lens = region_lens(slots);
            for out in outputs.iter_mut() {
                let (dtype, es) = (out.dtype(), out.dtype().size());
                let result = shared.result[dtype.index()].bytes(lens[dtype.index()] * es);
                let dst = region_bytes(out);
                for (_, at, len) in slot_places(slots).filter(|s| s.0 == dtype) {
                    let chunk = len / size;
                    let (to, from) = (at / size * es, (at + rank * chunk) * es);
                    dst[to..to + chunk * es].copy_from_slice(&result[from..from + chunk * es]);
                }
            }
        }
    }
}

impl Node {
    /// The leader's part of a stage, between the two barriers: the verdict of every rank
    /// of every process and, if they agree, the payload.
    fn lead(&self, collective: Collective) -> Outcome {
        let mut leader = lock(&self.leader);
        let leader = &mut *leader;
        let posts: Vec<MutexGuard<'_, Post>> = self.posts.iter().map(lock).collect();
        let mut shared = self.shared.write().unwrap_or_else(PoisonError::into_inner);
        if self.stop() {
            // No new MPI call after an abort: it would be matched with a given-up one.
            return aborted(Abandoned);
        }
        let header = match self.agree(leader, &posts, collective) {
            Ok(header) => header,
            Err(outcome) => return outcome,
        };
        match self.payload(leader, &posts, &header, &mut shared) {
            Ok(()) => Outcome::Ok,
            Err(reason) => Outcome::Comm(reason),
        }
    }

    /// Whether the group was aborted: its leader's MPI waits give up.
    fn stop(&self) -> bool {
        self.aborted.load(Acquire)
    }

    /// Leaves every buffer an abandoned request may reference to MPI (see `wait`).
    fn abandon(leader: &mut Leader, shared: &mut Shared) {
        wait::leak(&mut leader.send.0);
        for b in shared.all.iter_mut().chain(shared.result.iter_mut()) {
            wait::leak(&mut b.0);
        }
    }

    /// The verdict, the same on every process: `Ok` with the header every rank agreed on
    /// (the first rank's of this process), or why not.
    fn agree(
        &self,
        leader: &mut Leader,
        posts: &[MutexGuard<'_, Post>],
        collective: Collective,
    ) -> Result<OwnedHeader, Outcome> {
        let bad = |reason: &str| Outcome::Comm(reason.to_string());
        let first = wire::decode(&posts[0].words).ok_or_else(|| bad("a rank posted no header"))?;
        // Word 3 of a header is its status (see `wire::encode`): 0 for `Ok`.
        let failed = posts.iter().any(|p| p.words.get(3).is_none_or(|&w| w != 0));
        let alike = posts.iter().all(|p| p.words == posts[0].words);
        let digest = wire::digest(&posts[0].words);
        let mine = [
            u64::from(failed),
            u64::from(alike),
            digest,
            posts[0].words.len() as u64,
        ];
        let processes = self.counts.len();
        let mut records = vec![0u64; 4 * processes];
        wait::all_gather(&leader.comm.0, &mine, &mut records, || self.stop()).map_err(aborted)?;
        let fast = records
            .chunks_exact(4)
            .all(|r| r[0] == 0 && r[1] == 1 && r[2..] == mine[2..]);
        if fast {
            // Every rank of every process brought this very header.
            return match agree(self.size, collective, |_| first.header()) {
                Ok(()) => Ok(first),
                Err(d) => Err(Outcome::Disagreed(d)),
            };
        }
        // Every rank's header, and the failure of each failed one, from every process.
        let words = &mut leader.headers;
        words.clear();
        words.push(posts.len() as u64);
        for p in posts {
            words.push(p.words.len() as u64);
            words.extend_from_slice(&p.words);
            Failure::encode(p.failure.as_ref(), words);
        }
        let mut lens = vec![0u64; processes];
        let len = [words.len() as u64];
        wait::all_gather(&leader.comm.0, &len, &mut lens, || self.stop()).map_err(aborted)?;
        let counts: Vec<i32> = lens
            .iter()
            .map(|&n| i32::try_from(n).unwrap_or(i32::MAX))
            .collect();
        let displs: Vec<i32> = counts
            .iter()
            .scan(0i32, |at, &n| {
                let here = *at;
                *at = at.saturating_add(n);
                Some(here)
            })
            .collect();
        let total = lens.iter().sum::<u64>();
        let mut every = vec![0u64; usize::try_from(total).unwrap_or(0)];
        let stop = || self.stop();
        wait::all_gather_varcount(&leader.comm.0, words, counts, displs, &mut every, stop)
            .map_err(aborted)?;
        let mut headers: Vec<(OwnedHeader, Option<Failure>)> = Vec::with_capacity(self.size);
        let mut rest = &every[..];
        let corrupt = || bad("a process sent headers that do not decode");
        for _ in 0..processes {
            let n = wire::take(&mut rest).ok_or_else(corrupt)?;
            for _ in 0..n {
                let len = wire::take(&mut rest).ok_or_else(corrupt)?;
                let h = wire::take_n(&mut rest, len)
                    .and_then(wire::decode)
                    .ok_or_else(corrupt)?;
                let f = Failure::decode(&mut rest).ok_or_else(corrupt)?;
                headers.push((h, f));
            }
        }
        if headers.len() != self.size {
            return Err(corrupt());
        }
        let failed_rank = headers.iter().position(|(h, _)| h.status == Status::Failed);
        if let Some(rank) = failed_rank {
            let failure = headers.iter().find_map(|(_, f)| f.clone());
            let first_here = self.offsets[self.process];
            let here = headers[first_here..first_here + posts.len()]
                .iter()
                .any(|(h, _)| h.status == Status::Failed);
            return Err(Outcome::Failed {
                rank,
                failure,
                here,
            });
        }
        if headers.iter().any(|(h, _)| h.collective != collective) {
            let calls = headers
                .iter()
                .map(|(h, _)| Some(Call::Stage(h.collective)))
                .collect();
            return Err(Outcome::Disagreed(Disagreement::Calls { calls }));
        }
        match agree(self.size, collective, |q| headers[q].0.header()) {
            Ok(()) => Ok(first),
            Err(d) => Err(Outcome::Disagreed(d)),
        }
    }

    /// The payload of an agreed stage: one nonblocking MPI operation per dtype region,
    /// started together, then the reductions in rank order.
    fn payload(
        &self,
        leader: &mut Leader,
        posts: &[MutexGuard<'_, Post>],
        header: &OwnedHeader,
        shared: &mut Shared,
    ) -> Result<(), String> {
        let lens = region_lens(&header.slots);
        let dtypes: Vec<DType> = DType::ALL
            .into_iter()
            .filter(|d| lens[d.index()] > 0)
            .collect();
        let count = |elems: usize, d: DType| {
            i32::try_from(elems * d.size()).map_err(|_| {
                format!("a region of {elems} {d} elements is over MPI's 2 GiB per call")
            })
        };
        if let Collective::Broadcast { root } = header.collective {
            let from = self.process_of(root).ok_or("the root is no rank")?;
            let rank_here = root.wrapping_sub(self.offsets[self.process]);
            for &d in &dtypes {
                let bytes = lens[d.index()] * d.size();
                count(lens[d.index()], d)?;
                let buf = shared.result[d.index()].bytes_mut(bytes);
                if from == self.process {
                    buf.copy_from_slice(posts[rank_here].data[d.index()].bytes(bytes));
                }
            }
            let root = leader.comm.0.process_at_rank(from as i32);
            let done = ::mpi::request::scope(|scope| {
                let mut requests = Vec::with_capacity(dtypes.len());
                for (d, buf) in shared.result.iter_mut().enumerate() {
                    let bytes = lens[d] * DType::ALL[d].size();
                    if bytes > 0 {
                        requests.push(root.immediate_broadcast_into(scope, buf.bytes_mut(bytes)));
                    }
                }
                // SAFETY: on `Err` every buffer of the requests is leaked below, under the
                // locks, before anything else can reach it.
                unsafe { wait::all(requests, || self.stop()) }
            });
            if done.is_err() {
                Self::abandon(leader, shared);
                return Err(ABORTED.into());
            }
            return Ok(());
        }
        // Every rank's inputs, gathered: this process's ranks' back to back first.
        let n = posts.len();
        let mut partitions = Vec::with_capacity(dtypes.len());
        for &d in &dtypes {
            let region = lens[d.index()];
            let counts = self
                .counts
                .iter()
                .map(|&c| count(c * region, d))
                .collect::<Result<Vec<i32>, String>>()?;
            let displs = self
                .offsets
                .iter()
                .map(|&o| count(o * region, d))
                .collect::<Result<Vec<i32>, String>>()?;
            count(self.size * region, d)?;
            partitions.push((d, counts, displs));
        }
        // The send buffer holds every dtype's block, one after the other.
        let blocks: Vec<usize> = dtypes
            .iter()
            .map(|d| n * lens[d.index()] * d.size())
            .collect();
        let send = leader.send.bytes_mut(blocks.iter().sum());
        {
            let mut at = 0;
            for (&d, &block) in dtypes.iter().zip(&blocks) {
                let one = block / n;
                for (l, post) in posts.iter().enumerate() {
                    send[at + l * one..at + (l + 1) * one]
                        .copy_from_slice(post.data[d.index()].bytes(one));
                }
                at += block;
            }
        }
        let send = &*send;
        let all_lens: Vec<usize> = DType::ALL
            .iter()
            .map(|d| self.size * lens[d.index()] * d.size())
            .collect();
        let mut parts = partitions.iter();
        let mut recvs = Vec::with_capacity(dtypes.len());
        for (d, all) in shared.all.iter_mut().enumerate() {
            if all_lens[d] == 0 {
                continue;
            }
            let Some((_, counts, displs)) = parts.next() else {
                break;
            };
            recvs.push(PartitionMut::new(
                all.bytes_mut(all_lens[d]),
                &counts[..],
                &displs[..],
            ));
        }
        let comm = &leader.comm.0;
        let done = ::mpi::request::scope(|scope| {
            let mut at = 0;
            let mut requests = Vec::with_capacity(recvs.len());
            for (recv, &block) in recvs.iter_mut().zip(&blocks) {
                let request =
                    comm.immediate_all_gather_varcount_into(scope, &send[at..at + block], recv);
                requests.push(request);
                at += block;
            }
            // SAFETY: on `Err` every buffer of the requests (the send buffer, the receive
            // buffers and the partitions' counts and displacements) is leaked below, under
            // the locks, before anything else can reach it.
            unsafe { wait::all(requests, || self.stop()) }
        });
        drop(recvs);
        if done.is_err() {
            std::mem::forget(partitions);
            Self::abandon(leader, shared);
            return Err(ABORTED.into());
        }
        let op = match header.collective {
            Collective::AllReduce(op)
            | Collective::ReduceScatter(op)
            | Collective::Reduce { op, .. } => op,
            _ => return Ok(()),
        };
        for &d in &dtypes {
            let region = lens[d.index()];
            let all = shared.all[d.index()].bytes(self.size * region * d.size());
            let dst = shared.result[d.index()].bytes_mut(region * d.size());
            with_dtype!(d, E => fold::<E>(
                bytemuck::cast_slice(all),
                self.size,
                op,
                bytemuck::cast_slice_mut(dst),
            ));
        }
        Ok(())
    }

    /// The process that hosts global rank `rank`.
    fn process_of(&self, rank: usize) -> Option<usize> {
        (0..self.counts.len())
            .find(|&p| (self.offsets[p]..self.offsets[p] + self.counts[p]).contains(&rank))
    }
}

const ABORTED: &str = "aborted (an execution timed out), its MPI calls given up";

fn aborted(_: Abandoned) -> Outcome {
    Outcome::Comm(ABORTED.into())
}

/// `dst[i]` = rank 0's `i`-th element combined with rank 1's, then rank 2's, ... in the
/// accumulator, narrowed once: [`reduce_reference`](crate::comm::reduce_reference), by
/// blocks. `all` holds the ranks' regions back to back.
fn fold<E: Element>(all: &[E], ranks: usize, op: ReduceOp, dst: &mut [E]) {
    let region = dst.len();
    let mut acc = vec![<E::Acc as Default>::default(); BLOCK.min(region)];
    let mut start = 0;
    while start < region {
        let end = (start + BLOCK).min(region);
        let acc = &mut acc[..end - start];
        load::<E>(acc, &all[start..end]);
        for q in 1..ranks {
            combine::<E>(acc, &all[q * region + start..q * region + end], op);
        }
        finish::<E>(acc, op, ranks, &mut dst[start..end]);
        start = end;
    }
}

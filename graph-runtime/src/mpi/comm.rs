//! A group's endpoint under MPI: a fused stage in three steps.
//!
//! 1. Every rank of this process but the leader (its first rank) posts its header and
//!    its inputs in the process's shared memory (`Node::posts`): a region of large values
//!    straight from the values (the stage lends them: `reads_in_place`), sparing the
//!    pack, others packed first and posted in one copy. The leader packs its own and
//!    reads them in place; in a large reduction across processes it packs only its
//!    values under 8 KiB, and sends and folds the others from where they are
//!    (`Unpacked`). They meet at a barrier.
//! 2. The leader agrees with the other processes' leaders in one round, through their
//!    mailboxes in shared memory when every process is on this machine (`super::shm`), by
//!    point-to-point messages otherwise: each sends every other a fixed record (failed?,
//!    all ranks alike?, a digest of the header) and, when the stage is small, its ranks'
//!    data with it (`Node::agree`). When every process sent the same digest of alike
//!    ranks, every rank of the group has that header and the verdict is [`agree`] over it;
//!    otherwise the leaders exchange every rank's header (and the error of a failed rank)
//!    and run [`agree`] over them all (`Node::settle`), which names the same value and the
//!    same shapes everywhere. A small stage is then done: each leader has every rank's
//!    data (`Node::small`). A large one runs its payload: for the reductions a reduce-scatter
//!    in rank order then an allgather, point to point (`Node::scatter_gather`); for the
//!    others nonblocking MPI operations started together, in place where they can be: an
//!    `MPI_Ibcast` per piece of each dtype region into the leader's regions, the root's
//!    leader packing each piece just before it starts it (`Node::broadcast`), an
//!    `MPI_Iallgatherv` per value from where it is into the output
//!    (`Node::gather_by_slot`), or for many values one per dtype region
//!    (`Node::gather_by_region`). Reductions fold every rank's values in rank
//!    order, in the element's accumulator, as
//!    [`reduce_reference`](crate::comm::reduce_reference) does: bit for bit the same on
//!    every rank of every process, whatever the MPI library, and for `f16`/`bf16`, which
//!    MPI has no type for, too (MPI only moves bytes).
//! 3. The leader posts the verdict and the results (`Node::shared`), or leaves them in its
//!    own regions or outputs; after a second barrier every other rank copies out
//!    what is its own, or, for an `allreduce` of more than `SMALL` bytes, views the
//!    leader's buffers (`shares_results`: they are handed over at one more barrier).
//!
//! The ranks of a process share buffers behind a lock, not pointers. The leader's waits
//! in the agreement poll and give up when the group is aborted (`super::wait`, the one
//! `unsafe` call here: a request given up on leaves its buffers to MPI for good). Once
//! every process has agreed, the payload runs to its end: its requests may read and write
//! the leader's own regions in place, which could not be left to MPI.

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use ::mpi::datatype::PartitionMut;
use ::mpi::request::{Request, Scope};
use ::mpi::traits::Communicator as _;
use ::mpi::traits::*;

use super::late::Census;
use super::shm::Mailboxes;
use super::wait::{self, Abandoned};
use super::wire::{self, Failure, OwnedHeader};
use super::{GroupLayout, SendComm, World};
use crate::comm::reduce::fold_into;
use crate::comm::{
    agree, AbortHandle, Call, Collective, Communicator, Disagreement, Header, RegionMut,
    SharedBuffers, SlotData, SlotDesc, StageError, Status,
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
    /// Set by the abort handle: the leader gives up the agreement under way (see `wait`).
    aborted: AtomicBool,
    census: Census,
    /// The leader's result buffers for each of the process's ranks, by local rank, from
    /// the leader's `exchange_results` to the other's.
    lent: Mutex<Vec<SharedBuffers>>,
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
    /// Every rank's region of each dtype, rank after rank (gathers and reductions), or,
    /// when `by_slot`, laid out as an allgather's output: each value's every rank.
    all: [Bytes; DType::COUNT],
    /// `all` holds an allgather's output as it is (see [`Node::gather_by_slot`]).
    by_slot: bool,
    /// The result of each dtype (reductions, broadcasts).
    result: [Bytes; DType::COUNT],
    /// The stage's results stay in the leader's regions only: the process's other ranks
    /// view the leader's buffers after it (`exchange_results`), so none is copied here.
    lent: bool,
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
    /// The first round's mailboxes in shared memory, when every process is on this
    /// machine; otherwise the round goes by MPI messages through `send` and `inbox`.
    mailboxes: Option<Mailboxes>,
    /// What the leader sends: its record and small data, or an allgather's regions.
    send: Bytes,
    /// Each process's record and small data, by process.
    inbox: Vec<Bytes>,
    /// A large reduction's chunks of the other processes' ranks.
    scratch: Bytes,
    headers: Vec<u64>,
}

impl Leader {
    /// Process `q`'s message in the last first round: its record, then its data if it
    /// carried any (aligned for every element type).
    fn message(&self, q: usize) -> &[u8] {
        match &self.mailboxes {
            Some(boxes) => boxes.inbox(q),
            None => self
                .inbox
                .get(q)
                .map_or(&[], |b| bytemuck::cast_slice(&b.0)),
        }
    }
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
    /// Whether this process's leader keeps its large lent values out of its regions in
    /// this stage (see [`Unpacked`]): a reduction, or an allgather of few values, across
    /// processes whose data from this process is too large to ride with the records, so
    /// that it runs [`Node::scatter_gather`] or [`Node::gather_by_slot`] (a small stage
    /// sends the leader's regions whole).
    fn keeps_lent(&self, header: &Header<'_>, collective: Collective) -> bool {
        reads_lent(collective, header.slots.len())
            && header.status == Status::Ok
            && self.spans_processes()
            && self
                .node
                .carried_len(collective, &region_lens(header.slots), self.node.process)
                > SMALL
    }

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
                mailboxes: layout.mailboxes,
                send: Bytes::default(),
                inbox: Vec::new(),
                scratch: Bytes::default(),
                headers: Vec::new(),
            }),
            census: Census::new(layout.census, layout.counts.clone(), layout.process),
            lent: Mutex::new(vec![SharedBuffers::default(); n]),
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
        let mut unpacked = Unpacked::default();
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
            // A broadcast needs the root's values only; the leader reads its own in place.
            let needed = !matches!(collective, Collective::Broadcast { root } if root != self.rank);
            let posts_data = self.local != 0 && needed;
            // The leader reads its inputs from its regions (so may MPI), but for a large
            // reduction or allgather it keeps large lent values where they are
            // (`Unpacked`); the others post theirs, large lent values straight from where
            // they are.
            let reads_regions = needed;
            let keep_lent = self.local == 0 && self.keeps_lent(header, collective);
            for r in regions.iter_mut().filter(|_| reads_regions) {
                let d = r.dtype();
                let region = region_bytes(r);
                if posts_data && posts_in_place(header, d) {
                    let dst = post.data[d.index()].bytes_mut(region.len());
                    gather_input(header, d, region, dst);
                    continue;
                }
                let keep_from = if keep_lent { POST_IN_PLACE } else { usize::MAX };
                unpacked[d.index()] = pack_lent(header, d, region, keep_from);
                if posts_data {
                    post.data[d.index()]
                        .bytes_mut(region.len())
                        .copy_from_slice(region);
                }
            }
        }
        node.barrier
            .wait(self.local)
            .map_err(|_| StageError::Aborted)?;
        let lend = self.shares_results(collective, header);
        let mut in_place = false;
        if self.local == 0 {
            let outcome;
            (outcome, in_place) = node.lead(collective, regions, outputs, lend, unpacked);
            node.shared
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .outcome = outcome;
        }
        node.barrier
            .wait(self.local)
            .map_err(|_| StageError::Aborted)?;
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
        if in_place || lend {
            // The leader's results, or (lent) its buffers, which `exchange_results` hands
            // to this rank next.
            return Ok(());
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

    /// A large `allreduce` on a process of several ranks leaves the results in the
    /// leader's regions only: the others view its buffers, which spares the leader a copy
    /// into `shared` and each other rank a copy out of it.
    fn shares_results(&self, collective: Collective, header: &Header<'_>) -> bool {
        matches!(collective, Collective::AllReduce(_))
            && self.node.posts.len() > 1
            && header.bytes() > SMALL
    }

    fn lends_results(&self) -> bool {
        self.local == 0
    }

    /// A rank other than the leader copies its large values straight into its post,
    /// sparing the pack; everything else is packed here, as the stage would have.
    fn reads_in_place(&self) -> bool {
        true
    }

    fn exchange_results(&mut self, buffers: &mut SharedBuffers) -> Result<(), StageError> {
        let node = &self.node;
        if self.local == 0 {
            let mut lent = lock(&node.lent);
            lent.iter_mut().skip(1).for_each(|e| e.clone_from(buffers));
        }
        // Each rank takes its entry before the next stage's first barrier, which the
        // leader passes before it fills the entries again.
        node.barrier
            .wait(self.local)
            .map_err(|_| StageError::Aborted)?;
        if self.local != 0 {
            *buffers = std::mem::take(&mut lock(&node.lent)[self.local]);
            if buffers.iter().all(Option::is_none) {
                return Err(StageError::Comm(Error::Backend(format!(
                    "MPI stage of group `{}`: the leader lent no results",
                    node.group
                ))));
            }
        }
        Ok(())
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
        Collective::AllGather if shared.by_slot => {
            for out in outputs.iter_mut() {
                let dtype = out.dtype();
                let dst = region_bytes(out);
                dst.copy_from_slice(shared.all[dtype.index()].bytes(dst.len()));
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

/// The bytes from which a value lent in place is copied straight into a post; smaller
/// ones are packed into the rank's regions first and posted in one copy. The post's lines
/// were last read by the leader's core: a small copy's stores each wait for a line to
/// move over, where a large copy's full-line stores (memcpy's `rep movsb` path) do not.
const POST_IN_PLACE: usize = 8 << 10;

/// The elements slot entry `s` lent, as bytes, if it lent elements of `d`.
fn lent_bytes<'a>(s: &SlotData<'a>, d: DType) -> Option<&'a [u8]> {
    with_dtype!(d, E => s.lent::<E>().map(bytemuck::cast_slice::<E, u8>))
}

/// Each slot of dtype `d` of `header`: its index, and its bytes' place in that region.
fn slot_bytes<'h>(
    header: &'h Header<'_>,
    d: DType,
) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> + 'h {
    let mut at = 0usize;
    header
        .slots
        .iter()
        .enumerate()
        .filter(move |(_, s)| s.dtype == d)
        .map_while(move |(k, s)| {
            let end = at.checked_add(s.len.checked_mul(d.size())?)?;
            Some((k, std::mem::replace(&mut at, end)..end))
        })
}

/// Whether every value of dtype `d` that `header` says was lent is large enough to be
/// copied straight into the post ([`POST_IN_PLACE`]).
fn posts_in_place(header: &Header<'_>, d: DType) -> bool {
    let lent = |&(k, _): &(usize, std::ops::Range<usize>)| {
        header.data.get(k).is_some_and(|s| !s.is_packed())
    };
    let mut lent = slot_bytes(header, d).filter(lent).peekable();
    lent.peek().is_some() && lent.all(|(_, place)| place.len() >= POST_IN_PLACE)
}

/// A rank's input of dtype `d` into `dst`, as long as its `region`: each value from the
/// elements it lent, or from its place in the region where it was packed (see
/// [`Communicator::reads_in_place`]).
fn gather_input(header: &Header<'_>, d: DType, region: &[u8], dst: &mut [u8]) {
    for (k, place) in slot_bytes(header, d) {
        let lent = header.data.get(k).and_then(|s| lent_bytes(s, d));
        let src = lent.filter(|l| l.len() == place.len());
        let (Some(src), Some(out)) = (src.or(region.get(place.clone())), dst.get_mut(place)) else {
            return;
        };
        out.copy_from_slice(src);
    }
}

/// Copies the values of dtype `d` that were lent into their places in `region`, as if
/// the stage had packed them, except those of `keep_from` bytes or more: those are
/// returned instead (see [`Unpacked`]). With `usize::MAX` the region then holds the rank's
/// whole input.
fn pack_lent<'h>(
    header: &Header<'h>,
    d: DType,
    region: &mut [u8],
    keep_from: usize,
) -> Vec<(std::ops::Range<usize>, &'h [u8])> {
    let mut kept = Vec::new();
    for (k, place) in slot_bytes(header, d) {
        let lent = header.data.get(k).and_then(|s| lent_bytes(s, d));
        let (Some(src), Some(out)) = (lent, region.get_mut(place.clone())) else {
            continue;
        };
        if src.len() != out.len() {
            continue;
        }
        if src.len() >= keep_from {
            kept.push((place, src));
        } else {
            out.copy_from_slice(src);
        }
    }
    kept
}

/// The leader's lent values of at least [`POST_IN_PLACE`] bytes that it did not pack, by
/// dtype: each one's place in its region (whose bytes there are stale) and its elements.
/// In a large reduction the leader sends the chunks that lie within one such value
/// straight from it, and folds its own chunk reading it in place: a region of one 1 MiB
/// tensor is then never copied into the region before MPI reads it. A large allgather of
/// few values sends each from where it is ([`Node::gather_by_slot`]). Smaller values are
/// packed, as a copy per value costs more than it saves (see [`POST_IN_PLACE`]).
type Unpacked<'h> = [Vec<(std::ops::Range<usize>, &'h [u8])>; DType::COUNT];

/// Copies the part of each kept value of `values` (one dtype's [`Unpacked`]) that lies
/// within `piece`, the bytes of its region from `at` on, into its place there.
fn pack_kept(values: &[(std::ops::Range<usize>, &[u8])], piece: &mut [u8], at: usize) {
    let end = at.saturating_add(piece.len());
    for (place, src) in values {
        let (a, b) = (place.start.max(at), place.end.min(end));
        if a < b {
            piece[a - at..b - at].copy_from_slice(&src[a - place.start..b - place.start]);
        }
    }
}

/// Copies every value of `unpacked` into its place in the leader's regions, which then
/// hold its whole input (for a path that reads them whole), and forgets them.
fn pack_unpacked(unpacked: &mut Unpacked<'_>, mine: &mut Mine<'_>) {
    for (values, region) in unpacked.iter_mut().zip(mine.iter_mut()) {
        if let Some(region) = region.as_deref_mut() {
            pack_kept(values, region, 0);
        }
        values.clear();
    }
}

/// The part `lo..hi` of the leader's region of dtype `d` that lies within one value of
/// `unpacked`, as that value's elements; `None` if it lies (even partly) elsewhere.
fn within_unpacked<'h>(
    unpacked: &Unpacked<'h>,
    d: DType,
    lo: usize,
    hi: usize,
) -> Option<&'h [u8]> {
    unpacked[d.index()]
        .iter()
        .find(|(place, _)| place.start <= lo && hi <= place.end)
        .map(|(place, src)| &src[lo - place.start..hi - place.start])
}

/// `bytes` as the `i32` count of one MPI call, or why not.
fn mpi_count(bytes: usize) -> Result<i32, String> {
    i32::try_from(bytes).map_err(|_| format!("{bytes} bytes are over MPI's 2 GiB per call"))
}

/// The leader's input bytes at `place` of its region of dtype `d`: from the value kept
/// there (see [`Unpacked`]) when one covers it, else from the region.
fn leader_bytes<'a>(
    mine: &'a Mine<'_>,
    unpacked: &Unpacked<'a>,
    d: DType,
    place: std::ops::Range<usize>,
) -> Option<&'a [u8]> {
    within_unpacked(unpacked, d, place.start, place.end)
        .or_else(|| mine[d.index()].as_deref()?.get(place))
}

/// Whether `collective` reduces: its large payload is [`Node::scatter_gather`].
fn reduces(collective: Collective) -> bool {
    matches!(
        collective,
        Collective::AllReduce(_) | Collective::ReduceScatter(_) | Collective::Reduce { .. }
    )
}

/// The most values an allgather moves by one MPI call each ([`Node::gather_by_slot`]):
/// each is sent from where it is and received where the output wants it. One with more
/// packs them into one call per dtype, whose per-call cost would otherwise add up.
const GATHER_CALLS: usize = 16;

/// Whether the large payload of a `collective` of `slots` values reads the leader's lent
/// values where they are (see [`Unpacked`]): a broadcast's root packs them piece by piece.
fn reads_lent(collective: Collective, slots: usize) -> bool {
    match collective {
        Collective::AllGather => slots <= GATHER_CALLS,
        Collective::Broadcast { .. } => true,
        c => reduces(c),
    }
}

/// The pieces a large broadcast sends each region of `bytes` in, one `MPI_Ibcast` each, so
/// that the root's leader sends a piece while it packs the next: about 256 KiB each, at
/// most 16 (the same on every process).
fn broadcast_pieces(bytes: usize) -> usize {
    (bytes / (256 << 10)).clamp(1, 16)
}

/// Words of the record each leader sends first in a stage: failed?, its ranks' headers
/// alike?, the header's digest and length, and whether the data rides along.
const RECORD: usize = 5;

/// The most bytes of data a process sends with its record: a stage whose every process
/// contributes at most this much costs one MPI round (agreement and data together);
/// a larger one agrees first, then runs the payload.
const SMALL: usize = 64 << 10;

/// The most bytes of a leader's message in a stage's first round: its record and data.
pub(super) const FIRST_ROUND_BYTES: usize = RECORD * 8 + SMALL;

/// Tags of the stage's point-to-point messages. Messages between two processes with one
/// tag arrive in the order they were sent, so a stage's many messages of one tag match
/// their receives in order; stages follow each other on one communicator per group.
const TAG_FIRST: i32 = 1;
const TAG_SCATTER: i32 = 2;
const TAG_GATHER: i32 = 3;

/// `len` rounded up to a multiple of 8: each region in a message starts aligned for
/// every element type.
fn pad(len: usize) -> usize {
    len.div_ceil(8) * 8
}

/// The first element of process `q`'s chunk of a region of `len` elements cut in `parts`:
/// the same on every process.
fn bound(len: usize, q: usize, parts: usize) -> usize {
    // In u128: `len * q` may pass usize::MAX only for absurd lengths, but never panics.
    (len as u128 * q as u128 / parts as u128) as usize
}

/// Waits for every request of a stage's payload, to the end (see the module's docs: the
/// requests may use the leader's own regions, which could not be left to MPI).
fn wait_all<'a, D: ?Sized, S: Scope<'a>>(requests: Vec<Request<'a, D, S>>) {
    for r in requests {
        r.wait();
    }
}

/// The leader's own regions by dtype, as bytes (none for a failed leader).
type Mine<'r> = [Option<&'r mut [u8]>; DType::COUNT];

/// The input of this process's rank `local` for dtype `d`: the leader's own region, the
/// others' posts.
fn input<'s>(
    mine: &'s Mine<'_>,
    posts: &'s [MutexGuard<'_, Post>],
    local: usize,
    d: DType,
    bytes: usize,
) -> Result<&'s [u8], String> {
    if local == 0 {
        mine[d.index()]
            .as_deref()
            .and_then(|r| r.get(..bytes))
            .ok_or_else(|| format!("the leader has no {d} region of {bytes} bytes"))
    } else {
        Ok(posts[local].data[d.index()].bytes(bytes))
    }
}

impl Node {
    /// The leader's part of a stage, between the two barriers: the verdict of every rank
    /// of every process and, if they agree, the payload. Also whether the leader's own
    /// regions hold its results already (it then copies nothing out).
    fn lead(
        &self,
        collective: Collective,
        own: &mut [RegionMut<'_>],
        outputs: &mut [RegionMut<'_>],
        lend: bool,
        mut unpacked: Unpacked<'_>,
    ) -> (Outcome, bool) {
        let mut leader = lock(&self.leader);
        let leader = &mut *leader;
        let posts: Vec<MutexGuard<'_, Post>> = self.posts.iter().map(lock).collect();
        let mut shared = self.shared.write().unwrap_or_else(PoisonError::into_inner);
        shared.lent = lend;
        shared.by_slot = false;
        if self.stop() {
            // No new MPI call after an abort: it would be matched with a given-up one.
            return (aborted(Abandoned), false);
        }
        let mut mine: Mine<'_> = Default::default();
        for r in own.iter_mut() {
            let d = r.dtype();
            mine[d.index()] = Some(region_bytes(r));
        }
        let (header, carried) = match self.agree(leader, &posts, &mine, collective) {
            Ok(agreed) => agreed,
            Err(outcome) => return (outcome, false),
        };
        if carried || !reads_lent(header.collective, header.slots.len()) {
            // Not the path `MpiComm::keeps_lent` foresaw (it never sends a large stage's
            // data with the records): every other path reads the regions whole.
            pack_unpacked(&mut unpacked, &mut mine);
        }
        let mut outs: Mine<'_> = Default::default();
        for r in outputs.iter_mut() {
            let d = r.dtype();
            outs[d.index()] = Some(region_bytes(r));
        }
        let done = if carried {
            self.small(leader, &posts, &mut mine, &header, &mut shared)
        } else {
            self.payload(
                leader,
                &posts,
                (&mut mine, &mut outs),
                &header,
                &mut shared,
                &mut unpacked,
            )
        };
        match done {
            // Lent buffers that do not hold the results would be read as results.
            Ok(false) if lend => (
                Outcome::Comm("the leader's regions do not hold the results to lend".into()),
                false,
            ),
            Ok(in_place) => (Outcome::Ok, in_place),
            Err(reason) => (Outcome::Comm(reason), false),
        }
    }

    /// Whether the group was aborted: the leader's waits in an agreement give up.
    fn stop(&self) -> bool {
        self.aborted.load(Acquire)
    }

    /// The bytes process `q` contributes to a stage with regions of `lens` elements: for
    /// each dtype, each contributing rank's region, padded (every rank's, or the root's).
    fn carried_len(&self, collective: Collective, lens: &[usize; DType::COUNT], q: usize) -> usize {
        let ranks = match collective {
            Collective::Broadcast { root } => usize::from(self.process_of(root) == Some(q)),
            _ => self.counts[q],
        };
        DType::ALL
            .iter()
            .map(|d| ranks * pad(lens[d.index()] * d.size()))
            .sum()
    }

    /// The verdict, the same on every process: `Ok` with the header every rank agreed on
    /// (the first rank's of this process) and whether every process's data came with the
    /// records, or why not.
    ///
    /// One round of point-to-point messages between the leaders carries each process's
    /// record and, for a small stage, its data. When every process sent the same digest
    /// of alike ranks, every rank of the group has that header; otherwise the leaders
    /// exchange every rank's header (and the error of a failed rank) in [`Node::settle`].
    fn agree(
        &self,
        leader: &mut Leader,
        posts: &[MutexGuard<'_, Post>],
        mine: &Mine<'_>,
        collective: Collective,
    ) -> Result<(OwnedHeader, bool), Outcome> {
        let bad = |reason: &str| Outcome::Comm(reason.to_string());
        let first = wire::decode(&posts[0].words).ok_or_else(|| bad("a rank posted no header"))?;
        // Word 3 of a header is its status (see `wire::encode`): 0 for `Ok`.
        let failed = posts.iter().any(|p| p.words.get(3).is_none_or(|&w| w != 0));
        let alike = posts.iter().all(|p| p.words == posts[0].words);
        let lens = region_lens(&first.slots);
        let processes = self.counts.len();
        let locals: Vec<usize> = match collective {
            Collective::Broadcast { root } => (0..posts.len())
                .filter(|&l| self.offsets[self.process] + l == root)
                .collect(),
            _ => (0..posts.len()).collect(),
        };
        let has = |d: DType| {
            let bytes = lens[d.index()] * d.size();
            bytes == 0
                || locals
                    .iter()
                    .all(|&l| input(mine, posts, l, d, bytes).is_ok())
        };
        // If every process brings this header (the fast case), each decides alike.
        let carry = !failed
            && alike
            && first.collective == collective
            && (0..processes).all(|q| self.carried_len(collective, &lens, q) <= SMALL)
            && DType::ALL.into_iter().all(has);
        let record = [
            u64::from(failed),
            u64::from(alike),
            wire::digest(&posts[0].words),
            posts[0].words.len() as u64,
            u64::from(carry),
        ];
        let data = if carry {
            self.carried_len(collective, &lens, self.process)
        } else {
            0
        };
        let len = RECORD * 8 + data;
        // The message: the record, then every dtype's region of each contributing rank,
        // padded (checked by `has`) if the data rides along.
        let write = |message: &mut [u8]| {
            message[..RECORD * 8].copy_from_slice(bytemuck::cast_slice(&record));
            if !carry {
                return;
            }
            let mut at = RECORD * 8;
            for d in DType::ALL {
                let bytes = lens[d.index()] * d.size();
                if bytes == 0 {
                    // Not `input`: for a dtype the leader has no region of, its error
                    // message would be formatted on every stage.
                    continue;
                }
                for &l in &locals {
                    if let Ok(src) = input(mine, posts, l, d, bytes) {
                        message[at..at + bytes].copy_from_slice(src);
                    }
                    at += pad(bytes);
                }
            }
        };
        let got = match &mut leader.mailboxes {
            Some(boxes) => {
                write(boxes.outbox(len).ok_or_else(|| aborted(Abandoned))?);
                boxes.exchange(len, || self.stop()).map_err(aborted)?;
                (0..processes)
                    .filter(|&q| q != self.process)
                    .map(|q| boxes.inbox(q).len())
                    .collect()
            }
            None => self.first_round_by_messages(leader, len, write)?,
        };
        let peers = || (0..processes).filter(|&q| q != self.process).zip(&got);
        let mut fast = !failed && alike;
        let record_of = |q: usize| -> Option<&[u64]> {
            let bytes = leader.message(q).get(..RECORD * 8)?;
            bytemuck::try_cast_slice(bytes).ok()
        };
        for (q, &len) in peers() {
            let theirs = record_of(q).filter(|_| len >= RECORD * 8);
            let theirs = theirs.ok_or_else(|| bad("a process sent no record"))?;
            fast &= theirs[0] == 0 && theirs[1] == 1 && theirs[2..4] == record[2..4];
        }
        if !fast {
            return self
                .settle(leader, posts, collective, first)
                .map(|h| (h, false));
        }
        // Same header everywhere: every process decided alike whether to carry its data
        // (and if not, every process sees it and says so).
        let carried_by = |q: usize| record_of(q).map_or(u64::MAX, |r| r[RECORD - 1]);
        let odd = |(q, &len): (usize, &usize)| {
            carried_by(q) != record[RECORD - 1]
                || carry && len != RECORD * 8 + self.carried_len(collective, &lens, q)
        };
        if let Some((q, len)) = peers().find(|&p| odd(p)) {
            return Err(Outcome::Comm(format!(
                "the processes disagree on the data of a stage (process {q}: {len} bytes, \
                 carried: {}; here: {carry}, {} bytes expected)",
                carried_by(q),
                RECORD * 8 + self.carried_len(collective, &lens, q)
            )));
        }
        // Every rank of every process brought this very header.
        match agree(self.size, collective, |_| first.header()) {
            Ok(()) => Ok((first, carry)),
            Err(d) => Err(Outcome::Disagreed(d)),
        }
    }

    /// The first round by MPI messages: `write` fills the leader's message of `len` bytes,
    /// sent to every other leader while theirs come in (`inbox`). How many bytes came from
    /// each other process, in process order.
    fn first_round_by_messages(
        &self,
        leader: &mut Leader,
        len: usize,
        write: impl FnOnce(&mut [u8]),
    ) -> Result<Vec<usize>, Outcome> {
        let processes = self.counts.len();
        let Leader {
            comm, send, inbox, ..
        } = leader;
        let message = send.bytes_mut(len);
        write(message);
        let message = &*message;
        inbox.resize_with(processes, Bytes::default);
        let comm = &comm.0;
        let statuses = ::mpi::request::scope(|scope| {
            let mut requests = Vec::with_capacity(2 * processes);
            for (q, buf) in inbox.iter_mut().enumerate() {
                if q != self.process {
                    let from = comm.process_at_rank(q as i32);
                    let buf = buf.bytes_mut(FIRST_ROUND_BYTES);
                    requests.push(from.immediate_receive_into_with_tag(scope, buf, TAG_FIRST));
                }
            }
            for q in (0..processes).filter(|&q| q != self.process) {
                let to = comm.process_at_rank(q as i32);
                requests.push(to.immediate_send_with_tag(scope, message, TAG_FIRST));
            }
            // SAFETY: on `Err` the buffers of every request (`send` and `inbox`, the
            // leader's own) are leaked below, under the leader's lock, before anything
            // else can reach them.
            unsafe { wait::all_statuses(requests, || self.stop()) }
        });
        let Ok(statuses) = statuses else {
            wait::leak(&mut send.0);
            inbox.iter_mut().for_each(|b| wait::leak(&mut b.0));
            return Err(aborted(Abandoned));
        };
        Ok(statuses
            .iter()
            .map(|s| usize::try_from(s.count(u8::equivalent_datatype())).unwrap_or(0))
            .collect())
    }

    /// The verdict when the records differ: the leaders exchange every rank's header and
    /// the failure of each failed one, and every process runs [`agree`] over all of them,
    /// which names the same value and the same shapes everywhere.
    fn settle(
        &self,
        leader: &mut Leader,
        posts: &[MutexGuard<'_, Post>],
        collective: Collective,
        first: OwnedHeader,
    ) -> Result<OwnedHeader, Outcome> {
        let bad = |reason: &str| Outcome::Comm(reason.to_string());
        let processes = self.counts.len();
        // Every rank's header, and the failure of each failed one, from every process.
        let words = &mut leader.headers;
        words.clear();
        words.push(posts.len() as u64);
        for p in posts {
            words.push(p.words.len() as u64);
            words.extend_from_slice(&p.words);
            Failure::encode(p.failure.as_ref(), words);
        }
        let every =
            wait::all_gather_words(&leader.comm.0, words, || self.stop()).map_err(aborted)?;
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
            // The error every process reports: the first in rank order. The process
            // that hosts its rank reports it from there; the others learn it here, and
            // so does a rank of theirs that failed too (see `StepCtx::drain`).
            let first = headers.iter().position(|(_, f)| f.is_some());
            let failure = first.and_then(|q| headers[q].1.clone());
            let local = self.offsets[self.process]..self.offsets[self.process] + posts.len();
            let here = match first {
                Some(q) => local.contains(&q),
                None => headers[local]
                    .iter()
                    .any(|(h, _)| h.status == Status::Failed),
            };
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

    /// The payload of a small stage, from the data that came with the records: each
    /// leader has every contributing rank's region and computes the results itself.
    /// Whether the leader's regions hold its results already: a reduction folds into
    /// them in place (as [`Node::scatter_gather`] does), which spares the leader copying
    /// its results out, and the process's other ranks copy theirs from `shared`.
    fn small(
        &self,
        leader: &Leader,
        posts: &[MutexGuard<'_, Post>],
        mine: &mut Mine<'_>,
        header: &OwnedHeader,
        shared: &mut Shared,
    ) -> Result<bool, String> {
        let lens = region_lens(&header.slots);
        let collective = header.collective;
        let dtypes = DType::ALL.into_iter().filter(|d| lens[d.index()] > 0);
        let in_place = matches!(
            collective,
            Collective::AllReduce(_) | Collective::Reduce { .. }
        ) && dtypes.clone().all(|d| {
            mine[d.index()]
                .as_ref()
                .is_some_and(|r| r.len() == lens[d.index()] * d.size())
        });
        // In place, the leader's regions are results, not inputs: `region` never reads them.
        let mut own: Mine<'_> = Default::default();
        if in_place {
            std::mem::swap(&mut own, mine);
        }
        let mine: &Mine<'_> = mine;
        let first = self.offsets[self.process];
        // Rank `r`'s region of dtype `d`: here, or in its process's message (laid out as
        // `agree` wrote it).
        let region = |r: usize, d: DType| -> Result<&[u8], String> {
            let q = self.process_of(r).ok_or("a rank beyond the group")?;
            let bytes = lens[d.index()] * d.size();
            if q == self.process {
                return input(mine, posts, r - self.offsets[q], d, bytes);
            }
            let (ranks, within) = match collective {
                Collective::Broadcast { .. } => (1, 0),
                _ => (self.counts[q], r - self.offsets[q]),
            };
            let before: usize = DType::ALL[..d.index()]
                .iter()
                .map(|e| ranks * pad(lens[e.index()] * e.size()))
                .sum();
            let at = RECORD * 8 + before + within * pad(bytes);
            leader
                .message(q)
                .get(at..at.saturating_add(bytes))
                .ok_or_else(|| "a process's message is too short".to_string())
        };
        for d in dtypes {
            let bytes = lens[d.index()] * d.size();
            match collective {
                Collective::Broadcast { root } => {
                    let src = region(root, d)?;
                    shared.result[d.index()]
                        .bytes_mut(bytes)
                        .copy_from_slice(src);
                }
                Collective::AllGather => {
                    let all = shared.all[d.index()].bytes_mut(self.size * bytes);
                    for (r, dst) in all.chunks_exact_mut(bytes).enumerate() {
                        dst.copy_from_slice(region(r, d)?);
                    }
                }
                Collective::AllReduce(op)
                | Collective::ReduceScatter(op)
                | Collective::Reduce { op, .. } => {
                    let srcs = (0..self.size)
                        .map(|r| match in_place && r == first {
                            true => Ok(&[][..]),
                            false => region(r, d),
                        })
                        .collect::<Result<Vec<&[u8]>, String>>()?;
                    if in_place {
                        let Some(dst) = own[d.index()].as_deref_mut() else {
                            return Err(format!("the leader has no {d} region"));
                        };
                        with_dtype!(d, E => fold::<E>(&srcs, Some(first), op, dst));
                        if posts.len() > 1 && !shared.lent {
                            shared.result[d.index()]
                                .bytes_mut(bytes)
                                .copy_from_slice(dst);
                        }
                    } else {
                        let dst = shared.result[d.index()].bytes_mut(bytes);
                        with_dtype!(d, E => fold::<E>(&srcs, None, op, dst));
                    }
                }
            }
        }
        Ok(in_place)
    }

    /// The payload of a large stage, once agreed: [`Node::scatter_gather`] for the
    /// reductions, [`Node::broadcast`], and [`Node::gather_by_slot`] or
    /// [`Node::gather_by_region`] for an allgather of few or many values. Whether the
    /// leader's regions, or for an allgather its outputs, hold its results already.
    fn payload(
        &self,
        leader: &mut Leader,
        posts: &[MutexGuard<'_, Post>],
        (mine, outs): (&mut Mine<'_>, &mut Mine<'_>),
        header: &OwnedHeader,
        shared: &mut Shared,
        unpacked: &mut Unpacked<'_>,
    ) -> Result<bool, String> {
        let lens = region_lens(&header.slots);
        let dtypes: Vec<DType> = DType::ALL
            .into_iter()
            .filter(|d| lens[d.index()] > 0)
            .collect();
        for &d in &dtypes {
            mpi_count(lens[d.index()] * d.size())?;
        }
        match header.collective {
            c if reduces(c) => self.scatter_gather(leader, posts, mine, &lens, c, shared, unpacked),
            Collective::Broadcast { .. } => {
                self.broadcast(leader, posts, mine, header, shared, unpacked)
            }
            _ if header.slots.len() <= GATHER_CALLS => {
                self.gather_by_slot(leader, posts, (mine, outs), header, shared, unpacked)
            }
            _ => self.gather_by_region(leader, posts, mine, &lens, shared),
        }
    }

    /// A large broadcast: `MPI_Ibcast`s in place in the leader's regions, as `MPI_Bcast`
    /// does in the caller's buffer, each region in [`broadcast_pieces`], all started
    /// together. The root's leader fills each piece just before it starts it (from the
    /// values it kept, see [`Unpacked`], or its root rank's post), so that the first ones
    /// travel while it packs the rest. Whether the leader's regions hold the results
    /// (they do unless a region is missing); the process's other ranks copy them from
    /// `shared.result`.
    fn broadcast(
        &self,
        leader: &Leader,
        posts: &[MutexGuard<'_, Post>],
        mine: &mut Mine<'_>,
        header: &OwnedHeader,
        shared: &mut Shared,
        unpacked: &Unpacked<'_>,
    ) -> Result<bool, String> {
        let Collective::Broadcast { root } = header.collective else {
            return Err("a broadcast's payload for another collective".into());
        };
        let lens = region_lens(&header.slots);
        let from = self.process_of(root).ok_or("the root is no rank")?;
        let root_here = (from == self.process).then(|| root - self.offsets[self.process]);
        let bytes = |d: DType| lens[d.index()] * d.size();
        // In the leader's regions when it has them, whole; the same MPI calls either way.
        let in_place = DType::ALL.iter().all(|&d| {
            bytes(d) == 0
                || mine[d.index()]
                    .as_ref()
                    .is_some_and(|r| r.len() == bytes(d))
        });
        // Checked before any request starts (a request must be waited for).
        match root_here {
            Some(0) if !in_place => return Err("the root's leader has no whole regions".into()),
            Some(r) if r >= posts.len() => return Err("the root is no rank here".into()),
            _ => {}
        }
        let mut bufs: Vec<(DType, &mut [u8])> = Vec::new();
        for (d, (region, result)) in mine.iter_mut().zip(&mut shared.result).enumerate() {
            let (d, bytes) = (DType::ALL[d], bytes(DType::ALL[d]));
            if bytes > 0 {
                bufs.push(match region.as_deref_mut() {
                    Some(region) if in_place => (d, region),
                    _ => (d, result.bytes_mut(bytes)),
                });
            }
        }
        let root = leader.comm.0.process_at_rank(from as i32);
        ::mpi::request::scope(|scope| {
            let mut requests = Vec::new();
            for (d, buf) in bufs.iter_mut() {
                let pieces = broadcast_pieces(buf.len());
                let (len, mut at) = (buf.len().div_ceil(pieces), 0);
                let mut rest = &mut **buf;
                while !rest.is_empty() {
                    let cut = len.min(rest.len());
                    let (piece, tail) = std::mem::take(&mut rest).split_at_mut(cut);
                    match root_here {
                        Some(0) => pack_kept(&unpacked[d.index()], piece, at),
                        Some(r) => piece.copy_from_slice(
                            &posts[r].data[d.index()].bytes(at + piece.len())[at..],
                        ),
                        None => {}
                    }
                    at += piece.len();
                    rest = tail;
                    requests.push(root.immediate_broadcast_into(scope, piece));
                }
            }
            wait_all(requests);
        });
        if in_place && posts.len() > 1 {
            for (region, result) in mine.iter().zip(&mut shared.result) {
                if let Some(region) = region.as_deref().filter(|r| !r.is_empty()) {
                    result.bytes_mut(region.len()).copy_from_slice(region);
                }
            }
        }
        Ok(in_place)
    }

    /// A large allgather of at most [`GATHER_CALLS`] values: one `MPI_Iallgatherv` per
    /// value, started together, each sending the value from where it is (with one rank
    /// in this process: the value it lent, or its place in the leader's region; with more,
    /// every rank's packed one after the other) and receiving straight into its place in
    /// the output (the leader's, when it is this process's only rank; else `shared.all`,
    /// laid out as the output, from which every rank copies once). Whether the leader's
    /// outputs hold the results.
    fn gather_by_slot(
        &self,
        leader: &mut Leader,
        posts: &[MutexGuard<'_, Post>],
        (mine, outs): (&mut Mine<'_>, &mut Mine<'_>),
        header: &OwnedHeader,
        shared: &mut Shared,
        unpacked: &Unpacked<'_>,
    ) -> Result<bool, String> {
        let (n, size) = (posts.len(), self.size);
        let lens = region_lens(&header.slots);
        let places: Vec<(DType, std::ops::Range<usize>)> = slot_places(&header.slots)
            .filter(|&(_, _, len)| len > 0)
            .map(|(d, at, len)| (d, at * d.size()..(at + len) * d.size()))
            .collect();
        // Each value's counts and displacements: its bytes from each process's ranks.
        let mut partitions = Vec::with_capacity(places.len());
        for (_, place) in &places {
            let one = place.len();
            mpi_count(size * one)?;
            let counts = self.counts.iter().map(|&c| mpi_count(c * one));
            let displs = self.offsets.iter().map(|&o| mpi_count(o * one));
            partitions.push((
                counts.collect::<Result<Vec<i32>, String>>()?,
                displs.collect::<Result<Vec<i32>, String>>()?,
            ));
        }
        // With several ranks here, each value's send is theirs, one after the other.
        if n > 1 {
            let total: usize = places.iter().map(|(_, p)| n * p.len()).sum();
            let send = leader.send.bytes_mut(total);
            let mut at = 0;
            for (d, place) in &places {
                for (l, post) in posts.iter().enumerate() {
                    let src = match l {
                        0 => leader_bytes(mine, unpacked, *d, place.clone()),
                        _ => post.data[d.index()]
                            .bytes(lens[d.index()] * d.size())
                            .get(place.clone()),
                    };
                    let src = src.ok_or_else(|| {
                        format!("rank {l} here has no {d} value of {} bytes", place.len())
                    })?;
                    send[at..at + place.len()].copy_from_slice(src);
                    at += place.len();
                }
            }
        }
        let into_outputs = n == 1
            && DType::ALL.iter().all(|&d| {
                let want = size * lens[d.index()] * d.size();
                want == 0 || outs[d.index()].as_ref().is_some_and(|o| o.len() == want)
            });
        // Each dtype's output, cut into the values' parts in order.
        let mut rest: [&mut [u8]; DType::COUNT] = Default::default();
        for (d, (out, all)) in outs.iter_mut().zip(&mut shared.all).enumerate() {
            let want = size * lens[d] * DType::ALL[d].size();
            rest[d] = match out.as_deref_mut() {
                Some(out) if into_outputs => out,
                _ => all.bytes_mut(want),
            };
        }
        let mut recvs = Vec::with_capacity(places.len());
        let mut sends = Vec::with_capacity(places.len());
        let mut at = 0;
        for ((d, place), (counts, displs)) in places.iter().zip(&partitions) {
            let buf = std::mem::take(&mut rest[d.index()]);
            let (recv, tail) = buf.split_at_mut(size * place.len());
            rest[d.index()] = tail;
            recvs.push(PartitionMut::new(recv, &counts[..], &displs[..]));
            sends.push(if n > 1 {
                let send = leader.send.bytes(at + n * place.len());
                at += n * place.len();
                &send[at - n * place.len()..]
            } else {
                leader_bytes(mine, unpacked, *d, place.clone()).ok_or_else(|| {
                    format!("the leader has no {d} value of {} bytes", place.len())
                })?
            });
        }
        let comm = &leader.comm.0;
        ::mpi::request::scope(|scope| {
            let requests = sends
                .iter()
                .zip(recvs.iter_mut())
                .map(|(send, recv)| comm.immediate_all_gather_varcount_into(scope, *send, recv))
                .collect();
            wait_all(requests);
        });
        shared.by_slot = !into_outputs;
        Ok(into_outputs)
    }

    /// A large allgather of many values: one `MPI_Iallgatherv` per dtype region, started
    /// together, from every rank's region of this process one after the other, into
    /// `shared.all`.
    fn gather_by_region(
        &self,
        leader: &mut Leader,
        posts: &[MutexGuard<'_, Post>],
        mine: &Mine<'_>,
        lens: &[usize; DType::COUNT],
        shared: &mut Shared,
    ) -> Result<bool, String> {
        let n = posts.len();
        let dtypes: Vec<DType> = DType::ALL
            .into_iter()
            .filter(|d| lens[d.index()] > 0)
            .collect();
        let mut partitions = Vec::with_capacity(dtypes.len());
        for &d in &dtypes {
            let region = lens[d.index()] * d.size();
            let counts = self.counts.iter().map(|&c| mpi_count(c * region));
            let displs = self.offsets.iter().map(|&o| mpi_count(o * region));
            mpi_count(self.size * region)?;
            partitions.push((
                counts.collect::<Result<Vec<i32>, String>>()?,
                displs.collect::<Result<Vec<i32>, String>>()?,
            ));
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
                for l in 0..n {
                    let src = input(mine, posts, l, d, one)?;
                    send[at + l * one..at + (l + 1) * one].copy_from_slice(src);
                }
                at += block;
            }
        }
        let send = &*send;
        let mut parts = partitions.iter();
        let mut recvs = Vec::with_capacity(dtypes.len());
        for (d, all) in shared.all.iter_mut().enumerate() {
            let bytes = self.size * lens[d] * DType::ALL[d].size();
            if bytes == 0 {
                continue;
            }
            let Some((counts, displs)) = parts.next() else {
                break;
            };
            recvs.push(PartitionMut::new(
                all.bytes_mut(bytes),
                &counts[..],
                &displs[..],
            ));
        }
        let comm = &leader.comm.0;
        ::mpi::request::scope(|scope| {
            let mut at = 0;
            let mut requests = Vec::with_capacity(recvs.len());
            for (recv, &block) in recvs.iter_mut().zip(&blocks) {
                let request =
                    comm.immediate_all_gather_varcount_into(scope, &send[at..at + block], recv);
                requests.push(request);
                at += block;
            }
            wait_all(requests);
        });
        Ok(false)
    }

    /// A large reduction: a reduce-scatter in rank order, then an allgather. Each region
    /// is cut in one chunk per process (the same bounds everywhere). Process `p`'s leader
    /// receives chunk `p` of every other process's ranks' regions, folds chunk `p` over
    /// every rank in rank order (the same fold as `small`'s: `reduce_reference`, bit for
    /// bit) and sends it to every other process, which receive it in place. So every
    /// process ends with the same bits, and each leader moves and folds `1/P` of the
    /// region instead of all of it.
    ///
    /// For `allreduce` and `reduce`, the leader's own region is the result (it is the
    /// fold's source of the leader's rank, read before it is written); otherwise, and for
    /// the other ranks of the process, the result is in `shared.result`.
    #[allow(
        clippy::too_many_arguments,
        reason = "the stage's parts, each borrowed apart from the others"
    )]
    fn scatter_gather(
        &self,
        leader: &mut Leader,
        posts: &[MutexGuard<'_, Post>],
        mine: &mut Mine<'_>,
        lens: &[usize; DType::COUNT],
        collective: Collective,
        shared: &mut Shared,
        unpacked: &mut Unpacked<'_>,
    ) -> Result<bool, String> {
        let op = match collective {
            Collective::AllReduce(op)
            | Collective::ReduceScatter(op)
            | Collective::Reduce { op, .. } => op,
            _ => return Err("a reduce-scatter of a collective that reduces nothing".into()),
        };
        let dtypes: Vec<DType> = DType::ALL
            .into_iter()
            .filter(|d| lens[d.index()] > 0)
            .collect();
        let (p, processes, n) = (self.process, self.counts.len(), posts.len());
        let first = self.offsets[p];
        let remote = self.size - n;
        let total = |d: DType| lens[d.index()] * d.size();
        // Process `q`'s chunk of a region of dtype `d`, in bytes.
        let chunk = |d: DType, q: usize| {
            let (l, es) = (lens[d.index()], d.size());
            (bound(l, q, processes) * es, bound(l, q + 1, processes) * es)
        };
        let in_place = matches!(
            collective,
            Collective::AllReduce(_) | Collective::Reduce { .. }
        ) && dtypes.iter().all(|&d| {
            mine[d.index()]
                .as_ref()
                .is_some_and(|r| r.len() == total(d))
        });
        // The leader's chunks for other processes (and, unless it folds into its own
        // regions, its own chunk) that lie within no one value it kept out of its
        // regions: packed now, where the values cross into them.
        for &d in &dtypes {
            for q in (0..processes).filter(|&q| q != p || !in_place) {
                let (lo, hi) = chunk(d, q);
                if within_unpacked(unpacked, d, lo, hi).is_some() {
                    continue;
                }
                if let Some(piece) = mine[d.index()]
                    .as_deref_mut()
                    .and_then(|r| r.get_mut(lo..hi))
                {
                    pack_kept(&unpacked[d.index()], piece, lo);
                }
            }
        }
        // Every input this process sends, checked before any request starts (a request
        // must be waited for).
        let mut sends: Vec<(usize, &[u8])> = Vec::with_capacity(dtypes.len() * n * processes);
        for &d in &dtypes {
            for q in (0..processes).filter(|&q| q != p) {
                let (lo, hi) = chunk(d, q);
                for l in 0..n {
                    let kept = within_unpacked(unpacked, d, lo, hi).filter(|_| l == 0);
                    let src = match kept {
                        Some(src) => src,
                        None => &input(mine, posts, l, d, total(d))?[lo..hi],
                    };
                    sends.push((q, src));
                }
            }
        }
        // The scratch: for each dtype, chunk `p` of every other process's ranks.
        let mut blocks = [0usize; DType::COUNT];
        let mut size = 0;
        for &d in &dtypes {
            blocks[d.index()] = size;
            let (lo, hi) = chunk(d, p);
            size += remote * pad(hi - lo);
        }
        let scratch = leader.scratch.bytes_mut(size);
        let comm = &leader.comm.0;
        {
            let mut slots: Vec<(usize, &mut [u8])> = Vec::with_capacity(dtypes.len() * remote);
            let mut rest: &mut [u8] = &mut *scratch;
            for &d in &dtypes {
                let (lo, hi) = chunk(d, p);
                for q in (0..processes).filter(|&q| q != p) {
                    for _ in 0..self.counts[q] {
                        let (slot, tail) = std::mem::take(&mut rest).split_at_mut(pad(hi - lo));
                        slots.push((q, &mut slot[..hi - lo]));
                        rest = tail;
                    }
                }
            }
            ::mpi::request::scope(|scope| {
                let mut requests = Vec::with_capacity(slots.len() + sends.len());
                for (q, slot) in slots {
                    let from = comm.process_at_rank(q as i32);
                    requests.push(from.immediate_receive_into_with_tag(scope, slot, TAG_SCATTER));
                }
                for &(q, src) in &sends {
                    let to = comm.process_at_rank(q as i32);
                    requests.push(to.immediate_send_with_tag(scope, src, TAG_SCATTER));
                }
                wait_all(requests);
            });
        }
        drop(sends);
        let scratch = &*scratch;
        // Chunk `p`, folded over every rank in rank order.
        for &d in &dtypes {
            let (lo, hi) = chunk(d, p);
            let c = hi - lo;
            // Every rank's chunk but the leader's: the process's other ranks' posts, and
            // the other processes' ranks' slots in the scratch.
            let other = |r: usize| {
                if (first..first + n).contains(&r) {
                    &posts[r - first].data[d.index()].bytes(total(d))[lo..hi]
                } else {
                    let slot = if r < first { r } else { r - n };
                    &scratch[blocks[d.index()] + slot * pad(c)..][..c]
                }
            };
            if in_place {
                let Some(dst) = mine[d.index()].as_deref_mut() else {
                    return Err(format!("the leader has no {d} region"));
                };
                // Part `a..b` of the chunk, the leader's source being `own` (a value it
                // kept out of its region), or `dst` itself.
                let mut fold_part = |a: usize, b: usize, own: Option<&[u8]>| {
                    let srcs: Vec<&[u8]> = (0..self.size)
                        .map(|r| match own {
                            _ if r != first => &other(r)[a - lo..b - lo],
                            Some(own) => own,
                            None => &[][..],
                        })
                        .collect();
                    let own_rank = own.is_none().then_some(first);
                    with_dtype!(d, E => fold::<E>(&srcs, own_rank, op, &mut dst[a..b]));
                };
                let mut at = lo;
                for (place, src) in &unpacked[d.index()] {
                    let (a, b) = (place.start.max(lo), place.end.min(hi));
                    if a >= b {
                        continue;
                    }
                    if at < a {
                        fold_part(at, a, None);
                    }
                    fold_part(a, b, Some(&src[a - place.start..b - place.start]));
                    at = b;
                }
                if at < hi {
                    fold_part(at, hi, None);
                }
            } else {
                let own = match within_unpacked(unpacked, d, lo, hi) {
                    Some(kept) => kept,
                    None => &input(mine, posts, 0, d, total(d))?[lo..hi],
                };
                let srcs: Vec<&[u8]> = (0..self.size)
                    .map(|r| if r == first { own } else { other(r) })
                    .collect();
                let dst = &mut shared.result[d.index()].bytes_mut(total(d))[lo..hi];
                with_dtype!(d, E => fold::<E>(&srcs, None, op, dst));
            }
        }
        // Every chunk to every process.
        let results: Vec<&mut [u8]> = if in_place {
            mine.iter_mut()
                .filter_map(|r| r.as_deref_mut())
                .filter(|r| !r.is_empty())
                .collect()
        } else {
            shared
                .result
                .iter_mut()
                .zip(DType::ALL)
                .filter(|(_, d)| lens[d.index()] > 0)
                .map(|(b, d)| b.bytes_mut(total(d)))
                .collect()
        };
        if results.len() != dtypes.len() {
            return Err("the leader's regions do not match the header".into());
        }
        ::mpi::request::scope(|scope| {
            let mut requests = Vec::with_capacity(dtypes.len() * 2 * processes);
            for (&d, buf) in dtypes.iter().zip(results) {
                let mut rest = buf;
                for q in 0..processes {
                    let (lo, hi) = chunk(d, q);
                    let (part, tail) = std::mem::take(&mut rest).split_at_mut(hi - lo);
                    rest = tail;
                    if q == p {
                        let part: &[u8] = part;
                        for t in (0..processes).filter(|&t| t != p) {
                            let to = comm.process_at_rank(t as i32);
                            requests.push(to.immediate_send_with_tag(scope, part, TAG_GATHER));
                        }
                    } else {
                        let from = comm.process_at_rank(q as i32);
                        requests
                            .push(from.immediate_receive_into_with_tag(scope, part, TAG_GATHER));
                    }
                }
            }
            wait_all(requests);
        });
        if in_place && n > 1 && !shared.lent {
            // The process's other ranks copy the result out of `shared`.
            for (d, r) in mine.iter().enumerate() {
                if let Some(r) = r.as_deref().filter(|_| lens[d] > 0) {
                    shared.result[d].bytes_mut(r.len()).copy_from_slice(r);
                }
            }
        }
        Ok(in_place)
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

/// [`fold_into`] over byte regions: `srcs` by rank, `dst` the result (and rank `own`'s
/// input, whose source is then ignored).
fn fold<E: Element + bytemuck::Pod>(
    srcs: &[&[u8]],
    own: Option<usize>,
    op: ReduceOp,
    dst: &mut [u8],
) {
    // Rank `own`'s source is an empty byte slice, which need not be aligned for `E`
    // (`cast_slice` would panic): it is `&[]` of `E` instead, never read (`dst` holds it).
    let srcs: Vec<&[E]> = srcs
        .iter()
        .enumerate()
        .map(|(q, s)| match own {
            Some(o) if o == q => &[],
            _ => bytemuck::cast_slice(s),
        })
        .collect();
    fold_into(&srcs, own, op, bytemuck::cast_slice_mut(dst));
}

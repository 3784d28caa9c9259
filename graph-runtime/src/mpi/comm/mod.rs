//! A group's endpoint under MPI: a fused stage as post → agree → plan → run → hand back.
//!
//! 1. **Post.** Every rank of this process but the leader (its first rank) posts its
//!    header and inputs on the process's [`Board`](board::Board): a region of large values
//!    straight from the values (the stage lends them: `reads_in_place`), sparing the
//!    pack; others packed first and posted in one copy. The leader reads its own in
//!    place; when the stage will read them in place, it leaves its large lent values
//!    where they are (`pack::Unpacked`). The ranks meet at the board.
//! 2. **Agree.** The leader agrees with the other processes' leaders in one round
//!    ([`agree`]), through their mailboxes in shared memory when every process is on this
//!    machine, by point-to-point messages otherwise, and, for a small stage, with every
//!    process's data in the same round. No payload starts before every process has the
//!    verdict, and it is the same verdict on every process: each decides from the same
//!    records, or, when they differ, from every rank's header.
//! 3. **Plan.** [`plan::plan`] picks the algorithm from the agreed header's facts, the
//!    collective and the group's layout: what every process has alike, so every process
//!    picks the same one and makes the same MPI calls in the same order. The leader
//!    computes it once, before the round (whose record says whether the data rides).
//! 4. **Run.** One executor per [`Plan`](plan::Plan): [`small`] (the data came with the
//!    records: no further MPI call), [`scatter_gather`] (a large reduction: each leader
//!    moves and folds `1/P` of each region), [`gather`] (a large allgather, by value or by
//!    dtype region) and [`broadcast`] (in pieces, the first travelling while the root's
//!    leader packs the rest). Each large plan sends from where the data is and receives
//!    where it is wanted, in place in the leader's regions or outputs where it can.
//! 5. **Hand back.** The leader leaves the verdict and the results on the board, or in its
//!    own regions or outputs; after a second meeting every other rank copies out what is
//!    its own, or, for an `allreduce` of more than `plan::SMALL` bytes, views the leader's
//!    buffers (`shares_results`: handed over at one more meeting).
//!
//! A deferred stage (one the step completes after later calls) goes the same way, but
//! led by the group's progress thread over a job of its own while the ranks compute (see
//! [`background`]).
//!
//! Reductions fold every rank's values in rank order, in the element's accumulator, as
//! [`reduce_reference`](crate::comm::reduce_reference) does: bit for bit the same on every
//! rank of every process, whatever the MPI library, and for `f16`/`bf16`, which MPI has
//! no type for, too (MPI only moves bytes).
//!
//! The ranks of a process share buffers behind a lock, not pointers ([`board`]). The
//! leader's waits in the agreement poll and give up when the group is aborted
//! (`mpi::wait`; the one `unsafe` call here, in `agree`: a request given up on leaves its
//! buffers to MPI for good). Once every process has agreed, the payload runs to its end:
//! its requests may read and write the leader's own regions in place, which could not be
//! left to MPI. Each threshold that picks a path is in [`plan`], beside its reason; the
//! figures behind them are in `BENCHMARKS.md#thresholds`.

mod agree;
mod background;
mod board;
mod broadcast;
mod gather;
mod leader;
mod pack;
mod plan;
mod scatter_gather;
mod small;

pub(crate) use agree::FIRST_ROUND_BYTES;

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Release;
use std::sync::{Arc, Mutex};

use self::background::{copy_results, Background, Stopper};
use self::board::{aborted, lock, Board, Outcome, Post, Shared};
use self::leader::{mpi_count, Leader, Parts, Stop};
use self::pack::{
    by_dtype, copy_out, gather_input, pack_lent, pack_unpacked, posts_in_place, region_bytes, Mine,
    Unpacked,
};
use self::plan::{Caps, Facts, Plan};
use super::late::Census;
use super::wait::Abandoned;
use super::wire::{self, Failure, OwnedHeader};
use super::{GroupLayout, World};
use crate::comm::{
    AbortHandle, Collective, Communicator, Header, Progress, RegionMut, SharedBuffers, StageError,
    Status,
};
use crate::Error;

/// One rank's endpoint of a group launched over [`Mpi`](super::Mpi).
pub struct MpiComm {
    node: Arc<Node>,
    /// This rank's place among the process's ranks of the group (0: the leader).
    local: usize,
    /// Its rank in the whole group.
    rank: usize,
    /// The error of this rank's step in the execution under way, for the other processes.
    failure: Option<Failure>,
    /// How many deferred stages this rank has started, and completed (see `background`).
    started: u64,
    completed: u64,
    /// Shared by the process's endpoints of the group: the last one dropped stops the
    /// progress thread.
    _progress: Arc<Stopper>,
}

/// What the ranks of a group in one process share.
struct Node {
    group: &'static str,
    board: Board,
    /// The leader's: the group's MPI communicator and its scratch.
    leader: Mutex<Leader>,
    caps: Caps,
    /// Set by the abort handle: the leader gives up the agreement under way (see `wait`).
    aborted: AtomicBool,
    census: Census,
    /// The deferred stages and their progress thread.
    background: Background,
    // Last: the communicators in `leader` and `census` are freed before MPI may end.
    _world: Arc<World>,
}

impl MpiComm {
    /// The endpoints of this process's ranks of a group.
    pub(super) fn group(group: &'static str, layout: GroupLayout, world: Arc<World>) -> Vec<Self> {
        let n = layout.counts[layout.process];
        let first = layout.offsets[layout.process];
        let node = Arc::new(Node {
            group,
            board: Board::new(n),
            leader: Mutex::new(Leader::new(layout.comm, layout.mailboxes)),
            census: Census::new(layout.census, layout.counts.clone(), layout.process),
            caps: Caps::new(layout.counts, layout.offsets, layout.process),
            aborted: AtomicBool::new(false),
            background: Background::new(n),
            _world: world,
        });
        let progress = Arc::new(Stopper(Arc::clone(&node)));
        (0..n)
            .map(|local| MpiComm {
                node: Arc::clone(&node),
                local,
                rank: first + local,
                failure: None,
                started: 0,
                completed: 0,
                _progress: Arc::clone(&progress),
            })
            .collect()
    }

    /// Step 1: this rank's header, failure and inputs on the board. The leader posts no
    /// data (it reads its own regions, and so may MPI), and, when `keep_lent`, keeps its
    /// large lent values out of its regions: those are returned (see [`Unpacked`]). The
    /// others post theirs, large lent values straight from where they are.
    fn post<'h>(
        &mut self,
        header: &Header<'h>,
        collective: Collective,
        regions: &mut [RegionMut<'_>],
        keep_lent: bool,
    ) -> Unpacked<'h> {
        let mut unpacked = Unpacked::default();
        let failure = self.take_failure(header);
        let mut post = self.node.board.post(self.local);
        post.words.clear();
        wire::encode(header, collective, &mut post.words);
        post.failure = failure;
        // A broadcast needs the root's values only; the leader reads its own in place.
        let needed = !matches!(collective, Collective::Broadcast { root } if root != self.rank);
        let posts_data = self.local != 0 && needed;
        for r in regions.iter_mut().filter(|_| needed) {
            let d = r.dtype();
            let region = region_bytes(r);
            if posts_data && posts_in_place(header, d) {
                let dst = post.data[d.index()].bytes_mut(region.len());
                gather_input(header, d, region, dst);
                continue;
            }
            unpacked[d.index()] = pack_lent(header, d, region, keep_lent);
            if posts_data {
                post.data[d.index()]
                    .bytes_mut(region.len())
                    .copy_from_slice(region);
            }
        }
        unpacked
    }
}

impl MpiComm {
    /// This rank's error to send with a stage whose header is `header`.
    fn take_failure(&mut self, header: &Header<'_>) -> Option<Failure> {
        match header.status {
            Status::Failed => self.failure.take(),
            // A failure of an earlier execution that no stage carried is stale.
            Status::Ok => self.failure.take().and(None),
        }
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.node.caps.size
    }

    fn stage(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        regions: &mut [RegionMut<'_>],
        outputs: &mut [RegionMut<'_>],
    ) -> Result<(), StageError> {
        if self.started != self.completed {
            // The progress thread leads the stages in flight: a stage led here meanwhile
            // would make this process's MPI calls out of order.
            return Err(StageError::Comm(crate::Error::Backend(format!(
                "MPI stage of group `{}`: a stage run to its end while {} started ones are \
                 in flight (a step completes its stages before it runs another in place)",
                self.node.group,
                self.started - self.completed
            ))));
        }
        let node = Arc::clone(&self.node);
        // The leader plans once, from its own header: if the ranks agree, every process
        // plans from these very facts.
        let planned = (self.local == 0).then(|| {
            let facts = Facts::of(header.slots);
            (facts, plan::plan(&facts, collective, &node.caps))
        });
        let keep_lent = planned.is_some_and(|(facts, plan)| {
            header.status == Status::Ok && plan::keeps_lent(plan, &facts, collective, &node.caps)
        });
        // 1. Post.
        let unpacked = self.post(header, collective, regions, keep_lent);
        node.board.meet(self.local)?;
        // 2-4. The leader agrees, settles the plan and runs it.
        let lend = self.shares_results(collective, header);
        let mut in_place = false;
        if let Some(planned) = planned {
            let outcome;
            (outcome, in_place) = node.lead(planned, collective, regions, outputs, lend, unpacked);
            node.board.shared_mut().outcome = outcome;
        }
        node.board.meet(self.local)?;
        // 5. Hand back.
        let shared = node.board.shared();
        shared.outcome.to_result(node.group)?;
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
            node.caps.size,
            regions,
            outputs,
        );
        Ok(())
    }

    /// A deferred stage: this rank copies its inputs into the job (see `background`) and
    /// goes on; the progress thread leads it once every rank of the process has posted.
    fn start_stage(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        regions: &mut [RegionMut<'_>],
        _outputs: &mut [RegionMut<'_>],
    ) -> Result<Progress, StageError> {
        let failure = self.take_failure(header);
        let (local, rank) = (self.local, self.rank);
        let seq = self.started;
        self.started += 1;
        // A broadcast needs the root's values only.
        let needed = !matches!(collective, Collective::Broadcast { root } if root != rank);
        let (caps, ranks) = (&self.node.caps, self.node.board.ranks());
        self.node.post_job(seq, |job| {
            if local == 0 {
                // The leader's plan, from its own header, as in `stage`.
                let facts = Facts::of(header.slots);
                job.planned = Some((facts, plan::plan(&facts, collective, caps)));
                job.collective = Some(collective);
                job.slots.clear();
                job.slots.extend_from_slice(header.slots);
            }
            job.make_posts(ranks);
            let mut post = lock(&job.posts[local]);
            post.words.clear();
            wire::encode(header, collective, &mut post.words);
            post.failure = failure;
            for r in regions.iter_mut().filter(|_| needed) {
                let d = r.dtype();
                let region = region_bytes(r);
                let dst = match local {
                    0 => job.own[d.index()].bytes_mut(region.len()),
                    _ => post.data[d.index()].bytes_mut(region.len()),
                };
                gather_input(header, d, region, dst);
            }
        });
        Ok(Progress::InFlight)
    }

    fn complete_stage(
        &mut self,
        _collective: Collective,
        regions: &mut [RegionMut<'_>],
        outputs: &mut [RegionMut<'_>],
    ) -> Result<(), StageError> {
        let seq = self.completed;
        self.completed += 1;
        let me = (self.local, self.rank, self.node.caps.size);
        let outcome = self.node.take_job(seq, |job| {
            let outcome = job.outcome.as_ref().map(|(o, _)| o.clone());
            if matches!(outcome, Some(Outcome::Ok)) {
                copy_results(job, me, regions, outputs);
            }
            outcome.unwrap_or_default()
        })?;
        outcome.to_result(self.node.group)
    }

    fn abort_handle(&self) -> AbortHandle {
        let node = Arc::clone(&self.node);
        let abort = AbortHandle::new(move || {
            node.aborted.store(true, Release);
            node.board.abort();
            node.background.jobs.ring();
        });
        if !self.spans_processes() {
            return abort;
        }
        let node = Arc::clone(&self.node);
        abort.with_census(move |mine, timeout| node.census.take(mine, timeout))
    }

    fn spans_processes(&self) -> bool {
        self.node.caps.processes() > 1
    }

    /// A large `allreduce` on a process of several ranks leaves the results in the
    /// leader's regions only: the others view its buffers, which spares the leader a copy
    /// into the board and each other rank a copy out of it (see `plan::shares_results`).
    fn shares_results(&self, collective: Collective, header: &Header<'_>) -> bool {
        plan::shares_results(collective, self.node.board.ranks(), || header.bytes())
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
            node.board.lend(buffers);
        }
        node.board.meet(self.local)?;
        if self.local != 0 {
            *buffers = node.board.take_lent(self.local);
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

impl Node {
    /// The leader's part of a stage, between the two meetings: the verdict of every rank
    /// of every process and, if they agree, the payload of the plan. Also whether the
    /// leader's own regions (or outputs) hold its results already (it then copies nothing
    /// out).
    fn lead(
        &self,
        planned: (Facts, Plan),
        collective: Collective,
        own: &mut [RegionMut<'_>],
        outputs: &mut [RegionMut<'_>],
        lend: bool,
        unpacked: Unpacked<'_>,
    ) -> (Outcome, bool) {
        let posts = self.board.posts();
        let mut shared = self.board.shared_mut();
        let regions = (by_dtype(own), by_dtype(outputs));
        self.lead_with(
            planned,
            collective,
            (&posts, &mut shared),
            regions,
            lend,
            unpacked,
        )
    }

    /// [`Node::lead`] over the given posts and results: the board's for a stage run in
    /// place, a job's for a deferred one (see `background`). `mine` and `outs` are the
    /// leader's regions and outputs.
    fn lead_with(
        &self,
        (facts, plan): (Facts, Plan),
        collective: Collective,
        (posts, shared): (&[std::sync::MutexGuard<'_, Post>], &mut Shared),
        (mine, outs): (Mine<'_>, Mine<'_>),
        lend: bool,
        unpacked: Unpacked<'_>,
    ) -> (Outcome, bool) {
        let mut leader = lock(&self.leader);
        shared.lent = lend;
        shared.by_slot = false;
        let stop = Stop(&self.aborted);
        if stop.now() {
            // No new MPI call after an abort: it would be matched with a given-up one.
            return (aborted(Abandoned), false);
        }
        let mut parts = Parts {
            caps: &self.caps,
            facts,
            collective,
            leader: &mut leader,
            posts,
            mine,
            outs,
            unpacked,
            shared,
            stop,
        };
        let (header, rode) = match agree::agree(&mut parts, plan == Plan::Small) {
            Ok(agreed) => agreed,
            Err(outcome) => return (outcome, false),
        };
        // A small stage whose data could not ride after all runs its collective's payload.
        let plan = match plan {
            Plan::Small if !rode => plan::large(&facts, collective),
            plan => plan,
        };
        if !plan.reads_lent() {
            // A plan that reads the regions whole gets them whole, whatever was kept.
            pack_unpacked(&mut parts.unpacked, &mut parts.mine);
        }
        match run(plan, &mut parts, &header) {
            // Lent buffers that do not hold the results would be read as results.
            Ok(false) if lend => (
                Outcome::Comm("the leader's regions do not hold the results to lend".into()),
                false,
            ),
            Ok(in_place) => (Outcome::Ok, in_place),
            Err(reason) => (Outcome::Comm(reason), false),
        }
    }
}

/// Runs `plan`'s executor over the agreed `header`. Whether the leader's regions, or for an
/// allgather its outputs, hold its results already.
fn run(plan: Plan, parts: &mut Parts<'_>, header: &OwnedHeader) -> Result<bool, String> {
    if plan != Plan::Small {
        for d in parts.facts.dtypes() {
            mpi_count(parts.facts.bytes(d))?;
        }
    }
    match plan {
        Plan::Small => small::run(parts),
        Plan::ScatterGather { op } => scatter_gather::run(parts, op),
        Plan::Broadcast { root, pieces } => broadcast::run(parts, root, &pieces),
        Plan::GatherBySlot => gather::by_slot(parts, &header.slots),
        Plan::GatherByRegion => gather::by_region(parts),
    }
}

//! Stages that go on while the actors compute: the process's ranks post a deferred stage
//! (see `Communicator::start_stage`) as a [`Job`] and go on, and one progress thread per
//! group and process does the leader's part of each job, in the order the ranks started
//! them; each rank takes its results when its step first reads them.
//!
//! Why a thread: OpenMPI moves a message over TCP only inside an MPI call, so a stage in
//! flight needs someone in MPI while the actors compute. The progress thread is that
//! someone, and it is the leader of every deferred stage, so the leader's MPI calls of a
//! stage come from one thread, in stage order, as the other processes' do.
//!
//! Every rank copies its inputs into the job when it starts the stage (the leader's too,
//! which the thread reads as the leader's regions): its values may be moved or dropped as
//! soon as `start_stage` returns, and the thread touches no rank's memory. The thread's
//! results stay in the job until every rank of the process has taken its own, so a rank
//! may start further stages before it completes this one. Jobs are recycled: steady state
//! allocates nothing.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Acquire;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use super::board::{lock, Bytes, Outcome, Post, Shared};
use super::pack::{copy_out, Mine, Unpacked};
use super::plan::{Facts, Plan};
use super::Node;
use crate::comm::{Collective, SlotDesc};
use crate::DType;

/// One deferred stage of the process's ranks: their posts, the leader's regions, and, once
/// the progress thread has run it, the verdict and the results.
#[derive(Default)]
pub(super) struct Job {
    /// Each rank's post, by local rank (the leader's holds its header, not its data).
    pub(super) posts: Box<[Mutex<Post>]>,
    /// The leader's regions (its inputs, and the results of a plan that leaves them
    /// there) and outputs, by dtype.
    pub(super) own: [Bytes; DType::COUNT],
    pub(super) outs: [Bytes; DType::COUNT],
    pub(super) shared: Shared,
    /// The leader's header's slots and plan, and whether it has its values.
    pub(super) slots: Vec<SlotDesc>,
    pub(super) planned: Option<(Facts, Plan)>,
    pub(super) collective: Option<Collective>,
    /// The verdict, and whether the leader's regions (or outputs) hold its results.
    pub(super) outcome: Option<(Outcome, bool)>,
}

impl Job {
    fn new(ranks: usize) -> Box<Self> {
        Box::new(Job {
            posts: (0..ranks).map(|_| Mutex::default()).collect(),
            ..Job::default()
        })
    }
}

/// The leader's regions and outputs of a job as the executors see them: one per dtype of
/// its header, of the agreed lengths (none for a failed leader, whose header has none).
fn regions<'j>(
    (own, outs): (&'j mut [Bytes; DType::COUNT], &'j mut [Bytes; DType::COUNT]),
    facts: &Facts,
    collective: Collective,
    ranks: usize,
) -> (Mine<'j>, Mine<'j>) {
    let (mut mine, mut outputs): (Mine<'j>, Mine<'j>) = Default::default();
    for ((d, own), out) in DType::ALL.iter().zip(own).zip(outs) {
        let len = facts.lens[d.index()];
        if len == 0 {
            continue;
        }
        mine[d.index()] = Some(own.bytes_mut(len * d.size()));
        if collective.has_outputs() {
            let out_len = collective.output_len(len, ranks).unwrap_or(0);
            outputs[d.index()] = Some(out.bytes_mut(out_len * d.size()));
        }
    }
    (mine, outputs)
}

/// A job in the queue.
struct Entry {
    /// `None` while the progress thread runs it.
    job: Option<Box<Job>>,
    /// How many ranks have posted it, and taken their results.
    posted: usize,
    taken: usize,
}

/// The deferred stages of the process's ranks of a group, oldest first.
#[derive(Default)]
pub(super) struct Queue {
    entries: VecDeque<Entry>,
    /// The stage number of the first entry (each rank numbers its deferred stages 0, 1,
    /// ... in the order it starts them).
    first: u64,
    /// The next stage the progress thread runs.
    next: u64,
    free: Vec<Box<Job>>,
    /// Set when the last endpoint is dropped: the thread ends.
    stop: bool,
    thread: Option<JoinHandle<()>>,
}

/// The queue and the bell that rings when a job is posted in full or run.
#[derive(Default)]
pub(super) struct Background {
    queue: Mutex<Queue>,
    bell: Condvar,
}

impl Background {
    pub(super) fn lock(&self) -> MutexGuard<'_, Queue> {
        lock(&self.queue)
    }

    /// Wakes every waiter (after an abort, for them to see it).
    pub(super) fn ring(&self) {
        let _queue = self.lock();
        self.bell.notify_all();
    }

    fn wait<'a>(&self, queue: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        self.bell
            .wait(queue)
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The end of a group's progress thread in this process: dropped with the last endpoint,
/// it stops the thread and waits for it.
pub(super) struct Stopper(pub(super) Arc<Node>);

impl Drop for Stopper {
    fn drop(&mut self) {
        let bg = &self.0.background;
        let thread = {
            let mut queue = bg.lock();
            queue.stop = true;
            bg.bell.notify_all();
            queue.thread.take()
        };
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

impl Node {
    /// Rank `local`'s part of starting its deferred stage number `seq`: `post` writes into
    /// the job (the rank's post, and for the leader its regions too). The last rank to
    /// post rings the progress thread, which the first job of the group starts.
    pub(super) fn post_job(self: &Arc<Self>, seq: u64, post: impl FnOnce(&mut Job)) {
        let ranks = self.board.ranks();
        let mut queue = self.background.lock();
        if queue.thread.is_none() && !queue.stop {
            let node = Arc::clone(self);
            let name = format!("actorgraph-{}-progress", self.group);
            queue.thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || node.progress())
                .ok();
        }
        while queue.first + queue.entries.len() as u64 <= seq {
            let mut job = queue.free.pop().unwrap_or_else(|| Job::new(ranks));
            job.outcome = None;
            queue.entries.push_back(Entry {
                job: Some(job),
                posted: 0,
                taken: 0,
            });
        }
        let at = (seq - queue.first) as usize;
        let entry = &mut queue.entries[at];
        if let Some(job) = entry.job.as_deref_mut() {
            post(job);
        }
        entry.posted += 1;
        if entry.posted == ranks {
            self.background.bell.notify_all();
        }
    }

    /// Rank `local`'s part of completing its deferred stage number `seq`: waits until the
    /// progress thread has run it, then `take` reads the job (the verdict, the results).
    /// An error if the group is aborted first.
    pub(super) fn take_job<R>(
        &self,
        seq: u64,
        take: impl FnOnce(&Job) -> R,
    ) -> Result<R, crate::comm::StageError> {
        let ranks = self.board.ranks();
        let mut queue = self.background.lock();
        loop {
            let at = seq.checked_sub(queue.first).map(|a| a as usize);
            let done = at
                .and_then(|a| queue.entries.get(a))
                .and_then(|e| e.job.as_deref())
                .filter(|j| j.outcome.is_some());
            if let Some(job) = done {
                let taken = take(job);
                let at = at.unwrap_or_default();
                queue.entries[at].taken += 1;
                // Recycle every job at the front that every rank has taken.
                while queue.entries.front().is_some_and(|e| e.taken == ranks) {
                    if let Some(job) = queue.entries.pop_front().and_then(|e| e.job) {
                        queue.free.push(job);
                    }
                    queue.first += 1;
                }
                return Ok(taken);
            }
            if self.aborted.load(Acquire) {
                return Err(crate::comm::StageError::Aborted);
            }
            queue = self.background.wait(queue);
        }
    }

    /// The progress thread: runs each job once every rank has posted it, in order.
    fn progress(&self) {
        let ranks = self.board.ranks();
        let bg = &self.background;
        let mut queue = bg.lock();
        loop {
            if queue.stop {
                return;
            }
            let at = (queue.next - queue.first) as usize;
            let ready = queue.entries.get(at).is_some_and(|e| e.posted == ranks);
            let Some(mut job) = ready.then(|| queue.entries[at].job.take()).flatten() else {
                queue = bg.wait(queue);
                continue;
            };
            drop(queue);
            let outcome = self.run_job(&mut job);
            job.outcome = Some(outcome);
            queue = bg.lock();
            let at = (queue.next - queue.first) as usize;
            queue.entries[at].job = Some(job);
            queue.next += 1;
            bg.bell.notify_all();
        }
    }

    /// The leader's part of one job, as `lead` does it for a stage run in place.
    fn run_job(&self, job: &mut Job) -> (Outcome, bool) {
        let Job {
            posts,
            own,
            outs,
            shared,
            planned,
            collective,
            ..
        } = job;
        let (Some(planned), Some(collective)) = (*planned, *collective) else {
            return (Outcome::Comm("the leader posted no header".into()), false);
        };
        let posts: Vec<MutexGuard<'_, Post>> = posts.iter().map(lock).collect();
        let mine = regions((own, outs), &planned.0, collective, self.caps.size);
        self.lead_with(
            planned,
            collective,
            (&posts, shared),
            mine,
            false,
            Unpacked::default(),
        )
    }
}

/// Copies rank `rank`'s results of `job` into its buffers: the leader's from the job's
/// regions, when the plan left them there; every other's from the shared results.
pub(super) fn copy_results(
    job: &Job,
    (local, rank, size): (usize, usize, usize),
    regions: &mut [crate::comm::RegionMut<'_>],
    outputs: &mut [crate::comm::RegionMut<'_>],
) {
    let Some(collective) = job.collective else {
        return;
    };
    let in_place = job.outcome.as_ref().is_some_and(|(_, in_place)| *in_place);
    if local == 0 && in_place {
        let copy = |r: &mut crate::comm::RegionMut<'_>, from: &[Bytes; DType::COUNT]| {
            let d = r.dtype();
            let dst = super::pack::region_bytes(r);
            dst.copy_from_slice(from[d.index()].bytes(dst.len()));
        };
        regions.iter_mut().for_each(|r| copy(r, &job.own));
        outputs.iter_mut().for_each(|r| copy(r, &job.outs));
        return;
    }
    copy_out(
        &job.shared,
        &job.slots,
        collective,
        rank,
        size,
        regions,
        outputs,
    );
}

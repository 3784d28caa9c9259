//! Stages that go on while the actors compute: the process's ranks post a deferred stage
//! (see `Communicator::start_stage`) as a [`Job`] and go on, and one progress thread per
//! group and process does the leader's part of each job, in the order the ranks started
//! them; each rank takes its results when its step first reads them. The queue itself,
//! and how the ranks and the thread wait on it, is [`Jobs`](crate::sync::Jobs).
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
//! may start further stages before it completes this one.

use std::sync::atomic::Ordering::Acquire;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::board::{lock, Bytes, Outcome, Post, Shared};
use super::pack::{copy_out, region_bytes, Mine, Unpacked};
use super::plan::{Facts, Plan};
use super::Node;
use crate::comm::{Collective, RegionMut, SlotDesc, StageError};
use crate::sync::Jobs;
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
    /// The leader's header's slots and plan, and the collective.
    pub(super) slots: Vec<SlotDesc>,
    pub(super) planned: Option<(Facts, Plan)>,
    pub(super) collective: Option<Collective>,
    /// The verdict, and whether the leader's regions (or outputs) hold its results.
    pub(super) outcome: Option<(Outcome, bool)>,
}

impl Job {
    /// Makes the job's posts for `ranks` ranks, if it has not got them yet (a new job).
    pub(super) fn make_posts(&mut self, ranks: usize) {
        if self.posts.len() != ranks {
            self.posts = (0..ranks).map(|_| Mutex::default()).collect();
        }
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

/// A group's deferred stages in this process, and the thread that leads them.
pub(super) struct Background {
    pub(super) jobs: Jobs<Job>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Background {
    pub(super) fn new(ranks: usize) -> Self {
        Self {
            jobs: Jobs::new(ranks),
            thread: Mutex::new(None),
        }
    }
}

/// The end of a group's progress thread in this process: dropped with the last endpoint,
/// it stops the thread and waits for it.
pub(super) struct Stopper(pub(super) Arc<Node>);

impl Drop for Stopper {
    fn drop(&mut self) {
        let bg = &self.0.background;
        bg.jobs.stop();
        if let Some(thread) = lock(&bg.thread).take() {
            let _ = thread.join();
        }
    }
}

impl Node {
    /// Rank `local`'s part of starting its deferred stage number `seq`: `post` writes into
    /// the job (the rank's post, and for the leader its regions too). The first job of the
    /// group starts the progress thread.
    pub(super) fn post_job(self: &Arc<Self>, seq: u64, post: impl FnOnce(&mut Job)) {
        {
            let mut thread = lock(&self.background.thread);
            if thread.is_none() {
                let node = Arc::clone(self);
                let name = format!("actorgraph-{}-progress", self.group);
                *thread = std::thread::Builder::new()
                    .name(name)
                    .spawn(move || node.progress())
                    .ok();
            }
        }
        self.background.jobs.post(seq, post);
    }

    /// Rank `local`'s part of completing its deferred stage number `seq`: waits until the
    /// progress thread has run it, then `take` reads the job (the verdict, the results).
    /// An error if the group is aborted first.
    pub(super) fn take_job<R>(
        &self,
        seq: u64,
        take: impl FnOnce(&Job) -> R,
    ) -> Result<R, StageError> {
        let aborted = || self.aborted.load(Acquire);
        self.background
            .jobs
            .read(seq, aborted, take)
            .ok_or(StageError::Aborted)
    }

    /// The progress thread: leads each job once every rank has posted it, in order, until
    /// the last endpoint is dropped.
    fn progress(&self) {
        crate::mpi::wait::be_patient();
        while let Some((seq, mut job)) = self.background.jobs.next() {
            job.outcome = Some(self.run_job(&mut job));
            self.background.jobs.ran(seq, job);
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
    regions: &mut [RegionMut<'_>],
    outputs: &mut [RegionMut<'_>],
) {
    let Some(collective) = job.collective else {
        return;
    };
    let in_place = job.outcome.as_ref().is_some_and(|(_, in_place)| *in_place);
    if local == 0 && in_place {
        let copy = |r: &mut RegionMut<'_>, from: &[Bytes; DType::COUNT]| {
            let d = r.dtype();
            let dst = region_bytes(r);
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

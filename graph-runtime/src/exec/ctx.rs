//! What an actor's generated step sees: its rank, its communicator, its stages, the edges
//! it sends on and receives from, and its schedule of those, which its failure path follows.

use std::any::Any;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicU8;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::bucket::{Bucketable, FusedStage, Gather, Scatter, SlotIdx};
use crate::comm::{Collective, Communicator};
use crate::error::panic_message;
use crate::exec::edge::{Edge, RecvError, SendError};
use crate::exec::links::Links;
use crate::exec::{Activity, Ctx, IN_CODE, IN_COLLECTIVE, ON_EDGE};
use crate::method::Method;
use crate::{trace, BoxError, Error, ReduceOp};

/// The name a failure of a call of `each` gives as its method's, in [`Error::Method`] and
/// [`Error::Panic`].
const EACH: &str = "each";

/// One operation of a group's step that waits for other actors, in the order the step runs
/// them. `graph!` emits the list; a rank that fails runs the rest of it in "failed" mode
/// (see [`StepCtx`]), so the order is the one every actor agreed on at compile time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncPoint {
    /// Fused stage `idx` of the group.
    Stage(usize),
    /// Sending on edge `idx` of the graph (by the ranks that produce its value).
    Send(usize),
    /// Receiving from edge `idx` of the graph (by the ranks that read its value).
    Recv(usize),
    /// The end of a step whose methods run after its last stage: an empty stage, run
    /// only when the group spans processes ([`Communicator::spans_processes`]), so that a
    /// method's error after the last stage reaches every process. Always last.
    End,
}

/// The per-actor context of a generated step: calls methods, runs fused stages, moves
/// values over edges, and, when this rank fails, still takes its part in every remaining
/// stage and edge, in schedule order, so that no other actor waits for it forever.
pub struct StepCtx<C> {
    group: &'static str,
    rank: usize,
    /// This actor's place among its group's actors in this process (its rank, unless the
    /// group spans processes): its entry in `activity`.
    local: usize,
    comm: C,
    stages: Box<[FusedStage]>,
    round: u64,
    poisoned: Option<String>,
    /// Per rank, what it is doing (see `Group::collect`'s timeout).
    activity: Arc<[Activity]>,
    schedule: &'static [SyncPoint],
    /// Per schedule position, the last round whose send or receive there was done.
    marks: Box<[u64]>,
    links: Links,
    /// The empty stage that ends each step, if the schedule ends with [`SyncPoint::End`]
    /// and the group spans processes; `None` costs nothing.
    end: Option<FusedStage>,
    /// The stages started and not yet finished, in the order they started.
    in_flight: Vec<usize>,
}

impl<C: Communicator> StepCtx<C> {
    /// The context of rank `comm.rank()`, the `local`-th of its group in this process.
    /// `deferred` lists the stages that the step completes after later calls, which run
    /// in the background where the communicator can when `overlap` is on (see
    /// [`LaunchOptions::overlap`](crate::LaunchOptions::overlap)).
    pub(crate) fn new(
        group: &'static str,
        (comm, local): (C, usize),
        (stage_names, deferred, overlap): (&[&'static str], &[usize], bool),
        schedule: &'static [SyncPoint],
        links: Links,
        activity: Arc<[Activity]>,
    ) -> Self {
        let stages = stage_names.iter().enumerate().map(|(i, &n)| {
            let mut st = FusedStage::new(n);
            st.deferred = overlap && deferred.contains(&i);
            st
        });
        Self {
            group,
            rank: comm.rank(),
            local,
            in_flight: Vec::with_capacity(stage_names.len()),
            stages: stages.collect(),
            round: 0,
            poisoned: None,
            activity,
            schedule,
            marks: vec![0; schedule.len()].into_boxed_slice(),
            links,
            end: (schedule.last() == Some(&SyncPoint::End) && comm.spans_processes())
                .then(|| FusedStage::new("end of step")),
            comm,
        }
    }

    fn activity(&self) -> &AtomicU8 {
        &self.activity[self.local].0
    }

    /// The message of the panic that poisoned this actor, if one did.
    pub(crate) fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    /// Runs `f` on this actor between executions (its part of a call of `each`), as
    /// [`StepCtx::call`] runs a method: a poisoned actor does not run it, and its `Err` or
    /// its panic becomes an [`Error`] that names this rank, the panic poisoning the actor.
    pub(crate) fn visit<R>(
        &mut self,
        f: impl FnOnce(Ctx) -> Result<R, BoxError>,
    ) -> Result<R, Error> {
        if let Some(message) = &self.poisoned {
            return Err(Error::Poisoned {
                group: self.group,
                rank: self.rank,
                message: message.clone(),
            });
        }
        // `each` runs on the actor's own thread, whose context its start set; the fallback
        // only keeps a caller elsewhere from seeing another actor's.
        let ctx = Ctx::current()
            .filter(|c| c.group() == self.group && c.rank() == self.rank)
            .unwrap_or_else(|| Ctx::new(self.group, self.rank, self.comm.size(), 1, &[]));
        match catch_unwind(AssertUnwindSafe(|| f(ctx))) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(source)) => Err(Error::Method {
                group: self.group,
                rank: self.rank,
                method: EACH,
                source,
            }),
            Err(payload) => Err(self.poison(Some(EACH), payload)),
        }
    }

    /// This actor's rank in its group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Calls a method, turning its `Err` or its panic into an [`Error`] that names it.
    #[inline]
    pub fn call<A: Method<M>, M>(
        &mut self,
        actor: &mut A,
        args: A::Args<'_>,
    ) -> Result<A::Output, Error> {
        let _span = trace::method(self.group, self.rank, std::any::type_name::<A>(), A::NAME);
        match catch_unwind(AssertUnwindSafe(|| actor.call(args))) {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(source)) => Err(Error::Method {
                group: self.group,
                rank: self.rank,
                method: A::NAME,
                source,
            }),
            Err(payload) => Err(self.poison(Some(A::NAME), payload)),
        }
    }

    /// Starts fused stage `idx` of this execution, whose values are named `values` in the
    /// graph (by slot, for its errors).
    #[inline]
    pub fn stage<'v>(&mut self, idx: usize, values: &'static [&'static str]) -> Stage<'_, 'v, C> {
        // Only a hand-written step begins a stage again before completing it.
        let unfinished = match self.stages[idx].in_flight() {
            true => self.finish_through(idx).err(),
            false => None,
        };
        let st = &mut self.stages[idx];
        let span = trace::stage(self.group, self.rank, st.name(), values);
        st.begin();
        if let Some(e) = unfinished {
            st.refuse(e);
        }
        st.name_values(values);
        Stage {
            st,
            idx,
            in_flight: &mut self.in_flight,
            comm: &mut self.comm,
            group: self.group,
            round: self.round,
            activity: &self.activity[self.local].0,
            span,
            started: false,
            _values: PhantomData,
        }
    }

    /// Waits for stage `started` and hands its results out: what its
    /// [`Stage::start`] began, finished. Stages in flight finish in the order they
    /// started, so every one started before it finishes first (an error of one of them is
    /// this call's).
    #[inline]
    pub fn complete(&mut self, started: Started) -> Result<Done<'_>, Error> {
        let idx = started.idx;
        if self.stages[idx].in_flight() {
            let _span = trace::complete(self.group, self.rank, self.stages[idx].name());
            self.finish_through(idx)?;
        }
        Ok(Done {
            st: &mut self.stages[idx],
        })
    }

    /// Finishes every stage in flight up to and including `idx`, in the order they
    /// started; the first error, once all of them are finished.
    fn finish_through(&mut self, idx: usize) -> Result<(), Error> {
        let Some(end) = self.in_flight.iter().position(|&i| i == idx) else {
            return Ok(());
        };
        let activity = &self.activity[self.local].0;
        let mut first = Ok(());
        for i in self.in_flight.drain(..=end) {
            activity.store(IN_COLLECTIVE, Relaxed);
            let finished = self.stages[i].finish(&mut self.comm, self.group);
            activity.store(IN_CODE, Relaxed);
            if first.is_ok() {
                first = finished;
            }
        }
        first
    }

    /// Finishes every stage still in flight; the first error.
    fn finish_all(&mut self) -> Result<(), Error> {
        match self.in_flight.last() {
            Some(&last) => self.finish_through(last),
            None => Ok(()),
        }
    }

    /// Marks schedule position `at` as done in this round.
    fn mark(&mut self, at: usize) {
        if let Some(m) = self.marks.get_mut(at) {
            *m = self.round;
        }
    }

    /// Marks send position `at` as done, unless a value could not be encoded to leave
    /// the process: then no consumer got it, and the failure path ([`StepCtx::drain`])
    /// sends each a failure marker. (A panic while sending, in a user's `Clone`, leaves
    /// the position unmarked too.)
    fn mark_sent(&mut self, at: usize, failed: Option<&SendError>) {
        if !matches!(failed, Some(SendError::Encode(_))) {
            self.mark(at);
        }
    }

    /// Sends this rank's `value` to the one actor it feeds over `edge` (schedule position
    /// `at`); waits only while that actor has not taken the previous round's value.
    #[inline]
    pub fn send<T: Send + 'static>(
        &mut self,
        at: usize,
        edge: &Edge<T>,
        value: T,
    ) -> Result<(), Error> {
        let _span = trace::send(edge.value());
        self.activity().store(ON_EDGE, Relaxed);
        let sent = edge.send(self.rank, self.round, value);
        self.activity().store(IN_CODE, Relaxed);
        self.mark_sent(at, sent.as_ref().err());
        sent.map_err(|e| self.send_error(edge, e))
    }

    /// Sends this rank's `value` to every actor it feeds over `edge`: a `clone` each, the
    /// value itself to the last. (The clone function comes from the generated code, so
    /// that a type without `Clone` gets one error, at the user's argument.)
    #[inline]
    pub fn send_each<T: Send + 'static>(
        &mut self,
        at: usize,
        edge: &Edge<T>,
        value: T,
        clone: fn(&T) -> T,
    ) -> Result<(), Error> {
        let _span = trace::send(edge.value());
        self.activity().store(ON_EDGE, Relaxed);
        let sent = edge.send_each(self.rank, self.round, value, clone);
        self.activity().store(IN_CODE, Relaxed);
        self.mark_sent(at, sent.as_ref().err());
        sent.map_err(|e| self.send_error(edge, e))
    }

    #[cold]
    fn send_error<T>(&self, edge: &Edge<T>, e: SendError) -> Error {
        match e {
            SendError::Stopped => self.stopped(edge),
            SendError::Encode(reason) => Error::Travel {
                group: self.group,
                rank: self.rank,
                value: edge.value(),
                reason: format!("writing it: {reason}"),
            },
        }
    }

    /// Receives this round's value from `edge` (schedule position `at`). If its producer
    /// failed, this rank fails with [`Error::Upstream`], which `execute` reports as the
    /// producer's own error.
    #[inline]
    pub fn recv<T: Send + 'static>(&mut self, at: usize, edge: &Edge<T>) -> Result<T, Error> {
        self.mark(at);
        let _span = trace::recv(edge.value(), edge.from_group());
        self.activity().store(ON_EDGE, Relaxed);
        let got = edge.recv(self.rank, self.round);
        self.activity().store(IN_CODE, Relaxed);
        got.map_err(|e| self.recv_error(edge, e))
    }

    /// Hands a gather's `Vec`, read and no longer needed, back to its `edge`: the next
    /// round's values go into it, so a steady gather allocates nothing. (Generated code
    /// recycles every gathered `Vec` that the step did not move elsewhere.)
    #[inline]
    pub fn recycle<T: Send + 'static>(&self, edge: &Edge<T>, values: Vec<T>) {
        edge.recycle(values);
    }

    #[cold]
    fn recv_error<T>(&self, edge: &Edge<T>, e: RecvError) -> Error {
        match e {
            // The producer is in another process, whose error this one learns only here:
            // reported as its own, as it would be if the producer were local.
            RecvError::Failed {
                cause: Some(cause), ..
            } => cause,
            RecvError::Failed { from_rank, .. } => Error::Upstream {
                group: self.group,
                rank: self.rank,
                value: edge.value(),
                from_group: edge.from_group(),
                from_rank,
            },
            RecvError::Unreadable { reason, .. } => Error::Travel {
                group: self.group,
                rank: self.rank,
                value: edge.value(),
                reason,
            },
            RecvError::Aborted => self.stopped(edge),
        }
    }

    /// Sends this rank's `values` over a scatter `edge` (schedule position `at`), the k-th
    /// to consumer k, moved; returns the one this rank keeps when it is a consumer too. A
    /// `Vec` without one value per consumer is [`Error::ScatterLength`], and nothing is
    /// sent (the failure path sends every consumer a failure marker).
    #[inline]
    pub fn send_scatter<T: Send + 'static>(
        &mut self,
        at: usize,
        edge: &Edge<T>,
        values: Vec<T>,
    ) -> Result<Option<T>, Error> {
        let _span = trace::send(edge.value());
        self.activity().store(ON_EDGE, Relaxed);
        let sent = edge.send_scatter(self.rank, self.round, values);
        self.activity().store(IN_CODE, Relaxed);
        match sent {
            Ok(Ok(own)) => {
                self.mark(at);
                Ok(own)
            }
            Ok(Err(e)) => {
                self.mark_sent(at, Some(&e));
                Err(self.send_error(edge, e))
            }
            Err((got, expected)) => Err(Error::ScatterLength {
                value: edge.value(),
                group: self.group,
                rank: self.rank,
                expected,
                got,
            }),
        }
    }

    /// Receives every producer's value of this round from a gather `edge` (schedule
    /// position `at`), in rank order; `own` is this rank's own value when it is one of
    /// the producers. If a producer failed, this rank fails with [`Error::Upstream`]
    /// naming the lowest failed producer.
    #[inline]
    pub fn recv_gather<T: Send + 'static>(
        &mut self,
        at: usize,
        edge: &Edge<T>,
        own: Option<T>,
    ) -> Result<Vec<T>, Error> {
        self.mark(at);
        let _span = trace::recv(edge.value(), edge.from_group());
        self.activity().store(ON_EDGE, Relaxed);
        let got = edge.recv_gather(self.rank, self.round, own);
        self.activity().store(IN_CODE, Relaxed);
        got.map_err(|e| self.recv_error(edge, e))
    }

    #[cold]
    fn stopped<T>(&self, edge: &Edge<T>) -> Error {
        Error::Broken {
            group: self.group,
            reason: format!(
                "value `{}` of group `{}` could not reach rank {}: the graph was stopped",
                edge.value(),
                edge.from_group(),
                self.rank
            ),
        }
    }

    /// The value of a single-actor value (`workers[k].method(..)`) on the actor that holds
    /// it. Generated code asks only that actor, where it is always there.
    #[inline]
    pub fn held<'h, T>(&self, value: &'h Option<T>) -> Result<&'h T, Error> {
        value.as_ref().ok_or_else(|| self.missing())
    }

    /// Like [`StepCtx::held`], taking the value.
    #[inline]
    pub fn take_held<T>(&self, value: Option<T>) -> Result<T, Error> {
        value.ok_or_else(|| self.missing())
    }

    #[cold]
    fn missing(&self) -> Error {
        Error::ActorLost {
            group: self.group,
            rank: self.rank,
            reason: "internal error: a single-actor value is missing on its actor".into(),
        }
    }

    /// Runs one execution of `step`, its result written into `out` (an empty cell: the
    /// outbox's, so that a large output, a whole bucket's tensors, is not moved through
    /// temporaries on its way there); whatever happens, this rank takes part in every
    /// stage and every edge of its schedule, so no peer waits for it forever.
    pub(crate) fn execute<A, I, O>(
        &mut self,
        actor: &mut A,
        step: &impl Fn(&mut A, &mut Self, &I) -> Result<O, Error>,
        input: &I,
        out: &mut Option<Result<O, Error>>,
    ) {
        self.round += 1;
        let _span = trace::step(self.group, self.rank, self.round);
        match &self.poisoned {
            Some(message) => {
                *out = Some(Err(Error::Poisoned {
                    group: self.group,
                    rank: self.rank,
                    message: message.clone(),
                }))
            }
            None => {
                let ran = catch_unwind(AssertUnwindSafe(|| *out = Some(step(actor, self, input))));
                if let Err(payload) = ran {
                    *out = Some(Err(self.poison(None, payload)));
                }
            }
        }
        if let Some(Ok(_)) = out {
            // A step that left a stage in flight (only a hand-written one does) ends it.
            if let Err(e) = self.finish_all().and_then(|()| self.end_step()) {
                *out = Some(Err(e));
            }
        }
        if let Some(Err(e)) = out {
            self.comm.note_failure(e);
            if let Some(earlier) = self.drain(Some(e)) {
                *out = Some(Err(earlier));
            }
        }
        self.links.flush(self.group, self.rank);
    }

    /// The empty stage at the end of a step (see [`SyncPoint::End`]), if it has one: a
    /// failure of a rank of another process after the last stage is this rank's error.
    fn end_step(&mut self) -> Result<(), Error> {
        let Some(st) = &mut self.end else {
            return Ok(());
        };
        st.last_round = self.round;
        st.begin();
        st.prepare_on(&mut self.comm);
        let activity = &self.activity[self.local].0;
        activity.store(IN_COLLECTIVE, Relaxed);
        let result = st.run(
            &mut self.comm,
            Collective::AllReduce(ReduceOp::Sum),
            self.group,
        );
        activity.store(IN_CODE, Relaxed);
        result
    }

    /// Fails this execution without running the step (an internal error).
    pub(crate) fn fail<O>(&mut self, reason: &str) -> Result<O, Error> {
        self.round += 1;
        self.drain(None);
        self.links.flush(self.group, self.rank);
        Err(Error::ActorLost {
            group: self.group,
            rank: self.rank,
            reason: reason.to_string(),
        })
    }

    /// Runs, as a failed rank, every synchronization this execution has not reached, in
    /// schedule order: joins each stage as failed (its peers skip the payload), sends a
    /// failure marker on each edge this rank produces, and takes and drops each value it
    /// was due. Following the schedule's order is what keeps the failure path as free of
    /// deadlocks as the normal one: every actor runs its synchronizations in one global
    /// order, which the macro's scheduler (`graph-macros/src/graph/schedule.rs`) fixes at
    /// compile time.
    ///
    /// Returns the failure of an earlier rank of another process that a stage reported
    /// (under MPI): every process reports the first failed rank's error, this one too.
    fn drain(&mut self, cause: Option<&Error>) -> Option<Error> {
        let (rank, round) = (self.rank, self.round);
        // The earliest failed rank so far (this one's, if its error is its own) and the
        // error of an earlier one, reported by a stage.
        let mut first = cause.and_then(Error::failed_rank).unwrap_or(usize::MAX);
        let mut earlier: Option<Error> = None;
        let mut weigh = |reported: Option<Error>| {
            if let Some(e) = reported {
                if let Some(r) = e.failed_rank().filter(|&r| r < first) {
                    first = r;
                    earlier = Some(e);
                }
            }
        };
        // The stages in flight started before any synchronization not yet reached.
        while let Some(&idx) = self.in_flight.first() {
            weigh(self.finish_through(idx).err());
        }
        let activity = &self.activity[self.local].0;
        for (at, point) in self.schedule.iter().enumerate() {
            match *point {
                SyncPoint::Stage(idx) => {
                    if let Some(st) = self.stages.get_mut(idx) {
                        weigh(skip_stage(st, &mut self.comm, round, activity));
                    }
                }
                SyncPoint::End => {
                    if let Some(st) = &mut self.end {
                        weigh(skip_stage(st, &mut self.comm, round, activity));
                    }
                }
                SyncPoint::Send(e) | SyncPoint::Recv(e) => {
                    if self.marks[at] == round {
                        continue;
                    }
                    self.marks[at] = round;
                    let Some(edge) = self.links.get(e) else {
                        continue;
                    };
                    activity.store(ON_EDGE, Relaxed);
                    if matches!(point, SyncPoint::Send(_)) {
                        edge.fail_from(rank, round, cause);
                    } else {
                        edge.drain_to(rank, round);
                    }
                    activity.store(IN_CODE, Relaxed);
                }
            }
        }
        // Every stage is in the schedule; this only guards against one that is not.
        for st in self.stages.iter_mut() {
            weigh(skip_stage(st, &mut self.comm, round, activity));
        }
        earlier
    }

    fn poison(&mut self, method: Option<&'static str>, payload: Box<dyn Any + Send>) -> Error {
        let message = panic_message(payload.as_ref());
        self.poisoned = Some(message.clone());
        // The payload's own drop could panic; keep that off this thread's unwinding path.
        std::mem::forget(payload);
        Error::Panic {
            group: self.group,
            rank: self.rank,
            method,
            message,
        }
    }
}

/// Joins stage `st` as a failed rank, unless this round has joined it already.
/// Returns the error of another rank the stage reported instead, if any.
fn skip_stage<C: Communicator>(
    st: &mut FusedStage,
    comm: &mut C,
    round: u64,
    activity: &AtomicU8,
) -> Option<Error> {
    if st.last_round == round {
        return None;
    }
    st.last_round = round;
    activity.store(IN_COLLECTIVE, Relaxed);
    let reported = st.skip(comm);
    activity.store(IN_CODE, Relaxed);
    reported
}

/// One fused stage of one execution on one rank: add the values, pack them, run, and take
/// the outputs.
///
/// `'v` is how long the bucket's values are borrowed: at least until `run` is over, so that
/// a communicator can read them in place instead of from a packed copy.
pub struct Stage<'a, 'v, C> {
    st: &'a mut FusedStage,
    /// The stage's index in the step, and the step's stages in flight.
    idx: usize,
    in_flight: &'a mut Vec<usize>,
    comm: &'a mut C,
    group: &'static str,
    round: u64,
    activity: &'a AtomicU8,
    /// The stage's span, entered from `stage` until the outputs are made.
    span: trace::Guard,
    /// Whether [`Stage::start`] handed the stage on to [`StepCtx::complete`].
    started: bool,
    _values: PhantomData<&'v ()>,
}

impl<C> Drop for Stage<'_, '_, C> {
    fn drop(&mut self) {
        // The outputs are made: hand rank 0's shared result buffers back (once they are
        // made, after `StepCtx::complete`, for a started stage).
        if !self.started {
            self.st.release_shared();
        }
    }
}

/// A fused stage that [`Stage::start`] began: [`StepCtx::complete`] waits for it and hands
/// its results out.
#[must_use = "a started stage's results are read through `StepCtx::complete`"]
#[derive(Debug)]
pub struct Started {
    idx: usize,
}

/// A completed fused stage, whose results [`Done::output`] hands out.
pub struct Done<'a> {
    st: &'a mut FusedStage,
}

impl Drop for Done<'_> {
    fn drop(&mut self) {
        // The outputs are made: hand rank 0's shared result buffers back.
        self.st.release_shared();
    }
}

impl Done<'_> {
    /// This rank's result for a value: a view into the flat buffer.
    #[inline]
    pub fn output<T: Bucketable>(&mut self, value: &T, at: SlotIdx) -> T {
        self.st.output(value, at)
    }

    /// The stage itself, for the `output` flavours of the collectives whose results have
    /// another type or length (`allgather`, `reducescatter`, `reduce`).
    #[inline]
    pub fn fused(&mut self) -> &mut FusedStage {
        self.st
    }
}

impl<'v, C: Communicator> Stage<'_, 'v, C> {
    /// Appends a value to the bucket's layout.
    #[inline]
    pub fn add<T: Bucketable>(&mut self, value: &T) -> SlotIdx {
        self.st.add(value)
    }

    /// Takes the flat buffers for the layout.
    #[inline]
    pub fn prepare(&mut self) {
        self.st.prepare_on(self.comm)
    }

    /// Hands a value to the stage: lent in place to a communicator that reads values in
    /// place, else copied into the flat buffer.
    #[inline]
    pub fn pack<T: Bucketable>(&mut self, value: &'v T, at: SlotIdx) {
        if self.comm.reads_in_place() {
            self.st.lend(value, at)
        } else {
            self.st.pack(value, at)
        }
    }

    /// [`pack`](Self::pack) for `allgather`.
    #[inline]
    pub fn pack_gather<T: Gather>(&mut self, value: &'v T, at: SlotIdx) {
        self.pack(value, at)
    }

    /// [`pack`](Self::pack) for `reducescatter`.
    #[inline]
    pub fn pack_scatter<T: Scatter>(&mut self, value: &'v T, at: SlotIdx) {
        self.pack(value, at)
    }

    /// Agrees with the other ranks and starts the collective over the whole buffer, which
    /// goes on while the step runs its next calls if the stage is one the graph completes
    /// later and the communicator can ([`Communicator::start_stage`]); the values are no
    /// longer borrowed. [`StepCtx::complete`] waits for it.
    #[inline]
    pub fn start(mut self, collective: Collective) -> Result<Started, Error> {
        self.st.last_round = self.round;
        self.started = true;
        let _span = trace::collective(&self.span, collective, self.st.slots());
        self.activity.store(IN_COLLECTIVE, Relaxed);
        let result = self.st.start(self.comm, collective, self.group);
        self.activity.store(IN_CODE, Relaxed);
        result?;
        if self.st.in_flight() {
            self.in_flight.push(self.idx);
        }
        Ok(Started { idx: self.idx })
    }

    /// Agrees with the other ranks and runs the collective over the whole buffer.
    #[inline]
    pub fn run(&mut self, collective: Collective) -> Result<(), Error> {
        self.st.last_round = self.round;
        let _span = trace::collective(&self.span, collective, self.st.slots());
        self.activity.store(IN_COLLECTIVE, Relaxed);
        let result = self.st.run(self.comm, collective, self.group);
        self.activity.store(IN_CODE, Relaxed);
        result
    }

    /// This rank's result for a value: a view into the flat buffer.
    #[inline]
    pub fn output<T: Bucketable>(&mut self, value: &T, at: SlotIdx) -> T {
        self.st.output(value, at)
    }

    /// The stage itself, for the `add`/`pack`/`output` flavours of the collectives whose
    /// results have another type or length (`allgather`, `reducescatter`, `reduce`).
    #[inline]
    pub fn fused(&mut self) -> &mut FusedStage {
        self.st
    }
}

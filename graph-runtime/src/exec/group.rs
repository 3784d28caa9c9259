//! The driver's handle on one actor group ([`Group`]): it hands each execution's inputs to
//! the actors' handoffs ([`handoff`](super::handoff)), collects their outputs, runs the
//! steps nobody has started when that is faster ([`help`](super::help)), turns a late or
//! lost rank into a typed error that breaks the group, and stops and joins the threads at
//! teardown or drop. Starting the threads is [`launch`]; running a closure on every actor
//! between executions, [`each`].

mod each;
mod launch;

use std::marker::PhantomData;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::Arc;
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::handoff::{Returned, Shared};
use super::help::Help;
use super::links::Links;
use super::{lock, Deadline, Deal, SyncPoint, IN_CODE, IN_COLLECTIVE, TEARDOWN_GRACE};
use crate::comm::{AbortHandle, RankState};
use crate::Error;

/// What the generated code knows of a group before it runs: its name, its fused stages and
/// its schedule. `graph!` writes one per group as a literal, so that [`Group::start`]
/// takes the facts that never change apart from what each launch brings (the actors, the
/// backend, the edges, the step).
#[derive(Clone, Copy, Debug)]
pub struct GroupSpec {
    /// The group's name in the graph: in its threads' names and in every error.
    pub name: &'static str,
    /// The names of the group's fused stages, in step order.
    pub stages: &'static [&'static str],
    /// The stages whose step completes them after later calls (their results are first
    /// read there, or at the end of the step), by index: those that may go on meanwhile
    /// (see [`LaunchOptions::overlap`](crate::LaunchOptions::overlap)).
    pub deferred: &'static [usize],
    /// The group's stages and edge operations in step order, which the failure path of a
    /// rank follows (see [`SyncPoint`]).
    pub schedule: &'static [SyncPoint],
    /// Every group of the graph with its size, for [`Ctx::group_size`](crate::Ctx::group_size)
    /// (see [`group_sizes`](crate::__private::group_sizes)).
    pub groups: &'static [(&'static str, usize)],
}

/// The driver's handle on one actor group: its threads, and a slot per actor through which
/// inputs go in and outputs come back.
///
/// Dropping it stops the threads and joins them, waiting at most [`TEARDOWN_GRACE`]; the
/// actors are dropped on their own threads.
pub struct Group<A, I, O> {
    name: &'static str,
    shared: Arc<Shared<A, I, O>>,
    threads: Vec<Option<JoinHandle<Returned>>>,
    /// Per actor, the `done` value last seen by the driver.
    done_seen: Vec<u64>,
    abort: AbortHandle,
    /// The graph's edges, aborted with the communicator: a group that breaks or stops must
    /// not leave an actor of another group waiting for its values.
    links: Links,
    /// Why the group cannot run any more, if it cannot.
    broken: Option<String>,
    /// Per rank, the actor's state, if the driver may run its steps (see
    /// [`help`](super::help)).
    helpers: Vec<Option<Arc<dyn Help<I, O>>>>,
    /// Whether the last submission left the first actor's step for the driver to run.
    held: bool,
    /// Whether the driver runs, while it collects the last submission, the steps that no
    /// actor thread has started yet (see [`help`](super::help)).
    steal: bool,
    /// Executions submitted so far.
    submitted: u64,
    /// The most executions in flight (`max_in_flight`): the cells of each actor's handoff.
    depth: u64,
    /// The ranks of this process's actors in the whole group (all of them, unless the
    /// group spans processes), and the group's size.
    ranks: (std::ops::Range<usize>, usize),
    /// The group owns no actor (they live on their threads), so it is `Send` and `Sync`
    /// whatever the actor type.
    _actors: PhantomData<fn() -> A>,
}

impl<A, I, O> Group<A, I, O>
where
    A: 'static,
    I: Deal,
    O: Send + 'static,
{
    /// The ranks, in the whole group, of the actors this process hosts (consecutive:
    /// ranks are numbered in process order), and the group's size in every process.
    pub fn ranks(&self) -> (std::ops::Range<usize>, usize) {
        self.ranks.clone()
    }

    /// The number of actors.
    pub fn len(&self) -> usize {
        self.done_seen.len()
    }

    /// Whether the group has no actors (never true for a launched group).
    pub fn is_empty(&self) -> bool {
        self.done_seen.is_empty()
    }

    /// An error if the group cannot run (it timed out or lost a thread before).
    pub fn ready(&self) -> Result<(), Error> {
        match &self.broken {
            Some(reason) => Err(Error::Broken {
                group: self.name,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Queues one execution's input for every actor (see [`Deal`]), behind the executions
    /// already in flight, and starts their steps. Call [`Group::ready`] and [`Deal::check`]
    /// first; the caller keeps the number of executions in flight within the `depth`
    /// given at launch.
    pub fn submit(&mut self, input: I::Whole) {
        self.submit_holding(input, false, false);
    }

    /// [`Group::submit`], letting the next [`Group::collect`] run the steps that no actor
    /// thread has started, if the group has nothing else in flight; with `hold_first`,
    /// the first actor's step is then left for the caller to run with
    /// [`Group::run_held`], if that actor may run on the caller's thread: whether it was
    /// left (see [`help`](super::help)).
    pub(crate) fn submit_helped(&mut self, input: I::Whole, hold_first: bool) -> bool {
        // Every earlier execution collected: the actors' threads run nothing now.
        let idle = self.done_seen.iter().all(|&seen| seen == self.submitted);
        let hold = hold_first && self.helpers[0].is_some() && idle;
        self.submit_holding(input, hold, idle);
        hold
    }

    fn submit_holding(&mut self, input: I::Whole, hold: bool, steal: bool) {
        let execution = self.submitted;
        self.submitted += 1;
        let (slots, depth, collected) = (&self.shared.slots, self.depth, &self.done_seen);
        // Each actor starts as soon as it has its input; every actor starts, even one that
        // got none (it then fails its step, and its peers learn it). A held first actor is
        // left for `run_held`, which runs after every other actor has its input.
        let mut started = 0;
        let mut start_through = |rank: usize| {
            for (r, slot) in slots.iter().enumerate().take(rank + 1).skip(started) {
                // Before the `go` advance, or the held step, that lets the step run.
                slot.inbox.submitted.store(execution + 1, Release);
                if r != 0 || !hold {
                    slot.inbox.go.advance();
                }
            }
            started = started.max(rank + 1);
        };
        let mut overfull = false;
        I::deal(input, slots.len(), |rank, value| {
            if execution - collected[rank] < depth {
                // SAFETY: the protocol of `Slot`: this thread, the driver (it owns the group,
                // `&mut self`), collected execution `execution - depth` of this rank (just
                // checked), whose step took the cell's last input before its `done` advance,
                // which the collect saw; the step of this execution takes it only after the
                // `go` advance below, or on this thread (a held step).
                unsafe { slots[rank].inbox.inputs.put(execution, value) };
            } else {
                overfull = true;
            }
            start_through(rank);
        });
        start_through(slots.len() - 1);
        self.held = hold;
        self.steal = steal;
        if overfull {
            // More executions than `max_in_flight` in flight: the driver's `Pipeline` rules
            // it out; a caller of this hidden API may not. An actor without its input fails
            // its step (its peers learn it), and the group cannot run any more.
            self.break_with(
                "internal error: more executions submitted than `max_in_flight`".into(),
            );
        }
    }

    /// The name of the group.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Runs on this thread the first actor's step that [`Group::submit_helped`]
    /// left, or, if its own thread is busy after all, hands it over.
    pub(crate) fn run_held(&mut self) {
        if !std::mem::take(&mut self.held) {
            return;
        }
        if !self.run_here(0) {
            // Not run here (the actor's thread holds the runner, or ran the step already):
            // its thread runs it, once told.
            self.shared.slots[0].inbox.go.advance();
        }
    }

    /// Runs on this thread the step of rank `rank` that was submitted and that nobody has
    /// run yet, if its actor may run here and its thread does not hold it now: whether it
    /// ran one.
    fn run_here(&self, rank: usize) -> bool {
        let Some(helper) = &self.helpers[rank] else {
            return false;
        };
        // A panic here (never a method's: those are caught) may leave peers waiting for
        // this step: release them, as an actor thread that unwinds does.
        let guard = UnwindGuard {
            abort: &self.abort,
            links: &self.links,
        };
        let slot = &self.shared.slots[rank];
        let ran = helper.try_run(slot, &self.shared.waker);
        std::mem::forget(guard);
        ran
    }

    /// Runs on this thread every submitted step that no actor thread has started, if the
    /// actor threads cannot all be running (see [`Group::collect`]): the help of an async
    /// execution, which cannot hold a step back as `execute` does (it must not block
    /// before its first `Pending`).
    pub(crate) fn help(&self) {
        if !crate::sync::crowded() {
            return;
        }
        for rank in 0..self.len() {
            self.run_unstarted(rank);
        }
    }

    /// [`Group::run_here`], if no thread has started the step of rank `rank` that the
    /// driver collects next. Not started, its thread may not even be awake (a wake-up, or
    /// a turn on a busy core, costs far more than a small step); once started, the
    /// runner's lock is its thread's, and trying it would only take that line from the
    /// thread's core.
    fn run_unstarted(&self, rank: usize) {
        if self.shared.slots[rank].started.0.load(Relaxed) == self.done_seen[rank] {
            self.run_here(rank);
        }
    }

    /// Whether every actor has finished its step of the oldest execution not yet collected
    /// (or ended), so that [`Group::collect`] returns without waiting. Never blocks.
    pub fn is_done(&self) -> bool {
        self.shared
            .slots
            .iter()
            .zip(&self.done_seen)
            .all(|(slot, &seen)| slot.outbox.done.current() > seen)
    }

    /// Registers the waker of an async execution: the next actor of this group that
    /// finishes its step (or whose thread ends) wakes it, once. Register, then check
    /// [`Group::is_done`]: no wake-up is lost between the two. Never blocks for longer
    /// than an actor takes to swap the waker out.
    pub fn register_waker(&self, waker: &Waker) {
        self.shared.waker.register(waker);
    }

    /// Waits for every actor's step of the oldest execution not yet collected and returns
    /// the outputs by rank, or the first root-cause error (lowest rank) if any rank failed.
    ///
    /// With a `deadline`, ranks still running when it passes make this return
    /// [`Error::Timeout`]; the group is then broken: its communicator is aborted so that
    /// no rank waits for the late ones, and only teardown is left.
    pub fn collect(&mut self, deadline: Option<Deadline>) -> Result<Vec<O>, Error> {
        let mut outputs = Vec::with_capacity(self.len());
        let mut first_error: Option<Error> = None;
        // Only in an `execute` with nothing else in flight and no deadline (which this
        // thread must stay free to keep), and only when the actor threads cannot all be
        // running: otherwise each is spinning for its `go` and starts its step at once,
        // and looking would only move the lines it is writing.
        let steal = std::mem::take(&mut self.steal) && deadline.is_none() && crate::sync::crowded();
        for rank in 0..self.len() {
            if steal {
                self.run_unstarted(rank);
            }
            let execution = self.done_seen[rank];
            let slot = &self.shared.slots[rank];
            match slot
                .outbox
                .done
                .wait_past(execution, deadline.map(|d| d.at))
            {
                // One step per collect: a later execution may be done too.
                Ok(_) => self.done_seen[rank] += 1,
                Err(_) => {
                    return Err(self.time_out(rank, deadline.map_or(Duration::ZERO, |d| d.timeout)))
                }
            }
            // SAFETY: the protocol of `Slot`: step `execution` put its output before the
            // `done` advance that the wait above saw (acquire), or its thread ended (then
            // it touches no cell again); the step that puts into this cell next is that of
            // execution `execution + depth`, which this thread, the driver (it owns the
            // group, `&mut self`), submits only after this collect.
            let result = unsafe { slot.outbox.outputs.take(execution) }.unwrap_or_else(|| {
                Err(Error::ActorLost {
                    group: self.name,
                    rank,
                    reason: "its thread ended during the execution".into(),
                })
            });
            match result {
                Ok(out) => outputs.push(out),
                Err(e) => {
                    if matches!(e, Error::ActorLost { .. }) {
                        self.break_with(e.to_string());
                    }
                    let better = match &first_error {
                        None => true,
                        Some(prev) => !prev.is_root_cause() && e.is_root_cause(),
                    };
                    if better {
                        first_error = Some(e);
                    }
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(outputs),
        }
    }

    fn time_out(&mut self, first_late: usize, timeout: Duration) -> Error {
        let mine: Vec<RankState> = (0..self.len())
            .map(|r| {
                if r < first_late || self.shared.slots[r].outbox.done.current() != self.done_seen[r]
                {
                    return RankState::Done;
                }
                match self.shared.activity[r].0.load(Acquire) {
                    IN_CODE => RankState::InCode,
                    IN_COLLECTIVE => RankState::InCollective,
                    _ => RankState::OnEdge,
                }
            })
            .collect();
        // Release this process's ranks first: the census may wait for the other processes.
        self.abort.abort();
        self.links.abort();
        // Over several processes every one names every late rank, by global rank.
        let (states, first) = match self.abort.census(&mine, timeout) {
            Some(every) => (every, 0),
            None => (mine, self.ranks.0.start),
        };
        let ranks_where = |f: fn(RankState) -> bool| -> Vec<usize> {
            (0..states.len())
                .filter(|&r| f(states[r]))
                .map(|r| first + r)
                .collect()
        };
        let mut ranks = ranks_where(|s| s == RankState::InCode);
        let mut waiting = ranks_where(|s| matches!(s, RankState::InCollective | RankState::OnEdge));
        if ranks.is_empty() && !states.contains(&RankState::OnEdge) {
            // Everyone late is inside a collective: the communicator itself is stuck. (When
            // some wait on an edge, the late actors are in another group, whose own timeout
            // names them: `ranks` stays empty and the graph reports that one.)
            std::mem::swap(&mut ranks, &mut waiting);
        }
        self.break_with(format!(
            "an execution timed out after {timeout:?} with ranks {ranks:?} still running"
        ));
        Error::Timeout {
            group: self.name,
            ranks,
            waiting,
            timeout,
        }
    }

    fn break_with(&mut self, reason: String) {
        if self.broken.is_none() {
            self.broken = Some(reason);
        }
        self.abort.abort();
        self.links.abort();
    }

    /// Breaks the group for good: later executions return [`Error::Broken`] with `reason`,
    /// and every actor waiting on a peer or an edge is released. The generated code calls it
    /// when an earlier `execute` unwound in the driver after some actors got their input.
    pub fn mark_broken(&mut self, reason: &str) {
        self.break_with(reason.to_string());
    }
}

/// Handing the actors back: they leave their threads, so they must be `Send`.
impl<A, I, O> Group<A, I, O>
where
    A: Send + 'static,
{
    /// Stops the threads and hands every actor back, by rank; an error if any actor is not
    /// intact (poisoned by a panic, lost, or still stuck after [`TEARDOWN_GRACE`]).
    pub fn teardown(self) -> Result<Vec<A>, Error> {
        self.teardown_each().into_iter().collect()
    }

    /// Stops the threads and hands back, by rank, each actor that is intact, and for each
    /// other one the reason it is not. Returns within about [`TEARDOWN_GRACE`].
    pub fn teardown_each(mut self) -> Vec<Result<A, Error>> {
        // Before the threads see `shutdown`: each then hands its actor back.
        *lock(&self.shared.hand_back) = Some(|actor| Box::new(actor));
        self.stop_and_wait(TEARDOWN_GRACE);
        let name = self.name;
        let shared = Arc::clone(&self.shared);
        self.threads
            .iter_mut()
            .enumerate()
            .map(|(rank, handle)| {
                let handle = handle.take();
                if !shared.slots[rank].outbox.exited.load(Acquire) {
                    // Still inside a method: detach it, it ends on its own if it ever returns.
                    return Err(Error::ActorLost {
                        group: name,
                        rank,
                        reason: format!("it did not stop within {TEARDOWN_GRACE:?} (stuck in a method?); its thread was detached"),
                    });
                }
                match handle.map(JoinHandle::join) {
                    Some(Ok(Returned { actor: Some(actor), .. })) => {
                        // The thread boxed an `A` (see `hand_back` above).
                        actor.downcast().map(|a| *a).map_err(|_| Error::ActorLost {
                            group: name,
                            rank,
                            reason: "its thread handed back something else".into(),
                        })
                    }
                    Some(Ok(Returned { poisoned: Some(message), .. })) => Err(Error::Poisoned { group: name, rank, message }),
                    Some(Ok(Returned { actor: None, poisoned: None })) | Some(Err(_)) | None => Err(Error::ActorLost {
                        group: name,
                        rank,
                        reason: "its thread panicked outside a method".into(),
                    }),
                }
            })
            .collect()
    }
}

impl<A, I, O> Group<A, I, O> {
    /// Asks every thread to stop, unblocks the ones waiting in a collective, and waits up to
    /// `grace` for all of them to end.
    fn stop_and_wait(&self, grace: Duration) {
        self.shared.shutdown.store(true, Release);
        for slot in self.shared.slots.iter() {
            slot.inbox.go.advance();
        }
        let deadline = Instant::now() + grace;
        loop {
            let seen = self.shared.exits.current();
            if self
                .shared
                .slots
                .iter()
                .all(|s| s.outbox.exited.load(Acquire))
            {
                return;
            }
            // A thread still busy in a step may be blocked on a peer: release it.
            self.abort.abort();
            self.links.abort();
            if self.shared.exits.wait_past(seen, Some(deadline)).is_err() {
                return;
            }
        }
    }
}

impl<A, I, O> Drop for Group<A, I, O> {
    fn drop(&mut self) {
        if self.threads.iter().all(Option::is_none) {
            return;
        }
        self.stop_and_wait(TEARDOWN_GRACE);
        for (rank, handle) in self.threads.iter_mut().enumerate() {
            if let Some(handle) = handle.take() {
                if self.shared.slots[rank].outbox.exited.load(Acquire) {
                    let _ = handle.join();
                }
            }
        }
    }
}

/// Aborts the communicator and the edges if dropped while unwinding (see
/// [`Group::run_held`]).
struct UnwindGuard<'a> {
    abort: &'a AbortHandle,
    links: &'a Links,
}

impl Drop for UnwindGuard<'_> {
    fn drop(&mut self) {
        self.abort.abort();
        self.links.abort();
    }
}

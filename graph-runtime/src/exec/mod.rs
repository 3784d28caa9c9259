//! Actor threads: one owner of the threads per group, driver <-> actor slots, launch and
//! teardown; the edges that carry values between actors ([`edge`]); and the one generic
//! [`Driver`] of a launched graph, which owns its groups and runs its executions
//! ([`driver`]: generated graphs forward to it).
//!
//! Several executions may be in flight (up to the graph's `max_in_flight`, kept by the
//! driver's [`Pipeline`]): each actor has an input and an output queue of that capacity,
//! runs one step per `go` advance in submission order, and `collect` takes the oldest
//! output, one `done` advance per execution. Edges carry the round in their messages and a
//! full slot makes its producer wait, so an actor that runs ahead into the next execution
//! waits for its consumers; a fused stage reuses its buffers only when no output view of an
//! earlier execution is alive (correct under overlap, but then it allocates). An async
//! execution registers a waker ([`Group::register_waker`]) that the actors wake as they
//! finish. In an `execute` with nothing else in flight, the driver runs the first actor's
//! step itself, and then every step no actor thread has started, when those actors may
//! change threads ([`help`]).

mod actors;
mod ctx;
mod deal;
mod driver;
pub(crate) mod edge;
mod help;
mod pipeline;
mod rank;
mod wake;

pub use actors::Actors;
pub use ctx::{Stage, StepCtx, SyncPoint};
pub use deal::{Deal, Elements, PerRankValues, RankInputs};
pub use driver::{Driven, Driver, GraphDriver, Groups, Teardown};
pub use edge::{Edge, EdgeValue, Links, Route};
pub use pipeline::{LaunchOptions, Pipeline, Ticket};
pub use rank::Ctx;

use std::any::Any;
use std::marker::PhantomData;
use std::sync::atomic::AtomicU8;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::comm::{AbortHandle, Backend, Communicator, RankState};
use crate::error::caught;
use crate::sync::prims::{AtomicBool, AtomicU64};
use crate::sync::{Cells, Epoch};
use crate::{BoxError, Error};
use help::{Help, Helped};
use wake::WakeSlot;

/// The generated per-actor step of a graph: a closure over the graph's edges.
pub trait StepFn<A, C, I, O>:
    Fn(&mut A, &mut StepCtx<C>, &I) -> Result<O, Error> + Clone + Send + 'static
{
}

impl<A, C, I, O, F> StepFn<A, C, I, O> for F where
    F: Fn(&mut A, &mut StepCtx<C>, &I) -> Result<O, Error> + Clone + Send + 'static
{
}

/// When an execution must be done by, and the timeout it came from (for the error).
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    /// The instant.
    pub at: Instant,
    /// The timeout the caller gave.
    pub timeout: Duration,
}

impl Deadline {
    /// `timeout` from now.
    pub fn after(timeout: Duration) -> Self {
        Self {
            at: Instant::now() + timeout,
            timeout,
        }
    }
}

/// How long teardown (and drop) waits for actor threads to stop before it gives up on
/// the ones still running and detaches them.
pub const TEARDOWN_GRACE: Duration = Duration::from_secs(5);

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
    /// Per rank, the actor's state, if the driver may run its steps (see [`help`]).
    helpers: Vec<Option<Arc<dyn Help<I, O>>>>,
    /// Whether the last submission left the first actor's step for the driver to run.
    held: bool,
    /// Whether the driver runs, while it collects the last submission, the steps that no
    /// actor thread has started yet (see [`help`]).
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

/// Boxes an actor so that its thread can return it (only for `A: Send`).
type HandBack<A> = fn(A) -> Box<dyn Any + Send>;

/// What an actor thread hands back when it stops.
struct Returned {
    /// The actor, when teardown asked for it (see `Shared::hand_back`).
    actor: Option<Box<dyn Any + Send>>,
    /// The message of the panic that poisoned it, if one did.
    poisoned: Option<String>,
}

struct Shared<A, I, O> {
    slots: Box<[Slot<I, O>]>,
    /// Per rank, whether it is in its own code or waiting for other actors (in a collective
    /// or on an edge); shared with its `StepCtx` so a timeout can name the culprits.
    activity: Arc<[Activity]>,
    shutdown: AtomicBool,
    /// Advanced by each thread as it ends, however it ends.
    exits: Epoch,
    /// The waker of an async execution waiting for this group ([`Group::register_waker`]),
    /// woken by the next actor that finishes its step or ends.
    waker: WakeSlot,
    /// How a stopping thread hands its actor back: set only by `teardown`, which needs the
    /// actor type to be `Send` (this is the one place an actor leaves its thread). Without
    /// it, a thread drops its actor itself, so actors built on their threads need not be
    /// `Send`.
    hand_back: Mutex<Option<HandBack<A>>>,
}

/// What a rank is doing, on its own cache line: [`IN_CODE`], [`IN_COLLECTIVE`] or
/// [`ON_EDGE`].
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct Activity(pub(crate) AtomicU8);

/// Running its own code: methods, packing, the step itself.
pub(crate) const IN_CODE: u8 = 0;
/// Inside a collective, waiting for the peers of its group.
pub(crate) const IN_COLLECTIVE: u8 = 1;
/// Waiting on an edge, for another actor's value or for room to send one.
pub(crate) const ON_EDGE: u8 = 2;

/// An actor's handoff with the driver, in two halves, each on cache lines of its own: what
/// the driver writes and the actor reads (`go`, the inputs), and the other way round
/// (`done`, the outputs). Mixed on shared lines, or behind a lock that both sides write,
/// each side's writes would take from the other the lines it is about to read, and every
/// handoff would move more lines between the cores.
///
/// Execution `e` (counted from 0 in submission order) has its input and its output in the
/// cells of `e` (see [`Cells`]; `max_in_flight` cells each, allocated at launch). Each cell
/// has one access at a time, by this protocol:
/// - the driver puts input `e` before the `go` advance that starts step `e` (or runs the
///   step itself, see [`help`]), and only once it has collected execution `e - depth`,
///   whose step took the cell's last input before its `done` advance;
/// - step `e` runs once every earlier step has published (`e` is the `done` count then),
///   takes its input, and puts its output before its `done` advance;
/// - the driver takes output `e` after that advance, and submits execution `e + depth`,
///   whose step puts into that cell again, only after.
struct Slot<I, O> {
    inbox: Inbox<I>,
    outbox: Outbox<O>,
    started: Started,
}

/// Steps started, by whichever thread runs them: a hint for the driver, which skips a
/// step already started rather than contend for its runner (see [`help`]). On a line of
/// its own: in the outbox's, each step would write the line the driver waits on twice,
/// and each write takes it back from the driver's core.
#[repr(align(128))]
struct Started(AtomicU64);

/// Written by the driver, read by the actor.
#[repr(align(128))]
struct Inbox<I> {
    go: Epoch,
    /// Executions whose input is in `inputs`: a step whose index is below it may run
    /// (written before the `go` advance that announces it, or before the driver runs a
    /// held step; see [`help`]).
    submitted: AtomicU64,
    inputs: Cells<I>,
}

/// Written by the actor, read by the driver.
#[repr(align(128))]
struct Outbox<O> {
    done: Epoch,
    exited: AtomicBool,
    outputs: Cells<Result<O, Error>>,
}

impl<I, O> Slot<I, O> {
    fn new(depth: usize) -> Self {
        Self {
            inbox: Inbox {
                go: Epoch::new(),
                submitted: AtomicU64::new(0),
                inputs: Cells::new(depth),
            },
            outbox: Outbox {
                done: Epoch::new(),
                exited: AtomicBool::new(false),
                outputs: Cells::new(depth),
            },
            started: Started(AtomicU64::new(0)),
        }
    }

    /// The index of the step about to run (the number of steps published so far) and its
    /// input.
    ///
    /// # Safety
    ///
    /// Called by whoever runs the actor's steps (see [`Slot`]), one at a time, for a step
    /// that was submitted: its own thread after the `go` advance that starts the step, or,
    /// for an actor whose steps the driver may run, whichever thread holds the runner's
    /// lock, after it saw the step in `submitted` (see [`help`]).
    unsafe fn next_input(&self) -> (u64, Option<I>) {
        let index = self.outbox.done.current();
        // SAFETY: the protocol of `Slot`: the driver put this step's input before the `go`
        // advance that the caller's wait saw (acquire), or before its store of `submitted`
        // that the caller's check saw (acquire: a runner's holder, see [`help`]), or on the
        // caller's own thread; it puts into this cell again only after collecting this
        // step, after its `done` advance; no other thread runs a step meanwhile (the
        // caller's contract).
        (index, unsafe { self.inbox.inputs.take(index) })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The slot holds plain data; a panic elsewhere cannot leave it half-written.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<A, I, O> Group<A, I, O>
where
    A: 'static,
    I: Deal,
    O: Send + 'static,
{
    /// Spawns one thread per actor, named `actorgraph-<group>-<rank>`, each owning its actor,
    /// its communicator endpoint and its fused stages. Each thread attaches its
    /// communicator, then makes its actor; the group runs only if every rank did both.
    /// `schedule` lists the group's stages and edge operations in step order; `links` holds
    /// every edge of the graph, and `edges` the ones the steps use, typed, which each
    /// thread gets a clone of and hands to every `step`. `options` bound the executions the
    /// driver keeps in flight: the capacity of each actor's input and output queue (the
    /// driver keeps to it; see [`Pipeline`]).
    #[allow(clippy::too_many_arguments)]
    pub fn launch<B: Backend, E: Clone + Send + 'static>(
        name: &'static str,
        options: &LaunchOptions,
        actors: Actors<A>,
        backend: &B,
        stage_names: &'static [&'static str],
        schedule: &'static [SyncPoint],
        links: &Links,
        edges: &E,
        step: impl Fn(&mut A, &mut StepCtx<B::Comm>, &I, &E) -> Result<O, Error> + Copy + Send + 'static,
    ) -> Result<Self, Error> {
        let depth = options.in_flight_bound();
        if actors.is_empty() {
            return Err(Error::EmptyGroup { group: name });
        }
        let comms = backend.group_communicators(name, actors.len())?;
        if comms.len() != actors.len() {
            return Err(Error::Backend(format!(
                "the backend made {} communicators for the {} actors of group `{name}`",
                comms.len(),
                actors.len()
            )));
        }
        let shared = Arc::new(Shared {
            slots: (0..actors.len()).map(|_| Slot::new(depth)).collect(),
            activity: (0..actors.len()).map(|_| Activity::default()).collect(),
            shutdown: AtomicBool::new(false),
            exits: Epoch::new(),
            waker: WakeSlot::new(),
            hand_back: Mutex::new(None),
        });
        let mut group = Self {
            name,
            shared,
            threads: Vec::with_capacity(actors.len()),
            done_seen: vec![0; actors.len()],
            abort: comms[0].abort_handle(),
            links: links.clone(),
            broken: None,
            helpers: (0..actors.len()).map(|_| None).collect(),
            held: false,
            steal: false,
            submitted: 0,
            depth: depth as u64,
            ranks: (
                comms[0].rank()..comms[0].rank() + comms.len(),
                comms[0].size(),
            ),
            _actors: PhantomData,
        };
        let size = actors.len();
        let (attached_tx, attached) = std::sync::mpsc::sync_channel(size);
        let (makers, send) = actors.into_parts();
        let dispatch = crate::trace::Dispatch::current();
        for (rank, (make, mut comm)) in makers.into_iter().zip(comms).enumerate() {
            let shared = Arc::clone(&group.shared);
            let (links, edges) = (links.clone(), edges.clone());
            let attached_tx = attached_tx.clone();
            // The actor's rank in its whole group, which spans processes under MPI; `rank`
            // is its place among this process's actors.
            let (global, group_size) = (comm.rank(), comm.size());
            let dispatch = dispatch.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("actorgraph-{name}-{global}"))
                .spawn(move || {
                    let _dispatch = dispatch.enter();
                    crate::sync::actor_started();
                    rank::Ctx::new(name, global, group_size).enter();
                    let guard = ExitGuard {
                        shared: &shared,
                        rank,
                        abort: comm.abort_handle(),
                        links: links.clone(),
                    };
                    let actor = comm
                        .attach()
                        .and_then(|()| make_actor(make, name, global, group_size));
                    let actor = match actor {
                        Ok(actor) => actor,
                        Err(e) => {
                            let _ = attached_tx.send((rank, Err(e)));
                            drop(guard);
                            return Returned {
                                actor: None,
                                poisoned: None,
                            };
                        }
                    };
                    // The actor may run its steps on the driver's thread too, if it and its
                    // communicator may change threads.
                    let send = send.filter(|_| comm.runs_on_any_thread());
                    let activity = Arc::clone(&shared.activity);
                    let ctx =
                        StepCtx::new(name, comm, rank, stage_names, schedule, links, activity);
                    let step =
                        move |a: &mut A, c: &mut StepCtx<B::Comm>, i: &I| step(a, c, i, &edges);
                    let returned = match send {
                        Some(send) => {
                            let helped = Arc::new(Helped::new(
                                send(actor),
                                rank::Ctx::new(name, global, group_size),
                                ctx,
                                step,
                            ));
                            let helper: Arc<dyn Help<I, O>> = helped.clone();
                            let _ = attached_tx.send((rank, Ok(Some(helper))));
                            drop(attached_tx);
                            helped_loop(&helped, &shared, rank)
                        }
                        None => {
                            let _ = attached_tx.send((rank, Ok(None)));
                            drop(attached_tx);
                            actor_loop(actor, ctx, &step, &shared, rank)
                        }
                    };
                    drop(guard);
                    returned
                });
            match spawned {
                Ok(handle) => group.threads.push(Some(handle)),
                // Dropping `group` stops the threads spawned so far.
                Err(e) => {
                    return Err(Error::ActorLost {
                        group: name,
                        rank,
                        reason: format!("could not spawn its thread: {e}"),
                    })
                }
            }
        }
        drop(attached_tx);
        // Every rank attaches its communicator and makes its actor on its own thread; the
        // group runs only if all did. (A thread that died before sending closes the
        // channel: `recv` fails.) Of several failures, the lowest rank's is reported.
        let mut failed: Option<(usize, Error)> = None;
        let mut reported = vec![false; size];
        for _ in 0..size {
            let (rank, e) = match attached.recv() {
                Ok((rank, Ok(helper))) => {
                    reported[rank] = true;
                    group.helpers[rank] = helper;
                    continue;
                }
                Ok((rank, Err(e))) => {
                    reported[rank] = true;
                    (rank, e)
                }
                Err(_) => {
                    let rank = reported.iter().position(|&r| !r).unwrap_or(0);
                    let reason = "its thread ended while attaching its communicator".into();
                    (
                        rank,
                        Error::ActorLost {
                            group: name,
                            rank,
                            reason,
                        },
                    )
                }
            };
            if failed.as_ref().is_none_or(|&(r, _)| rank < r) {
                failed = Some((rank, e));
            }
            if matches!(failed, Some((_, Error::ActorLost { .. }))) {
                break;
            }
        }
        match failed {
            // Dropping `group` stops the threads; actors already made are dropped there.
            Some((_, e)) => Err(e),
            None => Ok(group),
        }
    }

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
    /// left (see [`help`]).
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

/// Marks an actor thread as ended however it ends; if it ends by unwinding, aborts the
/// communicator and the edges so that no peer waits for it, and wakes the driver.
struct ExitGuard<'a, A, I, O> {
    shared: &'a Shared<A, I, O>,
    rank: usize,
    abort: AbortHandle,
    /// Aborted too: an actor of another group may be waiting for this one's values, and
    /// the driver may be collecting that group first.
    links: Links,
}

impl<A, I, O> Drop for ExitGuard<'_, A, I, O> {
    fn drop(&mut self) {
        crate::sync::actor_ended();
        if std::thread::panicking() {
            self.abort.abort();
            self.links.abort();
        }
        let slot = &self.shared.slots[self.rank];
        slot.outbox.exited.store(true, Release);
        // A driver waiting for this rank's output finds none and reports the rank lost.
        slot.outbox.done.advance();
        self.shared.exits.advance();
        self.shared.waker.wake();
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

/// Makes rank `rank`'s actor on its own thread; a failing or panicking maker is
/// [`Error::ActorInit`].
fn make_actor<A>(
    make: Box<dyn FnOnce(usize, usize) -> Result<A, BoxError> + Send>,
    group: &'static str,
    rank: usize,
    size: usize,
) -> Result<A, Error> {
    let made = caught(|| make(rank, size)).unwrap_or_else(|why| Err(why.into()));
    made.map_err(|source| Error::ActorInit {
        group,
        rank,
        source,
    })
}

fn actor_loop<A, C: Communicator, I, O>(
    mut actor: A,
    mut ctx: StepCtx<C>,
    step: &impl StepFn<A, C, I, O>,
    shared: &Shared<A, I, O>,
    rank: usize,
) -> Returned {
    let slot = &shared.slots[rank];
    // Steps started so far: one per `go` advance, in order, however many are queued.
    let mut started = 0;
    loop {
        // `go` is never aborted, so the wait ends only when it advances (at once when steps
        // are already queued).
        let _ = slot.inbox.go.wait_past(started, None);
        if shared.shutdown.load(Acquire) {
            let poisoned = ctx.poisoned().map(str::to_owned);
            // A poisoned actor is not handed back: teardown reports it instead.
            let hand_back = *lock(&shared.hand_back);
            let actor = hand_back.filter(|_| poisoned.is_none()).map(|f| f(actor));
            return Returned { actor, poisoned };
        }
        started += 1;
        // SAFETY: this actor's steps run on this thread only (the driver helps only actors
        // with a `Helped` runner, which run `helped_loop`), after the `go` advance above.
        let (step_index, input) = unsafe { slot.next_input() };
        // SAFETY: this thread runs step `step_index`, in `publish`.
        unsafe {
            publish(&shared.waker, slot, step_index, |out| match input {
                Some(input) => ctx.execute(&mut actor, step, &input, out),
                None => *out = Some(ctx.fail("it was started without an input")),
            })
        };
    }
}

/// The loop of an actor whose steps the driver may run too (see [`help`]): one step per
/// `go` advance, through the shared runner.
fn helped_loop<A: 'static, C: Communicator, S, I, O>(
    helped: &Helped<A, C, S>,
    shared: &Shared<A, I, O>,
    rank: usize,
) -> Returned
where
    S: StepFn<A, C, I, O>,
{
    let slot = &shared.slots[rank];
    let mut started = 0;
    loop {
        // Never aborted: the wait ends only when `go` advances.
        if let Ok(now) = slot.inbox.go.wait_past(started, None) {
            started = now;
        }
        if shared.shutdown.load(Acquire) {
            // The driver is gone or stopping: nobody else uses the runner any more.
            let Some(runner) = lock(&helped.runner).take() else {
                return Returned {
                    actor: None,
                    poisoned: None,
                };
            };
            let poisoned = runner.ctx.poisoned().map(str::to_owned);
            let hand_back = lock(&shared.hand_back).is_some() && poisoned.is_none();
            // Otherwise the actor is dropped here, on its own thread.
            let actor = hand_back.then_some(runner.actor);
            return Returned { actor, poisoned };
        }
        // Every step submitted and not run yet, unless the driver holds the runner: it
        // then runs them. (`started` was read before: a step submitted since comes with
        // a `go` advance that the next wait sees.)
        helped.try_run(slot, &shared.waker);
    }
}

/// Runs step `step` (`run`, which writes its result into the outbox's cell, see
/// [`StepCtx::execute`]) and hands it to the driver: the `done` advance, the async waker.
///
/// # Safety
///
/// Called by whoever runs the step (see [`Slot`]).
unsafe fn publish<I, O>(
    waker: &WakeSlot,
    slot: &Slot<I, O>,
    step: u64,
    run: impl FnOnce(&mut Option<Result<O, Error>>),
) {
    // SAFETY: the protocol of `Slot`: the driver took the cell's last output when it
    // collected execution `step - depth`, before it submitted this one, so before the `go`
    // advance that started this step (or on this thread, for a step the driver runs); it
    // takes this output only after the `done` advance below.
    unsafe { slot.outbox.outputs.fill(step, run) };
    slot.outbox.done.advance();
    waker.wake();
}

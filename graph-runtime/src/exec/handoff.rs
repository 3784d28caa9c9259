//! The handoff between the driver and its actors: per actor, the cells that carry an
//! execution's input in and its output out ([`Slot`]); the state every thread of a group
//! shares ([`Shared`]); and the publication of a step's output ([`publish`]). Whoever runs
//! a step (the actor's thread, or the driver, see [`help`](super::help)) takes its input
//! with [`Slot::next_input`] and hands its output over with [`publish`], so the rest of
//! the protocol (collect, timeouts, the failure path) does not know who ran it.

use std::any::Any;
use std::sync::{Arc, Mutex};

use super::wake::WakeSlot;
use super::Activity;
use super::Ctx;
use crate::sync::prims::{AtomicBool, AtomicU64};
use crate::sync::{Cells, Epoch};
use crate::{BoxError, Error};

/// Boxes an actor so that its thread can return it (only for `A: Send`).
pub(super) type HandBack<A> = fn(A) -> Box<dyn Any + Send>;

/// What an actor thread hands back when it stops.
pub(super) struct Returned {
    /// The actor, when teardown asked for it (see `Shared::hand_back`).
    pub(super) actor: Option<Box<dyn Any + Send>>,
    /// The message of the panic that poisoned it, if one did.
    pub(super) poisoned: Option<String>,
}

/// A call of `each` as the actor threads see it, its closure and result types erased:
/// each thread runs it once on its actor, and the caller of `each` reads every rank's
/// result from it (see [`Group::try_each`](super::Group::try_each)).
pub(super) trait Visit<A>: Send + Sync {
    /// Runs the closure on the actor of rank `local` (its place among this process's
    /// actors), keeping its value for the caller; its error, to be made an [`Error`].
    fn run(&self, local: usize, ctx: Ctx, actor: &mut A) -> Result<(), BoxError>;
    /// Rank `local`'s part ended with `error` instead.
    fn fail(&self, local: usize, error: Error);
}

/// A call of `each` on its way to one actor's thread.
pub(super) type Visiting<A> = Arc<dyn Visit<A>>;

/// What the driver and every actor thread of a group share: the handoffs, by rank, and
/// what tells the threads to stop and the driver that they did.
pub(super) struct Shared<A, I, O> {
    pub(super) slots: Box<[Slot<I, O>]>,
    /// Per rank, whether it is in its own code or waiting for other actors (in a collective
    /// or on an edge); shared with its `StepCtx` so a timeout can name the culprits.
    pub(super) activity: Arc<[Activity]>,
    pub(super) shutdown: AtomicBool,
    /// Set while a call of `each` is under way (see `visits`): a thread woken for a step
    /// reads this flag, beside `shutdown`, rather than take the lock of its `visits` cell.
    pub(super) visiting: AtomicBool,
    /// Advanced by each thread as it ends, however it ends.
    pub(super) exits: Epoch,
    /// The waker of an async execution waiting for this group
    /// ([`Group::register_waker`](super::Group::register_waker)), woken by the next actor
    /// that finishes its step or ends.
    pub(super) waker: WakeSlot,
    /// How a stopping thread hands its actor back: set only by `teardown`, which needs the
    /// actor type to be `Send` (this is the one place an actor leaves its thread). Without
    /// it, a thread drops its actor itself, so actors built on their threads need not be
    /// `Send`.
    pub(super) hand_back: Mutex<Option<HandBack<A>>>,
    /// Per rank, the call of `each` its thread is to run next (see
    /// [`Group::try_each`](super::Group::try_each)), put there before the `go` advance
    /// that wakes the thread for it.
    pub(super) visits: Box<[Mutex<Option<Visiting<A>>>]>,
    /// Advanced by each thread as it finishes its part of a call of `each`, and as it ends
    /// however it ends.
    pub(super) visited: Epoch,
}

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
///   step itself, see [`help`](super::help)), and only once it has collected execution
///   `e - depth`, whose step took the cell's last input before its `done` advance;
/// - step `e` runs once every earlier step has published (`e` is the `done` count then),
///   takes its input, and puts its output before its `done` advance;
/// - the driver takes output `e` after that advance, and submits execution `e + depth`,
///   whose step puts into that cell again, only after.
pub(super) struct Slot<I, O> {
    pub(super) inbox: Inbox<I>,
    pub(super) outbox: Outbox<O>,
    pub(super) started: Started,
}

/// Steps started, by whichever thread runs them: a hint for the driver, which skips a
/// step already started rather than contend for its runner (see [`help`](super::help)).
/// On a line of its own: in the outbox's, each step would write the line the driver waits
/// on twice, and each write takes it back from the driver's core.
#[repr(align(128))]
pub(super) struct Started(pub(super) AtomicU64);

/// Written by the driver, read by the actor.
#[repr(align(128))]
pub(super) struct Inbox<I> {
    pub(super) go: Epoch,
    /// Executions whose input is in `inputs`: a step whose index is below it may run
    /// (written before the `go` advance that announces it, or before the driver runs a
    /// held step; see [`help`](super::help)).
    pub(super) submitted: AtomicU64,
    pub(super) inputs: Cells<I>,
}

/// Written by the actor, read by the driver.
#[repr(align(128))]
pub(super) struct Outbox<O> {
    pub(super) done: Epoch,
    pub(super) exited: AtomicBool,
    pub(super) outputs: Cells<Result<O, Error>>,
}

impl<I, O> Slot<I, O> {
    pub(super) fn new(depth: usize) -> Self {
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
    /// lock, after it saw the step in `submitted` (see [`help`](super::help)).
    #[inline]
    pub(super) unsafe fn next_input(&self) -> (u64, Option<I>) {
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

/// Runs step `step` (`run`, which writes its result into the outbox's cell, see
/// [`StepCtx::execute`](super::StepCtx::execute)) and hands it to the driver: the `done`
/// advance, the async waker. Inlined: it is on every step's path, called from the actor's
/// loop and from the driver's help, each in its own module.
///
/// # Safety
///
/// Called by whoever runs the step (see [`Slot`]).
#[inline]
pub(super) unsafe fn publish<I, O>(
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

//! The driver taking part in the work it waits for. A driver that only hands the inputs
//! over and waits makes an `execute` of N actors take N + 1 threads: on a machine with few
//! cores the extra thread costs a switch per execution (every wait yields, so that the
//! thread it waits for can run), and when the actors outnumber the cores, the waits cannot
//! spin at all. MPI ranks have no driver: each rank is its own caller. So, as rayon's
//! `join` runs one half of its work on the calling thread and steals the other half if no
//! thread has taken it yet, the driver runs the first actor's step itself when it would
//! otherwise only wait, and then, as it collects, every step that no actor thread has
//! started, when the awake actor threads and itself outnumber the cores
//! ([`crowded`](crate::sync::crowded)). Then an actor's thread may not run for a while
//! after its `go` (it takes a turn on a busy core, and a parked one a futex wake-up), and
//! either costs far more than a small step: see the echo rows of `BENCHMARKS.md`, which
//! run more actors than cores. With a core for every thread, each spins for its `go` and
//! starts at once, and the driver's look would only move lines that thread is writing.
//!
//! The actor must be able to change threads for that, so only actors that are `Send`
//! (ready values: [`Actors`](super::Actors) knows) on a communicator that is not bound
//! to its thread ([`Communicator::runs_on_any_thread`]) take part. Such an actor's state
//! lives in a [`Runner`] behind a mutex, shared by its own thread and the driver. Whoever
//! holds the lock runs every step that was submitted (the inbox's `submitted`) and has
//! not run (the outbox's `done`, which counts the steps published), and publishes each
//! before it lets go, so the next holder never runs a step twice. Nobody waits for the
//! lock: a thread that finds it taken leaves the steps to the holder, which runs every
//! step submitted before its check, and a step submitted after comes with a `go`
//! advance that the actor's thread sees. Its own thread runs the steps when woken (one
//! `go` advance per step, as for any actor: `submit`, `execute_async`, executions with a
//! timeout, which must not block the caller or must be abandoned when late); the driver
//! runs steps only in an `execute` with nothing else in flight and no deadline, and in an
//! async execution with nothing else in flight if the graph was launched with
//! `LaunchOptions::poll_runs_steps` (its poll runs the steps not started, the executor's
//! thread being the driver's). In an `execute` it then
//! does not advance the first actor's `go`, so that thread stays parked and costs no
//! wake-up. It skips a step already started (`Slot::started`): trying that runner's
//! lock would only take its line from the running thread's core. Whoever runs it, a
//! step takes its input, runs, and publishes its output exactly as on the actor's own
//! thread, so the rest of the protocol (collect, timeouts, the failure path) does not know
//! who ran it.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::{Mutex, TryLockError};

use super::handoff::{publish, Slot};
use super::wake::WakeSlot;
use super::{Ctx, StepCtx, StepFn};
use crate::comm::Communicator;
use crate::Error;

/// An actor's state, runnable by whichever thread holds it: the actor (boxed as `Send`,
/// which is why it may move), its rank context, its step context and its step.
pub(super) struct Runner<A, C, S> {
    pub(super) actor: Box<dyn Any + Send>,
    rank: Ctx,
    pub(super) ctx: StepCtx<C>,
    step: S,
    _actor: PhantomData<fn() -> A>,
}

/// What the driver sees of a [`Runner`] (its actor, communicator and step types erased).
pub(super) trait Help<I, O>: Send + Sync {
    /// Runs on the calling thread every step of `slot` that was submitted and that nobody
    /// has run yet, in order, each published (with `waker` woken) before the runner is let
    /// go (so that the next holder sees it done): whether it ran any. Runs none if another
    /// thread holds the runner now: that thread runs them.
    fn try_run(&self, slot: &Slot<I, O>, waker: &WakeSlot) -> bool;
}

/// A [`Runner`] shared by its actor's thread and the driver.
pub(super) struct Helped<A, C, S> {
    /// `None` once the actor's thread has taken the state out to stop.
    pub(super) runner: Mutex<Option<Runner<A, C, S>>>,
}

impl<A: 'static, C: Communicator, S> Helped<A, C, S> {
    pub(super) fn new(actor: Box<dyn Any + Send>, rank: Ctx, ctx: StepCtx<C>, step: S) -> Self {
        Self {
            runner: Mutex::new(Some(Runner {
                actor,
                rank,
                ctx,
                step,
                _actor: PhantomData,
            })),
        }
    }

    /// [`Help::try_run`].
    pub(super) fn try_run<I, O>(&self, slot: &Slot<I, O>, waker: &WakeSlot) -> bool
    where
        S: StepFn<A, C, I, O>,
    {
        let mut runner = match self.runner.try_lock() {
            Ok(runner) => runner,
            // A panic on a thread that ran a step left the state as a failed step leaves
            // it; that panic already broke the group.
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        let mut ran = false;
        while let Some((step, input)) = claim(slot) {
            // SAFETY: we hold the runner's lock, and run step `step` in `publish`, its output
            // written straight into the driver's cell.
            unsafe {
                publish(waker, slot, step, |out| {
                    run_step(runner.as_mut(), input, out)
                })
            };
            ran = true;
        }
        ran
    }
}

impl<A, C, S, I, O> Help<I, O> for Helped<A, C, S>
where
    A: 'static,
    C: Communicator,
    S: StepFn<A, C, I, O>,
    I: Send,
    O: Send,
{
    fn try_run(&self, slot: &Slot<I, O>, waker: &WakeSlot) -> bool {
        Helped::try_run(self, slot, waker)
    }
}

/// Claims the next step of `slot` if it was submitted: its index and input; `None` if
/// every step submitted has run. The caller holds the runner's lock and runs it.
fn claim<I, O>(slot: &Slot<I, O>) -> Option<(u64, Option<I>)> {
    // The steps published so far: every step that ran was published under the lock we
    // hold, so this is the next one to run.
    let next = slot.outbox.done.current();
    // Acquire: the driver stores it after it puts the step's input.
    if next >= slot.inbox.submitted.load(Acquire) {
        return None;
    }
    slot.started.0.store(next + 1, Relaxed);
    // SAFETY: the caller holds the runner's lock, as every thread that runs this actor's
    // steps does, and step `next` was submitted and has not run.
    Some(unsafe { slot.next_input() })
}

/// Runs a step, its result written into `out` (see [`StepCtx::execute`]).
fn run_step<A: 'static, C: Communicator, S, I, O>(
    runner: Option<&mut Runner<A, C, S>>,
    input: Option<I>,
    out: &mut Option<Result<O, Error>>,
) where
    S: StepFn<A, C, I, O>,
{
    let Some(Runner {
        actor,
        rank,
        ctx,
        step,
        ..
    }) = runner
    else {
        *out = Some(Err(Error::Backend(
            "internal error: a step ran after its actor stopped".into(),
        )));
        return;
    };
    // `Ctx::current` in the step, on whichever thread runs it.
    let _rank = rank.scope();
    let Some(actor) = actor.downcast_mut::<A>() else {
        *out = Some(ctx.fail("its thread holds something else than its actor"));
        return;
    };
    match input {
        Some(input) => ctx.execute(actor, step, &input, out),
        None => *out = Some(ctx.fail("it was started without an input")),
    }
}

/// The claim protocol under every interleaving, with the runtime's `Epoch`s and a mutex
/// standing in for the runner: an execution handed over (a `go` advance) that the driver
/// then tries to steal, one the driver holds and tries to run itself (`try_lock`, or a
/// `go` advance if the actor's thread holds the runner), then a stop. Each input runs
/// exactly once, in order, and the driver collects each output after its `done` advance.
#[cfg(all(test, loom))]
mod loom_tests {
    use std::collections::VecDeque;
    use std::sync::Arc;

    use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
    use loom::sync::Mutex;
    use loom::thread;

    use crate::sync::Epoch;

    struct Slot {
        go: Epoch,
        submitted: AtomicU64,
        done: Epoch,
        input: Mutex<VecDeque<u32>>,
        output: Mutex<VecDeque<u32>>,
        /// The runner: the inputs it ran, in order.
        runner: Mutex<Vec<u32>>,
        stop: AtomicBool,
    }

    /// `Helped::try_run` under the runner's lock: every step submitted and not run yet,
    /// each published before the lock is let go.
    fn run_pending(slot: &Slot, ran: &mut Vec<u32>) {
        while slot.done.current() < slot.submitted.load(Acquire) {
            let input = slot.input.lock().unwrap().pop_front();
            let input = input.expect("a step ran without an input");
            ran.push(input);
            slot.output.lock().unwrap().push_back(input);
            slot.done.advance();
        }
    }

    fn submit(slot: &Slot, input: u32) {
        slot.input.lock().unwrap().push_back(input);
        slot.submitted.fetch_add(1, Release);
    }

    #[test]
    fn loom_the_driver_and_the_actor_thread_run_each_step_once_in_order() {
        // Bounded: two executions, a steal and a held step have too many interleavings
        // to visit them all.
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(7);
        model.check(|| {
            let slot = Arc::new(Slot {
                go: Epoch::new(),
                submitted: AtomicU64::new(0),
                done: Epoch::new(),
                input: Mutex::new(VecDeque::new()),
                output: Mutex::new(VecDeque::new()),
                runner: Mutex::new(Vec::new()),
                stop: AtomicBool::new(false),
            });
            let actor = {
                let slot = slot.clone();
                thread::spawn(move || {
                    let mut started = 0;
                    loop {
                        started = slot.go.wait_past(started, None).unwrap();
                        if slot.stop.load(SeqCst) {
                            return;
                        }
                        if let Ok(mut ran) = slot.runner.try_lock() {
                            run_pending(&slot, &mut ran);
                        }
                    }
                })
            };
            // Handed over, then stolen if its thread has not taken the runner.
            submit(&slot, 1);
            slot.go.advance();
            if let Ok(mut ran) = slot.runner.try_lock() {
                run_pending(&slot, &mut ran);
            }
            slot.done.wait_past(0, None).unwrap();
            assert_eq!(slot.output.lock().unwrap().pop_front(), Some(1));
            // Held: run here if the runner is free, else handed over.
            submit(&slot, 2);
            match slot.runner.try_lock() {
                Ok(mut ran) => run_pending(&slot, &mut ran),
                Err(_) => slot.go.advance(),
            }
            slot.done.wait_past(1, None).unwrap();
            assert_eq!(slot.output.lock().unwrap().pop_front(), Some(2));
            slot.stop.store(true, SeqCst);
            slot.go.advance();
            actor.join().unwrap();
            assert_eq!(*slot.runner.lock().unwrap(), [1, 2]);
        });
    }
}

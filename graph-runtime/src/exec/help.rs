//! The driver taking part in the work it waits for. An `execute` of N actors used to take
//! N + 1 threads: the caller handed the inputs over and waited. On a machine with few cores
//! the extra thread cost a switch per execution (every wait yielded, so that the thread
//! it waited for could run), and when the actors outnumber the cores, the waits cannot
//! spin at all. MPI ranks have no driver: each rank is its own caller. So, as rayon's
//! `join` runs one half of its work on the calling thread, the driver runs the first
//! actor's step itself when it would otherwise only wait.
//!
//! The actor must be able to change threads for that, so only actors that are `Send`
//! (ready values: [`Actors`](super::Actors) knows) on a communicator that is not bound
//! to its thread ([`Communicator::runs_on_any_thread`]) take part. Such an actor's state
//! lives in a [`Runner`] behind a mutex, shared by its own thread and the driver, and
//! whoever holds the lock runs the oldest step queued for it. Its own thread runs the
//! steps the driver hands over (one per `go` advance, as for any actor: `submit`,
//! `execute_async`, executions with a timeout, which must not block the caller or must be
//! abandoned when late); the driver runs a step only in an `execute` with nothing else in
//! flight, and then does not advance `go`, so the actor's thread stays parked and costs no
//! wake-up. Either way a step pops its input, runs, and publishes its output exactly as on
//! the actor's own thread, so the rest of the protocol (collect, timeouts, the failure
//! path) does not know who ran it.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::{Mutex, TryLockError};

use super::{lock, Ctx, Slot, StepCtx, StepFn};
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
    /// Runs the oldest step queued in `slot` on the calling thread and returns its index
    /// and result, or `None` if the actor's own thread holds the runner now.
    fn try_run(&self, slot: &Slot<I, O>) -> Option<(u64, Result<O, Error>)>;
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

    /// Runs the oldest step queued in `slot` on this thread, waiting for the runner if
    /// the driver holds it: its index and result.
    pub(super) fn run<I, O>(&self, slot: &Slot<I, O>) -> (u64, Result<O, Error>)
    where
        S: StepFn<A, C, I, O>,
    {
        let mut runner = lock(&self.runner);
        step_once(runner.as_mut(), slot)
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
    fn try_run(&self, slot: &Slot<I, O>) -> Option<(u64, Result<O, Error>)> {
        let mut runner = match self.runner.try_lock() {
            Ok(runner) => runner,
            // A panic on a thread that ran a step left the state as a failed step leaves
            // it; that panic already broke the group.
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(step_once(runner.as_mut(), slot))
    }
}

/// Takes the input of the next step of `slot` and runs the step on it: the step's index
/// and result.
fn step_once<A: 'static, C: Communicator, S, I, O>(
    runner: Option<&mut Runner<A, C, S>>,
    slot: &Slot<I, O>,
) -> (u64, Result<O, Error>)
where
    S: StepFn<A, C, I, O>,
{
    // SAFETY: the caller holds the runner's lock, as every thread that runs this actor's
    // steps does: its own thread after the `go` advance that starts the step, or the
    // driver for a step it left for itself.
    let (index, input) = unsafe { slot.next_input() };
    (index, run_step(runner, input))
}

fn run_step<A: 'static, C: Communicator, S, I, O>(
    runner: Option<&mut Runner<A, C, S>>,
    input: Option<I>,
) -> Result<O, Error>
where
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
        return Err(Error::Backend(
            "internal error: a step ran after its actor stopped".into(),
        ));
    };
    // `Ctx::current` in the step, on whichever thread runs it.
    let _rank = rank.scope();
    let Some(actor) = actor.downcast_mut::<A>() else {
        return ctx.fail("its thread holds something else than its actor");
    };
    match input {
        Some(input) => ctx.execute(actor, step, &input),
        None => ctx.fail("it was started without an input"),
    }
}

/// The claim protocol under every interleaving, with the runtime's `Epoch`s and a mutex
/// standing in for the runner: an execution handed over (a `go` advance), then one the
/// driver tries to run itself (`try_lock`, or a `go` advance if the actor's thread holds
/// the runner), then a stop. Each input runs exactly once, in order, and the driver
/// collects each output after its `done` advance.
#[cfg(all(test, loom))]
mod loom_tests {
    use std::collections::VecDeque;
    use std::sync::Arc;

    use loom::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use loom::sync::Mutex;
    use loom::thread;

    use crate::sync::Epoch;

    struct Slot {
        go: Epoch,
        done: Epoch,
        input: Mutex<VecDeque<u32>>,
        output: Mutex<VecDeque<u32>>,
        /// The runner: the inputs it ran, in order.
        runner: Mutex<Vec<u32>>,
        stop: AtomicBool,
    }

    fn run(slot: &Slot, ran: &mut Vec<u32>) {
        let input = slot.input.lock().unwrap().pop_front();
        let input = input.expect("a step started without an input");
        ran.push(input);
        slot.output.lock().unwrap().push_back(input);
    }

    #[test]
    fn loom_the_driver_and_the_actor_thread_run_each_step_once_in_order() {
        loom::model(|| {
            let slot = Arc::new(Slot {
                go: Epoch::new(),
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
                        run(&slot, &mut slot.runner.lock().unwrap());
                        slot.done.advance();
                    }
                })
            };
            // Handed over.
            slot.input.lock().unwrap().push_back(1);
            slot.go.advance();
            slot.done.wait_past(0, None).unwrap();
            assert_eq!(slot.output.lock().unwrap().pop_front(), Some(1));
            // Run here if the runner is free, else handed over.
            slot.input.lock().unwrap().push_back(2);
            match slot.runner.try_lock() {
                Ok(mut ran) => {
                    run(&slot, &mut ran);
                    drop(ran);
                    slot.done.advance();
                }
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

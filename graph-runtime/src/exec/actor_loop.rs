//! The two loops an actor thread runs once its actor is made: one step per `go` advance,
//! until the group stops. An actor that may change threads runs its steps through the
//! runner it shares with the driver ([`helped_loop`]); any other runs them itself
//! ([`actor_loop`]). Between executions, a `go` advance may bring a call of `each`
//! instead of a step ([`run_visit`]): the driver makes one only with no step in flight, so
//! a wake-up that finds one is that call's.

use std::sync::atomic::Ordering::Acquire;

use super::handoff::{publish, Returned, Shared};
use super::help::Helped;
use super::{lock, StepCtx, StepFn};
use crate::comm::Communicator;

/// The loop of an actor whose steps run on its own thread only: one step per `go`
/// advance, until the group stops; then the actor is handed back (if teardown asked and it
/// is not poisoned) or dropped here, on its own thread.
pub(super) fn actor_loop<A, C: Communicator, I, O>(
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
        if run_visit(shared, rank, Some(&mut actor), &mut ctx) {
            continue;
        }
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

/// The loop of an actor whose steps the driver may run too (see [`help`](super::help)): one
/// step per `go` advance, through the shared runner.
pub(super) fn helped_loop<A: 'static, C: Communicator, S, I, O>(
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
        if shared.visiting.load(Acquire) && lock(&shared.visits[rank]).is_some() {
            // The driver holds the runner only while it runs a step, and it runs none while
            // a call of `each` is under way: this lock does not wait.
            let mut runner = lock(&helped.runner);
            if let Some(runner) = runner.as_mut() {
                let actor = runner.actor.downcast_mut::<A>();
                run_visit(shared, rank, actor, &mut runner.ctx);
            }
            continue;
        }
        // Every step submitted and not run yet, unless the driver holds the runner: it
        // then runs them. (`started` was read before: a step submitted since comes with
        // a `go` advance that the next wait sees.)
        helped.try_run(slot, &shared.waker);
    }
}

/// Runs on this thread the call of `each` waiting for rank `rank`, if one is, on `actor`
/// (`None`: the runner holds something else, which cannot happen): whether one was.
pub(super) fn run_visit<A, C: Communicator, I, O>(
    shared: &Shared<A, I, O>,
    rank: usize,
    actor: Option<&mut A>,
    ctx: &mut StepCtx<C>,
) -> bool {
    // The flag was set before the `go` advance that woke this thread (acquire).
    if !shared.visiting.load(Acquire) {
        return false;
    }
    let Some(visit) = lock(&shared.visits[rank]).take() else {
        return false;
    };
    let ran = ctx.visit(|c| match actor {
        Some(actor) => visit.run(rank, c, actor),
        None => Err("internal error: its thread holds something else than its actor".into()),
    });
    if let Err(e) = ran {
        visit.fail(rank, e);
    }
    // Before the advance: the caller of `each` may drop its own reference as soon as it
    // sees every rank done.
    drop(visit);
    shared.visited.advance();
    true
}

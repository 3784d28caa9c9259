//! Running a closure on every actor of a group between executions, on the actor's own
//! thread: a graph's `each_<group>` and `try_each_<group>`.
//!
//! The call travels as steps do: the driver puts it in each rank's `visits` cell, raises
//! `visiting` (which a thread woken for a step reads instead of locking its cell) and
//! advances the rank's `go`, and the thread, woken, finds it there (see
//! [`run_visit`](crate::exec::actor_loop::run_visit)). The driver makes a call only when no
//! step is in flight (the graph's driver first collects every execution submitted), so the
//! wake-up that finds a call is that call's, and the actor is idle: nothing runs beside
//! the closure on its thread, and a step that follows sees what it changed. It waits for
//! every rank's part (each thread advances `visited` when its part is done, or when it
//! ends), so the call returns only once no thread runs the closure any more.

use std::marker::PhantomData;
use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::{Arc, Mutex};

use super::Group;
use crate::exec::handoff::{Visit, Visiting};
use crate::exec::{lock, Ctx, Deal};
use crate::{BoxError, Error};

/// What one rank's part of a call of `each` ended with, once it has.
type Outcome<R> = Mutex<Option<Result<R, Error>>>;

/// One call of `each`: the closure, and a cell per rank for what its part ended with.
struct Each<A, F, R> {
    f: F,
    results: Box<[Outcome<R>]>,
    _actor: PhantomData<fn(&mut A)>,
}

impl<A, F, R> Visit<A> for Each<A, F, R>
where
    F: Fn(Ctx, &mut A) -> Result<R, BoxError> + Send + Sync,
    R: Send,
{
    fn run(&self, local: usize, ctx: Ctx, actor: &mut A) -> Result<(), BoxError> {
        let value = (self.f)(ctx, actor)?;
        *lock(&self.results[local]) = Some(Ok(value));
        Ok(())
    }

    fn fail(&self, local: usize, error: Error) {
        *lock(&self.results[local]) = Some(Err(error));
    }
}

impl<A, I, O> Group<A, I, O>
where
    A: 'static,
    I: Deal,
    O: Send + 'static,
{
    /// Runs `f` once on every actor of this process, each on its own thread, and returns
    /// the values by rank (this process's ranks, in order: see [`Group::ranks`]); the
    /// lowest rank's error if any rank's `f` returned `Err`, panicked (which poisons that
    /// actor, as a method's panic does) or found its actor poisoned. The group stays
    /// usable but for a poisoned actor; a thread found gone breaks it.
    ///
    /// Call it with no execution in flight (the graph's driver collects them first): a
    /// call made otherwise is refused, and nothing runs.
    pub fn try_each<R, F>(&mut self, f: F) -> Result<Vec<R>, Error>
    where
        F: Fn(Ctx, &mut A) -> Result<R, BoxError> + Send + Sync + 'static,
        R: Send + 'static,
    {
        self.ready()?;
        if self.done_seen.iter().any(|&seen| seen != self.submitted) {
            return Err(Error::Backend(
                "internal error: `each` was called with an execution in flight".into(),
            ));
        }
        let each = Arc::new(Each {
            f,
            results: (0..self.len()).map(|_| Mutex::new(None)).collect(),
            _actor: PhantomData,
        });
        self.shared.visiting.store(true, Release);
        for (rank, slot) in self.shared.slots.iter().enumerate() {
            // Before the `go` advance that wakes the thread for it.
            *lock(&self.shared.visits[rank]) = Some(Arc::clone(&each) as Visiting<A>);
            slot.inbox.go.advance();
        }
        let gone = |rank: usize| self.shared.slots[rank].outbox.exited.load(Acquire);
        loop {
            let seen = self.shared.visited.current();
            let waiting =
                (0..self.len()).any(|rank| lock(&each.results[rank]).is_none() && !gone(rank));
            if !waiting {
                break;
            }
            // Never aborted: it returns when a rank finishes its part or its thread ends.
            self.shared.visited.wait_past_unabortable(seen);
        }
        // Every thread has run its part or ended: none looks for a call any more.
        self.shared.visiting.store(false, Release);
        let mut values = Vec::with_capacity(self.len());
        let mut first_error = None;
        for rank in 0..self.len() {
            let result = lock(&each.results[rank]).take().unwrap_or_else(|| {
                // Its thread ended before it ran its part: the call is not left behind.
                lock(&self.shared.visits[rank]).take();
                Err(Error::ActorLost {
                    group: self.name,
                    rank: self.ranks.0.start + rank,
                    reason: "its thread ended before it ran `each`".into(),
                })
            });
            match result {
                Ok(value) => values.push(value),
                Err(e) => {
                    if matches!(e, Error::ActorLost { .. }) {
                        self.break_with(e.to_string());
                    }
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(values),
        }
    }
}

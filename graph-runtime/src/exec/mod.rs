//! Actor threads: one owner of the threads per group, driver <-> actor slots, launch and
//! teardown.

mod ctx;

pub use ctx::{Stage, StepCtx};

use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use crate::comm::{Backend, Communicator};
use crate::sync::prims::AtomicBool;
use crate::sync::Epoch;
use crate::Error;

/// The generated per-actor step of a graph.
pub type StepFn<A, C, I, O> = fn(&mut A, &mut StepCtx<C>, &I) -> Result<O, Error>;

/// The driver's handle on one actor group: its threads, and a slot per actor through which
/// inputs go in and outputs come back.
///
/// Dropping it stops and joins the threads.
pub struct Group<A, I, O> {
    name: &'static str,
    shared: Arc<Shared<I, O>>,
    threads: Vec<JoinHandle<A>>,
    /// Per actor, the `done` value last seen by the driver.
    done_seen: Vec<u64>,
}

struct Shared<I, O> {
    slots: Box<[Slot<I, O>]>,
    shutdown: AtomicBool,
}

#[repr(align(128))]
struct Slot<I, O> {
    go: Epoch,
    done: Epoch,
    input: Mutex<Option<I>>,
    output: Mutex<Option<Result<O, Error>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The slot holds plain data; a panic elsewhere cannot leave it half-written.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<A, I, O> Group<A, I, O>
where
    A: Send + 'static,
    I: Clone + Send + 'static,
    O: Send + 'static,
{
    /// Spawns one thread per actor, named `actorgraph-<group>-<rank>`, each owning its actor,
    /// its communicator endpoint and its fused stages.
    pub fn launch<B: Backend>(
        name: &'static str,
        actors: Vec<A>,
        backend: &B,
        stage_names: &'static [&'static str],
        step: StepFn<A, B::Comm, I, O>,
    ) -> Result<Self, Error> {
        if actors.is_empty() {
            return Err(Error::EmptyGroup { group: name });
        }
        let comms = backend.communicators(actors.len())?;
        if comms.len() != actors.len() {
            return Err(Error::Backend(format!(
                "the backend made {} communicators for the {} actors of group `{name}`",
                comms.len(),
                actors.len()
            )));
        }
        let shared = Arc::new(Shared {
            slots: (0..actors.len())
                .map(|_| Slot {
                    go: Epoch::new(),
                    done: Epoch::new(),
                    input: Mutex::new(None),
                    output: Mutex::new(None),
                })
                .collect(),
            shutdown: AtomicBool::new(false),
        });
        let mut group = Self {
            name,
            shared,
            threads: Vec::with_capacity(actors.len()),
            done_seen: vec![0; actors.len()],
        };
        for (rank, (actor, comm)) in actors.into_iter().zip(comms).enumerate() {
            let shared = Arc::clone(&group.shared);
            let spawned = std::thread::Builder::new()
                .name(format!("actorgraph-{name}-{rank}"))
                .spawn(move || {
                    actor_loop(
                        actor,
                        StepCtx::new(name, comm, stage_names),
                        step,
                        &shared,
                        rank,
                    )
                });
            match spawned {
                Ok(handle) => group.threads.push(handle),
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
        Ok(group)
    }

    /// The number of actors.
    pub fn len(&self) -> usize {
        self.done_seen.len()
    }

    /// Whether the group has no actors (never true for a launched group).
    pub fn is_empty(&self) -> bool {
        self.done_seen.is_empty()
    }

    /// Hands `input` to every actor and starts their steps.
    pub fn submit(&mut self, input: I) {
        let n = self.len();
        let mut input = Some(input);
        for (rank, slot) in self.shared.slots.iter().enumerate() {
            let value = if rank + 1 == n {
                input.take()
            } else {
                input.clone()
            };
            *lock(&slot.input) = value;
            slot.go.advance();
        }
    }

    /// Waits for every actor's step and returns the outputs by rank, or the first root-cause
    /// error (lowest rank) if any rank failed.
    pub fn collect(&mut self) -> Result<Vec<O>, Error> {
        let mut outputs = Vec::with_capacity(self.len());
        let mut first_error: Option<Error> = None;
        for (rank, slot) in self.shared.slots.iter().enumerate() {
            self.done_seen[rank] = slot.done.wait_past(self.done_seen[rank]);
            let result = lock(&slot.output).take().unwrap_or_else(|| {
                Err(Error::ActorLost {
                    group: self.name,
                    rank,
                    reason: "it finished without an output".into(),
                })
            });
            match result {
                Ok(out) => outputs.push(out),
                Err(e) => {
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

    /// Stops the threads and hands the actors back, by rank.
    pub fn teardown(mut self) -> Result<Vec<A>, Error> {
        self.stop();
        let mut actors = Vec::with_capacity(self.threads.len());
        let mut lost = None;
        for (rank, handle) in std::mem::take(&mut self.threads).into_iter().enumerate() {
            match handle.join() {
                Ok(actor) => actors.push(actor),
                Err(_) => {
                    lost.get_or_insert(Error::ActorLost {
                        group: self.name,
                        rank,
                        reason: "its thread panicked outside a method".into(),
                    });
                }
            }
        }
        match lost {
            Some(e) => Err(e),
            None => Ok(actors),
        }
    }
}

impl<A, I, O> Group<A, I, O> {
    fn stop(&self) {
        self.shared.shutdown.store(true, Release);
        for slot in self.shared.slots.iter() {
            slot.go.advance();
        }
    }
}

impl<A, I, O> Drop for Group<A, I, O> {
    fn drop(&mut self) {
        if self.threads.is_empty() {
            return;
        }
        self.stop();
        for handle in self.threads.drain(..) {
            let _ = handle.join();
        }
    }
}

fn actor_loop<A, C: Communicator, I, O>(
    mut actor: A,
    mut ctx: StepCtx<C>,
    step: StepFn<A, C, I, O>,
    shared: &Shared<I, O>,
    rank: usize,
) -> A {
    let slot = &shared.slots[rank];
    let mut seen = 0;
    loop {
        seen = slot.go.wait_past(seen);
        if shared.shutdown.load(Acquire) {
            return actor;
        }
        let input = lock(&slot.input).take();
        let result = match input {
            Some(input) => ctx.execute(&mut actor, step, &input),
            None => ctx.fail("it was started without an input"),
        };
        *lock(&slot.output) = Some(result);
        slot.done.advance();
    }
}

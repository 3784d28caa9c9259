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
//!
//! The files, by concern: [`group`] holds the driver's handle on a group, and
//! `group/launch.rs` the start of its threads; [`handoff`] the cells between the driver
//! and each actor; [`actor_loop`] the loops an actor thread runs; [`help`] the driver
//! running steps itself; [`driver`] and [`pipeline`] the graph's executions; [`edge`],
//! [`route`] and [`links`] the values that cross between actors; [`ctx`] what a step sees.

mod actor_loop;
mod actors;
mod ctx;
mod deal;
mod driver;
pub(crate) mod edge;
mod group;
mod handoff;
mod help;
mod links;
mod pipeline;
mod rank;
mod route;
mod wake;

pub use actors::Actors;
pub use ctx::{Done, Stage, Started, StepCtx, SyncPoint};
pub use deal::{Deal, Elements, PerRankValues, RankInputs};
pub use driver::{Driven, Driver, GraphDriver};
pub use edge::{Edge, EdgeValue};
pub use group::{Group, GroupSpec};
pub use links::Links;
pub use pipeline::{LaunchOptions, Pipeline, Ticket};
pub use rank::{group_sizes, Ctx};
pub use route::Route;

use std::sync::atomic::AtomicU8;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::Error;

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

/// Locks `m`, whatever a panic elsewhere left in it.
#[inline]
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The slot holds plain data; a panic elsewhere cannot leave it half-written.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

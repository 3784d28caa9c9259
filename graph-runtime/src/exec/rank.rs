//! Where a method runs: its actor's rank, its group's size and its group's name, for code
//! running on an actor's thread ([`Ctx::current`]).
//!
//! The context is a thread-local set once when the actor's thread starts, before its actor
//! is made: reading it costs a thread-local load. A step the driver's thread runs for an
//! actor (see `exec::help`) sets it for that step and puts the driver's back after.

use std::cell::Cell;

/// Where the calling code runs: the rank of its actor, the size of its group and the
/// group's name, as `torch.distributed`'s `get_rank()` and `get_world_size()` give them.
///
/// [`Ctx::current`] is callable anywhere on an actor's thread: in a method, in a helper
/// it calls, and in a constructor run by [`Actors::each`](crate::Actors::each). A method
/// thus needs no extra parameter, and stays an ordinary method callable outside a graph
/// (where `current` is `None`).
///
/// ```
/// use actorgraph::prelude::*;
///
/// struct Worker;
///
/// #[actor]
/// impl Worker {
///     /// This rank's shard of `data`: rows `rank, rank + size, ..`.
///     fn shard(&mut self, data: &Vec<u32>) -> Vec<u32> {
///         let ctx = Ctx::current().expect("called on an actor's thread");
///         data.iter().copied().skip(ctx.rank()).step_by(ctx.size()).collect()
///     }
///     fn whoami(&mut self) -> String {
///         Ctx::current().map_or("outside".into(), |c| format!("{}[{}]", c.group(), c.rank()))
///     }
/// }
///
/// graph! {
///     G(workers: [Worker], data: Vec<u32>) {
///         let s = workers.shard(data);
///         let me = workers.whoami();
///         (s, me)
///     }
/// }
///
/// let mut g = G::launch(vec![Worker, Worker], Cpu)?;
/// let out = g.execute(vec![0, 1, 2, 3, 4])?;
/// assert_eq!(out[0], (vec![0, 2, 4], "workers[0]".to_string()));
/// assert_eq!(out[1], (vec![1, 3], "workers[1]".to_string()));
/// assert_eq!(Worker.whoami(), "outside"); // not on an actor's thread
/// # Ok::<(), actorgraph::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ctx {
    group: &'static str,
    rank: usize,
    size: usize,
    threads: usize,
}

thread_local! {
    static CURRENT: Cell<Option<Ctx>> = const { Cell::new(None) };
}

impl Ctx {
    /// The context of the actor whose thread calls it; `None` on any other thread.
    pub fn current() -> Option<Ctx> {
        CURRENT.with(Cell::get)
    }

    /// The actor's rank in its group, `0..size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of actors in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The group's name, as the graph's parameter names it.
    pub fn group(&self) -> &'static str {
        self.group
    }

    /// The threads this actor's compute may use: its share of the process's cores, or
    /// what [`LaunchOptions::compute_threads`](crate::LaunchOptions::compute_threads) set.
    /// For a library that takes a thread count per call or per pool, such as a
    /// `rayon::ThreadPool` the actor builds for itself.
    pub fn compute_threads(&self) -> usize {
        self.threads
    }

    /// Makes this the context of the calling thread, for good: called once, by an actor's
    /// thread as it starts.
    pub(crate) fn enter(self) {
        CURRENT.with(|c| c.set(Some(self)));
    }

    /// Makes this the context of the calling thread until the returned guard drops: for a
    /// step that the driver's thread runs for an actor (see `exec::help`), so that the
    /// step sees its actor's context there too, and the driver none afterwards.
    pub(crate) fn scope(self) -> Scope {
        Scope(CURRENT.with(|c| c.replace(Some(self))))
    }

    pub(crate) fn new(group: &'static str, rank: usize, size: usize, threads: usize) -> Self {
        Self {
            group,
            rank,
            size,
            threads,
        }
    }
}

/// The calling thread's context before [`Ctx::scope`], put back on drop (also when a step
/// unwinds).
pub(crate) struct Scope(Option<Ctx>);

impl Drop for Scope {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

//! The MPI backend (feature `mpi`): graphs whose actors span processes and machines.
//!
//! Every process runs the same program (SPMD, under `mpirun` or `srun`), hosts one or
//! more actors of every group and calls `launch`, `execute` and `teardown` in the same
//! order. A group's ranks are global, in process order: process 0's actors first. Inside
//! a process the ranks of a group meet in shared memory; one leader per process (its
//! first actor) runs the MPI operations of a stage for all of them.
//!
//! ```
//! use actorgraph::mpi::Mpi;
//! use actorgraph::prelude::*;
//!
//! struct Worker;
//! #[actor]
//! impl Worker {
//!     fn grad(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
//!         x.clone()
//!     }
//! }
//! graph! {
//!     Step(workers: [Worker], x: Tensor<f32>) {
//!         allreduce(workers.grad(x), Sum)
//!     }
//! }
//!
//! # fn main() -> Result<(), actorgraph::Error> {
//! let mpi = Mpi::init()?; // once per process, before any graph
//! let mut g = Step::launch(vec![Worker, Worker], &mpi)?; // this process's two actors
//! let out = g.execute(Tensor::full([4], 1.0))?; // one entry per local actor
//! let ranks = g.ranks("workers").unwrap(); // their ranks in the whole group
//! assert_eq!(out.len(), ranks.len());
//! assert_eq!(out[0].to_vec(), vec![g.group_size("workers").unwrap() as f32; 4]);
//! g.teardown()?;
//! # Ok(())
//! # }
//! ```
//!
//! See the reference page `reference::mpi` for the model, the algorithm and what is not
//! supported yet.

mod comm;
mod edge;
pub(crate) mod late;
mod shm;
mod wait;
pub(crate) mod wire;

pub use comm::MpiComm;
pub use shm::SHARED_MEMORY_VAR;

/// The `mpi` crate (rsmpi), for MPI calls of a program's own beside its graphs (after
/// [`Mpi::init`], which initializes MPI).
pub use ::mpi as rsmpi;

use std::sync::{Arc, Mutex, PoisonError};

use ::mpi::environment::Universe;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;
use ::mpi::Threading;

use crate::comm::{Backend, GraphInfo, Wiring};
use crate::Error;

/// The groups of a graph that [`Backend::join`] can describe in its one collective call;
/// a graph with more groups is refused at launch.
pub const MAX_GROUPS: usize = 32;

/// An MPI communicator that may move between threads.
pub(crate) struct SendComm(pub(crate) SimpleCommunicator);

// SAFETY: `Mpi::init` refuses an MPI library that does not give `MPI_THREAD_MULTIPLE`, under
// which MPI may be called from any thread, so the handle is valid on every thread. It is
// reached only through `&`/`&mut` of this wrapper, and each communicator is used by one
// thread at a time (the world by the thread that launches, a group's by the leader of the
// stage under way: behind a `Mutex`), as MPI requires of a communicator's collectives.
unsafe impl Send for SendComm {}

/// MPI, once initialized: ends (`MPI_Finalize`) when the last [`Mpi`] and the last
/// communicator made from it are gone.
pub(crate) struct World {
    // Before `_universe`: a communicator is freed before MPI ends.
    comm: Mutex<SendComm>,
    process: usize,
    processes: usize,
    /// Whether every process runs on this machine, with shared memory not turned off
    /// ([`SHARED_MEMORY_VAR`]): the leaders' first round of a stage then goes through a
    /// segment they share (`shm`).
    shared_memory: bool,
    _universe: Universe,
}

impl Drop for World {
    fn drop(&mut self) {
        // A process that unwinds from a panic with MPI alive would end MPI next
        // (`MPI_Finalize`), which waits for every other process, while they may wait in a
        // stage for this one: no process would ever return. `MPI_Abort` ends them all
        // instead, as the MPI runtime ends a run whose process exits without finalizing.
        if std::thread::panicking() {
            eprintln!(
                "actorgraph: process {} of {} panicked with MPI running; MPI_Abort ends \
                 every process of the run",
                self.process, self.processes
            );
            let comm = self.comm.lock().unwrap_or_else(PoisonError::into_inner);
            comm.0.abort(PANICKED);
        }
    }
}

/// The exit code of a run that `MPI_Abort` ended after a panic (Rust's own for a panic).
const PANICKED: i32 = 101;

/// The MPI backend: the processes of `mpirun -np P` as one set of ranks.
///
/// Made once per process by [`Mpi::init`]; pass `&mpi` to a graph's `launch`. A launch
/// agrees with the other processes on the layout (how many actors each process hosts of
/// each group) and on the graph (its `FINGERPRINT`) in one collective call; every process
/// must launch the same graphs in the same order, and a mismatch is the same typed error
/// on every process ([`Error::GraphMismatch`], [`Error::ProcessLayout`]).
///
/// Dropping the last `Mpi` and every graph launched over it ends MPI (`MPI_Finalize`):
/// drop them on the main thread, before `main` returns. If that drop happens while the
/// thread unwinds from a panic, it calls `MPI_Abort` instead, which ends every process of
/// the run: the others may be waiting for this one, and would wait forever.
pub struct Mpi {
    /// The groups of the graph being launched, with their layout and communicators, from
    /// `join` until `group_communicators` takes them; left here by a launch that fails
    /// between the two (a root or an index beyond its group), until the next launch or
    /// the drop.
    // Before `world`, whose drop may end MPI: fields drop in order, and a communicator
    // freed after `MPI_Finalize` aborts the process before `main` can print its error.
    joined: Mutex<Joined>,
    world: Arc<World>,
}

#[derive(Default)]
struct Joined {
    graph: &'static str,
    groups: Vec<(&'static str, GroupLayout)>,
    /// Each group's number of actors per process, and the communicator of the graph's
    /// edges between processes (if it has edges and there are several processes), until
    /// `wiring` takes them.
    counts: Vec<(&'static str, Vec<usize>)>,
    edges: Option<SendComm>,
}

/// Where a group's ranks are: how many each process hosts, from which global rank.
pub(crate) struct GroupLayout {
    pub(crate) counts: Vec<usize>,
    pub(crate) offsets: Vec<usize>,
    pub(crate) process: usize,
    pub(crate) comm: SendComm,
    /// The communicator of the group's census after a timeout (see `late`).
    pub(crate) census: SendComm,
    /// The leaders' mailboxes in memory every process maps, if they share a machine.
    pub(crate) mailboxes: Option<shm::Mailboxes>,
}

impl GroupLayout {
    /// The number of ranks in every process together (for NCCL's communicator over them).
    #[cfg(feature = "nccl")]
    pub(crate) fn size(&self) -> usize {
        self.counts.iter().sum()
    }
}

impl Mpi {
    /// Initializes MPI with `MPI_THREAD_MULTIPLE` (each group's leader calls MPI from its
    /// own thread): once per process, before any graph is launched over it.
    ///
    /// An error if MPI was initialized already, or if the library does not give
    /// `MPI_THREAD_MULTIPLE`.
    pub fn init() -> Result<Self, Error> {
        let Some((universe, threading)) = ::mpi::initialize_with_threading(Threading::Multiple)
        else {
            return Err(Error::Backend(
                "MPI is initialized already: call `Mpi::init` once per process".into(),
            ));
        };
        if threading != Threading::Multiple {
            return Err(Error::Backend(format!(
                "the MPI library gives threading level {threading:?}; actorgraph needs \
                 MPI_THREAD_MULTIPLE (each group's leader calls MPI from its own thread)"
            )));
        }
        let comm = universe.world();
        let (process, processes) = (rank_of(comm.rank()), rank_of(comm.size()));
        let shared_memory = processes > 1 && shm::usable(&comm);
        Ok(Self {
            joined: Mutex::new(Joined::default()),
            world: Arc::new(World {
                comm: Mutex::new(SendComm(comm)),
                process,
                processes,
                shared_memory,
                _universe: universe,
            }),
        })
    }

    /// This process's place among the processes (its MPI rank in `MPI_COMM_WORLD`).
    pub fn process(&self) -> usize {
        self.world.process
    }

    /// The number of processes.
    pub fn processes(&self) -> usize {
        self.world.processes
    }

    /// Whether the leaders of a group meet in memory their processes share for the first
    /// round of each stage (its agreement and small data), rather than through MPI
    /// messages: when every process runs on this machine, unless a process turned it off
    /// with [`SHARED_MEMORY_VAR`] set to `0`. The same on every process. (A group whose
    /// segment some process cannot map, `/dev/shm` being full, say, uses MPI messages on
    /// every process all the same.)
    pub fn shares_memory(&self) -> bool {
        self.world.shared_memory
    }

    fn joined(&self) -> std::sync::MutexGuard<'_, Joined> {
        self.joined.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The world communicator, for collectives of the launching thread.
    pub(crate) fn world(&self) -> std::sync::MutexGuard<'_, SendComm> {
        self.world
            .comm
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// What keeps MPI alive: a communicator made from it holds one.
    pub(crate) fn keep_alive(&self) -> Arc<World> {
        Arc::clone(&self.world)
    }

    /// [`Backend::join`], with the leaders' mailboxes in shared memory (`shm`) made for
    /// each group if `mailboxes` (the NCCL backend over MPI has no use for them).
    pub(crate) fn join_groups(
        &self,
        graph: &GraphInfo<'_>,
        mailboxes: bool,
    ) -> Result<Vec<usize>, Error> {
        let mut joined = self.joined();
        // Groups of an earlier launch that failed after its join are dropped here.
        *joined = Joined {
            graph: graph.name,
            ..Joined::default()
        };
        let processes = self.processes();
        // One record per process: the graph, its number of groups and edges, and the
        // actors it gives each group.
        let width = 3 + MAX_GROUPS;
        let mut mine = vec![0u64; width];
        mine[0] = graph.fingerprint;
        mine[1] = graph.groups.len() as u64;
        mine[2] = graph.edges.len() as u64;
        for (slot, &(_, n)) in mine[3..].iter_mut().zip(graph.groups) {
            *slot = n as u64;
        }
        let mut all = vec![0u64; width * processes];
        let world = self.world();
        world.0.all_gather_into(&mine[..], &mut all[..]);
        let record = |p: usize| &all[p * width..(p + 1) * width];
        // The same verdict on every process: every process has every record.
        if let Some(process) = (1..processes).find(|&p| record(p)[..3] != record(0)[..3]) {
            return Err(Error::GraphMismatch {
                graph: graph.name,
                process,
            });
        }
        if graph.groups.len() > MAX_GROUPS {
            return Err(Error::Unsupported(format!(
                "graph `{}` has {} groups; a launch over MPI takes at most {MAX_GROUPS}",
                graph.name,
                graph.groups.len()
            )));
        }
        let mut sizes = Vec::with_capacity(graph.groups.len());
        let mut layouts = Vec::with_capacity(graph.groups.len());
        for (g, &(group, _)) in graph.groups.iter().enumerate() {
            let counts: Vec<usize> = (0..processes)
                .map(|p| usize::try_from(record(p)[3 + g]).unwrap_or(usize::MAX))
                .collect();
            if let Some(process) = counts.iter().position(|&n| n == 0) {
                return Err(Error::ProcessLayout { group, process });
            }
            let offsets = counts
                .iter()
                .scan(0usize, |next, &n| {
                    let at = *next;
                    *next = next.saturating_add(n);
                    Some(at)
                })
                .collect();
            sizes.push(counts.iter().sum());
            layouts.push((group, counts, offsets));
        }
        // Each group's stages run on a communicator of their own, so that groups whose
        // leaders run stages at the same time never match each other's messages.
        // The same on every process (the records agree on the number of edges): the
        // edges' messages have a communicator of their own too.
        if processes > 1 && !graph.edges.is_empty() {
            joined.edges = Some(SendComm(world.0.duplicate()));
        }
        for (group, counts, offsets) in layouts {
            joined.counts.push((group, counts.clone()));
            let comm = SendComm(world.0.duplicate());
            let census = SendComm(world.0.duplicate());
            let mailboxes = match mailboxes && self.world.shared_memory {
                true => shm::Mailboxes::open(&world.0, comm::FIRST_ROUND_BYTES),
                false => None,
            };
            joined.groups.push((
                group,
                GroupLayout {
                    counts,
                    offsets,
                    process: self.process(),
                    comm,
                    census,
                    mailboxes,
                },
            ));
        }
        Ok(sizes)
    }

    /// The layout and communicator of group `group` of the graph joined last, for this
    /// process's `size` actors; taken once.
    pub(crate) fn take_group(
        &self,
        group: &'static str,
        size: usize,
    ) -> Result<GroupLayout, Error> {
        let mut joined = self.joined();
        let Some(at) = joined.groups.iter().position(|(g, _)| *g == group) else {
            return Err(Error::Backend(format!(
                "group `{group}` was not part of the graph the MPI backend joined last"
            )));
        };
        let (_, layout) = joined.groups.remove(at);
        if layout.counts[layout.process] != size {
            return Err(Error::Backend(format!(
                "group `{group}` was joined with {} actors on this process, launched with {size}",
                layout.counts[layout.process]
            )));
        }
        Ok(layout)
    }
}

/// Every process's `words`, process after process (see `wait::all_gather_words`), for
/// the NCCL backend's agreement over MPI; given up on when `stop()` says so (`None`): the
/// requests then stay pending in MPI with their buffers leaked (see `wait`), so the caller
/// must never run another collective on `comm`.
#[cfg(feature = "nccl")]
pub(crate) fn all_gather_words_until(
    comm: &SimpleCommunicator,
    words: &[u64],
    stop: impl Fn() -> bool,
) -> Option<Vec<u64>> {
    wait::all_gather_words(comm, words, stop).ok()
}

fn rank_of(r: i32) -> usize {
    usize::try_from(r).unwrap_or(0)
}

impl Backend for Mpi {
    type Comm = MpiComm;

    /// Refused: the MPI backend makes its endpoints when a graph is launched over it.
    fn communicators(&self, size: usize) -> Result<Vec<MpiComm>, Error> {
        let _ = size;
        Err(Error::Unsupported(
            "the MPI backend makes its communicators when a graph is launched over it \
             (`G::launch(.., &mpi)`), not on their own"
                .into(),
        ))
    }

    fn join(&self, graph: &GraphInfo<'_>) -> Result<Vec<usize>, Error> {
        self.join_groups(graph, true)
    }

    fn group_communicators(&self, group: &'static str, size: usize) -> Result<Vec<MpiComm>, Error> {
        let layout = self.take_group(group, size)?;
        Ok(MpiComm::group(group, layout, Arc::clone(&self.world)))
    }

    /// Where each rank of the graph joined last lives; its edges between processes go over
    /// MPI point-to-point (see `reference::mpi`, "Edges across processes").
    fn wiring(&self) -> Result<Wiring, Error> {
        let mut joined = self.joined();
        let counts = std::mem::take(&mut joined.counts);
        Ok(match joined.edges.take() {
            Some(comm) => Wiring::across(
                self.process(),
                counts,
                Arc::new(edge::MpiPorts::new(comm, self.keep_alive())),
            ),
            None => Wiring::local(),
        })
    }

    fn confirm(&self, launched: Option<&Error>) -> Result<(), Error> {
        let graph = std::mem::take(&mut *self.joined()).graph;
        let world = self.world();
        let failed = u64::from(launched.is_some());
        let mut all = vec![0u64; self.processes()];
        world.0.all_gather_into(&failed, &mut all[..]);
        let Some(process) = all.iter().position(|&f| f != 0) else {
            return Ok(());
        };
        // The lowest process that failed says why, to every other.
        let root = world.0.process_at_rank(process as i32);
        let mut message = launched
            .map(|e| e.to_string().into_bytes())
            .unwrap_or_default();
        let mut len = message.len() as u64;
        root.broadcast_into(&mut len);
        message.resize(usize::try_from(len).unwrap_or(0), 0);
        root.broadcast_into(&mut message[..]);
        match launched {
            // This process has its own error, which `settle` returns.
            Some(_) => Ok(()),
            None => Err(Error::ProcessLaunch {
                graph,
                process,
                reason: String::from_utf8_lossy(&message).into_owned(),
            }),
        }
    }
}

impl Backend for &Mpi {
    type Comm = MpiComm;

    fn wiring(&self) -> Result<Wiring, Error> {
        (**self).wiring()
    }

    fn communicators(&self, size: usize) -> Result<Vec<MpiComm>, Error> {
        (**self).communicators(size)
    }

    fn join(&self, graph: &GraphInfo<'_>) -> Result<Vec<usize>, Error> {
        (**self).join(graph)
    }

    fn group_communicators(&self, group: &'static str, size: usize) -> Result<Vec<MpiComm>, Error> {
        (**self).group_communicators(group, size)
    }

    fn confirm(&self, launched: Option<&Error>) -> Result<(), Error> {
        (**self).confirm(launched)
    }
}

//! The NCCL backend across processes (features `nccl` and `mpi`): one NCCL communicator
//! over every GPU of every process, bootstrapped over MPI, as Horovod and DeepSpeed do.
//!
//! - **Launch.** [`Backend::join`] is the MPI backend's (the same fingerprint and layout
//!   checks, the same errors); then every process checks that it has one GPU per actor,
//!   and process 0 makes one `ncclUniqueId` per group and broadcasts them over MPI. Each
//!   rank inits its part of the group's communicator with its global rank and the global
//!   size, once every rank of every process has opened its GPU (an agreement round, so
//!   that none waits in `ncclCommInitRank` for a peer that failed before it).
//! - **Agreement.** A stage's header agreement ([`Board`](super::agree::Board)) first meets
//!   the process's ranks at a barrier, as in one process; then the process's first rank
//!   exchanges every local post with the other processes' first ranks (one
//!   `MPI_Allgatherv`) and, after a second barrier, every rank of every process decides
//!   over every rank's post: the same verdict everywhere. A failed rank's error travels
//!   with its post, so that the processes without it report the same typed error.
//! - **The end stage.** A step whose methods run after its last stage (or a group with no
//!   stage) ends, when the group spans processes, with an empty stage (`SyncPoint::End`):
//!   over NCCL its header agreement only, with no NCCL call, which carries an error there
//!   to every process.
//! - **Timeouts.** The leader's MPI exchange polls its requests (`mpi/wait.rs`) and gives
//!   up when the group is aborted (the driver's deadline), leaving them pending in MPI with
//!   their buffers leaked; every process then takes the MPI backend's census
//!   (`mpi/late.rs`) on a communicator of its own and names every late rank. The group is
//!   broken after it, as in one process.
//! - **Edges.** Those between processes go over MPI point-to-point: the wiring is the MPI
//!   backend's (`mpi/edge.rs`). A GPU tensor crosses through host memory.

use std::sync::{Mutex, PoisonError};

use cudarc::nccl::result as nccl;
use cudarc::nccl::sys;

use super::across::Across;
use super::agree::Board;
use super::{Nccl, NcclComm};
use crate::comm::{Backend, GraphInfo, Wiring};
use crate::mpi::Mpi;
use crate::Error;

use ::mpi::traits::*;

/// The NCCL backend over the processes of an MPI run: every process's actors of a group,
/// one per GPU of that process, in one NCCL communicator. Made by [`Nccl::over_mpi`]; pass
/// it (or `&` it) to a graph's `launch`.
///
/// Ranks are global, in process order, as on the [`Mpi`] backend: process 0's actors first.
///
/// The failure model is the MPI backend's (see `reference::mpi`): a method error or panic
/// on a rank of one process, in a stage's step or after its last stage, is the same typed
/// error on every process; `execute_timeout` returns the same [`Error::Timeout`] on every
/// process, naming the late ranks of every process, and breaks the group. Edges between
/// processes travel by MPI point-to-point; a GPU tensor on one arrives as a host tensor.
pub struct NcclMpi<'m> {
    mpi: &'m Mpi,
    nccl: Nccl,
    /// Each group's communicator id, from `join` until `group_communicators` takes it.
    ids: Mutex<Vec<(&'static str, sys::ncclUniqueId)>>,
}

impl std::fmt::Debug for NcclMpi<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclMpi")
            .field("process", &self.mpi.process())
            .field("devices", &self.nccl.devices())
            .finish()
    }
}

impl Nccl {
    /// The NCCL backend across the processes of `mpi`: this process's actors of a group
    /// run on its GPUs `devices` (actor `l` of this process on `devices[l]`), and every
    /// process's actors of the group share one NCCL communicator. Run one process per
    /// GPU, or per machine with its GPUs, under `mpirun`.
    ///
    /// The same errors as [`Nccl::new`] for `devices`.
    pub fn over_mpi(
        mpi: &Mpi,
        devices: impl IntoIterator<Item = usize>,
    ) -> Result<NcclMpi<'_>, Error> {
        Ok(NcclMpi {
            mpi,
            nccl: Nccl::new(devices)?,
            ids: Mutex::new(Vec::new()),
        })
    }
}

impl NcclMpi<'_> {
    /// This process's GPUs, one per local actor of a group.
    pub fn devices(&self) -> &[usize] {
        self.nccl.devices()
    }

    /// The MPI backend it runs over.
    pub fn mpi(&self) -> &Mpi {
        self.mpi
    }

    /// After the MPI backend's join: every process has a GPU per actor (the same verdict
    /// everywhere), and process 0's ids, one per group, reach every process.
    fn make_ids(&self, graph: &GraphInfo<'_>) -> Result<(), Error> {
        let world = self.mpi.world();
        // Per process: its GPUs, and the first group it gives another number of actors
        // (+1; 0: none) with that number.
        let gpus = self.nccl.devices().len();
        let bad = graph.groups.iter().enumerate().find(|(_, g)| g.1 != gpus);
        let mine = match bad {
            Some((g, &(_, n))) => [gpus as u64, g as u64 + 1, n as u64],
            None => [gpus as u64, 0, 0],
        };
        let mut all = vec![0u64; 3 * self.mpi.processes()];
        world.0.all_gather_into(&mine[..], &mut all[..]);
        for (process, r) in all.chunks_exact(3).enumerate() {
            let Some(&(group, _)) = r[1]
                .checked_sub(1)
                .and_then(|g| graph.groups.get(g as usize))
            else {
                continue;
            };
            return Err(Error::Backend(format!(
                "process {process} gives group `{group}` {} actor(s) and has {} GPU(s) for the \
                 NCCL backend: give it one GPU per actor",
                r[2], r[0]
            )));
        }
        // Process 0's ids, or the NCCL error it met making them.
        let id_words = std::mem::size_of::<sys::ncclUniqueId>().div_ceil(8);
        let mut words = vec![0u64; 1 + id_words * graph.groups.len()];
        if self.mpi.process() == 0 {
            let (status, ids) = words.split_at_mut(1);
            for chunk in ids.chunks_exact_mut(id_words) {
                match nccl::get_uniqueid() {
                    Ok(id) => write_id(&id, chunk),
                    Err(e) => {
                        status[0] = 1 + e.0 as u64;
                        break;
                    }
                }
            }
        }
        world.0.process_at_rank(0).broadcast_into(&mut words[..]);
        if words[0] != 0 {
            return Err(Error::Gpu {
                call: "ncclGetUniqueId",
                message: format!("failed on process 0 (NCCL result {})", words[0] - 1),
            });
        }
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        ids.clear();
        for (&(group, _), chunk) in graph.groups.iter().zip(words[1..].chunks_exact(id_words)) {
            ids.push((group, read_id(chunk)));
        }
        Ok(())
    }
}

fn write_id(id: &sys::ncclUniqueId, words: &mut [u64]) {
    let mut bytes = vec![0u8; words.len() * 8];
    for (b, &c) in bytes.iter_mut().zip(id.internal.iter()) {
        *b = c as u8;
    }
    for (w, b) in words.iter_mut().zip(bytes.chunks_exact(8)) {
        *w = u64::from_le_bytes(b.try_into().unwrap_or_default());
    }
}

fn read_id(words: &[u64]) -> sys::ncclUniqueId {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut id = sys::ncclUniqueId { internal: [0; 128] };
    for (c, &b) in id.internal.iter_mut().zip(&bytes) {
        *c = b as _;
    }
    id
}

impl Backend for NcclMpi<'_> {
    type Comm = NcclComm;

    /// Refused: the endpoints are made when a graph is launched over it.
    fn communicators(&self, size: usize) -> Result<Vec<NcclComm>, Error> {
        let _ = size;
        Err(Error::Unsupported(
            "the NCCL backend over MPI makes its communicators when a graph is launched over \
             it, not on their own"
                .into(),
        ))
    }

    fn join(&self, graph: &GraphInfo<'_>) -> Result<Vec<usize>, Error> {
        // NCCL moves the data: the leaders' mailboxes would go unused.
        let sizes = self.mpi.join_groups(graph, false)?;
        self.make_ids(graph)?;
        Ok(sizes)
    }

    fn group_communicators(
        &self,
        group: &'static str,
        size: usize,
    ) -> Result<Vec<NcclComm>, Error> {
        let layout = self.mpi.take_group(group, size)?;
        let id = {
            let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
            let at = ids.iter().position(|(g, _)| *g == group).ok_or_else(|| {
                Error::Backend(format!(
                    "group `{group}` was not part of the graph the backend joined last"
                ))
            })?;
            ids.remove(at).1
        };
        let first = layout.offsets[layout.process];
        let total = layout.size();
        let across = Across::new(group, layout, size, self.mpi.keep_alive());
        let board = Board::across(size, across);
        Ok(NcclComm::group_of(
            self.nccl.devices(),
            id,
            first,
            total,
            board,
        ))
    }

    fn confirm(&self, launched: Option<&Error>) -> Result<(), Error> {
        self.mpi.confirm(launched)
    }

    /// The MPI backend's: an edge between processes goes over MPI point-to-point, as on
    /// [`Mpi`] (a GPU tensor through host memory; see `reference::mpi`).
    fn wiring(&self) -> Result<Wiring, Error> {
        self.mpi.wiring()
    }
}

impl Backend for &NcclMpi<'_> {
    type Comm = NcclComm;

    fn communicators(&self, size: usize) -> Result<Vec<NcclComm>, Error> {
        (**self).communicators(size)
    }

    fn join(&self, graph: &GraphInfo<'_>) -> Result<Vec<usize>, Error> {
        (**self).join(graph)
    }

    fn group_communicators(
        &self,
        group: &'static str,
        size: usize,
    ) -> Result<Vec<NcclComm>, Error> {
        (**self).group_communicators(group, size)
    }

    fn confirm(&self, launched: Option<&Error>) -> Result<(), Error> {
        (**self).confirm(launched)
    }

    fn wiring(&self) -> Result<Wiring, Error> {
        (**self).wiring()
    }
}

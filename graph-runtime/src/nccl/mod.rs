//! The NCCL backend (cargo feature `nccl`): one GPU per actor, device tensors, and fused
//! stages run by NCCL.
//!
//! CUDA and NCCL are opened at run time (cudarc's `dynamic-loading`), so a program built
//! with the feature runs on a machine without them: every entry point here first checks
//! that the libraries can be opened and returns [`Error::LibraryMissing`] if not.
//!
//! The files, from the bottom up, each importing only from those before it: `post.rs` (a
//! rank's entry in a stage's header agreement), `across.rs` (the agreement's exchange
//! between processes, feature `mpi`), `agree.rs` (the agreement among a process's ranks),
//! `pool.rs` (memory pools shared with the peers' GPUs), `calls.rs` (the NCCL calls of a
//! stage), `comm.rs` ([`NcclComm`]),
//! `backend.rs` ([`Nccl`]), `mpi.rs` (`NcclMpi`, the backend over MPI).
//!
//! [`Error::LibraryMissing`]: crate::Error::LibraryMissing

#[cfg(feature = "mpi")]
mod across;
mod agree;
mod backend;
mod calls;
mod comm;
#[cfg(feature = "mpi")]
mod mpi;
mod pool;
mod post;

pub use crate::gpu::{current_device, device_count, nccl_version, Device};
pub use backend::Nccl;
pub use comm::NcclComm;
#[cfg(feature = "mpi")]
pub use mpi::NcclMpi;

/// The cudarc this backend is built on, for methods that allocate and compute on their
/// device with the same types.
pub use cudarc;

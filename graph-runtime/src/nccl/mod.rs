//! The NCCL backend (cargo feature `nccl`): one GPU per actor, device tensors, and fused
//! stages run by NCCL.
//!
//! CUDA and NCCL are opened at run time (cudarc's `dynamic-loading`), so a program built
//! with the feature runs on a machine without them: every entry point here first checks
//! that the libraries can be opened and returns [`Error::LibraryMissing`] if not.
//!
//! [`Error::LibraryMissing`]: crate::Error::LibraryMissing

mod agree;
mod backend;
mod calls;
mod comm;
#[cfg(feature = "mpi")]
mod mpi;
mod pool;

pub use crate::gpu::{current_device, device_count, nccl_version, Device};
pub use backend::Nccl;
pub use comm::NcclComm;
#[cfg(feature = "mpi")]
pub use mpi::NcclMpi;

/// The cudarc this backend is built on, for methods that allocate and compute on their
/// device with the same types.
pub use cudarc;

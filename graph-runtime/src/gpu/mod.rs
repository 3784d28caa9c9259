//! GPU memory (feature `nccl`): the CUDA driver opened at run time, devices and their
//! streams, allocation and ordered copies. Tensors, fused stages and the NCCL backend all
//! build on it; it knows nothing of them.
//!
//! The files, each depending only on those before it: `errors.rs` (how a failed driver
//! call reads), `probe.rs` (whether the driver and NCCL can be opened), `staging.rs`
//! (page-locked buffers that uploads go through), `device.rs` (a GPU, its stream and the
//! actor's current device).

mod device;
mod errors;
mod probe;
mod staging;

pub(crate) use device::{alloc_zeros, copy_ordered, dropped, set_current, take_dropped};
pub use device::{current_device, Device};
pub(crate) use errors::{driver_error, gpu, take_stored, TRACKING};
pub use probe::{device_count, nccl_version};
pub(crate) use probe::{require_cuda, require_nccl};
pub(crate) use staging::Pinned;

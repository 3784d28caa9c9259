//! GPU memory (feature `nccl`): the CUDA driver opened at run time, devices and their
//! streams, allocation and ordered copies. Tensors, fused stages and the NCCL backend all
//! build on it; it knows nothing of them.

mod device;
mod probe;
mod staging;

pub(crate) use device::{
    alloc_zeros, copy_ordered, dropped, gpu, set_current, take_dropped, take_stored, TRACKING,
};
pub use device::{current_device, Device};
pub use probe::{device_count, nccl_version};
pub(crate) use probe::{driver_error, require_cuda, require_nccl};
pub(crate) use staging::Pinned;

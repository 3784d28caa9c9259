//! Fused stages: one region per dtype, every value of the bucket packed into its dtype's
//! region, outputs handed out as views into it.
//!
//! What can go into a bucket is [`Bucketable`]; [`Gather`] and [`Scatter`] add what
//! `allgather` and `reducescatter` need to build a result of another length
//! (`traits.rs`). `region.rs` lays the values out, `stage.rs` drives a stage through its
//! sequence, and `device.rs` is its device mode.

#[cfg(feature = "nccl")]
mod device;
mod region;
mod stage;
mod traits;

#[cfg(feature = "nccl")]
pub(crate) use device::DevRegion;
pub use region::SlotIdx;
pub use stage::FusedStage;
pub use traits::{Bucketable, Gather, Reduced, Scatter};

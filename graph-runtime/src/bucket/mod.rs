//! Fused stages: one region per dtype, every value of the bucket packed into its dtype's
//! region, outputs handed out as views into it.
//!
//! What can go into a bucket is [`Bucketable`]; [`Gather`] and [`Scatter`] add what
//! `allgather` and `reducescatter` need to build a result of another length
//! (`traits.rs`); a value made of several parts walks them with `parts.rs`. `region.rs`
//! lays the values out (`kept.rs` keeps the layout's lists between executions),
//! `stage.rs` drives a stage through its sequence, and `device.rs` is its device mode
//! (`no_device.rs` without a GPU backend).

#[cfg_attr(not(feature = "nccl"), path = "no_device.rs")]
mod device;
mod kept;
mod parts;
#[cfg(all(test, not(loom)))]
mod proptests;
mod region;
mod stage;
mod traits;

pub use parts::{Hand, Layout, Parts};
pub use region::SlotIdx;
pub use stage::FusedStage;
pub use traits::{Bucketable, Gather, GatherList, Reduced, Scatter};

//! Fused stages: one region per dtype, every value of the bucket packed into its dtype's
//! region, outputs handed out as views into it.
//!
//! Fast: a stage is one collective launch however many values it carries, over buffers
//! that are reused while no output views them, so that a stage in steady state allocates
//! nothing; a value that holds its elements contiguously is lent to the communicator in
//! place instead of copied, and its result is a view of the stage's buffer.
//!
//! Correct: the stage runs in a fixed sequence, and a call out of order or a value whose
//! walks disagree with its layout makes `run` fail on that rank, which still takes part in
//! the stage as failed so that no peer waits; every part is checked against the slot it
//! was laid out in, so a result never views another value's elements.
//!
//! What can go into a bucket is [`Bucketable`]; [`Gather`] and [`Scatter`] add what
//! `allgather` and `reducescatter` need to build a result of another length
//! (`traits.rs`). The files, from the bottom up, each importing by path (`super::file::`)
//! only from those before it: `kept.rs` (a list kept between executions), `reduced.rs`
//! (the view of a value's result), `failure.rs` (how a failed stage reads), `region.rs`
//! (the layout: a region per dtype), `device.rs` (a stage's device buffers;
//! `no_device.rs` without a GPU backend), `stage.rs` ([`FusedStage`], its steps, and the
//! handles [`Layout`], [`Hand`] and [`Parts`] it gives a value to walk its parts with),
//! `traits.rs`, `parts.rs` (what those handles do). Through the names this file
//! re-exports, two of them also name a later one, by design: `stage.rs`'s steps are
//! generic over the traits, whose methods take its handles, and the stage's device mode
//! is an `impl FusedStage` in `device.rs`.

#[cfg_attr(not(feature = "nccl"), path = "no_device.rs")]
mod device;
mod failure;
mod kept;
mod parts;
#[cfg(all(test, not(loom)))]
mod proptests;
mod reduced;
mod region;
mod stage;
mod traits;

pub use reduced::Reduced;
pub use region::SlotIdx;
pub use stage::{FusedStage, Hand, Layout, Parts};
pub use traits::{Bucketable, Gather, GatherList, Scatter};

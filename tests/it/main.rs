//! The integration tests, one binary for all of them so that the crate is linked once:
//! one module per area, and what they share in `tests/support/`.
//!
//! Apart, in binaries of their own: the allocation tests (`tests/alloc/`, whose counting
//! global allocator would see every other test's allocations), the cases that must sit at
//! a crate's root (`tests/hygiene.rs`, `tests/impl_elsewhere.rs`), trybuild
//! (the package `tests/ui/`, which builds its cases without features), and the NCCL tests
//! that `scripts/gpu-check.sh` builds by name.

#[path = "../support/mod.rs"]
mod support;

mod actor_types;
mod actors;
mod allreduce;
mod async_exec;
mod attach;
mod collectives;
mod each;
mod failures;
mod groups;
mod helping;
#[cfg(feature = "candle")]
mod interop_candle;
#[cfg(feature = "ndarray")]
mod interop_ndarray;
mod overlap;
mod packaging;
mod parts;
mod per_rank;
mod pipeline;
mod rank_ctx;
mod readme;
mod real_graphs;
mod reduce_ops;
mod sizes;
mod soundness;
mod stress;
mod threads;

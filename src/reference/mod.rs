//! The reference: everything a graph author can write and everything the runtime reports,
//! each page with examples that run as doc tests.
//!
//! | page | what it holds |
//! | --- | --- |
//! | [`grammar`] | the `graph!` language: groups, inputs, calls, outputs, several groups, the schedule |
//! | [`actors`] | which methods of an `#[actor]` block are graph nodes; where actors are made |
//! | [`generated`] | the API `graph!` generates: launch, execute, pipelining, async, teardown, DOT |
//! | [`collectives`] | the five collectives, the values they take, element types and reduce ops |
//! | [`errors`] | every compile-time and run-time error |
//! | [`failures`] | failure semantics: agreement, root causes, timeouts, teardown, soundness |
//! | `nccl` | the NCCL backend: GPUs, device tensors, requirements, the GPU check (feature `nccl`) |
//! | `ndarray` | ndarray arrays in buckets; zero-copy conversions with `Tensor` (feature `ndarray`) |
//! | `candle` | candle tensors (CPU) in buckets (feature `candle`) |
//! | `mpi` | graphs whose actors span processes and machines, over MPI (feature `mpi`) |
//! | `tracing` | spans per execution, actor step, method call and fused stage; a Chrome trace timeline (feature `tracing`) |
//!
//! These modules hold documentation only.

#[doc = include_str!("grammar.md")]
pub mod grammar {}

#[doc = include_str!("actors.md")]
pub mod actors {}

#[doc = include_str!("generated.md")]
pub mod generated {}

#[doc = include_str!("collectives.md")]
pub mod collectives {}

#[doc = include_str!("errors.md")]
pub mod errors {}

#[doc = include_str!("failures.md")]
pub mod failures {}

#[cfg(feature = "nccl")]
#[doc = include_str!("../../docs/nccl.md")]
pub mod nccl {}

#[cfg(feature = "ndarray")]
#[doc = include_str!("ndarray.md")]
pub mod ndarray {}

#[cfg(feature = "candle")]
#[doc = include_str!("candle.md")]
pub mod candle {}

#[cfg(feature = "mpi")]
#[doc = include_str!("mpi.md")]
pub mod mpi {}

#[cfg(feature = "tracing")]
#[doc = include_str!("tracing.md")]
pub mod tracing {}

//! # actorgraph
//!
//! Typed, compiled actor graphs with fused collectives.
//!
//! `#[actor]` on an `impl` block turns its methods into graph nodes; `graph!` declares a
//! static graph of actor groups, inputs, method calls and collectives, checks it at
//! compile time and generates its type. Every collective becomes one fused stage: all of
//! an actor's values packed into one flat buffer per dtype, one collective over it, and
//! the outputs handed back as views into it. A runtime hosts the actors, one thread each,
//! and their communicators: [`Cpu`] (shared memory, no set-up), with the feature `nccl`,
//! NCCL on GPUs, and with the feature `mpi`, MPI between processes and machines.
//!
//! ```
//! use actorgraph::prelude::*;
//!
//! struct Worker { rank: usize }
//!
//! #[actor]
//! impl Worker {
//!     fn comp1(&mut self, _x: &Tensor<f32>) -> Tensor<f32> { Tensor::full([4], 1.0) }
//!     fn comp2(&mut self, _x: &Tensor<f32>) -> Tensor<f32> { Tensor::full([2], 2.0) }
//! }
//!
//! graph! {
//!     /// Both outputs of every worker, summed across workers by one collective.
//!     pub Bucketed(workers: [Worker], x: Tensor<f32>) {
//!         let c1 = workers.comp1(x);
//!         let c2 = workers.comp2(x);
//!         allreduce([c1, c2])
//!     }
//! }
//!
//! fn main() -> Result<(), actorgraph::Error> {
//!     let workers: Vec<Worker> = (0..4).map(|rank| Worker { rank }).collect();
//!     let mut g = Bucketed::launch(workers, Cpu)?;
//!     let out: Vec<(Tensor<f32>, Tensor<f32>)> = g.execute(Tensor::zeros([1]))?;
//!     assert_eq!(out[2].0.to_vec(), vec![4.0; 4]);
//!     assert_eq!(out[2].1.to_vec(), vec![8.0; 2]);
//!     let workers: Vec<Worker> = g.teardown()?;
//!     assert_eq!(workers[3].rank, 3);
//!     Ok(())
//! }
//! ```
//!
//! `execute` returns one output per actor, indexed by rank: here a tuple, because the
//! collective took a list. Nothing of the graph's shape is checked at run time that the
//! compiler could check: a misspelt name, a method the actor lacks, a value that cannot be
//! reduced or a reduce op given to `allgather` are compile errors at the user's tokens.
//!
//! # Reference
//!
//! The [`reference`](mod@reference) pages hold the full rules, each with examples that run
//! as doc tests:
//!
//! - [`reference::grammar`]: the `graph!` language, several groups and the schedule;
//! - [`reference::actors`]: what `#[actor]` makes a graph node, and where actors are made;
//! - [`reference::generated`]: `launch`, `execute`, `submit`/`wait`, the async variants,
//!   `in_flight`, `teardown`, `to_dot`;
//! - [`reference::collectives`]: the collectives, [`Bucketable`], [`Gather`], [`Scatter`],
//!   [`Tensor`], element types and [`ReduceOp`]s;
//! - [`reference::errors`]: every compile-time and run-time error;
//! - [`reference::failures`]: what a failure does to the graph, timeouts, teardown.
//!
//! With the feature `nccl`, the `nccl` module and its reference page
//! (`reference::nccl`) describe the GPU backend; with the feature `mpi`, the `mpi` module
//! and `reference::mpi` describe graphs that span processes.
//! With the feature `tracing`, the runtime opens `tracing` spans per execution, actor step,
//! method call and fused stage (`reference::tracing`).
#![warn(missing_docs)]

/// Reference: [`reference::actors`] (which methods become graph nodes, and where actors
/// are made).
///
// (rustdoc puts these lines before the macro's own docs, from `graph-macros`.)
pub use actorgraph_macros::actor;

/// Reference: [`reference::grammar`] (the language), [`reference::generated`] (the API
/// of the generated type), [`reference::errors`] (what it reports).
///
// (rustdoc puts these lines before the macro's own docs, from `graph-macros`.)
pub use actorgraph_macros::graph;

pub use actorgraph_runtime::*;

/// Derives [`Bucketable`](trait@Bucketable) for a struct; see the reference,
/// [`reference::collectives`].
///
// (rustdoc puts these lines before the macro's own docs, from `graph-macros`.)
pub use actorgraph_macros::Bucketable;
/// Derives [`Gather`](trait@Gather) for a struct.
pub use actorgraph_macros::Gather;
/// Derives [`Scatter`](trait@Scatter) for a struct.
pub use actorgraph_macros::Scatter;

pub mod reference;

/// Everything a graph author needs: the macros, tensors, backends, reduce ops and the
/// traits of the values collectives take.
pub mod prelude {
    pub use crate::{
        actor, graph, Actors, Backend, Bucketable, Cpu, Ctx, Error, Gather, LaunchOptions,
        ReduceOp, Scatter, Tensor, Ticket,
    };
}
// The README's example is compiled and run with the other doc tests, so what the README
// shows a newcomer works as written.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

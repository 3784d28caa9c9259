//! # actorgraph
//!
//! Typed, compiled actor graphs with fused collectives.
//!
//! `#[actor]` on an `impl` block turns its methods into graph nodes; `graph!` declares a
//! static graph of actor groups, inputs, method calls and collectives, checks it at
//! compile time and generates its type. Every collective becomes one fused stage: all of
//! an actor's values packed into one flat buffer, one collective over it, and the outputs
//! handed back as views into it.
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
//!     let mut g = Bucketed::launch(workers, Cpu::default())?;
//!     let out: Vec<(Tensor<f32>, Tensor<f32>)> = g.execute(Tensor::zeros([1]))?;
//!     assert_eq!(out[2].0.to_vec(), vec![4.0; 4]);
//!     assert_eq!(out[2].1.to_vec(), vec![8.0; 2]);
//!     let workers: Vec<Worker> = g.teardown()?;
//!     assert_eq!(workers[3].rank, 3);
//!     Ok(())
//! }
//! ```
//!
//! # Actors
//!
//! `#[actor]` goes on one inherent `impl` block of a type, generic or not, in any module
//! or crate. A graph names the type however it is in scope: `[Worker]`,
//! `[crate::types::Worker]`, `[W]` after `use model::Worker as W;`, `[Worker<f32>]`.
//!
//! A method of the block is a graph node when it takes `&self` or `&mut self`, its other
//! arguments as `&T` or `T` (a `T` holding no reference or lifetime), and returns a value
//! (of a type without a lifetime; `Result<T, E>` makes it fallible, the graph sees `T`).
//! Every other method is left as it is written, an ordinary method, so helpers can sit
//! beside the graph methods: associated functions (no `self`), methods that take `self` by
//! value, generic, `async` or `unsafe` methods, methods with a `where` clause, with a `&mut`
//! or `impl Trait` argument, or returning a reference, an `impl Trait` or a type with a
//! lifetime. A graph that calls one gets a compile error at the call saying why it cannot
//! be a node. Likewise a node's by-value parameters must be `Clone` (the graph's value is
//! cloned into the call) and a fallible node's error must convert into
//! `Box<dyn Error + Send + Sync>`, and a graph that calls a method that falls short gets the
//! unmet bound as its error. A type has one `#[actor]` block.
//!
//! An actor type need not be `Send`: actors built on their own threads
//! (`Actors::each`) may hold an `Rc` or a thread-bound handle. Actors given ready to
//! `launch` (a `Vec`, an array) move to their threads, so they must be `Send`, and so must
//! the actors `teardown` hands back. Values that leave their actor (the graph's output,
//! values that other actors read) must be `Send`; a value used only on its own actor need
//! not be.
//!
//! ```
//! use actorgraph::prelude::*;
//!
//! mod model {
//!     pub struct Worker<T> {
//!         pub weights: Vec<T>,
//!     }
//! }
//!
//! use model::Worker as W;
//!
//! #[actor]
//! impl<T: actorgraph::Element> W<T> {
//!     /// A node: the graph calls it.
//!     fn grad(&mut self) -> Tensor<T> {
//!         Tensor::from_slice(&self.weights)
//!     }
//!     /// Helpers: ordinary methods, which no graph can call.
//!     fn new(weights: Vec<T>) -> Self {
//!         W { weights }
//!     }
//!     fn weights(&self) -> &[T] {
//!         &self.weights
//!     }
//! }
//!
//! graph! {
//!     Sum(workers: [W<i64>]) {
//!         let g = workers.grad();
//!         allreduce(g)
//!     }
//! }
//!
//! let workers = vec![W::new(vec![1, 2]), W::new(vec![10, 20])];
//! assert_eq!(workers[1].weights(), &[10, 20]);
//! let mut g = Sum::launch(workers, Cpu)?;
//! let out: Vec<Tensor<i64>> = g.execute()?;
//! assert_eq!(out[0].to_vec(), vec![11, 22]);
//! # Ok::<(), actorgraph::Error>(())
//! ```
//!
//! See the README for the grammar of `graph!`, the generated API and the errors.
#![warn(missing_docs)]

pub use graph_macros::{actor, graph};
pub use graph_runtime::*;

/// Everything a graph author needs: the macros, tensors, backends, reduce ops and the
/// traits of the values collectives take.
pub mod prelude {
    pub use crate::{
        actor, graph, Actors, Backend, Bucketable, Cpu, Error, Gather, LaunchOptions, ReduceOp,
        Scatter, Tensor, Ticket,
    };
}

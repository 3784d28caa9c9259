//! Procedural macros of actorgraph: `#[actor]` describes an actor's methods, `graph!`
//! compiles a static graph of them. Use them through the `actorgraph` crate, whose
//! reference (`actorgraph::reference`) holds the grammar and the rules.

mod actor;
mod derive;
mod diag;
mod graph;
mod respan;
mod rt;

use proc_macro::TokenStream;

/// Makes the methods of an inherent `impl` block (generic or not) callable from a
/// `graph!`: each method that takes `&self` or `&mut self` and plain arguments becomes a
/// graph node; the others stay ordinary methods, and a graph that calls one gets an error
/// saying why it cannot be a node. The rules are in `actorgraph::reference::actors`.
#[proc_macro_attribute]
pub fn actor(attr: TokenStream, item: TokenStream) -> TokenStream {
    actor::expand(attr.into(), item.into()).into()
}

/// Declares a static actor graph, checks it, and generates its type.
#[proc_macro]
pub fn graph(input: TokenStream) -> TokenStream {
    graph::expand(input.into()).into()
}

/// Derives `Bucketable` for a struct: each field (a tensor, a scalar, a `Vec`, an array,
/// another derived struct) is a part of the value, in its own dtype's region of the stage,
/// read in place where it can be; the result is the struct of the fields' results, views
/// of the stage's buffer for tensors. See `actorgraph::Bucketable`.
#[proc_macro_derive(Bucketable)]
pub fn derive_bucketable(input: TokenStream) -> TokenStream {
    derive::bucketable(input.into()).into()
}

/// Derives `Gather` (and `GatherList`) for a struct whose fields each gather into their
/// own type (tensors, arrays): the gathered struct holds each field gathered on its own.
#[proc_macro_derive(Gather)]
pub fn derive_gather(input: TokenStream) -> TokenStream {
    derive::gather(input.into()).into()
}

/// Derives `Scatter` for a struct whose fields each scatter (tensors, arrays, `Vec`s):
/// each field is split along its rows on its own.
#[proc_macro_derive(Scatter)]
pub fn derive_scatter(input: TokenStream) -> TokenStream {
    derive::scatter(input.into()).into()
}

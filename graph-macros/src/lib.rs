//! Procedural macros of actorgraph: `#[actor]` describes an actor's methods, `graph!`
//! compiles a static graph of them. Use them through the `actorgraph` crate, whose
//! reference (`actorgraph::reference`) holds the grammar and the rules.

mod actor;
mod diag;
mod graph;
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

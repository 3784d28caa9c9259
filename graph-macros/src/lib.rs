//! Procedural macros of actorgraph: `#[actor]` describes an actor's methods, `graph!`
//! compiles a static graph of them. Use them through the `actorgraph` crate, whose docs
//! show the full grammar.

mod actor;
mod diag;
mod graph;

use proc_macro::TokenStream;

/// Makes every `&self`/`&mut self` method of an inherent `impl` block callable from a
/// `graph!`.
#[proc_macro_attribute]
pub fn actor(attr: TokenStream, item: TokenStream) -> TokenStream {
    actor::expand(attr.into(), item.into()).into()
}

/// Declares a static actor graph, checks it, and generates its type.
#[proc_macro]
pub fn graph(input: TokenStream) -> TokenStream {
    graph::expand(input.into()).into()
}

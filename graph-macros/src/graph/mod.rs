//! `graph!`, one file per stage: `parse` (syn AST, spans kept) -> `lower` into the IR of
//! `ir` (values and ops keyed by index), checking as it goes (every error collected with
//! its span in a `Diag`), with the types it cannot know spelled by `types` -> `schedule`
//! (edges between actors, one order for every actor) -> codegen (the graph's type, a step
//! per actor group, its DOT picture). On error the graph still expands to its struct with
//! the right methods, so the user sees the real errors and not a wall of secondary ones.

mod codegen;
mod doc;
mod dot;
mod fallback;
mod ir;
mod lower;
mod ops;
mod parse;
mod plan;
mod schedule;
mod stage;
mod step;
#[cfg(test)]
mod tests;
mod types;

use proc_macro2::TokenStream;
use quote::quote;

use crate::diag::Diag;

pub(crate) fn expand(input: TokenStream) -> TokenStream {
    let defs = match syn::parse2::<parse::Graphs>(input) {
        Ok(defs) => defs,
        Err(e) => return e.to_compile_error(),
    };
    defs.0
        .iter()
        .map(|def| {
            let mut diag = Diag::default();
            let graph = lower::lower(def, &mut diag);
            match graph {
                Some(graph) if diag.is_empty() => codegen::expand(&graph),
                _ => {
                    let errors = diag.to_tokens();
                    let fallback = fallback::expand(def);
                    quote!(#errors #fallback)
                }
            }
        })
        .collect()
}

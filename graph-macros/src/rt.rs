//! The one path by which generated code reaches the runtime. Every other path the macros
//! emit starts with `::core::`, so that a user crate that shadows prelude names (`Result`,
//! `Vec`, a `mod std`) or has no prelude (`#![no_implicit_prelude]`) compiles the same.

use proc_macro2::TokenStream;
use quote::quote;

/// `::actorgraph::__private`.
pub(crate) fn path() -> TokenStream {
    quote!(::actorgraph::__private)
}

/// The name of [`path`] inside a graph's `const _: () = { .. };` block, which imports it
/// (`import`) as serde_derive does: every item of a graph but its struct is in that block,
/// where this short name cannot clash with a user's (it starts with `__`, and the block's
/// names are seen by nothing outside it).
pub(crate) fn local() -> TokenStream {
    quote!(__rt)
}

/// The import of [`path`] as [`local`], first in a graph's block, with the traits whose
/// associated functions generated code calls (`Actors::from`, `LaunchOptions::default`)
/// and those of `travel::Probe`'s autoref specialization in scope without a name (a
/// user's module may have no prelude).
pub(crate) fn import() -> TokenStream {
    let (path, local) = (path(), local());
    quote!(use #path::{self as #local, Default as _, From as _, NoTravel as _, ViaSerde as _, ViaTravel as _};)
}

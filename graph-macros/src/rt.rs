//! The one path by which generated code reaches the runtime. Every other path the macros
//! emit starts with `::core::`, so that a user crate that shadows prelude names (`Result`,
//! `Vec`, a `mod std`) or has no prelude (`#![no_implicit_prelude]`) compiles the same.

use proc_macro2::TokenStream;
use quote::quote;

/// `::actorgraph::__private`.
pub(crate) fn path() -> TokenStream {
    quote!(::actorgraph::__private)
}

//! Error collection: a macro reports every error it finds in one pass, each at the user's
//! tokens, instead of stopping at the first.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;

#[derive(Default)]
pub(crate) struct Diag {
    errors: Vec<syn::Error>,
}

impl Diag {
    pub(crate) fn error(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.errors.push(syn::Error::new(span, msg));
    }

    /// An error spanning all of `tokens`.
    pub(crate) fn error_at(&mut self, tokens: impl ToTokens, msg: impl std::fmt::Display) {
        self.errors.push(syn::Error::new_spanned(tokens, msg));
    }

    pub(crate) fn push(&mut self, e: syn::Error) {
        self.errors.push(e);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    /// One `compile_error!` per error.
    pub(crate) fn to_tokens(&self) -> TokenStream {
        self.errors
            .iter()
            .map(syn::Error::to_compile_error)
            .collect()
    }
}

/// A type or expression as a person writes it, from its token string.
pub(crate) fn tidy(s: &str) -> String {
    let mut t = s.to_string();
    for (from, to) in [
        (" < ", "<"),
        ("< ", "<"),
        (" <", "<"),
        (" >", ">"),
        (" :: ", "::"),
        (":: ", "::"),
        (" ,", ","),
        ("& ", "&"),
        ("( ", "("),
        (" )", ")"),
        ("[ ", "["),
        (" ]", "]"),
        (" ;", ";"),
        (" . ", "."),
        (" :", ":"),
    ] {
        t = t.replace(from, to);
    }
    t
}

//! Token helpers: spans moved onto the user's tokens, so that a diagnostic about generated
//! code points at what the user wrote (the way serde_derive's `respan.rs` does).

use proc_macro2::{Ident, Span, TokenStream};

/// `tokens` with every token located at `at` (keeping each token's hygiene), so that a
/// diagnostic about any part of them points at `at`.
pub(crate) fn respan(tokens: TokenStream, at: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tt| {
            if let proc_macro2::TokenTree::Group(g) = &tt {
                let mut inner = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), at));
                inner.set_span(g.span().located_at(at));
                tt = proc_macro2::TokenTree::Group(inner);
            } else {
                tt.set_span(tt.span().located_at(at));
            }
            tt
        })
        .collect()
}

/// `tokens` with its first and last token located at `at`: a type so changed spans `at`
/// as a whole in diagnostics, while the tokens inside keep their own spans.
pub(crate) fn respan_ends(tokens: TokenStream, at: Span) -> TokenStream {
    let mut tts: Vec<proc_macro2::TokenTree> = tokens.into_iter().collect();
    let last = tts.len().saturating_sub(1);
    for i in [0, last] {
        if let Some(tt) = tts.get_mut(i) {
            tt.set_span(tt.span().located_at(at));
        }
    }
    tts.into_iter().collect()
}

/// `ident` located at the user's argument `at`, so that a type error on it points there
/// and not at the value's definition; its hygiene stays that of `ident`.
pub(crate) fn at_user(ident: &Ident, at: Span) -> Ident {
    let mut ident = ident.clone();
    ident.set_span(ident.span().located_at(at));
    ident
}

//! `#[actor]`: parse the impl block into a model of its methods, then emit, next to the
//! untouched block, the description `graph!` reads (see `expand`).

mod expand;
mod model;

use proc_macro2::TokenStream;
use quote::quote;

use crate::diag::Diag;

pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut diag = Diag::default();
    if !attr.is_empty() {
        diag.error_at(&attr, "`#[actor]` takes no arguments");
    }
    let imp = match syn::parse2::<syn::Item>(item.clone()) {
        Ok(syn::Item::Impl(imp)) => imp,
        Ok(other) => {
            diag.error_at(
                item_head(&other),
                "`#[actor]` goes on an inherent `impl` block, e.g. `#[actor] impl Worker { .. }`",
            );
            let errors = diag.to_tokens();
            return quote!(#errors #item);
        }
        Err(e) => {
            diag.push(e);
            let errors = diag.to_tokens();
            return quote!(#errors #item);
        }
    };
    if let Some((_, path, _)) = &imp.trait_ {
        diag.error_at(
            path,
            "`#[actor]` goes on an inherent `impl` block, not on a trait impl",
        );
        let errors = diag.to_tokens();
        return quote!(#errors #imp);
    }
    // Keep the user's impl whatever happens, and describe it even after an error in the
    // attribute, so that graphs using the type report nothing more.
    let errors = diag.to_tokens();
    let generated = expand::expand(&model::Actor::from_impl(&imp));
    quote!(#errors #imp #generated)
}

/// The tokens that name an item (for an error span that does not cover its whole body).
fn item_head(item: &syn::Item) -> TokenStream {
    use quote::ToTokens;
    match item {
        syn::Item::Fn(f) => f.sig.to_token_stream(),
        syn::Item::Struct(s) => {
            let (k, i) = (&s.struct_token, &s.ident);
            quote!(#k #i)
        }
        syn::Item::Enum(e) => {
            let (k, i) = (&e.enum_token, &e.ident);
            quote!(#k #i)
        }
        syn::Item::Trait(t) => {
            let (k, i) = (&t.trait_token, &t.ident);
            quote!(#k #i)
        }
        syn::Item::Mod(m) => {
            let (k, i) = (&m.mod_token, &m.ident);
            quote!(#k #i)
        }
        other => other.to_token_stream(),
    }
}

//! `#[actor]`: parse the impl block into a model of its methods, then emit, next to the
//! untouched block, a marker type per method and a `Method<marker>` impl that describes
//! its arguments and output to `graph!`.

mod expand;
pub(crate) use expand::marker_module;
mod model;

use proc_macro2::TokenStream;
use quote::quote;

use crate::diag::Diag;

pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut diag = Diag::default();
    if let Some(first) = attr.clone().into_iter().next() {
        diag.error_at(&attr, "`#[actor]` takes no arguments");
        let _ = first;
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
    let model = model::Actor::from_impl(&imp, &mut diag);
    let errors = diag.to_tokens();
    // Keep the user's impl whatever happens, so their other code still resolves.
    let generated = model.map(|m| expand::expand(&m)).unwrap_or_default();
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

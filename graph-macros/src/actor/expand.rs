//! Code emitted for an `#[actor]` model.

use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};

use super::model::Actor;

/// The name of the module holding an actor's method markers; `graph!` derives the same
/// name from the actor type it is given.
pub(crate) fn marker_module(actor: &Ident) -> Ident {
    format_ident!("__actorgraph_{}", actor)
}

pub(crate) fn expand(actor: &Actor) -> TokenStream {
    let module = marker_module(&actor.ident);
    let self_ty = &actor.self_ty;
    let markers = actor.methods.iter().map(|m| {
        let ident = &m.ident;
        quote_spanned!(ident.span()=> pub struct #ident;)
    });
    let lt = syn::Lifetime::new("'__ag", Span::call_site());
    let impls = actor.methods.iter().map(|m| {
        let ident = &m.ident;
        let name = ident.to_string();
        let output = &m.output;
        let arg_tys = m.params.iter().map(|p| {
            let ty = &p.ty;
            quote!(&#lt #ty)
        });
        let bindings: Vec<Ident> = (0..m.params.len())
            .map(|i| format_ident!("__a{}", i))
            .collect();
        let pass = m.params.iter().zip(&bindings).map(|(p, b)| {
            if p.by_value {
                let ty = &p.ty;
                quote_spanned!(ty.span_hack()=> <#ty as ::core::clone::Clone>::clone(#b))
            } else {
                quote!(#b)
            }
        });
        let call = quote!(<#self_ty>::#ident(self, #(#pass),*));
        let body = if m.fallible {
            quote!(::actorgraph::__private::into_result(#call))
        } else {
            quote!(::core::result::Result::Ok(#call))
        };
        quote! {
            impl ::actorgraph::__private::Method<#module::#ident> for #self_ty {
                type Args<#lt> = (#(#arg_tys,)*);
                type Output = #output;
                const NAME: &'static str = #name;
                #[inline]
                fn call(
                    &mut self,
                    (#(#bindings,)*): Self::Args<'_>,
                ) -> ::core::result::Result<Self::Output, ::actorgraph::__private::BoxError> {
                    #body
                }
            }
        }
    });
    quote! {
        #[doc(hidden)]
        #[allow(non_snake_case, non_camel_case_types, dead_code)]
        pub mod #module {
            #(#markers)*
        }
        #(#impls)*
    }
}

/// The span of a type's first token (`syn::Type` has no single span on stable).
trait SpanHack {
    fn span_hack(&self) -> Span;
}

impl SpanHack for syn::Type {
    fn span_hack(&self) -> Span {
        syn::spanned::Spanned::span(self)
    }
}

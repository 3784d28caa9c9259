//! Code emitted for an `#[actor]` model: an `Actor` impl listing every method, and for
//! each graph node `K` (its position in that list) a `Signature<MethodId<K>>` impl (its
//! argument and output types) and a `Method<MethodId<K>>` impl (the call). Nothing is
//! named after the type: `graph!` finds a method by asking `Actor::METHODS`, so the type
//! may be generic, imported under another name, or defined in another crate.

use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};

use super::model::{Actor, Node};
use crate::rt;

pub(crate) fn expand(actor: &Actor) -> TokenStream {
    let rt = rt::path();
    let self_ty = &actor.self_ty;
    let (impl_generics, _, where_clause) = actor.generics.split_for_impl();
    let preds: Vec<&syn::WherePredicate> =
        where_clause.iter().flat_map(|w| &w.predicates).collect();
    let infos = actor.methods.iter().map(|m| {
        let name = m.ident.to_string();
        match &m.node {
            Ok(node) => {
                let (text, arity) = (&node.text, node.params.len());
                quote!(#rt::MethodInfo::node(#name, #text, #arity))
            }
            Err(reason) => quote!(#rt::MethodInfo::other(#name, #reason)),
        }
    });
    let impls = actor.methods.iter().enumerate().filter_map(|(k, m)| {
        let node = m.node.as_ref().ok()?;
        let id = quote!(#rt::MethodId<#k>);
        let cfgs = &m.cfgs;
        let lt = syn::Lifetime::new("'__ag", Span::call_site());
        let arg_tys = node.params.iter().map(|p| {
            let ty = &p.ty;
            quote!(&#lt #ty)
        });
        let output = &node.output;
        let name = m.ident.to_string();
        let call_preds = call_bounds(node);
        let body = call_body(self_ty, &m.ident, node);
        let bindings = (0..node.params.len()).map(|i| format_ident!("__a{}", i));
        Some(quote! {
            #(#cfgs)*
            #[doc(hidden)]
            impl #impl_generics #rt::Signature<#id> for #self_ty #where_clause {
                type Args<#lt> = (#(#arg_tys,)*) where Self: #lt;
                type Output = #output;
            }
            #(#cfgs)*
            #[doc(hidden)]
            impl #impl_generics #rt::Method<#id> for #self_ty
            where
                #(#preds,)*
                #(#call_preds,)*
            {
                const NAME: &'static ::core::primitive::str = #name;
                #[inline]
                fn call<#lt>(
                    &mut self,
                    (#(#bindings,)*): <Self as #rt::Signature<#id>>::Args<#lt>,
                ) -> ::core::result::Result<<Self as #rt::Signature<#id>>::Output, #rt::BoxError>
                where
                    Self: #lt,
                {
                    #body
                }
            }
        })
    });
    // Hidden from rustdoc, as every impl the macros emit: they are the graphs' plumbing,
    // not the actor's API, and would fill its page with `__` names and projections.
    quote! {
        #[doc(hidden)]
        impl #impl_generics #rt::Actor for #self_ty #where_clause {
            const METHODS: &'static [#rt::MethodInfo] = &[#(#infos),*];
        }
        #(#impls)*
    }
}

/// What calling a node needs beyond its signature: every by-value parameter is `Clone`
/// (the graph's value is cloned into the call) and a fallible method's result converts.
/// Each is a `for<'_>` bound, so that a method that does not satisfy it still compiles,
/// as a helper, and only a graph that calls it gets the unmet bound as its error.
fn call_bounds(node: &Node) -> Vec<TokenStream> {
    let rt = rt::path();
    let mut preds: Vec<TokenStream> = node
        .params
        .iter()
        .filter(|p| p.by_value)
        .map(|p| {
            let ty = &p.ty;
            quote_spanned!(span_of(ty)=> for<'__ag> #ty: ::core::clone::Clone)
        })
        .collect();
    if let Some(ret) = &node.fallible {
        let ok = &node.output;
        preds.push(quote_spanned!(span_of(ret)=> for<'__ag> #ret: #rt::Fallible<Ok = #ok>));
    }
    preds
}

/// `<Self>::method(self, args..)`, each by-value argument cloned, as the result
/// `Method::call` returns.
fn call_body(self_ty: &syn::Type, method: &Ident, node: &Node) -> TokenStream {
    let rt = rt::path();
    let pass = node.params.iter().enumerate().map(|(i, p)| {
        let b = format_ident!("__a{}", i);
        if p.by_value {
            let ty = &p.ty;
            quote_spanned!(span_of(ty)=> <#ty as ::core::clone::Clone>::clone(#b))
        } else {
            quote!(#b)
        }
    });
    let call = quote!(<#self_ty>::#method(self, #(#pass),*));
    if node.fallible.is_some() {
        quote!(#rt::Fallible::into_result(#call))
    } else {
        quote!(::core::result::Result::Ok(#call))
    }
}

/// The span of a type's first token (`syn::Type` has no single span on stable).
fn span_of(ty: &syn::Type) -> Span {
    ty.to_token_stream()
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |t| t.span())
}

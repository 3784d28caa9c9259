//! What a graph with errors expands to (as thiserror's `fallback.rs` does): the graph's
//! struct with every public item of the real one, so that code using the graph type-checks
//! and the user sees only the graph's own errors, not a wall of secondary ones.

use proc_macro2::{Ident, TokenStream};
use quote::{format_ident, quote};

use super::codegen::{launch_param, output_alias};
use super::parse::GraphDef;
use crate::rt;

/// What a graph with errors expands to: its struct with every item of the real one, with
/// signatures that accept whatever the caller does (an output type it infers, the actor
/// types as declared), so that the only errors shown are the graph's own.
pub(crate) fn expand(def: &GraphDef) -> TokenStream {
    let (path, rt) = (rt::path(), rt::local());
    let (attrs, vis, name) = (&def.attrs, &def.vis, &def.name);
    let groups: Vec<(&Ident, Option<&syn::Type>, Option<&syn::Expr>)> = def
        .params
        .iter()
        .filter_map(|p| {
            let (actor, size) = p.group.as_ref()?;
            let actor = matches!(actor, syn::Type::Path(_)).then_some(actor);
            Some((&p.name, actor, size.as_ref()))
        })
        .collect();
    let params = |ready| -> Vec<TokenStream> {
        groups
            .iter()
            .map(|&(n, a, size)| launch_param(n, a, size, ready))
            .collect()
    };
    let (group_params, actors_params) = (params(true), params(false));
    let inputs: Vec<TokenStream> = def
        .params
        .iter()
        .filter(|p| p.group.is_none())
        .map(|p| {
            let (n, ty) = (&p.name, p.execute_ty());
            quote!(#n: #ty)
        })
        .collect();
    let group_names = groups.iter().map(|(n, ..)| n.to_string());
    // Teardown's types are known from the groups alone, so code that uses them infers.
    let actor_ty = |a: Option<&syn::Type>| match a {
        Some(a) => quote!(#a),
        None => quote!(_),
    };
    let vecs: Vec<TokenStream> = groups
        .iter()
        .map(|&(_, a, size)| {
            let a = actor_ty(a);
            match size {
                Some(len) => quote!([#a; #len]),
                None => quote!(#rt::Vec<#a>),
            }
        })
        .collect();
    let eaches: Vec<TokenStream> = groups
        .iter()
        .map(|&(_, a, _)| {
            let a = actor_ty(a);
            quote!(#rt::Vec<#rt::Result<#a, #rt::Error>>)
        })
        .collect();
    let all_known = groups.iter().all(|(_, a, _)| a.is_some());
    let (torn, each) = match (vecs.len(), all_known) {
        (1, true) => (vecs[0].clone(), eaches[0].clone()),
        (_, true) => (quote!((#(#vecs),*)), quote!((#(#eaches),*))),
        // `_` cannot be a return type: an unknown actor type leaves the caller to say.
        (_, false) => (quote!(__T), quote!(__T)),
    };
    let generic = (!all_known).then(|| quote!(<__T>));
    // `each_<group>` with the closure's actor type known where the group's is, so that the
    // closure's body is checked as it will be once the graph compiles.
    let each_methods = groups.iter().map(|&(n, a, _)| {
        let (each, try_each) = (format_ident!("each_{}", n), format_ident!("try_each_{}", n));
        let (a, param) = match a {
            Some(a) => (quote!(#a), quote!()),
            None => (quote!(__A), quote!(__A,)),
        };
        quote! {
            /// Not available: the graph has errors.
            pub fn #each<#param __R, __F: ::core::ops::Fn(#rt::Ctx, &mut #a) -> __R>(&mut self, f: __F) -> #rt::Result<#rt::Vec<__R>, #rt::Error> {
                ::core::unreachable!()
            }
            /// Not available: the graph has errors.
            pub fn #try_each<#param __R, __E, __F: ::core::ops::Fn(#rt::Ctx, &mut #a) -> #rt::Result<__R, __E>>(&mut self, f: __F) -> #rt::Result<#rt::Vec<__R>, #rt::Error> {
                ::core::unreachable!()
            }
        }
    });
    let out = quote!(#rt::Result<#rt::Vec<__O>, #rt::Error>);
    let alias = output_alias(name);
    quote! {
        #(#attrs)*
        #vis struct #name {
            __graph_has_errors: (),
        }

        /// Not available: the graph has errors.
        #vis type #alias = ();

        // As the real expansion, in a block that names the runtime `__rt`.
        const _: () = {
            use #path as #rt;

            #[allow(unused_variables, clippy::all)]
            impl #name {
                /// The actor groups of this graph, in declaration order.
                pub const GROUPS: &[&::core::primitive::str] = &[#(#group_names),*];
                /// Not available: the graph has errors.
                pub const FINGERPRINT: ::core::primitive::u64 = 0;
                /// Not available: the graph has errors.
                pub fn launch(#(#group_params,)* backend: impl ::core::marker::Sized) -> #rt::Result<Self, #rt::Error> {
                    ::core::unreachable!()
                }
                /// Not available: the graph has errors.
                pub fn launch_with(#(#group_params,)* backend: impl ::core::marker::Sized, options: #rt::LaunchOptions) -> #rt::Result<Self, #rt::Error> {
                    ::core::unreachable!()
                }
                /// Not available: the graph has errors.
                pub fn launch_actors(#(#actors_params,)* backend: impl ::core::marker::Sized, options: #rt::LaunchOptions) -> #rt::Result<Self, #rt::Error> {
                    ::core::unreachable!()
                }
                /// Not available: the graph has errors.
                pub fn execute<__O>(&mut self, #(#inputs),*) -> #out {
                    ::core::unreachable!()
                }
                /// Not available: the graph has errors.
                pub fn execute_timeout<__O>(&mut self, #(#inputs,)* timeout: #rt::Duration) -> #out {
                    ::core::unreachable!()
                }
                /// Not available: the graph has errors.
                pub fn execute_async<__O: 'static>(&mut self, #(#inputs),*) -> impl ::core::future::Future<Output = #out> + '_ {
                    ::core::future::pending()
                }
                /// Not available: the graph has errors.
                pub fn submit(&mut self, #(#inputs),*) -> #rt::Result<#rt::Ticket, #rt::Error> {
                    ::core::unreachable!()
                }
                /// Not available: the graph has errors.
                pub fn wait<__O>(&mut self, ticket: #rt::Ticket) -> #out {
                    ::core::unreachable!()
                }
                /// Not available: the graph has errors.
                pub fn wait_async<__O: 'static>(&mut self, ticket: #rt::Ticket) -> impl ::core::future::Future<Output = #out> + '_ {
                    ::core::future::pending()
                }
                /// Not available: the graph has errors.
                pub fn in_flight(&self) -> ::core::primitive::usize {
                    ::core::unreachable!()
                }
                /// Not available: the graph has errors.
                pub fn ranks(&self, group: &::core::primitive::str) -> ::core::option::Option<::core::ops::Range<::core::primitive::usize>> {
                    ::core::unreachable!()
                }
                /// Not available: the graph has errors.
                pub fn group_size(&self, group: &::core::primitive::str) -> ::core::option::Option<::core::primitive::usize> {
                    ::core::unreachable!()
                }
                /// Not available: the graph has errors.
                pub fn teardown #generic (self) -> #rt::Result<#torn, #rt::Error> {
                    ::core::unreachable!()
                }
                /// Not available: the graph has errors.
                pub fn teardown_each #generic (self) -> #each {
                    ::core::unreachable!()
                }
                #(#each_methods)*
                /// Not available: the graph has errors.
                pub fn to_dot() -> #rt::String {
                    ::core::unreachable!()
                }
            }
        };
    }
}

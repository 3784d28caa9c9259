//! Rendering the IR's types to tokens: every type the generated code names that the macro
//! cannot know (it sees no types) is spelled here as a projection rustc resolves, through
//! the graph's `Checked` and `MethodCall` impls (see codegen), by the private aliases the
//! graph's `const _` block gives those projections.

use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};

use super::ops::Kind;
use super::parse::GraphDef;
use crate::rt;

/// The type of check `k`: `__T<k>`, a private alias in the graph's block of
/// `<Graph as Checked<K, P>>::Type` (see `checked_alias`), so that the generated code
/// spells it once.
pub(crate) fn checked_type(k: usize) -> TokenStream {
    let alias = format_ident!("__T{}", k);
    quote!(#alias)
}

/// The name, in the graph's block, of the tuple of the types its declaration names (see
/// `privacy`).
pub(crate) fn privacy_alias() -> TokenStream {
    quote!(__P)
}

/// `type <checked_type(k)> = <Graph as Checked<K, P>>::Type;`. `P` is the tuple of every
/// type the graph's declaration names (its actor and input types), which makes the
/// `Checked` impls no more public than the least public of them: their associated types
/// name those types, and a public graph over a private actor type must still compile. The
/// alias is private, and transparent: rustdoc shows what it stands for.
pub(crate) fn checked_alias(graph: &Ident, k: usize) -> TokenStream {
    let (rt, alias, p) = (rt::local(), checked_type(k), privacy_alias());
    quote! {
        type #alias = <#graph as #rt::Checked<#k, #p>>::Type;
    }
}

/// The types a graph's declaration names, as a tuple of pointers to them (well-formed
/// whatever they are; see `checked_type`).
pub(crate) fn privacy(def: &GraphDef) -> TokenStream {
    let tys = def
        .params
        .iter()
        .filter_map(|p| match (&p.group, &p.per_rank) {
            (Some((actor @ syn::Type::Path(_), _)), _) => Some(actor),
            (Some(_), _) | (None, Some(None)) => None,
            (None, Some(Some(elem))) => Some(elem),
            (None, None) => Some(&p.ty),
        });
    quote!((#(*const #tys,)*))
}

/// The type a collective of `kind` (other than `allgather`, whose type is checked) makes
/// of a value of type `ty`.
pub(crate) fn output_type(kind: Kind, ty: &TokenStream) -> TokenStream {
    match kind {
        Kind::Rooted => quote!(::core::option::Option<#ty>),
        _ => ty.clone(),
    }
}

/// The method of call `call`: `__M<call>`, a private alias in the graph's block of
/// `<Graph as MethodCall<call>>::Method` (see `method_aliases`), at the user's `at` (it
/// resolves there as at the call site, and a diagnostic that names it stays the user's).
pub(crate) fn method(call: usize, at: Span) -> Ident {
    format_ident!("__M{}", call, span = at)
}

/// The output type of method call `call`: `__O<call>`, a private alias in the graph's
/// block of `<Actor as Signature<method(call)>>::Output`, at the user's `at` (as `method`).
pub(crate) fn call_output(call: usize, at: Span) -> TokenStream {
    let alias = format_ident!("__O{}", call, span = at);
    quote!(#alias)
}

/// The aliases of `method(call)` and `call_output(call)` for a call on `actor`, at the
/// user's method name `at`.
pub(crate) fn method_aliases(
    graph: &Ident,
    actor: &syn::Type,
    call: usize,
    at: Span,
) -> TokenStream {
    let (rt, m, out) = (rt::local(), method(call, at), call_output(call, at));
    quote_spanned! {at=>
        type #m = <#graph as #rt::MethodCall<#call>>::Method;
        type #out = <#actor as #rt::Signature<#m>>::Output;
    }
}

/// What an `allgather` makes of a value whose type passed check `checked`, at the user's
/// argument.
pub(crate) fn gathered(checked: &TokenStream, at: Span) -> TokenStream {
    let rt = rt::local();
    quote_spanned!(at=> <#checked as #rt::Gather>::Gathered)
}

/// Field `i` of a tuple whose type passed check `checked` (`Fields`).
pub(crate) fn tuple_field(checked: &TokenStream, i: usize) -> TokenStream {
    let rt = rt::local();
    quote!(<#checked as #rt::TupleField<#i>>::Type)
}

/// The tuple of `tys`.
pub(crate) fn tuple(tys: impl IntoIterator<Item = TokenStream>) -> TokenStream {
    let tys = tys.into_iter();
    quote!((#(#tys,)*))
}

/// What a gather edge hands its consumer: a `Vec` of `ty`, in rank order.
pub(crate) fn vec_of(ty: &TokenStream) -> TokenStream {
    let rt = rt::path();
    quote!(#rt::Vec<#ty>)
}

/// What each rank gets of a value `scatter` splits, whose type passed check `checked`.
pub(crate) fn split_item(checked: &TokenStream) -> TokenStream {
    let rt = rt::path();
    quote!(<#checked as #rt::Split>::Item)
}

//! One fused stage of a step, as code: lay the values out, pack them, run the collective,
//! take the results. Only the step (`step.rs`) emits stages.

use proc_macro2::{Ident, Span, TokenStream};
use quote::{quote, quote_spanned};

use super::ops::{CollectiveSpec, Kind, OpName, Root};
use crate::rt;

/// A value that goes through a fused stage.
pub(crate) struct StageValue {
    pub(crate) ident: Ident,
    /// The user's argument.
    pub(crate) span: Span,
    /// For an `allgather`, the value's type once checked (see `value_checks`).
    pub(crate) checked: Option<TokenStream>,
}

/// The local that holds stage `stage`'s start (its `Started` and its slots) until its
/// completion.
pub(crate) fn started_ident(stage: usize) -> Ident {
    quote::format_ident!("__started{}", stage)
}

/// One fused stage of a step, as two pieces of code: its start (lay the values out, pack
/// them, start the collective) where the graph has it, and its completion (wait for it,
/// take the results) before the first use of a result. Every call that names a value is
/// spanned at the user's argument and bound by the one trait this kind of collective
/// needs, so that a value of a type that cannot go through it gets exactly one error,
/// there. An `allgather` names the value's checked type, which is an error (and silent)
/// when the check failed. `stage`: its index and its values' names, for the runtime's
/// errors.
pub(crate) fn start_code(
    kind: Kind,
    stage: (usize, &[&str]),
    vals: &[StageValue],
    collective: &TokenStream,
) -> TokenStream {
    let (stage, labels) = stage;
    let mut adds = Vec::new();
    let mut packs = Vec::new();
    for (val, i) in vals.iter().zip((0..vals.len()).map(syn::Index::from)) {
        let (v, s) = (&val.ident, val.span);
        // The stage's own names at the user's span but with the graph's hygiene (a graph
        // written by a `macro_rules!` macro has the user's tokens in another context).
        let st = Ident::new("__st", Span::call_site().located_at(s));
        let slots = Ident::new("__slots", Span::call_site().located_at(s));
        let ty = val.checked.as_ref().map(|t| quote!(::<#t>));
        // Every token of these calls carries the user's span: rustc puts a failed bound
        // at the method's name, and dedups identical bounds at one span into one error.
        let (add, pack) = match kind {
            Kind::InPlace | Kind::Rooted => (quote_spanned!(s=> add), quote_spanned!(s=> pack)),
            Kind::Gather => (
                quote_spanned!(s=> fused().add_gather #ty),
                quote_spanned!(s=> pack_gather #ty),
            ),
            Kind::Scatter => (
                quote_spanned!(s=> fused().add_scatter),
                quote_spanned!(s=> pack_scatter),
            ),
        };
        adds.push(quote_spanned!(s=> #st.#add(&#v)));
        packs.push(quote_spanned!(s=> #st.#pack(&#v, #slots.#i);));
    }
    let started = started_ident(stage);
    quote! {
        let #started = {
            let mut __st = __ctx.stage(#stage, &[#(#labels),*]);
            let __slots = (#(#adds,)*);
            __st.prepare();
            #(#packs)*
            (__st.start(#collective)?, __slots)
        };
    }
}

/// The completion of stage `stage` (see [`start_code`]): its results, into `outs`.
pub(crate) fn complete_code(
    kind: Kind,
    stage: usize,
    outs: &[&Ident],
    vals: &[StageValue],
    root: Option<&Root>,
) -> TokenStream {
    let mut outputs = Vec::new();
    for (val, i) in vals.iter().zip((0..vals.len()).map(syn::Index::from)) {
        let (v, s) = (&val.ident, val.span);
        let st = Ident::new("__st", Span::call_site().located_at(s));
        let slots = Ident::new("__slots", Span::call_site().located_at(s));
        let ty = val.checked.as_ref().map(|t| quote!(::<#t>));
        outputs.push(match (kind, root) {
            (Kind::InPlace, _) => quote_spanned!(s=> #st.output(&#v, #slots.#i)),
            (Kind::Gather, _) => {
                quote_spanned!(s=> #st.fused().output_gathered #ty(&#v, #slots.#i))
            }
            (Kind::Scatter, _) => {
                quote_spanned!(s=> #st.fused().output_scattered(&#v, #slots.#i))
            }
            (Kind::Rooted, Some(r)) => {
                let rank = r.rank;
                quote_spanned!(s=> #st.fused().output_rooted(&#v, #slots.#i, #rank))
            }
            (Kind::Rooted, None) => {
                quote!(::core::compile_error!(
                    "actorgraph: a rooted collective without a root"
                ))
            }
        });
    }
    let started = started_ident(stage);
    quote! {
        let (#(#outs,)*) = {
            let (__started, __slots) = #started;
            let mut __st = __ctx.complete(__started)?;
            (#(#outputs,)*)
        };
    }
}

/// The runtime's description of a collective: the reduce op as written (or `Sum` at the
/// collective's span) and the root as written.
pub(crate) fn collective_expr(
    spec: &CollectiveSpec,
    op: Option<&OpName>,
    root: Option<&Root>,
    span: Span,
) -> TokenStream {
    let rt = rt::local();
    let op = {
        let op = op.map_or_else(|| Ident::new("Sum", span), |o| Ident::new(o.name, o.span));
        quote!(#rt::ReduceOp::#op)
    };
    let root = root.map(|r| {
        let lit = proc_macro2::Literal::usize_unsuffixed(r.rank);
        let mut lit = lit;
        lit.set_span(r.span);
        quote!(#lit)
    });
    match (spec.name, root) {
        ("allreduce", _) => quote!(#rt::Collective::AllReduce(#op)),
        ("allgather", _) => quote!(#rt::Collective::AllGather),
        ("reducescatter", _) => quote!(#rt::Collective::ReduceScatter(#op)),
        ("broadcast", Some(root)) => quote!(#rt::Collective::Broadcast { root: #root }),
        ("reduce", Some(root)) => quote!(#rt::Collective::Reduce { op: #op, root: #root }),
        (other, _) => {
            let msg = format!("actorgraph: collective `{other}` has no code generation");
            quote!(::core::compile_error!(#msg))
        }
    }
}

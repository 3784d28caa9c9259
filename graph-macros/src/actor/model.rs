//! The model of an `#[actor]` impl block: its type and its graph-callable methods.

use proc_macro2::Ident;
use syn::spanned::Spanned;

use crate::diag::Diag;

pub(crate) struct Actor {
    /// The type's name (the last segment of the impl's self type).
    pub(crate) ident: Ident,
    pub(crate) self_ty: syn::Type,
    pub(crate) methods: Vec<Method>,
}

pub(crate) struct Method {
    pub(crate) ident: Ident,
    pub(crate) params: Vec<Param>,
    /// The `T` the graph sees (the `T` of `Result<T, E>` for a fallible method).
    pub(crate) output: syn::Type,
    pub(crate) fallible: bool,
}

pub(crate) struct Param {
    /// The parameter type without its reference.
    pub(crate) ty: syn::Type,
    /// Taken by value: the graph's value is cloned into the call.
    pub(crate) by_value: bool,
}

impl Actor {
    pub(crate) fn from_impl(imp: &syn::ItemImpl, diag: &mut Diag) -> Option<Self> {
        let before = diag_len(diag);
        if let Some((_, path, _)) = &imp.trait_ {
            diag.error_at(
                path,
                "`#[actor]` goes on an inherent `impl` block, not on a trait impl",
            );
        }
        if !imp.generics.params.is_empty() {
            diag.error_at(&imp.generics, "generic actors are not supported yet");
        }
        let ident = match &*imp.self_ty {
            syn::Type::Path(p) if p.qself.is_none() => match p.path.segments.last() {
                Some(seg) if seg.arguments.is_none() => Some(seg.ident.clone()),
                _ => None,
            },
            _ => None,
        };
        if ident.is_none() {
            diag.error_at(
                &imp.self_ty,
                "`#[actor]` needs a named type without generic arguments, e.g. `impl Worker`",
            );
        }
        let methods: Vec<Method> = imp
            .items
            .iter()
            .filter_map(|item| match item {
                syn::ImplItem::Fn(f) => Method::from_fn(f, diag),
                _ => None,
            })
            .collect();
        if diag_len(diag) != before {
            return None;
        }
        Some(Actor {
            ident: ident?,
            self_ty: (*imp.self_ty).clone(),
            methods,
        })
    }
}

fn diag_len(diag: &Diag) -> bool {
    diag.is_empty()
}

impl Method {
    /// `None` for associated functions without a receiver: they are not graph nodes.
    fn from_fn(f: &syn::ImplItemFn, diag: &mut Diag) -> Option<Self> {
        let receiver = f.sig.receiver()?;
        let by_ref = receiver.reference.is_some()
            || (receiver.colon_token.is_some() && matches!(*receiver.ty, syn::Type::Reference(_)));
        if !by_ref {
            diag.error_at(
                receiver,
                "an actor method takes `&self` or `&mut self`: the actor stays on its thread; \
                 move methods that consume the actor to an impl block without `#[actor]`",
            );
        }
        if !f.sig.generics.params.is_empty() {
            diag.error_at(
                &f.sig.generics,
                "a graph method cannot be generic; move it to an impl block without `#[actor]`",
            );
        }
        if let Some(a) = &f.sig.asyncness {
            diag.error_at(a, "async graph methods are not supported");
        }
        let mut params = Vec::new();
        for input in f.sig.inputs.iter().skip(1) {
            let syn::FnArg::Typed(pt) = input else {
                continue;
            };
            match &*pt.ty {
                syn::Type::Reference(r) if r.mutability.is_some() => diag.error_at(
                    r,
                    "a graph method cannot take `&mut`: graph values are shared; take `&T` or `T`",
                ),
                syn::Type::ImplTrait(it) => {
                    diag.error_at(it, "a graph method cannot take `impl Trait` arguments")
                }
                syn::Type::Reference(r) => params.push(Param {
                    ty: (*r.elem).clone(),
                    by_value: false,
                }),
                ty => params.push(Param {
                    ty: ty.clone(),
                    by_value: true,
                }),
            }
        }
        let (output, fallible) = match &f.sig.output {
            syn::ReturnType::Default => (syn::parse_quote_spanned!(f.sig.span()=> ()), false),
            syn::ReturnType::Type(_, ty) => match result_ok_type(ty) {
                Some(ok) => (ok, true),
                None => ((**ty).clone(), false),
            },
        };
        Some(Method {
            ident: f.sig.ident.clone(),
            params,
            output,
            fallible,
        })
    }
}

/// `T` for a return type spelled `Result<T, ..>` (any path ending in `Result`).
fn result_ok_type(ty: &syn::Type) -> Option<syn::Type> {
    let syn::Type::Path(p) = ty else { return None };
    let seg = p.path.segments.last()?;
    if seg.ident != "Result" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &seg.arguments else {
        return None;
    };
    match args.args.first()? {
        syn::GenericArgument::Type(t) => Some(t.clone()),
        _ => None,
    }
}

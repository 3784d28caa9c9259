//! The model of an `#[actor]` impl block: its (possibly generic) type and its methods,
//! each either a graph node or an ordinary method with the reason it cannot be one.
//!
//! Nothing here is an error: an impl block holds helpers beside its graph methods, and
//! only a graph that calls a helper learns (at its call) why it is not a node.

use proc_macro2::Ident;
use quote::quote;

use crate::diag::tidy;

pub(crate) struct Actor {
    pub(crate) generics: syn::Generics,
    pub(crate) self_ty: syn::Type,
    pub(crate) methods: Vec<Method>,
}

pub(crate) struct Method {
    pub(crate) ident: Ident,
    /// The method's `#[cfg(..)]` attributes, which its generated impls carry too.
    pub(crate) cfgs: Vec<syn::Attribute>,
    /// The node, or why the method is not one (completing "it ..").
    pub(crate) node: Result<Node, &'static str>,
}

pub(crate) struct Node {
    pub(crate) params: Vec<Param>,
    /// The parameters after `self`, as written.
    pub(crate) text: String,
    /// The `T` the graph sees (the `T` of `Result<T, E>` for a fallible method).
    pub(crate) output: syn::Type,
    /// A fallible method's return type as written (`Result<T, E>`, `io::Result<T>`).
    pub(crate) fallible: Option<syn::Type>,
}

pub(crate) struct Param {
    /// The parameter type without its reference.
    pub(crate) ty: syn::Type,
    /// Taken by value: the graph's value is cloned into the call.
    pub(crate) by_value: bool,
}

impl Actor {
    pub(crate) fn from_impl(imp: &syn::ItemImpl) -> Self {
        let methods = imp
            .items
            .iter()
            .filter_map(|item| match item {
                syn::ImplItem::Fn(f) => Some(Method::from_fn(f)),
                _ => None,
            })
            .collect();
        Actor {
            generics: imp.generics.clone(),
            self_ty: (*imp.self_ty).clone(),
            methods,
        }
    }
}

impl Method {
    fn from_fn(f: &syn::ImplItemFn) -> Self {
        Method {
            ident: f.sig.ident.clone(),
            cfgs: f
                .attrs
                .iter()
                .filter(|a| a.path().is_ident("cfg"))
                .cloned()
                .collect(),
            node: Node::from_sig(&f.sig),
        }
    }
}

impl Node {
    fn from_sig(sig: &syn::Signature) -> Result<Self, &'static str> {
        let receiver = sig
            .receiver()
            .ok_or("takes no `self` (an associated function)")?;
        let by_ref = receiver.reference.is_some()
            || (receiver.colon_token.is_some() && matches!(*receiver.ty, syn::Type::Reference(_)));
        if !by_ref {
            return Err("takes `self` by value, and an actor stays on its thread");
        }
        if !sig.generics.params.is_empty() {
            return Err("is generic");
        }
        if sig.generics.where_clause.is_some() {
            return Err("has a `where` clause");
        }
        if sig.asyncness.is_some() {
            return Err("is `async`");
        }
        if sig.unsafety.is_some() {
            return Err("is `unsafe`");
        }
        let mut params = Vec::new();
        let mut text = Vec::new();
        for input in sig.inputs.iter().skip(1) {
            let syn::FnArg::Typed(pt) = input else {
                continue;
            };
            let (pat, ty) = (&pt.pat, &pt.ty);
            text.push(tidy(quote!(#pat: #ty)));
            let (ty, by_value) =
                match &**ty {
                    syn::Type::Reference(r) if r.mutability.is_some() => return Err(
                        "takes a `&mut` argument, and graph values are shared (take `&T` or `T`)",
                    ),
                    syn::Type::Reference(r) => ((*r.elem).clone(), false),
                    ty => (ty.clone(), true),
                };
            let found = Found::scan(&ty);
            if found.impl_trait {
                return Err("takes an `impl Trait` argument");
            }
            if found.lifetime {
                return Err("takes an argument whose type holds a reference or a lifetime");
            }
            params.push(Param { ty, by_value });
        }
        let (output, fallible) = match &sig.output {
            syn::ReturnType::Default => (syn::parse_quote!(()), None),
            syn::ReturnType::Type(_, ty) => {
                let found = Found::scan(ty);
                if found.impl_trait {
                    return Err("returns `impl Trait`");
                }
                if found.lifetime {
                    return Err("returns a reference or a type with a lifetime");
                }
                if found.never {
                    return Err("never returns");
                }
                match result_ok_type(ty) {
                    Some(ok) => (ok, Some((**ty).clone())),
                    None => ((**ty).clone(), None),
                }
            }
        };
        Ok(Node {
            params,
            text: text.join(", "),
            output,
            fallible,
        })
    }
}

/// What a type holds that a graph node's parameter or result cannot.
#[derive(Default)]
struct Found {
    /// A reference or a lifetime other than `'static`: the generated impl could not name
    /// it.
    lifetime: bool,
    impl_trait: bool,
    never: bool,
}

impl Found {
    fn scan(ty: &syn::Type) -> Self {
        let mut found = Found::default();
        found.ty(ty);
        found
    }

    fn ty(&mut self, ty: &syn::Type) {
        use syn::Type;
        match ty {
            Type::Reference(_) => self.lifetime = true,
            Type::ImplTrait(_) => self.impl_trait = true,
            Type::Never(_) => self.never = true,
            Type::Array(a) => self.ty(&a.elem),
            Type::Slice(s) => self.ty(&s.elem),
            Type::Ptr(p) => self.ty(&p.elem),
            Type::Group(g) => self.ty(&g.elem),
            Type::Paren(p) => self.ty(&p.elem),
            Type::Tuple(t) => t.elems.iter().for_each(|t| self.ty(t)),
            Type::Path(p) => {
                if let Some(q) = &p.qself {
                    self.ty(&q.ty);
                }
                self.path(&p.path);
            }
            Type::TraitObject(t) => t.bounds.iter().for_each(|b| self.bound(b)),
            // A function pointer's own elision rules make its references fine.
            _ => {}
        }
    }

    fn path(&mut self, path: &syn::Path) {
        for seg in &path.segments {
            // `Fn(&T) -> U` sugar elides its lifetimes itself; only `<..>` arguments count.
            let syn::PathArguments::AngleBracketed(args) = &seg.arguments else {
                continue;
            };
            for arg in &args.args {
                match arg {
                    syn::GenericArgument::Lifetime(l) => self.lifetime(l),
                    syn::GenericArgument::Type(t) => self.ty(t),
                    syn::GenericArgument::AssocType(a) => self.ty(&a.ty),
                    syn::GenericArgument::Constraint(c) => {
                        c.bounds.iter().for_each(|b| self.bound(b))
                    }
                    _ => {}
                }
            }
        }
    }

    fn bound(&mut self, b: &syn::TypeParamBound) {
        match b {
            syn::TypeParamBound::Lifetime(l) => self.lifetime(l),
            syn::TypeParamBound::Trait(t) => self.path(&t.path),
            _ => {}
        }
    }

    fn lifetime(&mut self, l: &syn::Lifetime) {
        if l.ident != "static" {
            self.lifetime = true;
        }
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

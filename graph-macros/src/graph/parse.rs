//! The surface syntax of `graph!`, parsed into syn's own AST so that every token keeps its
//! span:
//!
//! ```text
//! graph! {
//!     #[attrs] vis Name(group: [Actor], fixed: [Actor; 2], input: Type, ..) {
//!         let pattern = expr;   // pattern: `name` or `(a, b, ..)`
//!         expr;                 // a call kept for its effect
//!         output_expr           // a value or a tuple of values
//!     }
//! }
//! ```
//!
//! `[Actor]` is always a group (an unsized slice cannot be an input). `[T; N]` is a group of
//! N actors when the body calls a method on it (`fixed.method(..)`, `fixed[1].method(..)`),
//! and otherwise an input of array type.

use std::collections::HashSet;

use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{braced, parenthesized, Attribute, Expr, Ident, Stmt, Token, Type, Visibility};

/// One or more graph definitions.
pub(crate) struct Graphs(pub(crate) Vec<GraphDef>);

pub(crate) struct GraphDef {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) name: Ident,
    pub(crate) params: Vec<ParamDef>,
    pub(crate) stmts: Vec<Stmt>,
}

pub(crate) struct ParamDef {
    pub(crate) name: Ident,
    pub(crate) ty: Type,
    /// For an actor group: the actor type, and the size of a fixed-size group.
    pub(crate) group: Option<(Type, Option<syn::Expr>)>,
    /// For a per-rank input (`PerRank<T>`): `T`, or `None` when the `PerRank` is malformed.
    pub(crate) per_rank: Option<Option<Type>>,
}

impl ParamDef {
    /// The type `execute` takes for this input: a `Vec` of a per-rank input's elements,
    /// one per rank; otherwise the type as written.
    pub(crate) fn execute_ty(&self) -> proc_macro2::TokenStream {
        let rt = crate::rt::path();
        match &self.per_rank {
            Some(Some(elem)) => quote::quote!(#rt::Vec<#elem>),
            Some(None) => quote::quote!(#rt::Vec<()>),
            None => {
                let ty = &self.ty;
                quote::quote!(#ty)
            }
        }
    }
}

/// `PerRank<T>` (the last segment of a path, without `qself`): `Some(Some(T))`; a
/// `PerRank` without exactly one type argument: `Some(None)`; anything else: `None`.
fn per_rank(ty: &Type) -> Option<Option<Type>> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last().filter(|_| p.qself.is_none())?;
    if last.ident != "PerRank" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return Some(None);
    };
    match args.args.iter().collect::<Vec<_>>()[..] {
        [syn::GenericArgument::Type(t)] => Some(Some(t.clone())),
        _ => Some(None),
    }
}

/// Removes the invisible groups around the expressions of a graph: `macro_rules!` puts
/// one around each `$e:expr` it passes on, and a graph written by a macro must read as
/// one written by hand. Only where a graph's expressions nest (calls, indices, tuples,
/// lists); anything else is refused later as it is.
fn ungroup(e: &mut Expr) {
    while let Expr::Group(g) = e {
        *e = (*g.expr).clone();
    }
    match e {
        Expr::MethodCall(m) => {
            ungroup(&mut m.receiver);
            m.args.iter_mut().for_each(ungroup);
        }
        Expr::Call(c) => {
            ungroup(&mut c.func);
            c.args.iter_mut().for_each(ungroup);
        }
        Expr::Index(i) => {
            ungroup(&mut i.expr);
            ungroup(&mut i.index);
        }
        Expr::Paren(p) => ungroup(&mut p.expr),
        Expr::Tuple(t) => t.elems.iter_mut().for_each(ungroup),
        Expr::Array(a) => a.elems.iter_mut().for_each(ungroup),
        _ => {}
    }
}

impl Parse for Graphs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut defs = Vec::new();
        while !input.is_empty() {
            defs.push(input.parse()?);
        }
        Ok(Graphs(defs))
    }
}

impl Parse for GraphDef {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        let name = input.parse()?;
        let content;
        parenthesized!(content in input);
        let params: Vec<ParamDef> = Punctuated::<ParamDef, Token![,]>::parse_terminated(&content)?
            .into_iter()
            .collect();
        let body;
        braced!(body in input);
        let mut stmts = body.call(syn::Block::parse_within)?;
        for stmt in &mut stmts {
            match stmt {
                Stmt::Local(syn::Local {
                    init: Some(init), ..
                }) => ungroup(&mut init.expr),
                Stmt::Expr(e, _) => ungroup(e),
                _ => {}
            }
        }
        let mut receivers = HashSet::new();
        for stmt in &stmts {
            match stmt {
                Stmt::Local(l) => {
                    if let Some(init) = &l.init {
                        collect_receivers(&init.expr, &mut receivers);
                    }
                }
                Stmt::Expr(e, _) => collect_receivers(e, &mut receivers),
                _ => {}
            }
        }
        let params = params
            .into_iter()
            .map(|mut p: ParamDef| {
                p.group = match &p.ty {
                    Type::Slice(s) => Some(((*s.elem).clone(), None)),
                    Type::Array(a) if receivers.contains(&p.name.to_string()) => {
                        Some(((*a.elem).clone(), Some(a.len.clone())))
                    }
                    _ => None,
                };
                if p.group.is_none() {
                    p.per_rank = per_rank(&p.ty);
                }
                p
            })
            .collect();
        Ok(GraphDef {
            attrs,
            vis,
            name,
            params,
            stmts,
        })
    }
}

impl Parse for ParamDef {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name = input.parse()?;
        input.parse::<Token![:]>()?;
        let ty = input.parse()?;
        Ok(ParamDef {
            name,
            ty,
            group: None,
            per_rank: None,
        })
    }
}

/// The names methods are called on (`name.method(..)`, `name[k].method(..)`) anywhere in
/// an expression of the forms a graph body holds.
fn collect_receivers(e: &syn::Expr, into: &mut HashSet<String>) {
    match e {
        Expr::MethodCall(m) => {
            let mut recv = &*m.receiver;
            loop {
                match recv {
                    Expr::Paren(p) => recv = &p.expr,
                    Expr::Index(i) => recv = &i.expr,
                    _ => break,
                }
            }
            match recv {
                Expr::Path(p) => {
                    if let Some(i) = p.path.get_ident() {
                        into.insert(i.to_string());
                    }
                }
                other => collect_receivers(other, into),
            }
            m.args.iter().for_each(|a| collect_receivers(a, into));
        }
        Expr::Call(c) => c.args.iter().for_each(|a| collect_receivers(a, into)),
        Expr::Array(a) => a.elems.iter().for_each(|a| collect_receivers(a, into)),
        Expr::Tuple(t) => t.elems.iter().for_each(|a| collect_receivers(a, into)),
        Expr::Paren(p) => collect_receivers(&p.expr, into),
        _ => {}
    }
}

/// The value of an integer literal (a fixed group's size, an actor index, a root rank):
/// the one place the macros read a number the user wrote. `None` for anything else,
/// including a literal too large for a `usize`.
pub(crate) fn int_literal(e: &syn::Expr) -> Option<usize> {
    match e {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(lit),
            ..
        }) => lit.base10_parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::int_literal;

    #[test]
    fn int_literal_reads_integer_literals_only() {
        let read = |e: syn::Expr| int_literal(&e);
        assert_eq!(read(syn::parse_quote!(0)), Some(0));
        assert_eq!(read(syn::parse_quote!(2usize)), Some(2));
        assert_eq!(read(syn::parse_quote!(N)), None);
        assert_eq!(read(syn::parse_quote!(-1)), None);
        assert_eq!(read(syn::parse_quote!(1.0)), None);
        assert_eq!(read(syn::parse_quote!(99999999999999999999999)), None);
    }

    #[test]
    fn an_array_is_a_group_only_when_the_body_calls_a_method_on_it() {
        let def: super::GraphDef = syn::parse_quote! {
            G(w: [W; 2], xs: [f32; 2], v: [V]) {
                w[0].f(xs)
            }
        };
        let groups: Vec<bool> = def.params.iter().map(|p| p.group.is_some()).collect();
        assert_eq!(groups, [true, false, true]);
    }

    #[test]
    fn per_rank_inputs_are_recognised_by_their_last_segment() {
        let def: super::GraphDef = syn::parse_quote! {
            G(w: [W], a: PerRank<u32>, b: actorgraph::PerRank<Vec<f32>>, c: PerRank, d: PerRank<u8, u8>, e: u32) {
                w.f(a)
            }
        };
        let seen: Vec<Option<Option<String>>> = def
            .params
            .iter()
            .map(|p| {
                p.per_rank
                    .as_ref()
                    .map(|e| e.as_ref().map(crate::diag::tidy))
            })
            .collect();
        let some = |s: &str| Some(Some(s.to_string()));
        assert_eq!(
            seen,
            [
                None,
                some("u32"),
                some("Vec<f32>"),
                Some(None),
                Some(None),
                None
            ]
        );
    }
}

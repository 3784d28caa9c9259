//! Lowering a collective call (`allreduce(x, Avg)`, `reduce([a, b], Sum, 0)`): its values,
//! its reduce op and root, checked against the collective's row in `ops`, become one fused
//! stage of their group.

use syn::spanned::Spanned;

use super::{Binding, Lowered, Lowerer};
use crate::diag::tidy;
use proc_macro2::TokenStream;

use crate::graph::ir::{CheckKind, OpKind, Place, ValueId};
use crate::graph::ops::{self, CollectiveSpec, Kind, OpName, Param, Root, REDUCE_OPS};
use crate::graph::parse::int_literal;
use crate::graph::types::{checked_type, gathered, output_type};

impl Lowerer<'_> {
    pub(super) fn collective(&mut self, c: &syn::ExprCall) -> Option<Lowered> {
        let (fname, spec) = self.collective_spec(c)?;
        let mut args = c.args.iter();
        let Some(first) = args.next() else {
            self.diag.error_at(
                c,
                format!(
                    "`{fname}` takes a value or a list of values: {}",
                    spec.usage
                ),
            );
            return None;
        };
        if self.unbracketed_values(spec, first, c) {
            return None;
        }
        let (op, root, params_ok) = self.collective_params(spec, c, args);
        let (exprs, nested) = self.collective_values(fname, spec, first)?;
        let (ins, group) = self.collective_group(fname, &exprs);
        let group = group.filter(|_| params_ok)?;
        self.check_root(root.as_ref(), group)?;
        let stage = self.groups[group].stages.len();
        let mut shown: Vec<String> = exprs.iter().map(tidy).collect();
        if nested {
            shown = vec![format!("[{}]", shown.join(", "))];
        }
        shown.extend(op.iter().map(|o| o.name.to_string()));
        shown.extend(root.iter().map(|r| r.rank.to_string()));
        let name = format!("{fname}({})", shown.join(", "));
        if let Some(root) = &root {
            self.groups[group].roots.push((name.clone(), root.rank));
        }
        self.groups[group].stages.push(name.clone());
        let (checks, outs) = self.collective_outputs(spec, &ins, &exprs, &name, nested);
        let kind = OpKind::Collective {
            spec,
            op,
            root,
            args: ins,
            arg_spans: exprs.iter().map(|e| e.span()).collect(),
            checks,
            stage,
            span: c.span(),
        };
        let outs = self.push_op(Place::Group(group), kind, outs);
        Some(if nested {
            Lowered::Parts(outs)
        } else {
            Lowered::One(outs[0])
        })
    }

    /// The collective a call names, and the name as written.
    fn collective_spec<'c>(
        &mut self,
        c: &'c syn::ExprCall,
    ) -> Option<(&'c syn::Ident, &'static CollectiveSpec)> {
        let syn::Expr::Path(func) = &*c.func else {
            self.diag
                .error_at(&c.func, format!("expected a collective: {}", ops::names()));
            return None;
        };
        let Some(fname) = func.path.get_ident() else {
            self.diag
                .error_at(func, format!("expected a collective: {}", ops::names()));
            return None;
        };
        let Some(spec) = ops::find(&fname.to_string()) else {
            self.diag.error(
                fname.span(),
                format!(
                    "unknown collective `{fname}`; expected one of {}",
                    ops::names()
                ),
            );
            return None;
        };
        Some((fname, spec))
    }

    /// Whether the call passes values where its parameters go, as in `allreduce(g, l, Avg)`:
    /// a list written without its brackets. It is then reported once, with the call as it
    /// is written with them, instead of an error for each value read as a reduce op, a root
    /// or an argument too many.
    fn unbracketed_values(
        &mut self,
        spec: &CollectiveSpec,
        first: &syn::Expr,
        c: &syn::ExprCall,
    ) -> bool {
        let rest: Vec<&syn::Expr> = c.args.iter().skip(1).collect();
        let too_many = rest.len() > spec.params.len();
        let (values, params): (Vec<&syn::Expr>, Vec<&syn::Expr>) = rest
            .into_iter()
            .partition(|e| self.written_as_value(e, too_many));
        let Some(last) = values.last() else {
            return false;
        };
        let listed = match first {
            syn::Expr::Array(a) => a.elems.iter().collect(),
            e => vec![e],
        };
        let listed: Vec<String> = listed
            .into_iter()
            .chain(values.iter().copied())
            .map(tidy)
            .collect();
        let params: String = params.iter().map(|p| format!(", {}", tidy(p))).collect();
        self.diag.error_at(
            quote::quote!(#first #last),
            format!(
                "`{}` takes one value or one list of values; several values are written in brackets: `{}([{}]{params})`",
                spec.name,
                spec.name,
                listed.join(", "),
            ),
        );
        true
    }

    /// Whether an argument after the first is written as a value rather than as a
    /// parameter: a per-actor value of the graph (defined above or below), or a method
    /// call. When the call has more arguments than the collective takes, any other name
    /// that is not a reduce op or a group too: a graph input, or a value misspelt, which
    /// the call with brackets then reports. A graph input in a parameter's place is
    /// otherwise taken for a parameter (`broadcast(x, r)`, a root that is not a literal).
    fn written_as_value(&self, e: &syn::Expr, too_many: bool) -> bool {
        let ident = match e {
            syn::Expr::MethodCall(_) => return true,
            syn::Expr::Path(p) if !looks_like_op(e) => p.path.get_ident(),
            _ => None,
        };
        let Some(ident) = ident else {
            return false;
        };
        let name = ident.to_string();
        match self.scope.get(&name) {
            Some((Binding::Value(v), _)) if self.values[*v].place().is_some() => true,
            Some((Binding::Group(_), _)) => false,
            Some(_) => too_many,
            None => too_many || self.defined_later.contains_key(&name),
        }
    }

    /// The value expressions of the first argument, and whether it is a list: `None` (and
    /// an error) for an empty list.
    fn collective_values<'e>(
        &mut self,
        fname: &syn::Ident,
        spec: &CollectiveSpec,
        first: &'e syn::Expr,
    ) -> Option<(Vec<&'e syn::Expr>, bool)> {
        match first {
            syn::Expr::Array(a) => {
                if a.elems.is_empty() {
                    self.diag.error_at(
                        a,
                        format!(
                            "`{fname}([])` has nothing to {}; give it at least one value",
                            spec.verb
                        ),
                    );
                    return None;
                }
                Some((a.elems.iter().collect(), true))
            }
            e => Some((vec![e], false)),
        }
    }

    /// The values of `exprs`, and the group they all belong to: `None` (after every error
    /// is reported) if one is not a per-actor value of a group, or they mix groups.
    fn collective_group(
        &mut self,
        fname: &syn::Ident,
        exprs: &[&syn::Expr],
    ) -> (Vec<ValueId>, Option<usize>) {
        let mut ins = Vec::new();
        let mut group: Option<(usize, &syn::Expr)> = None;
        let mut ok = true;
        for e in exprs {
            if let syn::Expr::Array(inner) = e {
                self.diag
                    .error_at(inner, "lists in a collective do not nest: `[a, b, c]`");
                ok = false;
                continue;
            }
            let Some(v) = self.one(e) else {
                ok = false;
                continue;
            };
            match self.values[v].place() {
                None => {
                    self.diag.error_at(
                        e,
                        format!(
                            "`{}` is a graph input, the same on every actor; `{fname}` takes per-actor values (results of method calls)",
                            self.values[v].ident
                        ),
                    );
                    ok = false;
                }
                Some(Place::Actor(g, k)) => {
                    self.diag.error_at(
                        e,
                        format!(
                            "`{}` lives on one actor, `{}[{k}]`; `{fname}` runs on every actor of a group and takes per-actor values (results of `{}.method(..)`)",
                            self.values[v].label, self.groups[g].name, self.groups[g].name
                        ),
                    );
                    ok = false;
                }
                Some(Place::Group(g)) => match group {
                    None => group = Some((g, e)),
                    Some((g0, _)) if g0 != g => {
                        self.diag.error_at(
                            e,
                            format!(
                                "`{fname}` mixes values of actor groups `{}` and `{}`; a collective runs within one group",
                                self.groups[g0].name, self.groups[g].name
                            ),
                        );
                        ok = false;
                    }
                    Some(_) => {}
                },
            }
            ins.push(v);
        }
        (ins, group.filter(|_| ok).map(|(g, _)| g))
    }

    /// `None` (and an error) if `root` is past the end of a group of known size.
    fn check_root(&mut self, root: Option<&Root>, group: usize) -> Option<()> {
        if let (Some(root), Some((_, Some(size)))) = (root, &self.groups[group].size) {
            if root.rank >= *size {
                self.diag.error(
                    root.span,
                    format!(
                        "root {} is out of range: group `{}` has {size} actors (ranks 0..{size})",
                        root.rank, self.groups[group].name
                    ),
                );
                return None;
            }
        }
        Some(())
    }

    /// The type checks of an `allgather`'s values, and each output's label and type.
    fn collective_outputs(
        &mut self,
        spec: &CollectiveSpec,
        ins: &[ValueId],
        exprs: &[&syn::Expr],
        name: &str,
        nested: bool,
    ) -> (Vec<usize>, Vec<(String, TokenStream)>) {
        // An `allgather` value's type is checked once, in a constant: its output type
        // (`<T as Gather>::Gathered`) goes through that check, so a type that cannot be
        // gathered gets one error, at the user's argument, and nothing derived from it does.
        let checks: Vec<usize> = match spec.kind {
            Kind::Gather => ins
                .iter()
                .zip(exprs)
                .map(|(&v, e)| self.check(self.values[v].ty.clone(), e.span(), CheckKind::Gather))
                .collect(),
            _ => Vec::new(),
        };
        let outs = ins
            .iter()
            .zip(exprs)
            .enumerate()
            .map(|(i, (&v, e))| {
                let ty = match checks.get(i) {
                    Some(&k) => gathered(&checked_type(k), e.span()),
                    None => output_type(spec.kind, &self.values[v].ty),
                };
                let label = if nested {
                    format!("{name}.{i}")
                } else {
                    name.to_string()
                };
                (label, ty)
            })
            .collect();
        (checks, outs)
    }

    /// The arguments after the values: a reduce op and/or a root, as the collective takes
    /// them. Reports every problem; the flag says whether there was none.
    fn collective_params<'e>(
        &mut self,
        spec: &CollectiveSpec,
        call: &syn::ExprCall,
        mut args: impl Iterator<Item = &'e syn::Expr>,
    ) -> (Option<OpName>, Option<Root>, bool) {
        let fname = spec.name;
        let (mut op, mut root, mut ok) = (None, None, true);
        for param in spec.params {
            let arg = args.next();
            match (param, arg) {
                (Param::Op { .. }, Some(a)) => {
                    op = self.reduce_op(a);
                    ok &= op.is_some();
                }
                (Param::Root, Some(a)) => {
                    root = self.root(spec, a);
                    ok &= root.is_some();
                }
                (Param::Op { required: false }, None) => {}
                (Param::Op { required: true }, None) => {
                    self.diag.error_at(
                        call,
                        format!("`{fname}` needs a reduce op and a root: {}", spec.usage),
                    );
                    return (None, None, false);
                }
                (Param::Root, None) => {
                    self.diag.error_at(
                        call,
                        format!(
                            "`{fname}` needs a root, the rank whose value it {}: {}",
                            if spec.kind == Kind::Rooted {
                                "gets"
                            } else {
                                "sends"
                            },
                            spec.usage
                        ),
                    );
                    return (None, None, false);
                }
            }
        }
        for extra in args {
            ok = false;
            if !spec.takes_op() && looks_like_op(extra) {
                self.diag.error_at(
                    extra,
                    format!(
                        "`{fname}` takes no reduce op: it moves values without combining them; write {}",
                        spec.usage
                    ),
                );
            } else {
                self.diag
                    .error_at(extra, format!("unexpected argument to `{fname}`"));
            }
        }
        (op, root, ok)
    }

    fn root(&mut self, spec: &CollectiveSpec, e: &syn::Expr) -> Option<Root> {
        if let Some(rank) = int_literal(e) {
            return Some(Root {
                rank,
                span: e.span(),
            });
        }
        self.diag.error_at(
            e,
            format!(
                "the root of `{}` is a rank, written as an integer literal such as `0`, not `{}`",
                spec.name,
                tidy(e)
            ),
        );
        None
    }

    fn reduce_op(&mut self, e: &syn::Expr) -> Option<OpName> {
        let ident = match e {
            syn::Expr::Path(p) if p.qself.is_none() => p.path.segments.last().map(|s| &s.ident),
            _ => None,
        };
        let found = ident.and_then(|i| {
            REDUCE_OPS
                .iter()
                .find(|&&op| i == op)
                .map(|&op| (op, i.span()))
        });
        match found {
            Some((name, span)) => Some(OpName { name, span }),
            None => {
                self.diag.error_at(
                    e,
                    format!(
                        "unknown reduce op `{}`; expected one of {}",
                        tidy(e),
                        ops::reduce_op_names()
                    ),
                );
                None
            }
        }
    }
}

/// Whether an argument is written like a reduce op (`Sum`, `ReduceOp::Sum`).
fn looks_like_op(e: &syn::Expr) -> bool {
    match e {
        syn::Expr::Path(p) => p
            .path
            .segments
            .last()
            .is_some_and(|s| REDUCE_OPS.iter().any(|&op| s.ident == op)),
        _ => false,
    }
}

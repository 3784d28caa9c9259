//! Lowering: the parsed graph becomes values (each living on a group or being a graph
//! input) and ops (calls, collectives, tuple plumbing) in program order. Every check that
//! needs no types happens here, with the user's span.

use std::collections::HashMap;

use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;

use super::ops::{self, CollectiveSpec, Kind, OpName, Param, Root, REDUCE_OPS};
use super::parse::GraphDef;
use crate::actor::marker_module;
use crate::diag::Diag;

pub(crate) type ValueId = usize;

pub(crate) struct Graph<'a> {
    pub(crate) def: &'a GraphDef,
    pub(crate) groups: Vec<GroupDecl>,
    pub(crate) inputs: Vec<InputDecl>,
    pub(crate) values: Vec<Value>,
    pub(crate) ops: Vec<Op>,
    pub(crate) output: Output,
}

pub(crate) struct GroupDecl {
    pub(crate) name: Ident,
    pub(crate) actor: syn::Path,
    /// The path of the actor's method markers (`#[actor]`'s module).
    pub(crate) markers: syn::Path,
    /// The number of collective stages this group runs, and their names.
    pub(crate) stages: Vec<String>,
    /// The rooted stages' names and roots, checked against the group's size at launch.
    pub(crate) roots: Vec<(String, usize)>,
}

pub(crate) struct InputDecl {
    pub(crate) name: Ident,
    pub(crate) ty: syn::Type,
    pub(crate) value: ValueId,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Input,
    Group(usize),
}

pub(crate) struct Value {
    /// The local variable that holds it in the generated step.
    pub(crate) ident: Ident,
    /// Whether `ident` is the user's name (else a generated temporary).
    named: bool,
    pub(crate) place: Place,
    pub(crate) ty: TokenStream,
}

pub(crate) struct Op {
    pub(crate) group: usize,
    pub(crate) kind: OpKind,
    pub(crate) outs: Vec<ValueId>,
}

pub(crate) enum OpKind {
    Call {
        method: Ident,
        args: Vec<ValueId>,
        /// The user's expression for each argument, for error spans.
        arg_spans: Vec<Span>,
        /// The user's `(..)` around the arguments.
        parens: Span,
    },
    Collective {
        spec: &'static CollectiveSpec,
        op: Option<OpName>,
        root: Option<Root>,
        args: Vec<ValueId>,
        /// The user's expression for each argument, for error spans.
        arg_spans: Vec<Span>,
        stage: usize,
        span: Span,
    },
    /// `outs[0] = (parts..)`
    Tuple { parts: Vec<ValueId> },
    /// `outs = src.0, src.1, ..` (destructuring)
    Fields { src: ValueId },
}

pub(crate) struct Output {
    pub(crate) parts: Vec<ValueId>,
    pub(crate) tuple: bool,
}

/// An expression's result: one value, or several (a nested collective, a tuple).
enum Lowered {
    One(ValueId),
    Parts(Vec<ValueId>),
}

#[derive(Clone, Copy)]
enum Binding {
    Group(usize),
    Value(ValueId),
    /// A name whose definition has an error already reported: its uses stay silent.
    Failed,
}

struct Lowerer<'d> {
    diag: &'d mut Diag,
    groups: Vec<GroupDecl>,
    inputs: Vec<InputDecl>,
    values: Vec<Value>,
    ops: Vec<Op>,
    scope: HashMap<String, (Binding, Span)>,
    /// The op that produced a value, for tuple-field types.
    producer: HashMap<ValueId, usize>,
}

pub(crate) fn lower<'a>(def: &'a GraphDef, diag: &mut Diag) -> Option<Graph<'a>> {
    let mut l = Lowerer {
        diag,
        groups: Vec::new(),
        inputs: Vec::new(),
        values: Vec::new(),
        ops: Vec::new(),
        scope: HashMap::new(),
        producer: HashMap::new(),
    };
    l.params(def);
    let output = l.body(def);
    // A group whose type is wrong has its own error already.
    if !def
        .params
        .iter()
        .any(|p| matches!(p.ty, syn::Type::Slice(_)))
    {
        l.diag.error(
            def.name.span(),
            "a graph needs at least one actor group parameter, e.g. `workers: [Worker]`",
        );
    }
    let output = output?;
    Some(Graph {
        def,
        groups: l.groups,
        inputs: l.inputs,
        values: l.values,
        ops: l.ops,
        output,
    })
}

impl Lowerer<'_> {
    fn declare(&mut self, name: &Ident, binding: Binding) {
        let key = name.to_string();
        if let Some(&(_, first)) = self.scope.get(&key) {
            let mut e = syn::Error::new(
                name.span(),
                format!("`{name}` is already defined in this graph; a graph cannot shadow a name, give this one a new name"),
            );
            e.combine(syn::Error::new(
                first,
                format!("`{name}` is first defined here"),
            ));
            self.diag.push(e);
            // Later uses mean this definition: bind it, so that they report nothing more.
            self.scope.insert(key, (binding, first));
            return;
        }
        self.scope.insert(key, (binding, name.span()));
    }

    fn new_value(&mut self, ident: Option<Ident>, place: Place, ty: TokenStream) -> ValueId {
        let id = self.values.len();
        let named = ident.is_some();
        let ident = ident.unwrap_or_else(|| format_ident!("__v{}", id));
        self.values.push(Value {
            ident,
            named,
            place,
            ty,
        });
        id
    }

    fn params(&mut self, def: &GraphDef) {
        for p in &def.params {
            match &p.ty {
                syn::Type::Slice(s) => {
                    let Some(actor) = actor_path(&s.elem) else {
                        self.diag.error_at(
                            &s.elem,
                            "an actor group's type is a path to an `#[actor]` type without generic arguments, e.g. `[Worker]`",
                        );
                        self.declare(&p.name, Binding::Failed);
                        continue;
                    };
                    let mut markers = actor.clone();
                    if let Some(last) = markers.segments.last_mut() {
                        last.ident = marker_module(&last.ident);
                    }
                    let idx = self.groups.len();
                    self.groups.push(GroupDecl {
                        name: p.name.clone(),
                        actor,
                        markers,
                        stages: Vec::new(),
                        roots: Vec::new(),
                    });
                    self.declare(&p.name, Binding::Group(idx));
                }
                ty => {
                    let v = self.new_value(Some(p.name.clone()), Place::Input, quote!(#ty));
                    self.inputs.push(InputDecl {
                        name: p.name.clone(),
                        ty: ty.clone(),
                        value: v,
                    });
                    self.declare(&p.name, Binding::Value(v));
                }
            }
        }
    }

    fn body(&mut self, def: &GraphDef) -> Option<Output> {
        let n = def.stmts.len();
        let mut output = None;
        for (i, stmt) in def.stmts.iter().enumerate() {
            match stmt {
                syn::Stmt::Local(local) => self.local(local),
                syn::Stmt::Expr(e, Some(_)) => {
                    self.expr(e);
                }
                syn::Stmt::Expr(e, None) if i + 1 == n => output = self.output(e),
                syn::Stmt::Expr(e, None) => {
                    self.diag.error_at(e, "expected `;` after this statement")
                }
                other => self.diag.error_at(
                    other,
                    "a graph body holds `let` bindings, calls and a final output expression",
                ),
            }
        }
        if output.is_none() && self.diag.is_empty() {
            self.diag.error(
                def.name.span(),
                "the graph has no output: end its body with a value or a tuple of values, without `;`",
            );
        }
        output
    }

    fn local(&mut self, local: &syn::Local) {
        let Some(init) = &local.init else {
            self.diag.error_at(
                local,
                "a `let` in a graph needs a value: `let name = expr;`",
            );
            return;
        };
        if let Some((_, diverge)) = &init.diverge {
            self.diag
                .error_at(diverge, "`let .. else` is not supported in a graph");
        }
        let lowered = self.expr(&init.expr);
        match &local.pat {
            syn::Pat::Ident(pi)
                if pi.by_ref.is_none() && pi.mutability.is_none() && pi.subpat.is_none() =>
            {
                let Some(lowered) = lowered else {
                    self.declare(&pi.ident, Binding::Failed);
                    return;
                };
                let v = match lowered {
                    Lowered::One(v) => v,
                    Lowered::Parts(parts) => self.tuple(parts),
                };
                self.bind(&pi.ident, v);
            }
            syn::Pat::Wild(_) => {}
            syn::Pat::Tuple(t) => {
                let mut names = Vec::new();
                for el in &t.elems {
                    match el {
                        syn::Pat::Ident(pi)
                            if pi.by_ref.is_none()
                                && pi.mutability.is_none()
                                && pi.subpat.is_none() =>
                        {
                            names.push(Some(pi.ident.clone()))
                        }
                        syn::Pat::Wild(_) => names.push(None),
                        other => self.diag.error_at(other, "expected a name or `_`"),
                    }
                }
                let Some(lowered) = lowered else {
                    self.fail_names(&names);
                    return;
                };
                let parts = match lowered {
                    Lowered::Parts(parts) => {
                        if parts.len() != names.len() {
                            self.diag.error_at(
                                t,
                                format!(
                                    "this pattern has {} names but the value has {} parts",
                                    names.len(),
                                    parts.len()
                                ),
                            );
                            self.fail_names(&names);
                            return;
                        }
                        parts
                    }
                    Lowered::One(src) => match self.fields(src, names.len()) {
                        Some(parts) => parts,
                        None => return self.fail_names(&names),
                    },
                };
                for (name, part) in names.iter().zip(parts) {
                    if let Some(name) = name {
                        self.bind(name, part);
                    }
                }
            }
            other => self.diag.error_at(
                other,
                "a graph binds a name (`let x = ..`) or a tuple of names (`let (a, b) = ..`)",
            ),
        }
    }

    /// Declares names whose value has an error already reported.
    fn fail_names(&mut self, names: &[Option<Ident>]) {
        for name in names.iter().flatten() {
            self.declare(name, Binding::Failed);
        }
    }

    /// Gives `v` the user's name; a value that already has one (`let b = a;`) is aliased.
    fn bind(&mut self, name: &Ident, v: ValueId) {
        if !self.values[v].named {
            self.values[v].ident = name.clone();
            self.values[v].named = true;
        }
        self.declare(name, Binding::Value(v));
    }

    fn tuple(&mut self, parts: Vec<ValueId>) -> ValueId {
        let group = self.group_of(parts[0]).unwrap_or(0);
        let tys = parts.iter().map(|&p| self.values[p].ty.clone());
        let ty = quote!((#(#tys,)*));
        let out = self.new_value(None, Place::Group(group), ty);
        self.producer.insert(out, self.ops.len());
        self.ops.push(Op {
            group,
            kind: OpKind::Tuple { parts },
            outs: vec![out],
        });
        out
    }

    fn fields(&mut self, src: ValueId, n: usize) -> Option<Vec<ValueId>> {
        let place = self.values[src].place;
        let Place::Group(group) = place else {
            self.diag.error(
                self.values[src].ident.span(),
                "a graph input cannot be destructured",
            );
            return None;
        };
        let src_ty = self.values[src].ty.clone();
        let known: Option<Vec<TokenStream>> =
            self.producer
                .get(&src)
                .and_then(|&op| match &self.ops.get(op)?.kind {
                    OpKind::Tuple { parts } => {
                        Some(parts.iter().map(|&p| self.values[p].ty.clone()).collect())
                    }
                    _ => None,
                });
        let outs: Vec<ValueId> = (0..n)
            .map(|i| {
                let ty = match &known {
                    Some(tys) if tys.len() == n => tys[i].clone(),
                    _ => quote!(<#src_ty as ::actorgraph::__private::TupleField<#i>>::Type),
                };
                self.new_value(None, place, ty)
            })
            .collect();
        self.ops.push(Op {
            group,
            kind: OpKind::Fields { src },
            outs: outs.clone(),
        });
        Some(outs)
    }

    fn group_of(&self, v: ValueId) -> Option<usize> {
        match self.values[v].place {
            Place::Group(g) => Some(g),
            Place::Input => None,
        }
    }

    fn output(&mut self, e: &syn::Expr) -> Option<Output> {
        let lowered = self.expr(e)?;
        let (parts, tuple) = match lowered {
            Lowered::One(v) => (vec![v], false),
            Lowered::Parts(p) => (p, true),
        };
        let mut ok = true;
        for &p in &parts {
            if self.values[p].place == Place::Input {
                let name = &self.values[p].ident;
                self.diag.error(
                    name.span(),
                    format!(
                        "`{name}` is a graph input; a graph's output is made of per-actor values"
                    ),
                );
                ok = false;
            }
        }
        ok.then_some(Output { parts, tuple })
    }

    fn expr(&mut self, e: &syn::Expr) -> Option<Lowered> {
        match e {
            syn::Expr::Path(p) => self.name(p).map(Lowered::One),
            syn::Expr::Paren(p) => self.expr(&p.expr),
            syn::Expr::MethodCall(m) => self.call(m).map(Lowered::One),
            syn::Expr::Call(c) => self.collective(c),
            syn::Expr::Tuple(t) => {
                let mut parts = Vec::new();
                for el in &t.elems {
                    parts.push(self.one(el)?);
                }
                if parts.is_empty() {
                    self.diag.error_at(t, "an empty tuple is not a graph value");
                    return None;
                }
                Some(Lowered::Parts(parts))
            }
            other => {
                self.diag.error_at(
                    other,
                    "unsupported expression in a graph: expected a name, `group.method(..)`, a collective such as `allreduce(..)`, or a tuple",
                );
                None
            }
        }
    }

    /// An expression used as one value (a tuple of parts is packed into one).
    fn one(&mut self, e: &syn::Expr) -> Option<ValueId> {
        match self.expr(e)? {
            Lowered::One(v) => Some(v),
            Lowered::Parts(parts) => Some(self.tuple(parts)),
        }
    }

    fn name(&mut self, p: &syn::ExprPath) -> Option<ValueId> {
        let Some(ident) = p.path.get_ident().filter(|_| p.qself.is_none()) else {
            self.diag
                .error_at(p, "expected a name defined in this graph");
            return None;
        };
        match self.scope.get(&ident.to_string()) {
            Some((Binding::Value(v), _)) => Some(*v),
            Some((Binding::Failed, _)) => None,
            Some((Binding::Group(g), _)) => {
                let g = &self.groups[*g].name;
                self.diag.error(
                    ident.span(),
                    format!("`{g}` is an actor group, not a value; call a method on it: `{g}.method(..)`"),
                );
                None
            }
            None => {
                self.diag
                    .error(ident.span(), format!("cannot find `{ident}` in this graph"));
                None
            }
        }
    }

    fn call(&mut self, m: &syn::ExprMethodCall) -> Option<ValueId> {
        if let Some(t) = &m.turbofish {
            self.diag
                .error_at(t, "graph method calls take no generic arguments");
        }
        let group = match &*m.receiver {
            syn::Expr::Path(p) => match p
                .path
                .get_ident()
                .and_then(|i| self.scope.get(&i.to_string()).map(|b| (i, b.0)))
            {
                Some((_, Binding::Group(g))) => Some(g),
                Some((_, Binding::Failed)) => None,
                Some((i, Binding::Value(_))) => {
                    self.diag.error(
                        i.span(),
                        format!("`{i}` is a value, not an actor group; methods are called on groups: `group.{}(..)`", m.method),
                    );
                    None
                }
                None => {
                    self.name(p);
                    None
                }
            },
            other => {
                self.diag.error_at(
                    other,
                    "methods are called on an actor group: `group.method(..)`",
                );
                None
            }
        };
        let args: Vec<Option<ValueId>> = m.args.iter().map(|a| self.one(a)).collect();
        let group = group?;
        let mut ok = true;
        let mut arg_ids = Vec::new();
        for (arg, expr) in args.into_iter().zip(&m.args) {
            let arg = arg?;
            if let Place::Group(g) = self.values[arg].place {
                if g != group {
                    self.diag.error_at(
                        expr,
                        format!(
                            "this value lives on actor group `{}`, but `{}.{}` runs on group `{}`",
                            self.groups[g].name,
                            self.groups[group].name,
                            m.method,
                            self.groups[group].name
                        ),
                    );
                    ok = false;
                }
            }
            arg_ids.push(arg);
        }
        if !ok {
            return None;
        }
        let decl = &self.groups[group];
        let (actor, markers, method) = (&decl.actor, &decl.markers, &m.method);
        let ty = quote_spanned!(method.span()=> <#actor as ::actorgraph::__private::Method<#markers::#method>>::Output);
        let out = self.new_value(None, Place::Group(group), ty);
        self.producer.insert(out, self.ops.len());
        self.ops.push(Op {
            group,
            kind: OpKind::Call {
                method: m.method.clone(),
                args: arg_ids,
                arg_spans: m.args.iter().map(|a| a.span()).collect(),
                parens: m.paren_token.span.join(),
            },
            outs: vec![out],
        });
        Some(out)
    }

    fn collective(&mut self, c: &syn::ExprCall) -> Option<Lowered> {
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
        let (op, root, params_ok) = self.collective_params(spec, c, args);
        let (exprs, nested): (Vec<&syn::Expr>, bool) = match first {
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
                (a.elems.iter().collect(), true)
            }
            e => (vec![e], false),
        };
        let mut ins = Vec::new();
        let mut group: Option<(usize, &syn::Expr)> = None;
        let mut ok = true;
        for e in &exprs {
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
            match self.values[v].place {
                Place::Input => {
                    self.diag.error_at(
                        e,
                        format!(
                            "`{}` is a graph input, the same on every actor; `{fname}` takes per-actor values (results of method calls)",
                            self.values[v].ident
                        ),
                    );
                    ok = false;
                }
                Place::Group(g) => match group {
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
        let (group, _) = group.filter(|_| ok && params_ok)?;
        let stage = self.groups[group].stages.len();
        let mut shown: Vec<String> = exprs.iter().map(|e| show(e)).collect();
        if nested {
            shown = vec![format!("[{}]", shown.join(", "))];
        }
        shown.extend(op.iter().map(|o| o.name.to_string()));
        shown.extend(root.iter().map(|r| r.rank.to_string()));
        let name = format!("{fname}({})", shown.join(", "));
        if let Some(root) = &root {
            self.groups[group].roots.push((name.clone(), root.rank));
        }
        self.groups[group].stages.push(name);
        let outs: Vec<ValueId> = ins
            .iter()
            .zip(&exprs)
            .map(|(&v, e)| {
                let ty = output_type(spec.kind, &self.values[v].ty, e.span());
                self.new_value(None, Place::Group(group), ty)
            })
            .collect();
        for &o in &outs {
            self.producer.insert(o, self.ops.len());
        }
        self.ops.push(Op {
            group,
            kind: OpKind::Collective {
                spec,
                op,
                root,
                args: ins,
                arg_spans: exprs.iter().map(|e| e.span()).collect(),
                stage,
                span: c.span(),
            },
            outs: outs.clone(),
        });
        Some(if nested {
            Lowered::Parts(outs)
        } else {
            Lowered::One(outs[0])
        })
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
        if let syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(lit),
            ..
        }) = e
        {
            if let Ok(rank) = lit.base10_parse::<usize>() {
                return Some(Root {
                    rank,
                    span: lit.span(),
                });
            }
        }
        self.diag.error_at(
            e,
            format!(
                "the root of `{}` is a rank, written as an integer literal such as `0`, not `{}`",
                spec.name,
                show(e)
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
                        show(e),
                        REDUCE_OPS
                            .iter()
                            .map(|op| format!("`{op}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
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

/// The type a collective of `kind` makes of a value of type `ty`, spanned at the user's
/// argument so that a type that cannot go through it gets its error there.
fn output_type(kind: Kind, ty: &TokenStream, at: Span) -> TokenStream {
    match kind {
        Kind::InPlace | Kind::Scatter => ty.clone(),
        Kind::Gather => quote_spanned!(at=> <#ty as ::actorgraph::Gather>::Gathered),
        Kind::Rooted => quote!(::core::option::Option<#ty>),
    }
}

fn actor_path(ty: &syn::Type) -> Option<syn::Path> {
    match ty {
        syn::Type::Path(p) if p.qself.is_none() && p.path.segments.last()?.arguments.is_none() => {
            Some(p.path.clone())
        }
        _ => None,
    }
}

/// A compact rendering of a user's expression for stage names.
fn show(e: &syn::Expr) -> String {
    let s = quote!(#e).to_string();
    s.replace(" . ", ".")
        .replace("- ", "-")
        .replace(" (", "(")
        .replace("( ", "(")
        .replace(" )", ")")
        .replace(" ,", ",")
}

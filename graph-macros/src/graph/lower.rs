//! Lowering: the parsed graph becomes the IR (`ir`), checked as it goes. Every check that
//! needs no types happens here, with the user's span, and every error is collected in the
//! `Diag` rather than stopping at the first; the checks that need types are left to rustc,
//! in the constants codegen emits (`ir::Check`).
//!
//! A value is defined by a `let` before any use (a use of a later name is an error), so
//! program order is a topological order of the dataflow graph and the graph has no cycle
//! by construction: there is no syntax that could make one. The schedule relies on it.

mod collective;
mod gather;
mod per_rank;

use gather::{is_gather, is_scatter};

use std::collections::HashMap;

use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote, ToTokens};
use syn::spanned::Spanned;

use super::ir::{
    Check, CheckKind, Graph, GroupDecl, InputDecl, Op, OpKind, Origin, Output, Place, Value,
    ValueId,
};
use super::parse::{int_literal, GraphDef};
use super::types::{call_output, checked_type, privacy, tuple, tuple_field};
use crate::diag::{tidy, Diag};

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
    /// Every name a `let` of the graph defines, where: a use before its definition gets a
    /// better error than an unknown name.
    defined_later: HashMap<String, Span>,
    /// The number of method calls so far, which numbers them (`MethodCall<K>`).
    calls: usize,
    checks: Vec<Check>,
    privacy: TokenStream,
}

pub(crate) fn lower<'a>(def: &'a GraphDef, diag: &mut Diag) -> Option<Graph<'a>> {
    let mut l = Lowerer {
        calls: 0,
        checks: Vec::new(),
        privacy: privacy(def),
        diag,
        groups: Vec::new(),
        inputs: Vec::new(),
        values: Vec::new(),
        ops: Vec::new(),
        scope: HashMap::new(),
        defined_later: let_names(def),
    };
    l.params(def);
    let output = l.body(def);
    // A group whose type is wrong has its own error already.
    if !def.params.iter().any(|p| p.group.is_some()) {
        l.diag.error(
            def.name.span(),
            "a graph needs at least one actor group parameter, e.g. `workers: [Worker]`",
        );
    }
    l.per_rank_readers();
    let output = output?;
    Some(Graph {
        def,
        groups: l.groups,
        inputs: l.inputs,
        values: l.values,
        ops: l.ops,
        output,
        checks: l.checks,
        privacy: l.privacy,
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

    fn new_value(
        &mut self,
        ident: Option<Ident>,
        label: String,
        origin: Origin,
        ty: TokenStream,
    ) -> ValueId {
        let id = self.values.len();
        let named = ident.is_some();
        let ident = ident.unwrap_or_else(|| format_ident!("__v{}", id));
        self.values.push(Value {
            ident,
            named,
            label,
            origin,
            ty,
        });
        id
    }

    /// Adds an op at `place` and the values it makes (a label and a type each): the one
    /// place where ops are made, so every value made by an op names it as its origin.
    fn push_op(
        &mut self,
        place: Place,
        kind: OpKind,
        outs: Vec<(String, TokenStream)>,
    ) -> Vec<ValueId> {
        let op = self.ops.len();
        let outs: Vec<ValueId> = outs
            .into_iter()
            .map(|(label, ty)| self.new_value(None, label, Origin::Op { op, place }, ty))
            .collect();
        self.ops.push(Op {
            place,
            kind,
            outs: outs.clone(),
        });
        outs
    }

    fn params(&mut self, def: &GraphDef) {
        for p in &def.params {
            let group = p.group.as_ref().map(|(elem, len)| (elem, len.as_ref()));
            match (&p.ty, group) {
                (_, Some((elem, len))) => {
                    if !matches!(elem, syn::Type::Path(_)) {
                        self.diag.error_at(
                            elem,
                            "an actor group's type is a path to a type with an `#[actor]` impl block, e.g. `[Worker]` or `[model::Worker<f32>]`",
                        );
                        self.declare(&p.name, Binding::Failed);
                        continue;
                    }
                    let size = len.map(|len| (len.clone(), int_literal(len)));
                    let idx = self.groups.len();
                    self.groups.push(GroupDecl {
                        name: p.name.clone(),
                        actor: elem.clone(),
                        actor_text: tidy(elem),
                        size,
                        indices: Vec::new(),
                        stages: Vec::new(),
                        roots: Vec::new(),
                    });
                    self.declare(&p.name, Binding::Group(idx));
                }
                (ty, None) => {
                    let (elem, kind) = match &p.per_rank {
                        None => (ty, CheckKind::Input),
                        Some(Some(elem)) => (elem, CheckKind::RankInput),
                        Some(None) => {
                            self.diag.error_at(
                                ty,
                                "a per-rank input is written `PerRank<T>`, with one type: `execute` then takes a `Vec<T>` with one value per rank",
                            );
                            self.declare(&p.name, Binding::Failed);
                            continue;
                        }
                    };
                    let v = self.new_value(
                        Some(p.name.clone()),
                        p.name.to_string(),
                        Origin::Input(self.inputs.len()),
                        quote!(#elem),
                    );
                    let k = self.check(quote!(#elem), elem.span(), kind);
                    self.inputs.push(InputDecl {
                        name: p.name.clone(),
                        ty: p.execute_ty(),
                        text: tidy(ty),
                        checked: checked_type(k),
                        per_rank: p.per_rank.is_some(),
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
                    Lowered::One(v) => Some(v),
                    Lowered::Parts(parts) => self.tuple(parts, &init.expr),
                };
                match v {
                    Some(v) => self.bind(&pi.ident, v),
                    None => self.declare(&pi.ident, Binding::Failed),
                }
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
                    Lowered::One(src) => match self.fields(src, names.len(), t) {
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
            self.values[v].label = name.to_string();
            self.values[v].named = true;
        }
        self.declare(name, Binding::Value(v));
    }

    /// Packs values into one tuple value. Its parts must live on the same actors (graph
    /// inputs, readable everywhere, may join them); `at` is the user's tuple, for errors.
    fn tuple(&mut self, parts: Vec<ValueId>, at: &dyn ToTokens) -> Option<ValueId> {
        let mut place = None;
        for &p in &parts {
            match (self.values[p].place(), place) {
                (None, _) => {}
                (Some(here), None) => place = Some(here),
                (Some(here), Some(first)) if here != first => {
                    self.diag.error_at(
                        at,
                        format!(
                            "a tuple's values must live on the same actors, but `{}` lives on {} and `{}` on {}",
                            self.values[parts[0]].label,
                            self.describe(first),
                            self.values[p].label,
                            self.describe(here)
                        ),
                    );
                    return None;
                }
                _ => {}
            }
        }
        let Some(place) = place else {
            self.diag.error_at(
                at,
                "a tuple of graph inputs is not a per-actor value; make it one input of the graph",
            );
            return None;
        };
        let tys = parts.iter().map(|&p| self.values[p].ty.clone());
        let ty = tuple(tys);
        let labels: Vec<&str> = parts
            .iter()
            .map(|&p| self.values[p].label.as_str())
            .collect();
        let label = format!("({})", labels.join(", "));
        let outs = self.push_op(place, OpKind::Tuple { parts }, vec![(label, ty)]);
        Some(outs[0])
    }

    /// Where a value lives, in words.
    fn describe(&self, place: Place) -> String {
        match place {
            Place::Group(g) => format!("group `{}`", self.groups[g].name),
            Place::Actor(g, k) => format!("`{}[{k}]`", self.groups[g].name),
        }
    }

    /// Checks `ty` once, at `at` (see `Check`).
    fn check(&mut self, ty: TokenStream, at: Span, kind: CheckKind) -> usize {
        self.checks.push(Check { ty, at, kind });
        self.checks.len() - 1
    }

    /// Destructures `src` into `n` values; `pat` is the user's pattern, where a value that
    /// is not a tuple of `n` fields gets its one error.
    fn fields(&mut self, src: ValueId, n: usize, pat: &syn::PatTuple) -> Option<Vec<ValueId>> {
        let Some(place) = self.values[src].place() else {
            self.diag.error(
                self.values[src].ident.span(),
                "a graph input cannot be destructured",
            );
            return None;
        };
        let src_ty = self.values[src].ty.clone();
        let known: Option<Vec<TokenStream>> = self.values[src].made_by().and_then(|op| match &self
            .ops[op]
            .kind
        {
            OpKind::Tuple { parts } => {
                Some(parts.iter().map(|&p| self.values[p].ty.clone()).collect())
            }
            _ => None,
        });
        let (tys, check) = match known {
            Some(tys) if tys.len() == n => (tys, None),
            Some(tys) => {
                self.diag.error_at(
                    pat,
                    format!(
                        "this pattern has {n} names but the value has {} parts",
                        tys.len()
                    ),
                );
                return None;
            }
            None => {
                let k = self.check(src_ty, pat.span(), CheckKind::Fields(n));
                let checked = checked_type(k);
                let tys = (0..n).map(|i| tuple_field(&checked, i)).collect();
                (tys, Some(k))
            }
        };
        let outs = tys
            .into_iter()
            .enumerate()
            .map(|(i, ty)| (format!("{}.{i}", self.values[src].label), ty))
            .collect();
        Some(self.push_op(place, OpKind::Fields { src, check }, outs))
    }

    fn output(&mut self, e: &syn::Expr) -> Option<Output> {
        let lowered = self.expr(e)?;
        let (parts, tuple) = match lowered {
            Lowered::One(v) => (vec![v], false),
            Lowered::Parts(p) => (p, true),
        };
        let spans: Vec<Span> = match e {
            syn::Expr::Tuple(t) if t.elems.len() == parts.len() => {
                t.elems.iter().map(|e| e.span()).collect()
            }
            _ => vec![e.span(); parts.len()],
        };
        let mut ok = true;
        let mut tys = Vec::new();
        for (&p, &at) in parts.iter().zip(&spans) {
            if self.values[p].is_input() {
                let name = &self.values[p].ident;
                self.diag.error(
                    name.span(),
                    format!(
                        "`{name}` is a graph input; a graph's output is made of per-actor values"
                    ),
                );
                ok = false;
            }
            let k = self.check(self.values[p].ty.clone(), at, CheckKind::Send);
            tys.push(checked_type(k));
        }
        ok &= self.output_ranks(&parts, &spans);
        ok.then_some(Output { parts, tys, tuple })
    }

    fn expr(&mut self, e: &syn::Expr) -> Option<Lowered> {
        match e {
            syn::Expr::Path(p) => self.name(p).map(Lowered::One),
            syn::Expr::Paren(p) => self.expr(&p.expr),
            syn::Expr::MethodCall(m) => self.call(m).map(Lowered::One),
            syn::Expr::Index(ix) => self.pick(ix).map(Lowered::One),
            syn::Expr::Call(c) if is_gather(c) || is_scatter(c) => {
                self.edge_fn_misplaced(c);
                None
            }
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
            Lowered::Parts(parts) => self.tuple(parts, e),
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
                self.unknown(ident);
                None
            }
        }
    }

    /// Reports a name that is not (yet) defined.
    fn unknown(&mut self, ident: &Ident) {
        match self.defined_later.get(&ident.to_string()) {
            Some(&def) => {
                let mut e = syn::Error::new(
                    ident.span(),
                    format!(
                        "`{ident}` is used before it is defined; a graph runs in the order it is written, so a value can only use values defined above it (and the graph cannot have a cycle)"
                    ),
                );
                e.combine(syn::Error::new(def, format!("`{ident}` is defined here")));
                self.diag.push(e);
            }
            None => self
                .diag
                .error(ident.span(), format!("cannot find `{ident}` in this graph")),
        }
    }

    fn call(&mut self, m: &syn::ExprMethodCall) -> Option<ValueId> {
        if let Some(t) = &m.turbofish {
            self.diag
                .error_at(t, "graph method calls take no generic arguments");
        }
        let place = self.receiver(&m.receiver, &m.method);
        // Arguments may live anywhere: a value of other actors comes over an edge (see the
        // schedule); rustc checks its type against the method's parameter.
        let args: Vec<Option<ValueId>> = m
            .args
            .iter()
            .map(|a| match a {
                syn::Expr::Call(c) if is_gather(c) => self.gather(c, place),
                syn::Expr::Call(c) if is_scatter(c) => self.scatter(c, place),
                a => self.one(a),
            })
            .collect();
        let place = place?;
        let arg_ids: Vec<ValueId> = args.into_iter().collect::<Option<_>>()?;
        let method = &m.method;
        let call = self.calls;
        self.calls += 1;
        let ty = call_output(call, method.span());
        let receiver = tidy(&m.receiver);
        let label = format!("{receiver}.{method}(..)");
        let kind = OpKind::Call {
            call,
            method: m.method.clone(),
            receiver,
            args: arg_ids,
            arg_spans: m.args.iter().map(|a| a.span()).collect(),
            parens: m.paren_token.span.join(),
        };
        let outs = self.push_op(place, kind, vec![(label, ty)]);
        Some(outs[0])
    }

    /// The actors a method runs on: `group` (every actor) or `group[k]` (one).
    fn receiver(&mut self, e: &syn::Expr, method: &Ident) -> Option<Place> {
        match e {
            syn::Expr::Paren(p) => self.receiver(&p.expr, method),
            syn::Expr::Path(p) => match p
                .path
                .get_ident()
                .and_then(|i| self.scope.get(&i.to_string()).map(|b| (i, b.0)))
            {
                Some((_, Binding::Group(g))) => Some(Place::Group(g)),
                Some((_, Binding::Failed)) => None,
                Some((i, Binding::Value(_))) => {
                    self.diag.error(
                        i.span(),
                        format!("`{i}` is a value, not an actor group; methods are called on groups: `group.{method}(..)` or `group[0].{method}(..)`"),
                    );
                    None
                }
                None => {
                    self.name(p);
                    None
                }
            },
            syn::Expr::Index(ix) => {
                let group = match self.receiver(&ix.expr, method)? {
                    Place::Group(g) => g,
                    _ => {
                        self.diag
                            .error_at(ix, "an actor is addressed once: `group[0].method(..)`");
                        return None;
                    }
                };
                let index = self.rank_index(group, &ix.index)?;
                Some(Place::Actor(group, index))
            }
            other => {
                self.diag.error_at(
                    other,
                    "methods are called on an actor group or on one of its actors: `group.method(..)` or `group[0].method(..)`",
                );
                None
            }
        }
    }
}

impl Lowerer<'_> {
    /// A rank of `group` written as an index (`group[k]`, `value[k]`): an integer
    /// literal, in range of a group of known size; recorded for the launch-time check.
    fn rank_index(&mut self, group: usize, index: &syn::Expr) -> Option<usize> {
        let Some(k) = int_literal(index) else {
            let g = &self.groups[group].name;
            self.diag.error_at(
                index,
                format!(
                    "an actor index is a rank, written as an integer literal such as `{g}[0]`, not `{}`",
                    tidy(index)
                ),
            );
            return None;
        };
        let span = index.span();
        let decl = &mut self.groups[group];
        if let Some((_, Some(size))) = &decl.size {
            if k >= *size {
                let msg = format!(
                    "actor index {k} is out of range: group `{}` has {size} actors (ranks 0..{size})",
                    decl.name
                );
                self.diag.error(span, msg);
                return None;
            }
        }
        if !decl.indices.iter().any(|&(i, _)| i == k) {
            decl.indices.push((k, span));
        }
        Some(k)
    }
}

/// Every name a `let` of the graph binds, with its span.
fn let_names(def: &GraphDef) -> HashMap<String, Span> {
    let mut names = HashMap::new();
    let mut add = |pat: &syn::Pat| {
        if let syn::Pat::Ident(pi) = pat {
            names
                .entry(pi.ident.to_string())
                .or_insert_with(|| pi.ident.span());
        }
    };
    for stmt in &def.stmts {
        if let syn::Stmt::Local(local) = stmt {
            match &local.pat {
                syn::Pat::Tuple(t) => t.elems.iter().for_each(&mut add),
                pat => add(pat),
            }
        }
    }
    names
}

//! The per-actor step of one group: its ops, sends and receives in schedule order (see
//! `schedule`), as straight-line code with no boxing or dynamic dispatch per node.
//!
//! In the step, a per-actor value of the group is a local `T`; a single-actor value
//! (`workers[k].method(..)`) is a local `Option<T>`, `Some` on actor k only; a value that
//! comes over an edge is received into a local of the same shape. Values are borrowed by
//! calls and stages, and moved at their last use by whatever needs them owned (a send, a
//! tuple, the output), cloned before that.

use std::collections::{HashMap, HashSet};

use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};

use super::ir::{Graph, OpKind, Place, ValueId};
use super::plan::{edge_type, GroupPlan};
use super::schedule::{Item, Route, Schedule};
use super::stage::{collective_expr, complete_code, start_code, StageValue};
use super::types::{checked_type, method as method_of};
use crate::respan::{at_user, respan};
use crate::rt;

/// One piece of a step: an item of the schedule, or the completion of the stage that op
/// `i` started (see [`completions`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Entry {
    Item(Item),
    Complete(usize),
}

/// A local of the generated step.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Local {
    /// A graph value held by this group's actors.
    Value(ValueId),
    /// A value received over edge `e`.
    Landed(usize),
}

fn step_name(name: &Ident) -> Ident {
    format_ident!("__step_{}", name)
}

/// The name of a group's step function.
pub(crate) fn name(g: &Graph, group: usize) -> Ident {
    step_name(&g.groups[group].name)
}

/// The type of the graph's edges as the steps see them: a tuple of `Arc<Edge<T>>`, by
/// edge index.
pub(crate) fn links_type(g: &Graph, sched: &Schedule) -> TokenStream {
    let rt = rt::local();
    let tys = (0..sched.edges.len()).map(|e| edge_type(g, e));
    quote!((#(#rt::Arc<#rt::Edge<#tys>>,)*))
}

struct Gen<'a> {
    g: &'a Graph<'a>,
    sched: &'a Schedule,
    group: usize,
    /// Uses of each local left in the step, to move it at the last one.
    uses: HashMap<Local, usize>,
    /// The group's synchronizations in order, for the runtime's failure path.
    sync: Vec<TokenStream>,
    /// Locals moved at their last use (the others live to the end of the step).
    moved: HashSet<Local>,
    /// Whether a method runs after the group's last stage (or the group has no stage):
    /// its schedule then ends with `SyncPoint::End`.
    calls_after_stages: bool,
}

/// A stage started and not yet completed, while [`Gen::completions`] walks a step.
struct Open {
    op: usize,
    /// Whether something that takes time (a call, another stage, an edge) runs between its
    /// start and its completion.
    busy: bool,
    /// Its results, and the values made from them by the items it holds.
    outs: Vec<ValueId>,
    /// The items that only take its results apart or put them together (a nested
    /// collective's tuple, a `let (x, y) = ..`): they wait for its completion, and their
    /// values count as its results.
    held: Vec<Item>,
}

/// A group's step, as code.
pub(crate) struct Step {
    /// The step function.
    pub(crate) f: TokenStream,
    /// Its schedule of synchronizations (the `&[SyncPoint]` the runtime's failure path
    /// follows).
    pub(crate) schedule: TokenStream,
    /// The stages it completes after later calls, by index (`&[usize]`).
    pub(crate) deferred: TokenStream,
}

/// The step function of group `p.index`, its schedule of synchronizations and its deferred
/// stages.
pub(crate) fn step_fn(g: &Graph, sched: &Schedule, p: &GroupPlan) -> Step {
    let rt = rt::local();
    let mut gen = Gen {
        g,
        sched,
        group: p.index,
        uses: HashMap::new(),
        sync: Vec::new(),
        moved: HashSet::new(),
        calls_after_stages: false,
    };
    let (entries, deferred) = gen.completions();
    gen.count_uses(p, &entries);
    let body: Vec<TokenStream> = entries.iter().map(|&e| gen.entry(e)).collect();
    let result = gen.result(p);
    let recycle = gen.recycle();
    if gen.calls_after_stages {
        // An error there reaches a group's other processes through one more, empty,
        // stage (the runtime runs it only when the group spans processes).
        gen.sync_point(quote!(#rt::SyncPoint::End));
    }

    let decl = &g.groups[p.index];
    let actor = &decl.actor;
    let step = name(g, p.index);
    let in_ty = p.input_type(g);
    let bind_inputs = p.bind_inputs(g);
    let links = links_type(g, sched);
    let out_ty = &p.out_ty;
    let sync = &gen.sync;
    let f = quote! {
        fn #step<__C: #rt::Communicator>(
            __actor: &mut #actor,
            __ctx: &mut #rt::StepCtx<__C>,
            __inputs: &#in_ty,
            __links: &#links,
        ) -> #rt::Result<#out_ty, #rt::Error> {
            #(#bind_inputs)*
            #(#body)*
            let __result = #result;
            #(#recycle)*
            #rt::Result::Ok(__result)
        }
    };
    Step {
        f,
        schedule: quote!(&[#(#sync),*]),
        deferred: quote!(&[#(#deferred),*]),
    }
}

impl Gen<'_> {
    /// The local an argument of an op at `at` reads.
    fn arg_local(&self, v: ValueId, at: Place) -> Option<Local> {
        if let Some(&e) = self.sched.landing.get(&(v, at)) {
            return Some(Local::Landed(e));
        }
        (!self.g.values[v].is_input()).then_some(Local::Value(v))
    }

    fn note(&mut self, l: Local) {
        *self.uses.entry(l).or_default() += 1;
    }

    /// The locals an item reads, as the code generation uses them.
    fn reads(&self, item: Item) -> Vec<Local> {
        match item {
            Item::Op(i) => {
                let op = &self.g.ops[i];
                let reads: Vec<ValueId> = match &op.kind {
                    OpKind::Call { args, .. } => args.clone(),
                    OpKind::Collective { args, .. } => args.clone(),
                    OpKind::Tuple { parts } => parts.clone(),
                    OpKind::Fields { src, .. } | OpKind::Pick { src } => vec![*src],
                    OpKind::Gather { .. } | OpKind::Scatter { .. } => {
                        return vec![Local::Landed(self.sched.carried[&i])];
                    }
                };
                reads
                    .into_iter()
                    .filter_map(|v| self.arg_local(v, op.place))
                    .collect()
            }
            Item::Send(e) => vec![Local::Value(self.sched.edges[e].sent)],
            Item::Recv(e) => {
                let edge = &self.sched.edges[e];
                match edge.route {
                    Route::Fan {
                        skip_from: true, ..
                    }
                    | Route::Gather { keep: true, .. } => vec![Local::Value(edge.value)],
                    _ => vec![],
                }
            }
        }
    }

    /// The group's schedule with each stage's completion placed right before the first
    /// item that reads one of its results (or at the end of the step), so that the calls
    /// between run while the stage goes on; and the deferred stages, by stage index: those
    /// with something that takes time between their start and completion, or that start
    /// while another is in flight. Stages complete in the order they started: completing
    /// one completes every one started before it, which is what a communicator that runs
    /// them in turn needs.
    fn completions(&self) -> (Vec<Entry>, Vec<usize>) {
        let mut entries = Vec::new();
        let mut deferred = Vec::new();
        let mut open: Vec<Open> = Vec::new();
        let mut close = |open: &mut Vec<Open>, upto: usize, entries: &mut Vec<Entry>| {
            for o in open.drain(..upto) {
                entries.push(Entry::Complete(o.op));
                entries.extend(o.held.into_iter().map(Entry::Item));
                if o.busy {
                    if let OpKind::Collective { stage, .. } = self.g.ops[o.op].kind {
                        deferred.push(stage);
                    }
                }
            }
        };
        for item in self.sched.of_group(self.g, self.group) {
            let reads = self.reads(item);
            let reads_open = open
                .iter()
                .rposition(|o| o.outs.iter().any(|&v| reads.contains(&Local::Value(v))));
            // What takes time: everything but taking a value apart or putting it together.
            let instant = match item {
                Item::Op(i) => matches!(
                    self.g.ops[i].kind,
                    OpKind::Tuple { .. } | OpKind::Fields { .. } | OpKind::Pick { .. }
                ),
                Item::Send(_) | Item::Recv(_) => false,
            };
            match (reads_open, item) {
                // Held by the stage whose results it reads (the latest, if several).
                (Some(k), Item::Op(i)) if instant => {
                    open[k].outs.extend(&self.g.ops[i].outs);
                    open[k].held.push(item);
                    continue;
                }
                (Some(k), _) => close(&mut open, k + 1, &mut entries),
                (None, _) => {}
            }
            if !instant {
                open.iter_mut().for_each(|o| o.busy = true);
            }
            entries.push(Entry::Item(item));
            if let Item::Op(i) = item {
                if matches!(self.g.ops[i].kind, OpKind::Collective { .. }) {
                    // A stage that starts while others are in flight goes through the same
                    // door, so that the communicator sees every stage of the run in order.
                    open.push(Open {
                        op: i,
                        busy: !open.is_empty(),
                        outs: self.g.ops[i].outs.clone(),
                        held: Vec::new(),
                    });
                }
            }
        }
        let all = open.len();
        close(&mut open, all, &mut entries);
        (entries, deferred)
    }

    /// Counts every use of every local, in the same walk as the code generation: a stage's
    /// completion reads its values again (their results are made from them).
    fn count_uses(&mut self, p: &GroupPlan, entries: &[Entry]) {
        for &entry in entries {
            let reads = match entry {
                Entry::Item(item) => self.reads(item),
                Entry::Complete(i) => self.stage_reads(i),
            };
            reads.into_iter().for_each(|l| self.note(l));
        }
        for &k in &p.out_parts {
            self.note(Local::Value(self.g.output.parts[k]));
        }
    }

    /// The locals a stage's completion reads: its values.
    fn stage_reads(&self, i: usize) -> Vec<Local> {
        let op = &self.g.ops[i];
        match &op.kind {
            OpKind::Collective { args, .. } => args
                .iter()
                .filter_map(|&v| self.arg_local(v, op.place))
                .collect(),
            _ => vec![],
        }
    }

    fn ident(&self, l: Local) -> Ident {
        match l {
            Local::Value(v) => self.g.values[v].ident.clone(),
            Local::Landed(e) => format_ident!("__edge{}", e),
        }
    }

    /// Uses `l` once more without taking it.
    fn borrow(&mut self, l: Local) -> Ident {
        if let Some(n) = self.uses.get_mut(&l) {
            *n = n.saturating_sub(1);
        }
        self.ident(l)
    }

    /// Takes `l`: moved at its last use, else cloned. A single-actor local gives its
    /// `Option`; `own_held` gives the value itself.
    fn own(&mut self, l: Local, at: Span) -> TokenStream {
        let id = at_user(&self.borrow(l), at);
        if self.last_use(l) {
            quote!(#id)
        } else {
            quote_spanned!(at=> ::core::clone::Clone::clone(&#id))
        }
    }

    /// Takes `l` to send it to other actors: moved at its last use, else cloned, with the
    /// error of a type without `Clone` at the user's argument `at`.
    fn own_sent(&mut self, l: Local, at: Span) -> TokenStream {
        let rt = rt::local();
        let id = at_user(&self.borrow(l), at);
        if self.last_use(l) {
            quote!(#id)
        } else {
            respan(quote!(#rt::clone_value(&#id)), at)
        }
    }

    /// Takes the value of a single-actor local on its actor: moved at its last use, else
    /// cloned. The clone needs `T: Clone`, and says so at the user's argument `at`.
    fn own_held(&mut self, l: Local, at: Span) -> TokenStream {
        let rt = rt::local();
        let id = at_user(&self.borrow(l), at);
        if self.last_use(l) {
            quote!(__ctx.take_held(#id)?)
        } else {
            respan(quote!(#rt::clone_value(__ctx.held(&#id)?)), at)
        }
    }

    /// Whether the use just counted was `l`'s last: it is moved there.
    fn last_use(&mut self, l: Local) -> bool {
        let last = self.uses.get(&l).copied().unwrap_or(0) == 0;
        if last {
            self.moved.insert(l);
        }
        last
    }

    /// Each gathered `Vec` the step did not move, handed back to its edge at the end of
    /// the step, for the next round's values (no allocation per execution).
    fn recycle(&self) -> Vec<TokenStream> {
        let rt = rt::path();
        let g = self.g;
        g.ops
            .iter()
            .enumerate()
            .filter(|(_, op)| op.group() == self.group)
            .filter(|(_, op)| matches!(op.kind, OpKind::Gather { .. }))
            .filter(|(_, op)| !self.moved.contains(&Local::Value(op.outs[0])))
            .map(|(i, op)| {
                let e = syn::Index::from(self.sched.carried[&i]);
                let id = &g.values[op.outs[0]].ident;
                match op.place {
                    Place::Actor(..) => quote! {
                        if let #rt::Option::Some(__gathered) = #id {
                            __ctx.recycle(&*__links.#e, __gathered);
                        }
                    },
                    Place::Group(_) => quote!(__ctx.recycle(&*__links.#e, #id);),
                }
            })
            .collect()
    }

    /// Whether a local holds `Option<T>` (a value of one actor) rather than `T`.
    fn is_single(&self, l: Local) -> bool {
        match l {
            Local::Value(v) => matches!(self.g.values[v].place(), Some(Place::Actor(..))),
            Local::Landed(e) => matches!(self.sched.edges[e].to, Place::Actor(..)),
        }
    }

    /// The position of the next synchronization in the group's schedule.
    fn sync_point(&mut self, point: TokenStream) -> usize {
        self.sync.push(point);
        self.sync.len() - 1
    }

    fn entry(&mut self, entry: Entry) -> TokenStream {
        match entry {
            Entry::Item(Item::Op(i)) => self.op(i),
            Entry::Item(Item::Send(e)) => self.send(e),
            Entry::Item(Item::Recv(e)) => self.recv(e),
            Entry::Complete(i) => self.complete(i),
        }
    }

    /// The values of the stage op `i` starts or completes, at the user's arguments.
    fn stage_values(&mut self, i: usize) -> Vec<StageValue> {
        let OpKind::Collective {
            args,
            arg_spans,
            checks,
            ..
        } = &self.g.ops[i].kind
        else {
            return vec![];
        };
        args.iter()
            .zip(arg_spans)
            .enumerate()
            .map(|(n, (&a, &span))| StageValue {
                ident: at_user(&self.borrow(Local::Value(a)), span),
                span,
                checked: checks.get(n).map(|&k| checked_type(k)),
            })
            .collect()
    }

    /// The completion of the stage that op `i` started: its results.
    fn complete(&mut self, i: usize) -> TokenStream {
        let g = self.g;
        let op = &g.ops[i];
        let OpKind::Collective {
            spec, root, stage, ..
        } = &op.kind
        else {
            return quote!();
        };
        let outs: Vec<&Ident> = op.outs.iter().map(|&o| &g.values[o].ident).collect();
        let vals = self.stage_values(i);
        complete_code(spec.kind, *stage, &outs, &vals, root.as_ref())
    }

    fn op(&mut self, i: usize) -> TokenStream {
        let rt = rt::local();
        let g = self.g;
        let op = &g.ops[i];
        let outs: Vec<&Ident> = op.outs.iter().map(|&o| &g.values[o].ident).collect();
        let on_rank = match op.place {
            Place::Actor(_, k) => Some(k),
            _ => None,
        };
        match &op.kind {
            OpKind::Call {
                call,
                method,
                args,
                arg_spans,
                parens,
                ..
            } => {
                self.calls_after_stages = true;
                let (held, call) =
                    self.method_call(op.place, *call, method, (args, arg_spans), *parens);
                let out = outs[0];
                match on_rank {
                    None => quote!(let #out = #call;),
                    Some(k) => quote! {
                        let #out = if __ctx.rank() == #k {
                            #(#held)*
                            #rt::Option::Some(#call)
                        } else {
                            #rt::Option::None
                        };
                    },
                }
            }
            OpKind::Collective {
                spec,
                op: reduce,
                root,
                args,
                stage,
                span,
                ..
            } => {
                self.sync_point(quote!(#rt::SyncPoint::Stage(#stage)));
                self.calls_after_stages = false;
                let vals = self.stage_values(i);
                let collective = collective_expr(spec, reduce.as_ref(), root.as_ref(), *span);
                let labels: Vec<&str> = args.iter().map(|&a| g.values[a].label.as_str()).collect();
                start_code(spec.kind, (*stage, &labels), &vals, &collective)
            }
            OpKind::Tuple { parts } => {
                let at = Span::call_site();
                let parts: Vec<TokenStream> = parts
                    .iter()
                    .map(|&v| match self.arg_local(v, op.place) {
                        None => {
                            let id = &g.values[v].ident;
                            quote!(::core::clone::Clone::clone(#id))
                        }
                        Some(l) if on_rank.is_some() => self.own_held(l, at),
                        Some(l) => self.own(l, at),
                    })
                    .collect();
                let out = outs[0];
                match on_rank {
                    None => quote!(let #out = (#(#parts,)*);),
                    Some(k) => quote! {
                        let #out = if __ctx.rank() == #k {
                            #rt::Option::Some((#(#parts,)*))
                        } else {
                            #rt::Option::None
                        };
                    },
                }
            }
            // Rank k's value, taken on rank k (moved at its last use).
            OpKind::Pick { src } => {
                let k = on_rank.unwrap_or_default();
                let src = self.own(Local::Value(*src), Span::call_site());
                let out = outs[0];
                quote! {
                    let #out = if __ctx.rank() == #k {
                        #rt::Option::Some(#src)
                    } else {
                        #rt::Option::None
                    };
                }
            }
            // The values came over the gather or scatter edge, right before: they are the
            // value.
            OpKind::Gather { .. } | OpKind::Scatter { .. } => {
                let landed = self.own(Local::Landed(self.sched.carried[&i]), Span::call_site());
                let out = outs[0];
                quote!(let #out = #landed;)
            }
            OpKind::Fields { src, check } => self.fields(*src, *check, &outs, on_rank),
        }
    }

    /// A method call of an op at `place`: the statements that take its single-actor
    /// arguments out of their `Option`s, and the call.
    fn method_call(
        &mut self,
        place: Place,
        call: usize,
        method: &Ident,
        (args, arg_spans): (&[ValueId], &[Span]),
        parens: Span,
    ) -> (Vec<TokenStream>, TokenStream) {
        let g = self.g;
        // A single-actor value is taken out of its `Option` first, so that a type
        // error on it reads as a plain mismatch at the user's argument.
        let mut held = Vec::new();
        let args: Vec<TokenStream> = args
            .iter()
            .zip(arg_spans)
            .enumerate()
            .map(|(n, (&a, &s))| match self.arg_local(a, place) {
                None => {
                    let id = at_user(&g.values[a].ident, s);
                    quote!(#id)
                }
                Some(l) if self.is_single(l) => {
                    let id = self.borrow(l);
                    let tmp = format_ident!("__arg{}", n);
                    held.push(quote!(let #tmp = __ctx.held(&#id)?;));
                    let tmp = at_user(&tmp, s);
                    quote!(#tmp)
                }
                Some(l) => {
                    let id = at_user(&self.borrow(l), s);
                    quote_spanned!(s=> &#id)
                }
            })
            .collect();
        // A wrong argument count or type points at the user's `method(..)`.
        let args = quote_spanned!(parens=> (#(#args,)*));
        let ctx = Ident::new("__ctx", Span::call_site().located_at(method.span()));
        // The actor type is inferred from `__actor`: an unmet bound of the call (a
        // by-value parameter that is not `Clone`) is then reported at the user's
        // method, and an unknown actor type only where it is written.
        let m = method_of(call, method.span());
        let call = quote_spanned!(method.span()=> call::<_, #m>);
        // `__actor` as the graph's own name (a graph written by a `macro_rules!`
        // macro has the user's tokens in another hygiene context).
        let actor = Ident::new("__actor", Span::call_site().located_at(parens));
        let call_args = quote_spanned!(parens=> (#actor, #args));
        (held, quote!(#ctx.#call #call_args?))
    }

    /// `outs = src.fields` (of a tuple value, or of a single actor's `Option` of one).
    fn fields(
        &mut self,
        src: ValueId,
        check: Option<usize>,
        outs: &[&Ident],
        on_rank: Option<usize>,
    ) -> TokenStream {
        let rt = rt::local();
        let src = self.own(Local::Value(src), Span::call_site());
        // A checked value is named by its checked type, which is an error (and
        // silent) when the check failed.
        let src = match check {
            Some(k) => {
                let ty = checked_type(k);
                let ty = match on_rank {
                    None => ty,
                    Some(_) => quote!(#rt::Option<#ty>),
                };
                quote!(#rt::checked::<#ty>(#src))
            }
            None => src,
        };
        match on_rank {
            None => quote!(let (#(#outs,)*) = #src;),
            Some(_) => {
                let tmp: Vec<Ident> = (0..outs.len()).map(|i| format_ident!("__f{}", i)).collect();
                let nones = outs.iter().map(|_| quote!(#rt::Option::None));
                quote! {
                    let (#(#outs,)*) = match #src {
                        #rt::Option::Some((#(#tmp,)*)) => (#(#rt::Option::Some(#tmp),)*),
                        #rt::Option::None => (#(#nones,)*),
                    };
                }
            }
        }
    }

    /// Sends a value on edge `e` right after it exists (this group produces it).
    fn send(&mut self, e: usize) -> TokenStream {
        let rt = rt::local();
        let edge = &self.sched.edges[e];
        let at = self.sync_point(quote!(#rt::SyncPoint::Send(#e)));
        let idx = syn::Index::from(e);
        let span = edge.span;
        let local = Local::Value(edge.sent);
        let value = if self.is_single(local) {
            self.own_held(local, span)
        } else {
            self.own_sent(local, span)
        };
        // A value sent to several actors is cloned: its type must be `Clone`. The clone
        // function named at the user's argument gives the one error, there (rustc merges
        // it with the same error of `own_held`).
        let clone_fn = respan(quote!(, #rt::clone_value), span);
        // The edge's type is checked `Send`: named here, so that when the check failed
        // the send is an error type too, and silent.
        let ty = edge_type(self.g, e);
        let (send, clone_fn) = match edge.route {
            Route::Fan { .. } | Route::GatherAll => (quote!(send_each::<#ty>), clone_fn),
            _ => (quote!(send::<#ty>), quote!()),
        };
        // Every actor of the group sends on a zip edge; on the others, only the one that
        // holds the value (a single-actor value, or the rank a single actor reads).
        if let Route::Scatter { from, keep } = edge.route {
            // Rank `from` keeps its own value, until its receive (see `recv`).
            let kept = format_ident!("__kept{}", e);
            // Named by its checked type: silent when the check failed (it says why).
            let checked = match self.g.values[edge.value]
                .made_by()
                .map(|o| &self.g.ops[o].kind)
            {
                Some(OpKind::Scatter { check, .. }) => {
                    let ty = checked_type(*check);
                    quote!(#rt::checked::<#ty>(#value))
                }
                _ => value,
            };
            let values = quote!(#rt::Split::into_values(#checked));
            let send = quote!(__ctx.send_scatter::<#ty>(#at, &*__links.#idx, #values)?);
            return match keep {
                true => quote! {
                    let #kept = if __ctx.rank() == #from { #send } else { #rt::Option::None };
                },
                false => quote!(if __ctx.rank() == #from { #send; }),
            };
        }
        let code = quote! {
            let __sent = #value;
            __ctx.#send(#at, &*__links.#idx, __sent #clone_fn)?;
        };
        match edge.route {
            Route::Zip | Route::Gather { keep: false, .. } | Route::GatherAll => {
                quote!({ #code })
            }
            Route::Fan { from: k, .. } | Route::One { from: k, .. } => {
                quote!(if __ctx.rank() == #k { #code })
            }
            Route::Scatter { .. } => quote!(),
            // The consumer keeps its own value (see `recv`).
            Route::Gather { to, keep: true } => quote!(if __ctx.rank() != #to { #code }),
        }
    }

    /// Receives a value from edge `e` right before its first use (this group reads it).
    fn recv(&mut self, e: usize) -> TokenStream {
        let rt = rt::local();
        let edge = &self.sched.edges[e];
        let at = self.sync_point(quote!(#rt::SyncPoint::Recv(#e)));
        let idx = syn::Index::from(e);
        let landed = self.ident(Local::Landed(e));
        let ty = edge_type(self.g, e);
        let recv = quote!(__ctx.recv::<#ty>(#at, &*__links.#idx)?);
        match (edge.route, edge.to) {
            (
                Route::Fan {
                    from,
                    skip_from: true,
                },
                _,
            ) => {
                let own = self.own_held(Local::Value(edge.value), edge.span);
                quote! {
                    let #landed = if __ctx.rank() == #from {
                        #own
                    } else {
                        #recv
                    };
                }
            }
            (Route::Gather { to, keep }, _) => {
                let own = if keep {
                    let own = self.own(Local::Value(edge.value), edge.span);
                    quote!(#rt::Option::Some(#own))
                } else {
                    quote!(#rt::Option::None)
                };
                quote! {
                    let #landed = if __ctx.rank() == #to {
                        #rt::Option::Some(__ctx.recv_gather::<#ty>(#at, &*__links.#idx, #own)?)
                    } else {
                        #rt::Option::None
                    };
                }
            }
            (
                Route::Scatter {
                    from, keep: true, ..
                },
                _,
            ) => {
                let kept = format_ident!("__kept{}", e);
                quote! {
                    let #landed = if __ctx.rank() == #from {
                        __ctx.take_held(#kept)?
                    } else {
                        #recv
                    };
                }
            }
            (Route::GatherAll, _) => {
                quote!(let #landed = __ctx.recv_gather::<#ty>(#at, &*__links.#idx, #rt::Option::None)?;)
            }
            (_, Place::Actor(_, j)) => quote! {
                let #landed = if __ctx.rank() == #j {
                    #rt::Option::Some(#recv)
                } else {
                    #rt::Option::None
                };
            },
            _ => quote!(let #landed = #recv;),
        }
    }

    /// The step's result: this group's parts of the graph output.
    fn result(&mut self, p: &GroupPlan) -> TokenStream {
        let parts: Vec<TokenStream> = p
            .out_parts
            .iter()
            .map(|&k| self.own(Local::Value(self.g.output.parts[k]), Span::call_site()))
            .collect();
        if p.out_parts.is_empty() {
            quote!(())
        } else if self.g.output.tuple {
            quote!((#(#parts,)*))
        } else {
            quote!(#(#parts)*)
        }
    }
}

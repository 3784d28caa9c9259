//! Code generation: the graph's struct, `launch`/`execute`/`teardown`, and one step
//! function per actor group that runs the group's ops in program order (the schedule: every
//! actor of a group runs its collectives in the same order, fixed here).

use std::collections::HashMap;

use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};

use super::ir::{Graph, OpKind, Place, ValueId};
use super::ops::{CollectiveSpec, Kind, OpName, Root};
use super::parse::GraphDef;

const RT: &str = "::actorgraph::__private";

fn rt() -> TokenStream {
    RT.parse().unwrap_or_default()
}

fn group_field(name: &Ident) -> Ident {
    format_ident!("__group_{}", name)
}

fn step_name(name: &Ident) -> Ident {
    format_ident!("__step_{}", name)
}

pub(crate) fn expand(g: &Graph) -> TokenStream {
    let rt = rt();
    let def = g.def;
    let (attrs, vis, name) = (&def.attrs, &def.vis, &def.name);
    let groups: Vec<GroupPlan> = (0..g.groups.len())
        .map(|gi| GroupPlan::new(g, gi))
        .collect();

    let fields = groups.iter().map(|p| {
        let field = group_field(&g.groups[p.index].name);
        let actor = &g.groups[p.index].actor;
        let in_tys = p.inputs.iter().map(|&i| &g.inputs[i].ty);
        let out_ty = &p.out_ty;
        quote!(#field: #rt::Group<#actor, (#(#in_tys,)*), #out_ty>)
    });

    // launch
    let group_params = g.groups.iter().map(|d| {
        let (n, a) = (&d.name, &d.actor);
        quote!(#n: #rt::Vec<#a>)
    });
    let zipped: Vec<&GroupPlan> = groups.iter().filter(|p| !p.out_parts.is_empty()).collect();
    let size_check = if g.output.tuple && zipped.len() > 1 {
        let checks = zipped.iter().map(|p| {
            let n = &g.groups[p.index].name;
            let s = n.to_string();
            quote!((#s, #n.len()))
        });
        quote!(#rt::same_size(&[#(#checks),*])?;)
    } else {
        quote!()
    };
    let launches = groups.iter().map(|p| {
        let d = &g.groups[p.index];
        let (n, field, step) = (&d.name, group_field(&d.name), step_name(&d.name));
        let s = n.to_string();
        let stages = &d.stages;
        // A root outside the group is an error here, before any thread starts.
        let roots = d.roots.iter().map(|(stage, root)| {
            quote!(#rt::check_root(#s, #n.len(), #stage, #root)?;)
        });
        quote! {
            #(#roots)*
            let #field = #rt::Group::launch(#s, #n, &backend, &[#(#stages),*], Self::#step::<__B::Comm>)?;
        }
    });
    let field_names: Vec<Ident> = g.groups.iter().map(|d| group_field(&d.name)).collect();

    // execute
    let input_params: Vec<TokenStream> = g
        .inputs
        .iter()
        .map(|i| {
            let (n, t) = (&i.name, &i.ty);
            quote!(#n: #t)
        })
        .collect();
    let mut remaining_uses: Vec<usize> = (0..g.inputs.len())
        .map(|i| groups.iter().filter(|p| p.inputs.contains(&i)).count())
        .collect();
    let submits: Vec<TokenStream> = groups
        .iter()
        .map(|p| {
            let field = group_field(&g.groups[p.index].name);
            let vals = p.inputs.iter().map(|&i| {
                remaining_uses[i] -= 1;
                let n = &g.inputs[i].name;
                if remaining_uses[i] == 0 {
                    quote!(#n)
                } else {
                    quote!(::core::clone::Clone::clone(&#n))
                }
            });
            quote!(self.#field.submit((#(#vals,)*));)
        })
        .collect();
    let unused_inputs = g
        .inputs
        .iter()
        .enumerate()
        .filter(|(i, _)| !groups.iter().any(|p| p.inputs.contains(i)))
        .map(|(_, inp)| &inp.name);
    let results: Vec<Ident> = g
        .groups
        .iter()
        .map(|d| format_ident!("__result_{}", d.name))
        .collect();
    let collects = groups.iter().zip(&results).map(|(p, r)| {
        let field = group_field(&g.groups[p.index].name);
        quote!(let #r = self.#field.collect(__deadline);)
    });
    let assemble = assemble(g, &groups, &results);
    let out_ty = output_type(g);

    // teardown
    let actor_vecs: Vec<TokenStream> = g
        .groups
        .iter()
        .map(|d| {
            let a = &d.actor;
            quote!(#rt::Vec<#a>)
        })
        .collect();
    let torn: Vec<Ident> = g
        .groups
        .iter()
        .map(|d| format_ident!("__torn_{}", d.name))
        .collect();
    let each_vecs: Vec<TokenStream> = g
        .groups
        .iter()
        .map(|d| {
            let a = &d.actor;
            quote!(#rt::Vec<#rt::Result<#a, #rt::Error>>)
        })
        .collect();
    let (teardown_ty, teardown_val, each_ty, each_val) = if g.groups.len() == 1 {
        let (t, v, e) = (&actor_vecs[0], &torn[0], &each_vecs[0]);
        (quote!(#t), quote!(#v?), quote!(#e), quote!(#v))
    } else {
        (
            quote!((#(#actor_vecs),*)),
            quote!((#(#torn?),*)),
            quote!((#(#each_vecs),*)),
            quote!((#(#torn),*)),
        )
    };
    let ready = field_names_for_ready(g);
    let input_names: Vec<&Ident> = g.inputs.iter().map(|i| &i.name).collect();

    let steps = groups.iter().map(|p| step_fn(g, p));
    let group_names = g.groups.iter().map(|d| d.name.to_string());
    let launch_doc = format!(
        "Spawns one thread per actor of every group ({}), each with its communicator endpoint from `backend`.",
        g.groups.iter().map(|d| format!("`{}`", d.name)).collect::<Vec<_>>().join(", ")
    );

    let bounds = gather_bounds(g);

    quote! {
        #(#attrs)*
        #vis struct #name #bounds {
            #(#fields,)*
        }

        impl #name #bounds {
            /// The actor groups of this graph, in declaration order.
            pub const GROUPS: &'static [&'static str] = &[#(#group_names),*];

            #[doc = #launch_doc]
            ///
            /// Fails if a group is empty, if groups that feed one output differ in size, or
            /// if the backend cannot connect the actors.
            pub fn launch<__B: #rt::Backend>(#(#group_params,)* backend: __B) -> #rt::Result<Self, #rt::Error> {
                #size_check
                #(#launches)*
                #rt::Result::Ok(Self { #(#field_names),* })
            }

            /// Runs the graph once on every actor and returns the output, indexed by rank.
            ///
            /// If a method fails or panics on any rank, every rank skips the rest of its
            /// collectives and this returns the error; the graph stays usable (an actor that
            /// panicked stays poisoned).
            #[allow(clippy::too_many_arguments)]
            pub fn execute(&mut self, #(#input_params),*) -> #rt::Result<#rt::Vec<#out_ty>, #rt::Error> {
                self.__execute(#(#input_names,)* ::core::option::Option::None)
            }

            /// Like `execute`, but returns `Error::Timeout` naming the ranks still running
            /// when `timeout` passes. The graph is then broken: later calls return
            /// `Error::Broken`, and only teardown is left.
            #[allow(clippy::too_many_arguments)]
            pub fn execute_timeout(&mut self, #(#input_params,)* timeout: #rt::Duration) -> #rt::Result<#rt::Vec<#out_ty>, #rt::Error> {
                self.__execute(#(#input_names,)* ::core::option::Option::Some(#rt::Deadline::after(timeout)))
            }

            #[allow(clippy::too_many_arguments)]
            fn __execute(&mut self, #(#input_params,)* __deadline: ::core::option::Option<#rt::Deadline>) -> #rt::Result<#rt::Vec<#out_ty>, #rt::Error> {
                let _ = (#(#unused_inputs,)*);
                #(#ready)*
                #(#submits)*
                #(#collects)*
                #assemble
            }

            /// Stops the actor threads and hands the actors back, by rank, with their state;
            /// an error if any actor is not intact (poisoned, lost, or stuck in a method).
            pub fn teardown(self) -> #rt::Result<#teardown_ty, #rt::Error> {
                let Self { #(#field_names),* } = self;
                #(let #torn = #field_names.teardown();)*
                #rt::Result::Ok(#teardown_val)
            }

            /// Stops the actor threads and hands back, by rank, every actor that is intact
            /// and, for each other one, why not. Returns within a bounded time even if an
            /// actor is stuck in a method (its thread is then detached).
            pub fn teardown_each(self) -> #each_ty {
                let Self { #(#field_names),* } = self;
                #(let #torn = #field_names.teardown_each();)*
                #each_val
            }

            #(#steps)*
        }
    }
}

/// `where T: Gather, ..` for every value of an `allgather`, each predicate at the user's
/// argument. The output type `<T as Gather>::Gathered` appears in the struct and in every
/// signature; without the bound, a `T` that cannot be gathered would get an error at each
/// of them. With it, rustc reports the unsatisfied bound once (the struct's and the impl's
/// are identical diagnostics, deduplicated) and checks the rest assuming it.
fn gather_bounds(g: &Graph) -> TokenStream {
    let preds: Vec<TokenStream> = g
        .ops
        .iter()
        .filter_map(|op| match &op.kind {
            OpKind::Collective {
                spec,
                args,
                arg_spans,
                ..
            } if spec.kind == Kind::Gather => Some(args.iter().zip(arg_spans)),
            _ => None,
        })
        .flatten()
        .map(|(&v, &span)| {
            let ty = &g.values[v].ty;
            respan(quote!(#ty: ::actorgraph::Gather), span)
        })
        .collect();
    if preds.is_empty() {
        quote!()
    } else {
        quote!(where #(#preds),*)
    }
}

/// `tokens` with every token located at `at` (keeping each token's hygiene), so that a
/// diagnostic about any part of them points at `at`.
fn respan(tokens: TokenStream, at: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tt| {
            if let proc_macro2::TokenTree::Group(g) = &tt {
                let mut inner = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), at));
                inner.set_span(g.span().located_at(at));
                tt = proc_macro2::TokenTree::Group(inner);
            } else {
                tt.set_span(tt.span().located_at(at));
            }
            tt
        })
        .collect()
}

fn field_names_for_ready(g: &Graph) -> Vec<TokenStream> {
    g.groups
        .iter()
        .map(|d| {
            let f = group_field(&d.name);
            quote!(self.#f.ready()?;)
        })
        .collect()
}

/// The type of one rank's output.
fn output_type(g: &Graph) -> TokenStream {
    let tys = g.output.parts.iter().map(|&p| &g.values[p].ty);
    if g.output.tuple {
        quote!((#(#tys,)*))
    } else {
        quote!(#(#tys)*)
    }
}

fn assemble(g: &Graph, groups: &[GroupPlan], results: &[Ident]) -> TokenStream {
    let rt = rt();
    let checks = results.iter().map(|r| quote!(let #r = #r?;));
    let contributing: Vec<&GroupPlan> = groups.iter().filter(|p| !p.out_parts.is_empty()).collect();
    let body = if !g.output.tuple || contributing.len() == 1 {
        let r = &results[contributing[0].index];
        quote!(#rt::Result::Ok(#r))
    } else {
        // Zip the groups' per-rank tuples and put the parts back in output order.
        let part_ident = |k: usize| format_ident!("__out{}", k);
        let mut iter = quote!(#rt::Vec::from(#rt::Vec::new()).into_iter());
        let mut pat = quote!();
        for (n, p) in contributing.iter().enumerate() {
            let r = &results[p.index];
            let parts = p.out_parts.iter().map(|&k| part_ident(k));
            let this = quote!((#(#parts,)*));
            if n == 0 {
                iter = quote!(#r.into_iter());
                pat = this;
            } else {
                iter = quote!(#iter.zip(#r));
                pat = quote!((#pat, #this));
            }
        }
        let all = (0..g.output.parts.len()).map(part_ident);
        quote!(#rt::Result::Ok(#iter.map(|#pat| (#(#all,)*)).collect()))
    };
    quote!(#(#checks)* #body)
}

/// What one group runs and returns.
struct GroupPlan {
    index: usize,
    /// Graph inputs this group reads, by input index.
    inputs: Vec<usize>,
    /// Positions in the graph output that this group produces.
    out_parts: Vec<usize>,
    out_ty: TokenStream,
}

impl GroupPlan {
    fn new(g: &Graph, index: usize) -> Self {
        let mut inputs = Vec::new();
        for op in g.ops.iter().filter(|op| op.group == index) {
            let args: &[ValueId] = match &op.kind {
                OpKind::Call { args, .. } => args,
                _ => &[],
            };
            for &a in args {
                if let Some(i) = g.inputs.iter().position(|inp| inp.value == a) {
                    if !inputs.contains(&i) {
                        inputs.push(i);
                    }
                }
            }
        }
        inputs.sort_unstable();
        let out_parts: Vec<usize> = g
            .output
            .parts
            .iter()
            .enumerate()
            .filter(|(_, &v)| g.values[v].place == Place::Group(index))
            .map(|(k, _)| k)
            .collect();
        let tys = out_parts.iter().map(|&k| &g.values[g.output.parts[k]].ty);
        let out_ty = if out_parts.is_empty() {
            quote!(())
        } else if g.output.tuple {
            quote!((#(#tys,)*))
        } else {
            quote!(#(#tys)*)
        };
        GroupPlan {
            index,
            inputs,
            out_parts,
            out_ty,
        }
    }
}

fn step_fn(g: &Graph, p: &GroupPlan) -> TokenStream {
    let rt = rt();
    let decl = &g.groups[p.index];
    let (actor, markers) = (&decl.actor, &decl.markers);
    let step = step_name(&decl.name);
    let in_tys: Vec<&syn::Type> = p.inputs.iter().map(|&i| &g.inputs[i].ty).collect();
    let bind_inputs = p.inputs.iter().enumerate().map(|(k, &i)| {
        let inp = &g.inputs[i];
        let (n, t) = (&inp.name, &inp.ty);
        let k = syn::Index::from(k);
        quote!(let #n: &#t = &__inputs.#k;)
    });
    // How often each value is read later, to move it at its last read instead of cloning.
    let mut reads: HashMap<ValueId, usize> = HashMap::new();
    for op in g.ops.iter().filter(|op| op.group == p.index) {
        match &op.kind {
            OpKind::Tuple { parts } => parts
                .iter()
                .for_each(|&v| *reads.entry(v).or_default() += 1),
            OpKind::Fields { src } => *reads.entry(*src).or_default() += 1,
            _ => {}
        }
    }
    let borrow = |v: ValueId, at: Span| {
        let val = &g.values[v];
        let id = at_user(&val.ident, at);
        match val.place {
            Place::Input => quote!(#id),
            Place::Group(_) => quote!(&#id),
        }
    };
    let take = |v: ValueId, reads: &mut HashMap<ValueId, usize>| {
        let id = &g.values[v].ident;
        let left = reads.entry(v).or_default();
        *left = left.saturating_sub(1);
        if *left == 0 {
            quote!(#id)
        } else {
            quote!(::core::clone::Clone::clone(&#id))
        }
    };
    for &v in &g.output.parts {
        *reads.entry(v).or_default() += 1;
    }
    let mut body = Vec::new();
    for op in g.ops.iter().filter(|op| op.group == p.index) {
        let outs: Vec<&Ident> = op.outs.iter().map(|&o| &g.values[o].ident).collect();
        body.push(match &op.kind {
            OpKind::Call {
                method,
                args,
                arg_spans,
                parens,
            } => {
                let args = args.iter().zip(arg_spans).map(|(&a, &s)| borrow(a, s));
                let out = outs[0];
                // A wrong argument count or type points at the user's `method(..)`.
                let args = quote_spanned!(*parens=> (#(#args,)*));
                let ctx = Ident::new("__ctx", Span::call_site().located_at(method.span()));
                let call = quote_spanned!(method.span()=> call::<#actor, #markers::#method>);
                let call_args = quote_spanned!(*parens=> (__actor, #args));
                quote! {
                    let #out = #ctx.#call #call_args?;
                }
            }
            OpKind::Collective {
                spec,
                op: reduce,
                root,
                args,
                stage,
                span,
                arg_spans,
            } => {
                let vals: Vec<Ident> = args
                    .iter()
                    .zip(arg_spans)
                    .map(|(&a, &s)| at_user(&g.values[a].ident, s))
                    .collect();
                let collective = collective_expr(spec, reduce.as_ref(), root.as_ref(), *span);
                stage_code(
                    spec.kind,
                    *stage,
                    &outs,
                    &vals,
                    arg_spans,
                    &collective,
                    root.as_ref(),
                )
            }
            OpKind::Tuple { parts } => {
                let parts: Vec<TokenStream> = parts.iter().map(|&v| take(v, &mut reads)).collect();
                let out = outs[0];
                quote!(let #out = (#(#parts,)*);)
            }
            OpKind::Fields { src } => {
                let src = take(*src, &mut reads);
                quote!(let (#(#outs,)*) = #src;)
            }
        });
    }
    let parts: Vec<TokenStream> = p
        .out_parts
        .iter()
        .map(|&k| take(g.output.parts[k], &mut reads))
        .collect();
    let result = if p.out_parts.is_empty() {
        quote!(())
    } else if g.output.tuple {
        quote!((#(#parts,)*))
    } else {
        quote!(#(#parts)*)
    };
    let out_ty = &p.out_ty;
    quote! {
        #[doc(hidden)]
        #[allow(unused_variables, clippy::let_unit_value, clippy::unused_unit)]
        fn #step<__C: #rt::Communicator>(
            __actor: &mut #actor,
            __ctx: &mut #rt::StepCtx<__C>,
            __inputs: &(#(#in_tys,)*),
        ) -> #rt::Result<#out_ty, #rt::Error> {
            #(#bind_inputs)*
            #(#body)*
            #rt::Result::Ok(#result)
        }
    }
}

/// `ident` located at the user's argument `at`, so that a type error on it points there
/// and not at the value's definition; its hygiene stays that of `ident`.
fn at_user(ident: &Ident, at: Span) -> Ident {
    let mut ident = ident.clone();
    ident.set_span(ident.span().located_at(at));
    ident
}

/// One fused stage of a step: lay the values out, pack them, run the collective, and take
/// the results. Every call that names a value is spanned at the user's argument and bound
/// by the one trait this kind of collective needs, so that a value of a type that cannot go
/// through it gets exactly one error, there.
fn stage_code(
    kind: Kind,
    stage: usize,
    outs: &[&Ident],
    vals: &[Ident],
    spans: &[Span],
    collective: &TokenStream,
    root: Option<&Root>,
) -> TokenStream {
    let idx = (0..vals.len()).map(syn::Index::from);
    let mut adds = Vec::new();
    let mut packs = Vec::new();
    let mut outputs = Vec::new();
    for ((v, &s), i) in vals.iter().zip(spans).zip(idx) {
        // Every token of these calls carries the user's span: rustc puts a failed bound
        // at the method's name, and dedups identical bounds at one span into one error.
        let (add, pack) = match kind {
            Kind::InPlace | Kind::Rooted => (quote_spanned!(s=> add), quote_spanned!(s=> pack)),
            Kind::Gather => (
                quote_spanned!(s=> fused().add_gather),
                quote_spanned!(s=> pack_gather),
            ),
            Kind::Scatter => (
                quote_spanned!(s=> fused().add_scatter),
                quote_spanned!(s=> pack_scatter),
            ),
        };
        adds.push(quote_spanned!(s=> __st.#add(&#v)));
        packs.push(quote_spanned!(s=> __st.#pack(&#v, __slots.#i);));
        outputs.push(match (kind, root) {
            (Kind::InPlace, _) => quote_spanned!(s=> __st.output(&#v, __slots.#i)),
            (Kind::Gather, _) => quote_spanned!(s=> __st.fused().output_gathered(&#v, __slots.#i)),
            (Kind::Scatter, _) => {
                quote_spanned!(s=> __st.fused().output_scattered(&#v, __slots.#i))
            }
            (Kind::Rooted, Some(r)) => {
                let rank = r.rank;
                quote_spanned!(s=> __st.fused().output_rooted(&#v, __slots.#i, #rank))
            }
            (Kind::Rooted, None) => {
                quote!(::core::compile_error!(
                    "actorgraph: a rooted collective without a root"
                ))
            }
        });
    }
    quote! {
        let (#(#outs,)*) = {
            let mut __st = __ctx.stage(#stage);
            let __slots = (#(#adds,)*);
            __st.prepare();
            #(#packs)*
            __st.run(#collective)?;
            (#(#outputs,)*)
        };
    }
}

/// The runtime's description of a collective: the reduce op as written (or `Sum` at the
/// collective's span) and the root as written.
fn collective_expr(
    spec: &CollectiveSpec,
    op: Option<&OpName>,
    root: Option<&Root>,
    span: Span,
) -> TokenStream {
    let rt = rt();
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

/// What a graph with errors expands to: its struct with methods whose signatures accept
/// whatever the caller does, so that the only errors shown are the graph's own.
pub(crate) fn fallback(def: &GraphDef) -> TokenStream {
    let rt = rt();
    let (attrs, vis, name) = (&def.attrs, &def.vis, &def.name);
    let groups = def.params.iter().filter_map(|p| match &p.ty {
        syn::Type::Slice(s) => {
            let (n, e) = (&p.name, &s.elem);
            Some(quote!(#n: #rt::Vec<#e>))
        }
        _ => None,
    });
    let inputs: Vec<TokenStream> = def
        .params
        .iter()
        .filter_map(|p| match &p.ty {
            syn::Type::Slice(_) => None,
            ty => {
                let n = &p.name;
                Some(quote!(#n: #ty))
            }
        })
        .collect();
    quote! {
        #(#attrs)*
        #vis struct #name {
            __graph_has_errors: (),
        }

        #[allow(unused_variables, clippy::all)]
        impl #name {
            /// Not available: the graph has errors.
            pub fn launch<__B>(#(#groups,)* backend: __B) -> #rt::Result<Self, #rt::Error> {
                ::core::unreachable!()
            }
            /// Not available: the graph has errors.
            pub fn execute<__O>(&mut self, #(#inputs),*) -> #rt::Result<#rt::Vec<__O>, #rt::Error> {
                ::core::unreachable!()
            }
            /// Not available: the graph has errors.
            pub fn execute_timeout<__O>(&mut self, #(#inputs,)* timeout: #rt::Duration) -> #rt::Result<#rt::Vec<__O>, #rt::Error> {
                ::core::unreachable!()
            }
            /// Not available: the graph has errors.
            pub fn teardown<__T>(self) -> #rt::Result<__T, #rt::Error> {
                ::core::unreachable!()
            }
            /// Not available: the graph has errors.
            pub fn teardown_each<__T>(self) -> __T {
                ::core::unreachable!()
            }
        }
    }
}

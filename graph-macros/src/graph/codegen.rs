//! Code generation: the graph's struct, `launch`/`execute`/`teardown`, `to_dot`, and one
//! step function per actor group (see `step`) that runs the group's part of the schedule
//! (see `schedule`): every actor runs its ops, collectives and edge transfers in one order
//! fixed here.
//!
//! Everything but the struct and the `MethodCall` impls goes in one `const _: () = { .. };`
//! block (serde_derive's pattern), which imports the runtime as `rt::local()` and names
//! every type it spells more than once by a block-local alias (see `types`): nothing
//! outside sees those names, and they start with `__`, so none shadows a user's.
//!
//! What rustdoc shows of a graph is written for its user: one rank's output is a public
//! alias, `<Graph>Output`, documented from the graph (see `doc`); the parameters of the
//! public methods have plain names, hygienic (`Span::mixed_site`) so that none clashes
//! with a group or input of the same name; every impl that is the graphs' plumbing is
//! `#[doc(hidden)]`.

use proc_macro2::{Delimiter, Group, Ident, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};

use super::ir::{Check, CheckKind, Graph, OpKind, Place};
use super::plan::{edge_type, list, output_type, GroupPlan};
use super::schedule::{self, Route, Schedule};
use super::types::{checked_alias, method_aliases, privacy_alias};
use super::{doc, dot, step};
use crate::respan::{respan, respan_ends};
use crate::rt;

// The docs of the generated methods that take more than a line: each is one attribute (one
// string), which rustdoc shows as the paragraph it is.
const LAUNCH_ACTORS_DOC: &str = concat!(
    " Like `launch_with`, with each group's actors as `Actors`: ready, or made on their own",
    " threads by `Actors::each` (then they need not be `Send`)."
);
const EXECUTE_TIMEOUT_DOC: &str =
    " Like `execute`; after `timeout`, `Error::Timeout`, and the graph is broken.";
const RANKS_DOC: &str = concat!(
    " The ranks of the actors of `group` that this process hosts (`None` if the graph has no",
    " such group): all of them, unless the graph spans processes (see the MPI backend); entry",
    " `i` of an output zipped by `group`'s ranks belongs to rank `ranks(group).start + i`."
);
const TEARDOWN_DOC: &str = concat!(
    " Stops the actor threads and hands the actors back by rank, a fixed-size group's as an",
    " array; an error if any is not intact."
);

pub(crate) fn expand(g: &Graph) -> TokenStream {
    let rt = rt::local();
    let def = g.def;
    let (attrs, vis, name) = (&def.attrs, &def.vis, &def.name);
    let sched = schedule::schedule(g);
    let groups: Vec<GroupPlan> = (0..g.groups.len())
        .map(|gi| GroupPlan::new(g, gi))
        .collect();
    let steps: Vec<step::Step> = groups.iter().map(|p| step::step_fn(g, &sched, p)).collect();

    let out_ty = output_type(g);
    let driver_ty = driver_type(g, &groups, &out_ty);
    let out_alias = output_alias(name);
    let (backend, options, timeout, ticket) = (
        param("backend"),
        param("options"),
        param("timeout"),
        param("ticket"),
    );

    // launch
    let params = |ready| -> Vec<TokenStream> {
        g.groups
            .iter()
            .map(|d| {
                launch_param(
                    &d.name,
                    Some(&d.actor),
                    d.size.as_ref().map(|s| &s.0),
                    ready,
                )
            })
            .collect()
    };
    let group_params = params(true);
    let group_names_launch = g.groups.iter().map(|d| &d.name);
    let group_names_launch2 = group_names_launch.clone();
    let group_params2 = group_params.clone();
    let actors_params = params(false);
    let to_vecs = g.groups.iter().filter_map(|d| {
        let (n, len) = (&d.name, &d.size.as_ref()?.0);
        let s = n.to_string();
        let size = size_var(n);
        Some(quote!(#rt::check_size(#s, #len, #size)?;))
    });
    let checks = launch_checks(g, &groups, &sched);
    let edges = wire_edges(g, &sched);
    // The edges' table and the steps' typed handles on them; a graph without edges passes
    // an empty table to every group.
    let (links, links_arg) = if edges.is_empty() {
        (quote!(), quote!(&#rt::Links::new(), &()))
    } else {
        (
            quote! {
                let mut __links = #rt::Links::wired(&#backend)?;
                let __edges = (#(#edges,)*);
            },
            quote!(&__links, &__edges),
        )
    };
    let launches = groups.iter().map(|p| {
        let d = &g.groups[p.index];
        let (n, field, step) = (&d.name, group_var(&d.name), step::name(g, p.index));
        let s = n.to_string();
        let stages = &d.stages;
        let step::Step {
            schedule, deferred, ..
        } = &steps[p.index];
        quote! {
            let #field = #rt::Group::start(
                #rt::GroupSpec {
                    name: #s,
                    stages: &[#(#stages),*],
                    deferred: #deferred,
                    schedule: #schedule,
                    groups: __groups,
                },
                &#options, #n, &#backend, #links_arg, #step,
            )?;
        }
    });
    let launched = list(g.groups.iter().map(|d| {
        let v = group_var(&d.name);
        quote!(#v)
    }));
    let join = join_sizes(g, &sched, name);
    // The process's actors, all groups', share its cores: resolved once, before any
    // group's threads start.
    let local_actors = g.groups.iter().map(|d| &d.name);
    let threads = quote!(let #options = #options.resolve_threads(0 #(+ #local_actors.len())*););
    let split = split(g, &groups);
    let assemble = assemble(g, &groups);

    // execute
    let input_params: Vec<TokenStream> = g
        .inputs
        .iter()
        .map(|i| {
            let (n, t) = (&i.name, &i.ty);
            quote!(#n: #t)
        })
        .collect();
    let input_names: Vec<&Ident> = g.inputs.iter().map(|i| &i.name).collect();
    let inputs = quote!((#(#input_names,)*));

    let (teardown_ty, each_ty, teardown, teardown_each) = teardown_bodies(g);
    let each_methods = each_methods(g);
    // Spanned at the group's actor type, where a missing `Send` is reported; `for<'a>`
    // keeps a bound that does not hold from failing the graph's definition.
    let send_bounds: Vec<TokenStream> = g
        .groups
        .iter()
        .map(|d| {
            let a = &d.actor;
            quote_spanned!(syn::spanned::Spanned::span(a)=> for<'a> #a: ::core::marker::Send)
        })
        .collect();

    let steps = steps.iter().map(|s| &s.f);
    let group_names = g.groups.iter().map(|d| d.name.to_string());
    let launch_doc = format!(
        " Spawns one thread per actor of {}, each with its communicator endpoint from \
         `backend`. The actors move to their threads, so they must be `Send`; \
         `launch_actors` takes actors made on their own threads.",
        crate::diag::code_list(g.groups.iter().map(|d| &d.name))
    );
    let dot = dot::to_dot(g, &sched);
    let fingerprint = fingerprint(g, &dot, &out_ty);
    let ranks_doc = RANKS_DOC;
    let output_doc = doc::output(g);
    let execute_doc = format!(
        " Runs the graph once on every actor and returns one [`{out_alias}`] per rank: \
         {output_doc}. A failure on any rank is one typed error (see `actorgraph::reference`)."
    );
    let alias_doc = format!(
        " One rank's output of [`{name}`]: {output_doc}. Its `execute`, `wait` and their \
         variants return one per rank. rustdoc shows the type as the graph spells it for the \
         compiler: each part is the type of the method that makes it, as the collective \
         hands it back."
    );
    let (launch_actors_doc, execute_timeout_doc, teardown_doc) =
        (LAUNCH_ACTORS_DOC, EXECUTE_TIMEOUT_DOC, TEARDOWN_DOC);
    let index_asserts = index_asserts(g);
    let (method_calls, method_aliases) = method_calls(g);
    let value_checks = value_checks(g, &sched);
    let import = rt::import();
    let (path, privacy, p) = (rt::path(), &g.privacy, privacy_alias());

    quote! {
        #(#attrs)*
        #vis struct #name {
            // Spelled through the graph's block, where its types have names.
            __driver: #path::Driven<#name, #privacy>,
        }

        #[doc = #alias_doc]
        #vis type #out_alias = <#name as #path::GraphDriver<#privacy>>::Output;

        #(#method_calls)*
        #(#index_asserts)*

        // Everything else is in a block (as serde_derive does), where the runtime and the
        // checked types have short names that nothing outside sees.
        #[allow(unused_variables, clippy::all)]
        const _: () = {
            #import
            type #p = #privacy;
            type __R = #rt::Result<#rt::Vec<#out_alias>, #rt::Error>;

            #(#method_aliases)*
            #[doc(hidden)]
            impl #rt::GraphDriver<#p> for #name {
                type Driver = #driver_ty;
                type Output = #out_ty;
            }
            #(#value_checks)*

            impl #name {
                /// The actor groups of this graph, in declaration order.
                pub const GROUPS: &[&::core::primitive::str] = &[#(#group_names),*];

                /// A hash of this graph's structure and types, which a launch over several
                /// processes compares between them.
                pub const FINGERPRINT: ::core::primitive::u64 = #fingerprint;

                #[doc = #launch_doc]
                pub fn launch(#(#group_params,)* #backend: impl #rt::Backend) -> #rt::Result<Self, #rt::Error>
                where
                    #(#send_bounds,)*
                {
                    Self::launch_with(#(#group_names_launch,)* #backend, #rt::LaunchOptions::default())
                }

                /// Like `launch`, with options (`max_in_flight` for pipelining).
                pub fn launch_with(#(#group_params2,)* #backend: impl #rt::Backend, #options: #rt::LaunchOptions) -> #rt::Result<Self, #rt::Error>
                where
                    #(#send_bounds,)*
                {
                    Self::launch_actors(#(#rt::Actors::from(#group_names_launch2),)* #backend, #options)
                }

                #[doc = #launch_actors_doc]
                pub fn launch_actors(#(#actors_params,)* #backend: impl #rt::Backend, #options: #rt::LaunchOptions) -> #rt::Result<Self, #rt::Error> {
                    #join
                    #threads
                    #(#to_vecs)*
                    #checks
                    #links
                    let #launched = #rt::settle(&#backend, (|| -> #rt::Result<_, #rt::Error> {
                        #(#launches)*
                        #rt::Result::Ok(#launched)
                    })())?;
                    let __driver = #rt::Driven::new(#launched, #options, #split, #assemble);
                    #rt::Result::Ok(Self { __driver })
                }

                #[doc = #execute_doc]
                pub fn execute(&mut self, #(#input_params),*) -> __R {
                    self.__driver.0.execute(#inputs)
                }

                #[doc = #execute_timeout_doc]
                pub fn execute_timeout(&mut self, #(#input_params,)* #timeout: #rt::Duration) -> __R {
                    self.__driver.0.execute_timeout(#inputs, #timeout)
                }

                /// Like `execute`, as a future that never blocks the executor's thread.
                pub fn execute_async(&mut self, #(#input_params),*) -> impl ::core::future::Future<Output = __R> + '_ {
                    self.__driver.0.execute_async(#inputs)
                }

                /// Submits one execution and returns its ticket for `wait`.
                pub fn submit(&mut self, #(#input_params),*) -> #rt::Result<#rt::Ticket, #rt::Error> {
                    self.__driver.0.submit(#inputs)
                }

                /// Waits for the execution of `ticket` and returns its output, as `execute`.
                pub fn wait(&mut self, #ticket: #rt::Ticket) -> __R {
                    self.__driver.0.wait(#ticket)
                }

                /// `wait` as a future that never blocks the executor's thread.
                pub fn wait_async(&mut self, #ticket: #rt::Ticket) -> impl ::core::future::Future<Output = __R> + '_ {
                    self.__driver.0.wait_async(#ticket)
                }

                /// The executions submitted whose results are neither read nor discarded yet.
                pub fn in_flight(&self) -> ::core::primitive::usize {
                    self.__driver.0.in_flight()
                }

                #[doc = #ranks_doc]
                pub fn ranks(&self, group: &::core::primitive::str) -> ::core::option::Option<::core::ops::Range<::core::primitive::usize>> {
                    self.__driver.0.ranks(group)
                }

                /// The number of actors of `group` in every process together (`None` if the
                /// graph has no such group).
                pub fn group_size(&self, group: &::core::primitive::str) -> ::core::option::Option<::core::primitive::usize> {
                    self.__driver.0.group_size(group)
                }

                #[doc = #teardown_doc]
                pub fn teardown(self) -> #rt::Result<#teardown_ty, #rt::Error>
                where
                    #(#send_bounds,)*
                {
                    #teardown
                }

                /// Stops the actor threads and hands back each intact actor, or why not.
                pub fn teardown_each(self) -> #each_ty
                where
                    #(#send_bounds,)*
                {
                    #teardown_each
                }

                #(#each_methods)*

                /// The graph as Graphviz DOT (render it with `dot -Tsvg`).
                pub fn to_dot() -> #rt::String {
                    #rt::String::from(#dot)
                }
            }

            #(#steps)*
        };
    }
}

/// The driver's type: the groups as a list, the graph's inputs, one rank's output.
fn driver_type(g: &Graph, groups: &[GroupPlan], out_ty: &TokenStream) -> TokenStream {
    let rt = rt::local();
    let group_tys = groups.iter().map(|p| {
        let actor = &g.groups[p.index].actor;
        let in_ty = p.input_type(g);
        let out_ty = &p.out_ty;
        quote!(#rt::Group<#actor, #in_ty, #out_ty>)
    });
    let input_tys = g.inputs.iter().map(|i| &i.ty);
    let groups_ty = list(group_tys);
    quote!(#rt::Driver<#groups_ty, (#(#input_tys,)*), #out_ty>)
}

/// Each edge of the schedule, wired by `launch`: `__links.edge_to::<T>(..)`.
fn wire_edges(g: &Graph, sched: &Schedule) -> Vec<TokenStream> {
    let rt = rt::local();
    sched
        .edges
        .iter()
        .enumerate()
        .map(|(e, edge)| {
            let from_group = &g.groups[edge.from.group()].name;
            let ty = edge_type(g, e);
            let value = &g.values[edge.value].label;
            let from = g.groups[edge.from.group()].name.to_string();
            let to = &g.groups[edge.to.group()].name;
            let to_name = to.to_string();
            let producers = size_var(from_group);
            let route = match edge.route {
                Route::Zip => quote!(#rt::Route::Zip),
                Route::Fan { from, skip_from } => {
                    quote!(#rt::Route::Fan { from: #from, skip_from: #skip_from })
                }
                Route::One { from, to } => quote!(#rt::Route::One { from: #from, to: #to }),
                Route::Gather { to, keep } => quote!(#rt::Route::Gather { to: #to, keep: #keep }),
                Route::GatherAll => {
                    quote!(#rt::Route::GatherAll { producers: #producers })
                }
                Route::Scatter { from, keep } => {
                    quote!(#rt::Route::Scatter { from: #from, keep: #keep })
                }
            };
            // A gather has a slot per producer; every other edge one per consumer. Ranks
            // are global: the sizes are every process's actors together.
            let slots = size_var(match edge.route {
                Route::Gather { .. } => from_group,
                _ => to,
            });
            // Whether the value's type can travel to another process, asked without
            // requiring it (`travel::Probe`); `edge_to` refuses an edge that must and
            // cannot.
            let codec = quote!((&&&#rt::Probe::<#ty>::NEW).codec());
            quote!(__links.edge_to::<#ty>(#value, #from, #to_name, #route, #slots, #codec)?)
        })
        .collect()
}

/// The start of `launch`: it asks the backend for each group's size (the sizes of a graph
/// spanning processes are the sum of theirs), which every check then uses, and which every
/// actor's `Ctx` gets (`__groups`).
fn join_sizes(g: &Graph, sched: &Schedule, name: &Ident) -> TokenStream {
    let rt = rt::local();
    let size_vars = g.groups.iter().map(|d| size_var(&d.name));
    let size_vars2 = size_vars.clone();
    let names = g.groups.iter().map(|d| d.name.to_string());
    let local_sizes = g.groups.iter().map(|d| {
        let (n, s) = (&d.name, d.name.to_string());
        quote!((#s, #n.len()))
    });
    let edge_values = sched.edges.iter().map(|e| &g.values[e.value].label);
    let group_count = g.groups.len();
    let graph_name = name.to_string();
    let backend = param("backend");
    quote! {
        let [#(#size_vars),*] = #rt::join::<_, #group_count>(&#backend, &#rt::GraphInfo {
            name: #graph_name,
            fingerprint: Self::FINGERPRINT,
            groups: &[#(#local_sizes),*],
            edges: &[#(#edge_values),*],
        })?;
        let __groups = #rt::group_sizes(&[#((#names, #size_vars2)),*]);
    }
}

/// `teardown`'s and `teardown_each`'s return types and bodies. They hand the actors back to
/// this thread, so only there must the actors be `Send`. `teardown` hands a fixed-size
/// group back as the array `launch` took; `teardown_each` as a `Vec`, which never fails:
/// a process of a graph over several processes hosts only some of a group's actors.
fn teardown_bodies(g: &Graph) -> (TokenStream, TokenStream, TokenStream, TokenStream) {
    let rt = rt::local();
    let actor_vecs: Vec<TokenStream> = g
        .groups
        .iter()
        .map(|d| {
            let a = &d.actor;
            match &d.size {
                Some((len, _)) => quote!([#a; #len]),
                None => quote!(#rt::Vec<#a>),
            }
        })
        .collect();
    let torn: Vec<Ident> = g
        .groups
        .iter()
        .map(|d| format_ident!("__torn_{}", d.name))
        .collect();
    // Each group's actors as `teardown` returns them.
    let arrays: Vec<TokenStream> = g
        .groups
        .iter()
        .zip(&torn)
        .map(|(d, t)| match &d.size {
            Some((len, _)) => {
                let s = d.name.to_string();
                quote!(#rt::fixed_group::<_, { #len }>(#s, #t)?)
            }
            None => quote!(#t),
        })
        .collect();
    let each_vecs: Vec<TokenStream> = g
        .groups
        .iter()
        .map(|d| {
            let a = &d.actor;
            quote!(#rt::Vec<#rt::Result<#a, #rt::Error>>)
        })
        .collect();
    // The driver's list of groups' actors as the graph returns them: one group's alone,
    // several groups' as a tuple.
    let torn_list = list(torn.iter().map(|t| quote!(#t)));
    if g.groups.len() == 1 {
        let (t, e, torn, array) = (&actor_vecs[0], &each_vecs[0], &torn[0], &arrays[0]);
        (
            quote!(#t),
            quote!(#e),
            quote! {
                let #torn = self.__driver.0.teardown()?.0;
                #rt::Result::Ok(#array)
            },
            quote!(self.__driver.0.teardown_each().0),
        )
    } else {
        (
            quote!((#(#actor_vecs),*)),
            quote!((#(#each_vecs),*)),
            quote! {
                let #torn_list = self.__driver.0.teardown()?;
                #rt::Result::Ok((#(#arrays),*))
            },
            quote! {
                let #torn_list = self.__driver.0.teardown_each();
                (#(#torn),*)
            },
        )
    }
}

/// Per group, `each_<group>` and `try_each_<group>`: a closure run on every actor of the
/// group between executions. A method per group, rather than one `each` that takes the
/// group's name, so that the closure's actor type is the group's, checked by rustc; the
/// group is reached in the driver's list of groups by its position (`.1` per group before
/// it, then `.0`).
fn each_methods(g: &Graph) -> Vec<TokenStream> {
    let rt = rt::local();
    g.groups
        .iter()
        .enumerate()
        .map(|(gi, d)| {
            let (a, name) = (&d.actor, d.name.to_string());
            let each = format_ident!("each_{}", d.name);
            let try_each = format_ident!("try_each_{}", d.name);
            let rest = (0..gi).map(|_| syn::Index::from(1));
            let pick = quote!(|__g| &mut __g #(.#rest)* .0);
            let each_doc = format!(
                " Runs `f` once on every actor of group `{name}` in this process, each on its \
                 own thread, between executions (those in flight finish first), and returns \
                 the values by rank: entry `i` is rank `ranks(\"{name}\").start + i`. A panic \
                 in `f` is `Error::Panic`, naming the rank, and poisons that actor; see \
                 `actorgraph::reference::generated`."
            );
            let try_each_doc = format!(
                " Like `{each}`, with a closure that can fail: the lowest failing rank's `Err` \
                 is `Error::Method` (method `each`), and the graph stays usable."
            );
            let (r, e) = (type_param(g, "R"), type_param(g, "E"));
            quote! {
                #[doc = #each_doc]
                pub fn #each<#r: ::core::marker::Send + 'static>(
                    &mut self,
                    f: impl ::core::ops::Fn(#rt::Ctx, &mut #a) -> #r + ::core::marker::Send + ::core::marker::Sync + 'static,
                ) -> #rt::Result<#rt::Vec<#r>, #rt::Error> {
                    self.__driver.0.each(#pick, f)
                }

                #[doc = #try_each_doc]
                pub fn #try_each<#r: ::core::marker::Send + 'static, #e: ::core::convert::Into<#rt::BoxError>>(
                    &mut self,
                    f: impl ::core::ops::Fn(#rt::Ctx, &mut #a) -> #rt::Result<#r, #e> + ::core::marker::Send + ::core::marker::Sync + 'static,
                ) -> #rt::Result<#rt::Vec<#r>, #rt::Error> {
                    self.__driver.0.try_each(#pick, move |__c, __a| f(__c, __a).map_err(::core::convert::Into::into))
                }
            }
        })
        .collect()
}

/// A type parameter of a generated method, named as rustdoc shows it: `base`, or `base`
/// with a digit if an actor type of the graph spells that name (a type parameter would
/// shadow it in the signature).
fn type_param(g: &Graph, base: &str) -> Ident {
    let taken = |name: &str| {
        g.groups.iter().any(|d| {
            d.actor
                .to_token_stream()
                .into_iter()
                .any(|t| spells(&t, name))
        })
    };
    let name = (0..)
        .map(|k| {
            if k == 0 {
                base.to_string()
            } else {
                format!("{base}{k}")
            }
        })
        .find(|n| !taken(n))
        .expect("an unbounded range has a free name");
    Ident::new(&name, Span::call_site())
}

/// Whether `tree`, or a token inside it, is the identifier `name`.
fn spells(tree: &proc_macro2::TokenTree, name: &str) -> bool {
    match tree {
        proc_macro2::TokenTree::Ident(i) => i == name,
        proc_macro2::TokenTree::Group(g) => g.stream().into_iter().any(|t| spells(&t, name)),
        _ => false,
    }
}

/// The public alias of one rank's output of graph `name`: `<name>Output`.
pub(super) fn output_alias(name: &Ident) -> Ident {
    format_ident!("{}Output", name)
}

/// A parameter of the graph's public methods, named as rustdoc shows it: hygienic, so that
/// a group or input of the same name is another variable.
fn param(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

fn group_var(name: &Ident) -> Ident {
    format_ident!("__group_{}", name)
}

/// The variable that holds a group's size, in every process together, during `launch`.
fn size_var(name: &Ident) -> Ident {
    format_ident!("__size_{}", name)
}

/// The graph's `FINGERPRINT`: FNV-1a of its picture (groups, values, ops, edges) and of
/// the spelling of its actor, input and output types, so that two processes that launch
/// different graphs, or the same graph over other types, see different numbers.
fn fingerprint(g: &Graph, dot: &str, out_ty: &TokenStream) -> u64 {
    let mut text = String::from(dot);
    for d in &g.groups {
        let a = &d.actor;
        text.push_str(&quote!(#a).to_string());
        text.push('\n');
    }
    for i in &g.inputs {
        let t = &i.ty;
        text.push_str(&quote!(#t).to_string());
        text.push('\n');
    }
    text.push_str(&out_ty.to_string());
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h: u64, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The graph's inputs into each group's, for the driver: a group gets the inputs it reads,
/// each moved to the last group that reads it and cloned for the others before.
fn split(g: &Graph, groups: &[GroupPlan]) -> TokenStream {
    let mut remaining_uses: Vec<usize> = (0..g.inputs.len())
        .map(|i| {
            groups
                .iter()
                .filter(|p| p.inputs.contains(&i) || p.own.contains(&i))
                .count()
        })
        .collect();
    let pats = g.inputs.iter().zip(&remaining_uses).map(|(i, &uses)| {
        let n = &i.name;
        if uses == 0 {
            quote!(_)
        } else {
            quote!(#n)
        }
    });
    let pat = quote!((#(#pats,)*));
    let per_group: Vec<TokenStream> = groups
        .iter()
        .map(|p| {
            p.whole_input(g, |i| {
                remaining_uses[i] -= 1;
                let n = &g.inputs[i].name;
                if remaining_uses[i] == 0 {
                    quote!(#n)
                } else {
                    quote!(::core::clone::Clone::clone(&#n))
                }
            })
        })
        .collect();
    let body = list(per_group.into_iter());
    quote!(|#pat| #body)
}

/// Everything `launch` checks before it starts a thread: groups zipped into one output or
/// connected by a per-actor edge have equal sizes; every addressed actor and every root
/// exists.
fn launch_checks(g: &Graph, groups: &[GroupPlan], sched: &Schedule) -> TokenStream {
    let rt = rt::local();
    // Groups that give per-actor values to the output are zipped by rank; a value of one
    // actor of another group goes at its rank, which must exist.
    let zipped: Vec<&GroupPlan> = groups
        .iter()
        .filter(|p| !p.out_parts.is_empty() && !p.only_single(g))
        .collect();
    let out_ranks = zipped.first().map(|z| {
        let zn = &g.groups[z.index].name;
        let zs = zn.to_string();
        let checks = groups.iter().filter(|p| p.only_single(g)).flat_map(|p| {
            p.out_parts.iter().filter_map(|&k| {
                let v = &g.values[g.output.parts[k]];
                let Some(Place::Actor(_, rank)) = v.place() else {
                    return None;
                };
                let label = &v.label;
                let zsize = size_var(zn);
                Some(quote!(#rt::check_output_rank(#label, #rank, #zs, #zsize)?;))
            })
        });
        quote!(#(#checks)*)
    });
    let size_check = if zipped.len() > 1 {
        let checks = zipped.iter().map(|p| {
            let n = &g.groups[p.index].name;
            let s = n.to_string();
            let size = size_var(n);
            quote!((#s, #size))
        });
        quote!(#rt::same_size(&[#(#checks),*])?;)
    } else {
        quote!()
    };
    let indices = g.groups.iter().flat_map(|d| {
        let rt = rt.clone();
        let n = &d.name;
        let s = n.to_string();
        d.indices.iter().map(move |(k, _)| {
            let size = size_var(n);
            quote!(#rt::check_index(#s, #size, #k)?;)
        })
    });
    let roots = g.groups.iter().flat_map(|d| {
        let rt = rt.clone();
        let n = &d.name;
        let s = n.to_string();
        d.roots.iter().map(move |(stage, root)| {
            let size = size_var(n);
            quote!(#rt::check_root(#s, #size, #stage, #root)?;)
        })
    });
    let edges = sched.edges.iter().filter_map(|e| {
        // Only a per-actor value maps actor i to actor i; a value of one actor goes
        // wherever its index (checked above) says.
        let (Place::Group(from), to) = (e.from, e.to.group()) else {
            return None;
        };
        // A gather takes every rank's value, whatever the sizes.
        if let Route::Gather { .. } | Route::GatherAll = e.route {
            return None;
        }
        let (f, t) = (&g.groups[from].name, &g.groups[to].name);
        let (fs, ts) = (f.to_string(), t.to_string());
        let value = &g.values[e.value].label;
        let (fsize, tsize) = (size_var(f), size_var(t));
        Some(quote!(#rt::check_edge(#value, (#fs, #fsize), (#ts, #tsize))?;))
    });
    quote! {
        #(#indices)*
        #(#roots)*
        #(#edges)*
        #size_check
        #out_ranks
    }
}

/// A group's parameter of `launch` (`ready`: its actors as a `Vec`, or an array for a
/// fixed-size group) or of `launch_actors` (an `Actors`). Without a usable actor type (a
/// graph with errors), any value.
pub(super) fn launch_param(
    name: &Ident,
    actor: Option<&syn::Type>,
    size: Option<&syn::Expr>,
    ready: bool,
) -> TokenStream {
    let rt = rt::local();
    match (actor, size, ready) {
        (Some(a), Some(len), true) => quote!(#name: [#a; #len]),
        (Some(a), None, true) => quote!(#name: #rt::Vec<#a>),
        (Some(a), _, false) => quote!(#name: #rt::Actors<#a>),
        (None, ..) => quote!(#name: impl ::core::marker::Sized),
    }
}

/// For each method call of the graph, `impl MethodCall<K> for Graph`: the method's
/// `MethodId`, found at compile time by `method_index` in the one constant of that call.
/// A method that does not exist, cannot be a node, or gets the wrong number of arguments
/// fails that constant, at the user's `method(..)`, with a message that says which; every
/// type derived from the call goes through this impl, so nothing else reports an error.
/// These impls are outside the graph's block, so that rustc names the failed constant
/// `<Graph as MethodCall<K>>`. Second, for the block, each call's aliases of its method and
/// its output type (see `types::method_aliases`).
fn method_calls(g: &Graph) -> (Vec<TokenStream>, Vec<TokenStream>) {
    let rt = rt::path();
    let graph = &g.def.name;
    g.ops
        .iter()
        .filter_map(|op| match &op.kind {
            OpKind::Call {
                call,
                method,
                args,
                parens,
                ..
            } => {
                let decl = &g.groups[op.group()];
                let (actor, text) = (&decl.actor, &decl.actor_text);
                let (name, n) = (method.to_string(), args.len());
                // The call's tokens span the user's `method(..)`, which rustc then shows. A
                // failed lookup is reported at the call, so the call's ends take the user's
                // span whole, not only its place, and the error reads as the user's rather
                // than as coming from a macro: the path goes in parentheses of the user's
                // span, and keeps the macro's own hygiene (which resolves `::actorgraph`
                // the same in every edition).
                let f = respan(quote!(#rt::method_index), method.span());
                let mut f = Group::new(Delimiter::Parenthesis, quote!(#f::<#actor>));
                f.set_span(method.span());
                let lookup = quote_spanned!(*parens=> #f(#text, #name, #n));
                let call_impl = quote! {
                    #[doc(hidden)]
                    impl #rt::MethodCall<#call> for #graph {
                        type Method = #rt::MethodId<{ #lookup }>;
                    }
                };
                Some((
                    call_impl,
                    method_aliases(graph, actor, *call, method.span()),
                ))
            }
            _ => None,
        })
        .unzip()
}

/// For a group whose size is a constant but not a literal (`[Worker; N]`), an index it
/// addresses is checked by the compiler: a failing `const` assertion at the user's index.
fn index_asserts(g: &Graph) -> Vec<TokenStream> {
    g.groups
        .iter()
        .filter_map(|d| match &d.size {
            Some((len, None)) => Some((d, len)),
            _ => None,
        })
        .flat_map(|(d, len)| {
            d.indices.iter().map(move |&(k, span)| {
                let msg = format!(
                    "`{}[{k}]` is out of range: group `{}` has `{}` actors",
                    d.name,
                    d.name,
                    crate::diag::tidy(len)
                );
                quote_spanned!(span=> const _: () = ::core::assert!(#k < (#len), #msg);)
            })
        })
        .collect()
}

/// `impl Checked<K, P> for Graph` for each value type the graph checks (see `ir::Check`,
/// `types::checked_type`), then for each edge's value (checked `Send`):
/// the type itself when it satisfies the bound, checked by a constant at the user's
/// argument; when it does not, that constant fails with the bound's own message, and the
/// type, with every type and call derived from it, is an error that reports nothing more.
/// The graph's struct thus needs no `where` clause (which would make every
/// `impl MethodCall<K> for Graph` report it again).
fn value_checks(g: &Graph, sched: &Schedule) -> Vec<TokenStream> {
    let rt = rt::local();
    let (graph, p) = (&g.def.name, privacy_alias());
    // Each value sent over an edge leaves its actor's thread: its type is checked `Send`,
    // after the graph's own checks (see `edge_type`).
    let edges = sched.edges.iter().map(|e| Check {
        ty: g.values[e.value].ty.clone(),
        at: e.span,
        kind: CheckKind::Send,
    });
    let edges: Vec<Check> = edges.collect();
    g.checks
        .iter()
        .chain(&edges)
        .enumerate()
        .map(|(k, c)| {
            // The check, and the type as a whole, at the user's token; the type's own
            // tokens keep their spans, so an error in them (an unknown type) is reported
            // once, where it is written.
            let at = c.at;
            let ty = respan_ends(c.ty.clone(), at);
            let f = respan(
                match c.kind {
                    CheckKind::Gather => quote!(#rt::gatherable),
                    CheckKind::Send => quote!(#rt::sendable),
                    CheckKind::Input => quote!(#rt::input),
                    CheckKind::RankInput => quote!(#rt::rank_input),
                    CheckKind::Split => quote!(#rt::splittable),
                    CheckKind::Fields(_) => quote!(#rt::destructures),
                },
                at,
            );
            let check = match c.kind {
                CheckKind::Fields(n) => quote_spanned!(at=> #f::<#ty, #n>()),
                _ => quote_spanned!(at=> #f::<#ty>()),
            };
            let alias = checked_alias(graph, k);
            quote! {
                #alias
                #[doc(hidden)]
                impl #rt::Checked<#k, #p> for #graph {
                    type Type = <#ty as #rt::Valid<{ #check }>>::Type;
                }
            }
        })
        .collect()
}
/// The driver's assembly of the output from every group's per-rank results (`Vec`s, as a
/// list, already checked).
fn assemble(g: &Graph, groups: &[GroupPlan]) -> TokenStream {
    let result = |p: &GroupPlan| format_ident!("__result_{}", g.groups[p.index].name);
    let contributing: Vec<&GroupPlan> = groups.iter().filter(|p| !p.out_parts.is_empty()).collect();
    let pat = list(groups.iter().map(|p| {
        if p.out_parts.is_empty() {
            quote!(_)
        } else {
            let r = result(p);
            quote!(#r)
        }
    }));
    if !g.output.tuple || contributing.len() == 1 {
        let r = result(contributing[0]);
        return quote!(|#pat| #r);
    }
    // Zip the groups' per-rank tuples and put the parts back in output order (traits
    // named in full: the user's module may have no prelude).
    // A group that gives only values of one actor may be of another size: its entries are
    // padded with `None` to the output's length (see `launch_checks`).
    let rt = rt::path();
    let part_ident = |k: usize| format_ident!("__out{}", k);
    let mut iter = quote!();
    let mut parts_pat = quote!();
    for (n, p) in contributing.iter().enumerate() {
        let r = result(p);
        let parts = p.out_parts.iter().map(|&k| part_ident(k));
        let this = quote!((#(#parts,)*));
        let r = if p.only_single(g) {
            let nones = p.out_parts.iter().map(|_| quote!(#rt::Option::None));
            quote!(::core::iter::Iterator::chain(::core::iter::IntoIterator::into_iter(#r), ::core::iter::repeat_with(|| (#(#nones,)*))))
        } else {
            quote!(#r)
        };
        if n == 0 {
            iter = quote!(::core::iter::IntoIterator::into_iter(#r));
            parts_pat = this;
        } else {
            iter = quote!(::core::iter::Iterator::zip(#iter, #r));
            parts_pat = quote!((#parts_pat, #this));
        }
    }
    let lens = contributing.iter().map(|p| {
        let r = result(p);
        quote!(#rt::Vec::len(&#r))
    });
    let all = (0..g.output.parts.len()).map(part_ident);
    quote!(|#pat| {
        let __len: ::core::primitive::usize = 0;
        #(let __len = ::core::cmp::max(__len, #lens);)*
        ::core::iter::Iterator::collect(::core::iter::Iterator::take(::core::iter::Iterator::map(#iter, |#parts_pat| (#(#all,)*)), __len))
    })
}

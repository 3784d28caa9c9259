//! What each group of a graph runs and returns, and the types of the values that leave
//! an actor (the graph's output, edge values): shared by the graph's code (`codegen`) and
//! its steps (`step`).

use proc_macro2::TokenStream;
use quote::quote;

use super::ir::{Graph, OpKind, Origin, Place};
use super::types::checked_type;

/// What one group runs and returns.
pub(crate) struct GroupPlan {
    pub(crate) index: usize,
    /// Graph inputs this group reads that every actor gets whole, by input index.
    pub(crate) inputs: Vec<usize>,
    /// Per-rank inputs this group reads (rank k gets value k), by input index.
    pub(crate) own: Vec<usize>,
    /// Positions in the graph output that this group produces.
    pub(crate) out_parts: Vec<usize>,
    pub(crate) out_ty: TokenStream,
}

impl GroupPlan {
    pub(crate) fn new(g: &Graph, index: usize) -> Self {
        let mut inputs = Vec::new();
        for op in g.ops.iter().filter(|op| op.group() == index) {
            let reads: &[_] = match &op.kind {
                OpKind::Call { args, .. } => args,
                OpKind::Tuple { parts } => parts,
                _ => &[],
            };
            for &a in reads {
                if let Origin::Input(i) = g.values[a].origin {
                    if !inputs.contains(&i) {
                        inputs.push(i);
                    }
                }
            }
        }
        inputs.sort_unstable();
        let (own, inputs) = inputs.into_iter().partition(|&i| g.inputs[i].per_rank);
        let out_parts: Vec<usize> = g
            .output
            .parts
            .iter()
            .enumerate()
            .filter(|(_, &v)| g.values[v].place().map(Place::group) == Some(index))
            .map(|(k, _)| k)
            .collect();
        let out_ty = if out_parts.is_empty() {
            quote!(())
        } else {
            parts_type(g, out_parts.iter().copied())
        };
        GroupPlan {
            index,
            inputs,
            own,
            out_parts,
            out_ty,
        }
    }
}

impl GroupPlan {
    /// Whether every output part this group gives is a value of one actor (so its size
    /// need not match the output's, see codegen's `assemble`).
    pub(crate) fn only_single(&self, g: &Graph) -> bool {
        self.out_parts
            .iter()
            .all(|&k| matches!(g.values[g.output.parts[k]].place(), Some(Place::Actor(..))))
    }

    /// The type of one actor's input: the tuple of the inputs every actor gets, or, with
    /// per-rank inputs, `RankInputs` of that tuple and of the list of its own values.
    pub(crate) fn input_type(&self, g: &Graph) -> TokenStream {
        let shared = self.inputs.iter().map(|&i| &g.inputs[i].checked);
        let shared = quote!((#(#shared,)*));
        if self.own.is_empty() {
            return shared;
        }
        let rt = crate::rt::path();
        let own = list(self.own.iter().map(|&i| g.inputs[i].checked.clone()));
        quote!(#rt::RankInputs<#shared, #own>)
    }

    /// In the step: `let name = &..;` for each input the group reads, from `__inputs`.
    pub(crate) fn bind_inputs(&self, g: &Graph) -> Vec<TokenStream> {
        let split = !self.own.is_empty();
        let shared = self.inputs.iter().enumerate().map(|(k, &i)| {
            let (n, k) = (&g.inputs[i].name, syn::Index::from(k));
            match split {
                false => quote!(let #n = &__inputs.#k;),
                true => quote!(let #n = &__inputs.shared.#k;),
            }
        });
        let own = self.own.iter().enumerate().map(|(k, &i)| {
            let n = &g.inputs[i].name;
            let rest = (0..k).map(|_| quote!(.1));
            quote!(let #n = &__inputs.own #(#rest)* .0;)
        });
        shared.chain(own).collect()
    }

    /// The group's input of one execution, in the driver's `split`: `take(i)` is graph
    /// input i (moved or cloned); a per-rank input's values go with its name, for the
    /// length check.
    pub(crate) fn whole_input(
        &self,
        g: &Graph,
        mut take: impl FnMut(usize) -> TokenStream,
    ) -> TokenStream {
        let shared: Vec<TokenStream> = self.inputs.iter().map(|&i| take(i)).collect();
        let shared = quote!((#(#shared,)*));
        if self.own.is_empty() {
            return shared;
        }
        let rt = crate::rt::path();
        let own = list(self.own.iter().map(|&i| {
            let name = g.inputs[i].name.to_string();
            let values = take(i);
            quote!(#rt::PerRankValues::new(#name, #values))
        }));
        quote!((#shared, #own))
    }
}

/// `items` as a list: `(a, (b, ()))`.
pub(crate) fn list(items: impl DoubleEndedIterator<Item = TokenStream>) -> TokenStream {
    items
        .rev()
        .fold(quote!(()), |rest, item| quote!((#item, #rest)))
}

/// The type of one output part on one rank: a value of one actor is `Some` on that rank
/// only.
fn part_type(g: &Graph, k: usize) -> TokenStream {
    let v = &g.values[g.output.parts[k]];
    let ty = &g.output.tys[k];
    match v.place() {
        Some(Place::Actor(..)) => quote!(::core::option::Option<#ty>),
        _ => quote!(#ty),
    }
}

/// The type of one rank's output.
pub(crate) fn output_type(g: &Graph) -> TokenStream {
    parts_type(g, 0..g.output.parts.len())
}

/// The type of output parts `parts` on one rank: a tuple of them if the output is one.
fn parts_type(g: &Graph, parts: impl Iterator<Item = usize>) -> TokenStream {
    let tys = parts.map(|k| part_type(g, k));
    if g.output.tuple {
        quote!((#(#tys,)*))
    } else {
        quote!(#(#tys)*)
    }
}

/// The type of the values on edge `e`: checked `Send` (see `value_checks`).
pub(crate) fn edge_type(g: &Graph, e: usize) -> TokenStream {
    checked_type(g.checks.len() + e)
}

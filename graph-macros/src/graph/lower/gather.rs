//! Values between groups of different sizes: one rank's value of a per-actor value
//! (`losses[k]`, a value of one actor, readable by any actor of any group), every rank's
//! value brought to one actor (`coord[0].record(gather(losses))`, a `Vec` in rank order),
//! and a `Vec` of one actor split over a group (`workers.f(scatter(shards))`, the k-th
//! value to rank k). All are point-to-point edges (see `schedule`): no collective, no copy
//! of the data.

use proc_macro2::Span;
use quote::ToTokens;
use syn::spanned::Spanned;

use super::{Binding, Lowerer};
use crate::diag::tidy;
use crate::graph::ir::{CheckKind, OpKind, Place, ValueId};
use crate::graph::types::{checked_type, split_item, vec_of};

/// Whether a call is `gather(..)`.
pub(crate) fn is_gather(c: &syn::ExprCall) -> bool {
    calls(c, "gather")
}

/// Whether a call is `scatter(..)`.
pub(crate) fn is_scatter(c: &syn::ExprCall) -> bool {
    calls(c, "scatter")
}

fn calls(c: &syn::ExprCall, name: &str) -> bool {
    matches!(&*c.func, syn::Expr::Path(p) if p.qself.is_none() && p.path.is_ident(name))
}

impl Lowerer<'_> {
    /// `src[k]`: rank k's value of per-actor value `src`, a value of actor k.
    pub(super) fn pick(&mut self, ix: &syn::ExprIndex) -> Option<ValueId> {
        let base = match &*ix.expr {
            syn::Expr::Path(p) => p,
            other => {
                self.diag.error_at(
                    other,
                    "an index picks one rank's value of a per-actor value: `losses[0]`",
                );
                return None;
            }
        };
        if let Some(ident) = base.path.get_ident() {
            if let Some(&(Binding::Group(g), _)) = self.scope.get(&ident.to_string()) {
                let g = &self.groups[g].name;
                self.diag.error_at(
                    ix,
                    format!(
                        "`{g}[..]` is an actor, not a value; call a method on it: `{}.method(..)`",
                        tidy(ix)
                    ),
                );
                return None;
            }
        }
        let src = self.name(base)?;
        let label = self.values[src].label.clone();
        let group = match self.values[src].place() {
            Some(Place::Group(g)) => g,
            None => {
                self.diag.error_at(
                    ix,
                    format!("`{label}` is a graph input, the same on every actor: an index picks one rank's value of a per-actor value (`losses[0]`)"),
                );
                return None;
            }
            Some(place) => {
                let at = self.describe(place);
                self.diag.error_at(
                    ix,
                    format!("`{label}` lives on one actor already, {at}: an index picks one rank's value of a per-actor value"),
                );
                return None;
            }
        };
        let k = self.rank_index(group, &ix.index)?;
        let label = format!("{label}[{k}]");
        let ty = self.values[src].ty.clone();
        let outs = self.push_op(
            Place::Actor(group, k),
            OpKind::Pick { src },
            vec![(label, ty)],
        );
        Some(outs[0])
    }

    /// `gather(src)` as an argument of a call at `place`: every rank's value of per-actor
    /// value `src`, in rank order, on the one actor that calls, or on every actor of
    /// another group.
    pub(super) fn gather(&mut self, c: &syn::ExprCall, place: Option<Place>) -> Option<ValueId> {
        let [arg] = c.args.iter().collect::<Vec<_>>()[..] else {
            self.diag.error_at(
                c,
                "`gather` takes one per-actor value: `coord[0].record(gather(losses))`",
            );
            return None;
        };
        let src = self.one(arg)?;
        let label = self.values[src].label.clone();
        let from = match self.values[src].place() {
            Some(Place::Group(g)) => g,
            None => {
                self.diag.error_at(
                    arg,
                    format!("`{label}` is a graph input, the same on every actor: `gather` takes a per-actor value"),
                );
                return None;
            }
            Some(at) => {
                let at = self.describe(at);
                self.diag.error_at(
                    arg,
                    format!("`{label}` lives on one actor, {at}: `gather` takes a per-actor value"),
                );
                return None;
            }
        };
        let place = place?;
        if place == Place::Group(from) {
            let g = &self.groups[from].name;
            self.diag.error_at(
                c,
                format!("every actor of `{g}` reading every rank's value of `{g}` is an allgather: `allgather({label})`; `gather` brings the values to one actor, `{g}[0].method(gather({label}))`, or to another group"),
            );
            return None;
        }
        let ty = vec_of(&self.values[src].ty);
        let outs = self.push_op(
            place,
            OpKind::Gather {
                src,
                span: c.span(),
            },
            vec![(format!("gather({label})"), ty)],
        );
        Some(outs[0])
    }

    /// `scatter(src)` as an argument of a call at `place`: the k-th value of `src` (a `Vec`
    /// on one actor) on rank k of the calling group.
    pub(super) fn scatter(&mut self, c: &syn::ExprCall, place: Option<Place>) -> Option<ValueId> {
        let [arg] = c.args.iter().collect::<Vec<_>>()[..] else {
            self.diag.error_at(
                c,
                "`scatter` takes one value of one actor: `workers.train(scatter(shards))`",
            );
            return None;
        };
        let src = self.one(arg)?;
        let label = self.values[src].label.clone();
        match self.values[src].place() {
            Some(Place::Actor(..)) => {}
            None => {
                self.diag.error_at(
                    arg,
                    format!("`{label}` is a graph input: split it with a per-rank input, `{label}: PerRank<T>`"),
                );
                return None;
            }
            Some(Place::Group(g)) => {
                let g = &self.groups[g].name;
                self.diag.error_at(
                    arg,
                    format!("`{label}` is a per-actor value of `{g}`: `scatter` splits a value of one actor, such as `{g}[0].load(..)`"),
                );
                return None;
            }
        }
        let place = place?;
        let Place::Group(_) = place else {
            self.diag.error_at(
                c,
                "`scatter` gives every actor of a group its value: call a method of the whole group, `workers.method(scatter(..))`",
            );
            return None;
        };
        let check = self.check(self.values[src].ty.clone(), arg.span(), CheckKind::Split);
        let ty = split_item(&checked_type(check));
        let outs = self.push_op(
            place,
            OpKind::Scatter {
                src,
                span: c.span(),
                check,
            },
            vec![(format!("scatter({label})"), ty)],
        );
        Some(outs[0])
    }

    /// An output that zips the per-actor values of a group of known size with a value of
    /// one actor of another group at a rank past that size: the launch-time
    /// `Error::OutputRank`, known at compile time. Reported at the value; `false` then.
    pub(super) fn output_ranks(&mut self, parts: &[ValueId], spans: &[Span]) -> bool {
        let places: Vec<Option<Place>> = parts.iter().map(|&p| self.values[p].place()).collect();
        let zipped = places.iter().find_map(|p| match p {
            Some(Place::Group(g)) => Some(*g),
            _ => None,
        });
        let Some((zipped, size)) = zipped.and_then(|g| match &self.groups[g].size {
            Some((_, Some(n))) => Some((g, *n)),
            _ => None,
        }) else {
            return true;
        };
        let mut ok = true;
        for ((&p, place), &at) in parts.iter().zip(&places).zip(spans) {
            // A group that gives a per-actor value too is zipped (sizes checked at launch).
            let Some(Place::Actor(g, k)) = *place else {
                continue;
            };
            let zipped_too = places.contains(&Some(Place::Group(g)));
            if g != zipped && !zipped_too && k >= size {
                let (label, name) = (&self.values[p].label, &self.groups[zipped].name);
                self.diag.error(
                    at,
                    format!("`{label}` would be `Some` at rank {k}, but this output has one entry per actor of group `{name}`, which has {size}"),
                );
                ok = false;
            }
        }
        ok
    }

    /// `gather(..)` or `scatter(..)` anywhere but as a method's argument.
    pub(super) fn edge_fn_misplaced(&mut self, c: &syn::ExprCall) {
        let arg = c
            .args
            .first()
            .map_or_else(|| "x".to_string(), |a| tidy(a.to_token_stream()));
        let msg = if is_gather(c) {
            format!("`gather` is written as the argument of the one actor's method that reads the values: `coord[0].record(gather({arg}))`")
        } else {
            format!("`scatter` is written as the argument of the group's method that reads the values: `workers.train(scatter({arg}))`")
        };
        self.diag.error_at(c, msg);
    }
}

//! Values between groups of different sizes: one rank's value of a per-actor value
//! (`losses[k]`, a value of one actor, readable by any actor of any group) and every rank's
//! value brought to one actor (`coord[0].record(gather(losses))`, a `Vec` in rank order).
//! Both are point-to-point edges (see `schedule`): no collective, no copy of the data.

use quote::ToTokens;
use syn::spanned::Spanned;

use super::{Binding, Lowerer};
use crate::diag::tidy;
use crate::graph::ir::{OpKind, Place, ValueId};
use crate::graph::types::vec_of;

/// Whether a call is `gather(..)`.
pub(crate) fn is_gather(c: &syn::ExprCall) -> bool {
    matches!(&*c.func, syn::Expr::Path(p) if p.qself.is_none() && p.path.is_ident("gather"))
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
    /// value `src`, in rank order, on the one actor that calls.
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
        let Place::Actor(..) = place else {
            let g = &self.groups[from].name;
            let msg = if place.group() == from {
                format!("every actor of `{g}` reading every rank's value of `{g}` is an allgather: `allgather({label})`; `gather` brings the values to one actor, `{g}[0].method(gather({label}))`")
            } else {
                let h = &self.groups[place.group()].name;
                format!("`gather` brings every rank's value to one actor: call a method of one actor, `{h}[0].method(gather({label}))`")
            };
            self.diag.error_at(c, msg);
            return None;
        };
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

    /// `gather(..)` anywhere but as a method's argument.
    pub(super) fn gather_misplaced(&mut self, c: &syn::ExprCall) {
        let arg = c
            .args
            .first()
            .map_or_else(|| "x".to_string(), |a| tidy(a.to_token_stream()));
        self.diag.error_at(
            c,
            format!("`gather` is written as the argument of the one actor's method that reads the values: `coord[0].record(gather({arg}))`"),
        );
    }
}

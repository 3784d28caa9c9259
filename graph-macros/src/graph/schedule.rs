//! The schedule: which values cross between actors (edges), and the one order in which
//! every actor runs its operations.
//!
//! A method argument that lives on other actors than the method (a per-actor value of
//! another group, a value of one actor read by others) travels over an edge: the producer
//! sends it right after the op that makes it, the consumer receives it right before the
//! first op that reads it. Every op, send and receive gets a position in one global order:
//! program order, with each edge's sends just after its producing op and its receives just
//! before its first consumer. Each actor runs the items that concern it in that order.
//!
//! Why no actor can deadlock: program order is a topological order of the dataflow (a name
//! is defined before any use, see `lower`), so a send always precedes its receive. Sends never
//! wait (one message per slot per execution; with several executions in flight, a full slot
//! waits only for an earlier round). A collective is one item in which every actor of its
//! group takes part. Take the blocked operation with the lowest position: a receive there
//! would need its send, which is lower, hence done; a collective there would need every
//! rank of its group, and each of them has reached it (all are blocked at it or later, and
//! none passes it alone). So nothing is blocked. A failed actor runs the rest of the same
//! order (markers instead of values, skipped stages), so failures keep this property.

use std::collections::HashMap;

use proc_macro2::Span;

use super::ir::{Graph, OpKind, Place, ValueId};

/// A value's way to the actors of one place that read it.
pub(crate) struct Edge {
    /// The value its consumers get (its type is the edge's).
    pub(crate) value: ValueId,
    /// The value its producer sends: `value`, but for a scatter, the `Vec` it splits.
    pub(crate) sent: ValueId,
    /// Where the value lives (a graph input never travels: every actor has it).
    pub(crate) from: Place,
    /// Where it is read: a group (every actor) or one actor.
    pub(crate) to: Place,
    pub(crate) route: Route,
    /// The first argument that reads it, for errors about its type.
    pub(crate) span: Span,
}

/// Which ranks an edge connects.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Route {
    /// Rank i of one group feeds rank i of another (sizes checked at launch).
    Zip,
    /// Rank `from` feeds every rank of the reading group; `skip_from` when that is its own
    /// group (rank `from` has the value already).
    Fan { from: usize, skip_from: bool },
    /// Rank `from` feeds rank `to`.
    One { from: usize, to: usize },
    /// Every rank feeds rank `to` (`gather`); `keep` when that is its own group (rank `to`
    /// has its own value already).
    Gather { to: usize, keep: bool },
    /// Every rank feeds every rank of another group (`gather` to a group).
    GatherAll,
    /// Rank `from` splits a `Vec` over the reading group, the k-th value to rank k
    /// (`scatter`); `keep` when that is its own group (rank `from` keeps its value).
    Scatter { from: usize, keep: bool },
}

/// One item of the global order.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Item {
    Op(usize),
    Send(usize),
    Recv(usize),
}

pub(crate) struct Schedule {
    pub(crate) edges: Vec<Edge>,
    /// Every op, send and receive, in the one order all actors follow.
    pub(crate) items: Vec<Item>,
    /// The edge that brings a value to a place, by (value, reading place).
    pub(crate) landing: HashMap<(ValueId, Place), usize>,
    /// The edge that brings each `gather` or `scatter` op its values, by op.
    pub(crate) carried: HashMap<usize, usize>,
}

/// The route a value living at `from` takes to an op running at `to`; `None` when the
/// actors that run the op hold it already.
pub(crate) fn route(from: Place, to: Place) -> Option<Route> {
    match (from, to) {
        (Place::Group(g), Place::Group(h)) if g == h => None,
        (Place::Group(g), Place::Actor(h, _)) if g == h => None,
        (a, b) if a == b => None,
        (Place::Group(_), Place::Group(_)) => Some(Route::Zip),
        (Place::Group(_), Place::Actor(_, j)) => Some(Route::One { from: j, to: j }),
        (Place::Actor(g, k), Place::Group(h)) => Some(Route::Fan {
            from: k,
            skip_from: g == h,
        }),
        (Place::Actor(_, k), Place::Actor(_, j)) => Some(Route::One { from: k, to: j }),
    }
}

pub(crate) fn schedule(g: &Graph) -> Schedule {
    let mut edges: Vec<Edge> = Vec::new();
    let mut landing = HashMap::new();
    // The op before which each edge is received.
    let mut first_use: Vec<usize> = Vec::new();
    let mut carried = HashMap::new();
    for (i, op) in g.ops.iter().enumerate() {
        if let OpKind::Scatter { src, span, .. } = &op.kind {
            // Lowering made sure that `src` lives on one actor.
            if let Some(from @ Place::Actor(h, k)) = g.values[*src].place() {
                edges.push(Edge {
                    value: op.outs[0],
                    sent: *src,
                    from,
                    to: op.place,
                    route: Route::Scatter {
                        from: k,
                        keep: h == op.group(),
                    },
                    span: *span,
                });
                first_use.push(i);
                carried.insert(i, edges.len() - 1);
            }
            continue;
        }
        if let OpKind::Gather { src, span } = &op.kind {
            // Its own edge, even for a value that also travels otherwise to these actors.
            let from = Place::Group(g.values[*src].place().map_or(op.group(), Place::group));
            let route = match op.place {
                Place::Actor(to, j) => Route::Gather {
                    to: j,
                    keep: from.group() == to,
                },
                // Lowering made sure that it is another group.
                Place::Group(_) => Route::GatherAll,
            };
            edges.push(Edge {
                value: *src,
                sent: *src,
                from,
                to: op.place,
                route,
                span: *span,
            });
            first_use.push(i);
            carried.insert(i, edges.len() - 1);
            continue;
        }
        let OpKind::Call {
            args, arg_spans, ..
        } = &op.kind
        else {
            continue;
        };
        for (&v, &span) in args.iter().zip(arg_spans) {
            let Some(from) = g.values[v].place() else {
                continue;
            };
            let Some(route) = route(from, op.place) else {
                continue;
            };
            landing.entry((v, op.place)).or_insert_with(|| {
                edges.push(Edge {
                    value: v,
                    sent: v,
                    from,
                    to: op.place,
                    route,
                    span,
                });
                first_use.push(i);
                edges.len() - 1
            });
        }
    }
    let mut items = Vec::new();
    for i in 0..g.ops.len() {
        items.extend(
            (0..edges.len())
                .filter(|&e| first_use[e] == i)
                .map(Item::Recv),
        );
        items.push(Item::Op(i));
        items.extend(
            (0..edges.len())
                .filter(|&e| g.values[edges[e].sent].made_by() == Some(i))
                .map(Item::Send),
        );
    }
    Schedule {
        edges,
        items,
        landing,
        carried,
    }
}

impl Schedule {
    /// The items group `group`'s actors run, in order.
    pub(crate) fn of_group<'s>(
        &'s self,
        g: &'s Graph,
        group: usize,
    ) -> impl Iterator<Item = Item> + 's {
        self.items.iter().copied().filter(move |item| match *item {
            Item::Op(i) => g.ops[i].group() == group,
            Item::Send(e) => self.edges[e].from.group() == group,
            Item::Recv(e) => self.edges[e].to.group() == group,
        })
    }
}

//! Lowering and scheduling, from a graph written as tokens: the IR (values, ops, which op
//! made each value, groups) and the per-actor schedule, and the errors lowering reports.

use proc_macro2::TokenStream;
use quote::quote;

use super::ir::{CheckKind, Graph, OpKind, Origin, Place, ValueId};
use super::lower::lower;
use super::parse::GraphDef;
use super::schedule::{schedule, Item, Route, Schedule};
use crate::diag::Diag;

fn parse(tokens: TokenStream) -> GraphDef {
    syn::parse2(tokens).expect("the graph parses")
}

/// Lowers a graph that has no error and schedules it.
fn lowered<R>(tokens: TokenStream, check: impl FnOnce(&Graph, &Schedule) -> R) -> R {
    let def = parse(tokens);
    let mut diag = Diag::default();
    let graph = lower(&def, &mut diag);
    assert_eq!(diag.messages(), Vec::<String>::new());
    let graph = graph.expect("a graph without errors lowers");
    let sched = schedule(&graph);
    check(&graph, &sched)
}

/// The errors lowering a graph reports.
fn errors(tokens: TokenStream) -> Vec<String> {
    let def = parse(tokens);
    let mut diag = Diag::default();
    lower(&def, &mut diag);
    let messages = diag.messages();
    assert!(!messages.is_empty(), "the graph lowers without error");
    messages
}

/// The value the user named `name`.
fn value(g: &Graph, name: &str) -> ValueId {
    let found: Vec<ValueId> = (0..g.values.len())
        .filter(|&v| g.values[v].named && g.values[v].label == name)
        .collect();
    assert_eq!(found.len(), 1, "one value named `{name}`");
    found[0]
}

fn kinds(g: &Graph) -> Vec<&'static str> {
    g.ops
        .iter()
        .map(|op| match op.kind {
            OpKind::Call { .. } => "call",
            OpKind::Collective { .. } => "collective",
            OpKind::Tuple { .. } => "tuple",
            OpKind::Fields { .. } => "fields",
            OpKind::Pick { .. } => "pick",
            OpKind::Gather { .. } => "gather",
            OpKind::Scatter { .. } => "scatter",
        })
        .collect()
}

/// Every op's outputs name it as their origin, at its place, and every value made by an op
/// is one of its outputs: the IR records each value's origin once and consistently.
fn assert_origins_consistent(g: &Graph) {
    for (i, op) in g.ops.iter().enumerate() {
        for &o in &op.outs {
            assert_eq!(
                g.values[o].origin,
                Origin::Op {
                    op: i,
                    place: op.place
                }
            );
        }
    }
    for (v, value) in g.values.iter().enumerate() {
        if let Some(op) = value.made_by() {
            assert!(g.ops[op].outs.contains(&v));
        }
    }
}

#[test]
fn a_pipeline_lowers_to_values_ops_and_groups() {
    let pipe = quote! {
        Pipe(a: [Stage], b: [Stage; 2], x: f32) {
            let h = a.fwd(x);
            let s = allreduce(h, Avg);
            let y = b.fwd(s);
            let t = b[1].last(y);
            (y, t)
        }
    };
    lowered(pipe, |g, _| {
        assert_origins_consistent(g);
        let names: Vec<String> = g.groups.iter().map(|d| d.name.to_string()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(g.groups[0].actor_text, "Stage");
        assert!(g.groups[0].size.is_none());
        assert_eq!(g.groups[1].size.as_ref().map(|s| s.1), Some(Some(2)));
        let indices: Vec<usize> = g.groups[1].indices.iter().map(|i| i.0).collect();
        assert_eq!(indices, [1]);
        assert_eq!(g.groups[0].stages, ["allreduce(h, Avg)"]);
        assert!(g.groups[1].stages.is_empty());

        let x = value(g, "x");
        assert_eq!(g.inputs.len(), 1);
        assert_eq!(g.inputs[0].name, "x");
        assert_eq!(g.values[x].origin, Origin::Input(0));
        assert_eq!(g.values[x].place(), None);

        assert_eq!(kinds(g), ["call", "collective", "call", "call"]);
        let (h, s, y, t) = (value(g, "h"), value(g, "s"), value(g, "y"), value(g, "t"));
        assert_eq!(g.values[h].made_by(), Some(0));
        assert_eq!(g.values[s].made_by(), Some(1));
        assert_eq!(g.values[y].made_by(), Some(2));
        assert_eq!(g.values[t].made_by(), Some(3));
        let places: Vec<Place> = g.ops.iter().map(|op| op.place).collect();
        assert_eq!(
            places,
            [
                Place::Group(0),
                Place::Group(0),
                Place::Group(1),
                Place::Actor(1, 1)
            ]
        );
        match &g.ops[1].kind {
            OpKind::Collective {
                spec,
                op,
                root,
                args,
                stage,
                ..
            } => {
                assert_eq!(spec.name, "allreduce");
                assert_eq!(op.as_ref().map(|o| o.name), Some("Avg"));
                assert!(root.is_none());
                assert_eq!(args, &[h]);
                assert_eq!(*stage, 0);
            }
            _ => unreachable!("op 1 is the collective"),
        }
        match &g.ops[0].kind {
            OpKind::Call {
                call,
                method,
                receiver,
                args,
                ..
            } => {
                assert_eq!((*call, method.to_string()), (0, "fwd".to_string()));
                assert_eq!(receiver, "a");
                assert_eq!(args, &[x]);
            }
            _ => unreachable!("op 0 is a call"),
        }
        match &g.ops[3].kind {
            OpKind::Call { call, receiver, .. } => {
                assert_eq!((*call, receiver.as_str()), (2, "b[1]"));
            }
            _ => unreachable!("op 3 is a call"),
        }

        assert_eq!(g.output.parts, [y, t]);
        assert!(g.output.tuple);
        // The input is checked once as an input, each output part once as `Send`.
        let checks: Vec<bool> = g
            .checks
            .iter()
            .map(|c| matches!(c.kind, CheckKind::Input))
            .collect();
        assert_eq!(checks, [true, false, false]);
        assert!(g.checks[1..]
            .iter()
            .all(|c| matches!(c.kind, CheckKind::Send)));
    });
}

#[test]
fn a_pipeline_schedules_one_edge_between_its_groups() {
    let pipe = quote! {
        Pipe(a: [Stage], b: [Stage; 2], x: f32) {
            let h = a.fwd(x);
            let s = allreduce(h, Avg);
            let y = b.fwd(s);
            let t = b[1].last(y);
            (y, t)
        }
    };
    lowered(pipe, |g, sched| {
        // `x` is an input (every actor has it) and `y` goes to an actor of its own group:
        // only `s` crosses, rank i of `a` to rank i of `b`.
        assert_eq!(sched.edges.len(), 1);
        let e = &sched.edges[0];
        assert_eq!(e.value, value(g, "s"));
        assert_eq!(
            (e.from, e.to, e.route),
            (Place::Group(0), Place::Group(1), Route::Zip)
        );
        assert_eq!(
            sched.landing.get(&(value(g, "s"), Place::Group(1))),
            Some(&0)
        );

        use Item::{Op, Recv, Send};
        assert_eq!(sched.items, [Op(0), Op(1), Send(0), Recv(0), Op(2), Op(3)]);
        let a: Vec<Item> = sched.of_group(g, 0).collect();
        let b: Vec<Item> = sched.of_group(g, 1).collect();
        assert_eq!(a, [Op(0), Op(1), Send(0)]);
        assert_eq!(b, [Recv(0), Op(2), Op(3)]);
    });
}

#[test]
fn a_value_of_one_actor_fans_out_and_lands_once_per_place() {
    let fan = quote! {
        Fan(w: [W], v: [W]) {
            let r = w[0].root();
            let a = w.take(r);
            let b = v.take(r);
            let c = v[1].pick(a);
            let d = v.take(r);
            (b, c, d)
        }
    };
    lowered(fan, |g, sched| {
        assert_origins_consistent(g);
        let (r, a) = (value(g, "r"), value(g, "a"));
        let edges: Vec<(ValueId, Place, Place, Route)> = sched
            .edges
            .iter()
            .map(|e| (e.value, e.from, e.to, e.route))
            .collect();
        assert_eq!(
            edges,
            [
                // Rank 0 of `w` has `r` already; the others receive it.
                (
                    r,
                    Place::Actor(0, 0),
                    Place::Group(0),
                    Route::Fan {
                        from: 0,
                        skip_from: true
                    }
                ),
                (
                    r,
                    Place::Actor(0, 0),
                    Place::Group(1),
                    Route::Fan {
                        from: 0,
                        skip_from: false
                    }
                ),
                (
                    a,
                    Place::Group(0),
                    Place::Actor(1, 1),
                    Route::One { from: 1, to: 1 }
                ),
            ]
        );
        // `d` reads `r` where it has landed already: no second edge, no second receive.
        use Item::{Op, Recv, Send};
        assert_eq!(
            sched.items,
            [
                Op(0),
                Send(0),
                Send(1),
                Recv(0),
                Op(1),
                Send(2),
                Recv(1),
                Op(2),
                Recv(2),
                Op(3),
                Op(4)
            ]
        );
        let w: Vec<Item> = sched.of_group(g, 0).collect();
        let v: Vec<Item> = sched.of_group(g, 1).collect();
        assert_eq!(w, [Op(0), Send(0), Send(1), Recv(0), Op(1), Send(2)]);
        assert_eq!(v, [Recv(1), Op(2), Recv(2), Op(3), Op(4)]);
    });
}

#[test]
fn tuples_and_fields_record_the_op_that_made_each_part() {
    let tup = quote! {
        Tup(w: [W]) {
            let (p, q) = w.pair();
            let (g1, g2) = allreduce([p, q]);
            let t = (g1, q);
            let (m, n) = t;
            (m, g2, n)
        }
    };
    lowered(tup, |g, sched| {
        assert_origins_consistent(g);
        assert_eq!(
            kinds(g),
            ["call", "fields", "collective", "tuple", "fields"]
        );
        let [p, q, g1, g2, t, m, n] = ["p", "q", "g1", "g2", "t", "m", "n"].map(|x| value(g, x));
        // The call's result is a temporary, taken apart by a checked `Fields`.
        let pair = g.ops[0].outs[0];
        assert!(!g.values[pair].named);
        assert_eq!(g.values[pair].label, "w.pair(..)");
        match g.ops[1].kind {
            OpKind::Fields { src, check } => {
                assert_eq!(src, pair);
                let k = check.expect("a call's tuple type is checked");
                assert!(matches!(g.checks[k].kind, CheckKind::Fields(2)));
            }
            _ => unreachable!("op 1 takes the call's result apart"),
        }
        assert_eq!(g.ops[1].outs, [p, q]);
        // One fused stage for both values.
        assert_eq!(g.ops[2].outs, [g1, g2]);
        assert_eq!(g.groups[0].stages, ["allreduce([p, q])"]);
        match &g.ops[3].kind {
            OpKind::Tuple { parts } => assert_eq!(parts, &[g1, q]),
            _ => unreachable!("op 3 packs `t`"),
        }
        assert_eq!(g.values[t].made_by(), Some(3));
        // A tuple the graph built is taken apart by its known parts: nothing to check.
        match g.ops[4].kind {
            OpKind::Fields { src, check } => assert_eq!((src, check), (t, None)),
            _ => unreachable!("op 4 takes `t` apart"),
        }
        assert_eq!(g.ops[4].outs, [m, n]);
        assert!(g.ops.iter().all(|op| op.place == Place::Group(0)));
        assert_eq!(g.output.parts, [m, g2, n]);
        // One group: nothing crosses, and its actors run every op in program order.
        assert!(sched.edges.is_empty());
        let items: Vec<Item> = sched.of_group(g, 0).collect();
        assert_eq!(items, (0..5).map(Item::Op).collect::<Vec<_>>());
    });
}

#[test]
fn a_graph_input_in_a_collective_is_reported() {
    let e = errors(quote! {
        G(w: [W], x: f32) {
            let s = allreduce(x);
            s
        }
    });
    assert_eq!(
        e,
        ["`x` is a graph input, the same on every actor; `allreduce` takes per-actor values (results of method calls)"]
    );
}

#[test]
fn a_tuple_of_graph_inputs_is_reported() {
    let e = errors(quote! {
        G(w: [W], x: f32, y: f32) {
            let t = (x, y);
            w.f(t)
        }
    });
    assert_eq!(
        e,
        ["a tuple of graph inputs is not a per-actor value; make it one input of the graph"]
    );
}

#[test]
fn an_index_out_of_range_is_reported() {
    let e = errors(quote! {
        G(w: [W; 2]) {
            w[2].f()
        }
    });
    assert_eq!(
        e,
        ["actor index 2 is out of range: group `w` has 2 actors (ranks 0..2)"]
    );
}

#[test]
fn a_use_before_definition_is_reported_with_the_definition() {
    let e = errors(quote! {
        G(w: [W]) {
            let a = w.f(b);
            let b = w.g();
            a
        }
    });
    assert_eq!(
        e,
        [
            "`b` is used before it is defined; a graph runs in the order it is written, so a value can only use values defined above it (and the graph cannot have a cycle)",
            "`b` is defined here",
        ]
    );
}

#[test]
fn every_error_is_reported_not_just_the_first() {
    let e = errors(quote! {
        G(w: [W], r: usize) {
            let a = broadcast(w.f(), r);
            let b = allreduce(w.g(), ReduceOp::Mean);
            (a, b)
        }
    });
    assert_eq!(
        e,
        [
            "the root of `broadcast` is a rank, written as an integer literal such as `0`, not `r`",
            "unknown reduce op `ReduceOp::Mean`; expected one of `Sum`, `Prod`, `Min`, `Max`, `Avg`",
        ]
    );
}

#[test]
fn values_without_their_brackets_are_reported_as_one_list() {
    let e = errors(quote! {
        G(w: [W], r: usize) {
            let g = w.g();
            let l = w.l();
            let a = allreduce(g, l, Avg);
            let b = allgather(g, w.f());
            let c = broadcast(g, l, 0);
            let d = reduce([g], l, Sum, 0);
            let s = reducescatter(g, later);
            let t = allreduce(g, lx, Avg);
            let u = allreduce(g, r);
            let later = w.h();
            (a, b, c, d, s, t, u, later)
        }
    });
    let list = |call: &str, written: &str| {
        format!("`{call}` takes one value or one list of values; several values are written in brackets: `{written}`")
    };
    assert_eq!(
        e,
        [
            list("allreduce", "allreduce([g, l], Avg)"),
            list("allgather", "allgather([g, w.f()])"),
            list("broadcast", "broadcast([g, l], 0)"),
            list("reduce", "reduce([g, l], Sum, 0)"),
            list("reducescatter", "reducescatter([g, later])"),
            // A name the graph does not know, in an argument too many.
            list("allreduce", "allreduce([g, lx], Avg)"),
            // A graph input where the reduce op goes is read as one.
            "unknown reduce op `r`; expected one of `Sum`, `Prod`, `Min`, `Max`, `Avg`".into(),
        ]
    );
}

#[test]
fn a_graph_without_a_group_is_reported() {
    let e = errors(quote! {
        G(x: f32) {
            x
        }
    });
    assert_eq!(
        e,
        [
            "`x` is a graph input; a graph's output is made of per-actor values",
            "a graph needs at least one actor group parameter, e.g. `workers: [Worker]`",
        ]
    );
}

#[test]
fn a_per_rank_input_goes_to_the_one_group_that_reads_it() {
    lowered(
        quote! {
            G(w: [W], h: [H], batch: PerRank<u32>, lr: f32) {
                let a = w.f(batch, lr);
                let b = h.g(lr);
                (a, b)
            }
        },
        |g, _| {
            assert!(g.inputs[0].per_rank && !g.inputs[1].per_rank);
            assert_eq!(g.inputs[0].text, "PerRank<u32>");
            let w = super::plan::GroupPlan::new(g, 0);
            let h = super::plan::GroupPlan::new(g, 1);
            assert_eq!((w.inputs, w.own), (vec![1], vec![0]));
            assert_eq!((h.inputs, h.own), (vec![1], vec![]));
            assert!(matches!(g.checks[0].kind, CheckKind::RankInput));
        },
    );
}

#[test]
fn a_per_rank_input_read_by_two_groups_is_reported() {
    let errs = errors(quote! {
        G(w: [W], h: [H], batch: PerRank<u32>) {
            let a = w.f(batch);
            let b = h.g(batch);
            (a, b)
        }
    });
    assert_eq!(
        errs,
        ["per-rank input `batch` is split over the ranks of group `w`, so group `h` cannot read it too; give `h` an input of its own"]
    );
}

#[test]
fn one_ranks_value_gather_and_scatter_are_edges_of_their_own() {
    lowered(
        quote! {
            G(w: [W], c: [C; 1], x: f32) {
                let l = w.loss(x);
                let m = c[0].record(gather(l));
                let h = c.see(l[2]);
                let s = c[0].split(x);
                let y = w.take(scatter(s));
                (y, m, h)
            }
        },
        |g, sched| {
            let picked = g.values[value(g, "h")].made_by().unwrap();
            let OpKind::Call { args, .. } = &g.ops[picked].kind else {
                panic!("`h` is a call");
            };
            // `l[2]` is a value of worker 2.
            assert_eq!(g.values[args[0]].place(), Some(Place::Actor(0, 2)));
            assert_eq!(g.values[args[0]].label, "l[2]");
            assert_eq!(
                g.groups[0].indices.iter().map(|i| i.0).collect::<Vec<_>>(),
                [2]
            );
            let routes: Vec<Route> = sched.edges.iter().map(|e| e.route).collect();
            assert_eq!(
                routes,
                [
                    Route::Gather { to: 0, keep: false },
                    Route::Fan {
                        from: 2,
                        skip_from: false
                    },
                    Route::Scatter {
                        from: 0,
                        keep: false
                    }
                ]
            );
            // The scatter sends `s` and delivers its items.
            let scatter = &sched.edges[2];
            assert_eq!(scatter.sent, value(g, "s"));
            assert_ne!(scatter.value, scatter.sent);
            // Each is received right before the op that reads it, sent right after `l` / `s`.
            let items: Vec<Item> = sched.of_group(g, 1).collect();
            let pos = |it: Item| items.iter().position(|&i| i == it).unwrap();
            assert!(pos(Item::Recv(0)) < pos(Item::Op(sched_op(g, "m"))));
            assert!(pos(Item::Send(2)) > pos(Item::Op(sched_op(g, "s"))));
        },
    );
}

/// The op that made the value named `name`.
fn sched_op(g: &Graph, name: &str) -> usize {
    g.values[value(g, name)].made_by().unwrap()
}

#[test]
fn misplaced_indices_gathers_and_scatters_are_reported() {
    let errs = errors(quote! {
        G(w: [W; 2], c: [C], x: f32) {
            let l = w.loss(x);
            let a = c.see(l[2]);
            let b = w.all(gather(l));
            let d = c.see(scatter(l));
            (a, b, d)
        }
    });
    assert_eq!(
        errs,
        [
            "actor index 2 is out of range: group `w` has 2 actors (ranks 0..2)",
            "every actor of `w` reading every rank's value of `w` is an allgather: `allgather(l)`; `gather` brings the values to one actor, `w[0].method(gather(l))`, or to another group",
            "`l` is a per-actor value of `w`: `scatter` splits a value of one actor, such as `w[0].load(..)`",
        ]
    );
}

#[test]
fn a_value_of_one_actor_past_a_fixed_size_output_is_reported() {
    let errs = errors(quote! {
        G(w: [W; 2], c: [C; 4]) {
            let l = w.loss();
            let a = c[1].loss();
            let b = c[2].loss();
            (l, a, b)
        }
    });
    assert_eq!(
        errs,
        ["`b` would be `Some` at rank 2, but this output has one entry per actor of group `w`, which has 2"]
    );
}

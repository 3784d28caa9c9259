//! The graph as Graphviz DOT, built at compile time (the generated `to_dot` returns it):
//! one cluster per actor group holding its method calls and fused stages (one node per
//! stage, however many values it fuses), the graph inputs, the output, and an edge per
//! value read. Values that cross between actors are bold and name the ranks they connect.

use std::collections::HashSet;

use super::ir::{Graph, OpKind, Origin, Place, ValueId};
use super::schedule::{Route, Schedule};
use crate::diag::tidy;

const CROSS: &str = "#c0392b";

pub(crate) fn to_dot(g: &Graph, sched: &Schedule) -> String {
    let mut d = Dot {
        g,
        out: String::new(),
        seen: HashSet::new(),
    };
    d.write(sched);
    d.out
}

struct Dot<'a> {
    g: &'a Graph<'a>,
    out: String,
    /// Edges written so far, to write each once.
    seen: HashSet<(String, String, String)>,
}

impl Dot<'_> {
    fn line(&mut self, indent: usize, text: &str) {
        for _ in 0..indent {
            self.out.push_str("  ");
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    fn write(&mut self, sched: &Schedule) {
        let g = self.g;
        let name = g.def.name.to_string();
        self.line(0, &format!("digraph {} {{", quoted(&name)));
        self.line(
            1,
            &format!(
                "graph [rankdir=LR, fontname=\"Helvetica\", fontsize=12, label={}, labelloc=t, nodesep=0.3];",
                quoted(&name)
            ),
        );
        self.line(
            1,
            "node [fontname=\"Helvetica\", fontsize=10, shape=box, style=\"rounded,filled\", fillcolor=white];",
        );
        self.line(1, "edge [fontname=\"Helvetica\", fontsize=9];");
        for inp in &g.inputs {
            let ty = &inp.text;
            let label = format!("{}: {ty}", inp.name);
            self.line(
                1,
                &format!(
                    "in_{} [label={}, shape=ellipse, fillcolor=\"#e8f5e9\"];",
                    inp.name,
                    quoted(&label)
                ),
            );
        }
        for (gi, decl) in g.groups.iter().enumerate() {
            let actor = &decl.actor_text;
            let size = match &decl.size {
                Some((len, _)) => format!("; {}", tidy(len)),
                None => String::new(),
            };
            self.line(1, &format!("subgraph cluster_{} {{", decl.name));
            self.line(
                2,
                &format!(
                    "label={}; style=\"rounded,filled\"; fillcolor=\"#eef3fa\"; color=\"#8fa8c8\";",
                    quoted(&format!("{}: [{actor}{size}]", decl.name))
                ),
            );
            for (i, op) in g.ops.iter().enumerate() {
                if op.group() != gi {
                    continue;
                }
                let node = match &op.kind {
                    OpKind::Call {
                        method, receiver, ..
                    } => {
                        let label = match op.place {
                            Place::Actor(..) => format!("{receiver}.{method}"),
                            _ => method.to_string(),
                        };
                        format!("op{i} [label={}];", quoted(&label))
                    }
                    OpKind::Collective { stage, args, .. } => {
                        let values = match args.len() {
                            1 => "1 value".to_string(),
                            n => format!("{n} values"),
                        };
                        let label = format!("{}\\nfused stage, {values}", decl.stages[*stage]);
                        format!(
                            "op{i} [label={}, shape=box3d, style=filled, fillcolor=\"#ffe8b0\"];",
                            quoted_raw(&label)
                        )
                    }
                    // Tuple plumbing is not a node: its values' producers connect directly.
                    // Nor is picking one rank's value or gathering them: the edges say it.
                    OpKind::Tuple { .. }
                    | OpKind::Fields { .. }
                    | OpKind::Pick { .. }
                    | OpKind::Gather { .. }
                    | OpKind::Scatter { .. } => continue,
                };
                self.line(2, &node);
            }
            self.line(1, "}");
        }
        self.line(
            1,
            "out [label=\"output\", shape=doubleoctagon, fillcolor=\"#f3e5f5\"];",
        );
        for (i, op) in g.ops.iter().enumerate() {
            let reads: &[ValueId] = match &op.kind {
                OpKind::Call { args, .. } | OpKind::Collective { args, .. } => args,
                _ => continue,
            };
            for &v in reads {
                let gathered = g.values[v].made_by().and_then(|o| sched.carried.get(&o));
                let cross = sched
                    .landing
                    .get(&(v, op.place))
                    .or(gathered)
                    .map(|&e| sched.edges[e].route);
                self.edges_from(v, &format!("op{i}"), cross);
            }
        }
        for &v in &g.output.parts {
            self.edges_from(v, "out", None);
        }
        self.line(0, "}");
    }

    /// The nodes a value comes from (through tuple plumbing).
    fn producers(&self, v: ValueId, into: &mut Vec<String>) {
        let g = self.g;
        let i = match g.values[v].origin {
            Origin::Input(k) => return into.push(format!("in_{}", g.inputs[k].name)),
            Origin::Op { op, .. } => op,
        };
        match &g.ops[i].kind {
            OpKind::Tuple { parts } => parts.iter().for_each(|&p| self.producers(p, into)),
            OpKind::Fields { src, .. }
            | OpKind::Pick { src }
            | OpKind::Gather { src, .. }
            | OpKind::Scatter { src, .. } => self.producers(*src, into),
            _ => into.push(format!("op{i}")),
        }
    }

    /// An edge from each producer of `v` to node `to`; bold, with the ranks it connects,
    /// when `v` crosses between actors along `cross`.
    fn edges_from(&mut self, v: ValueId, to: &str, cross: Option<Route>) {
        let mut from = Vec::new();
        self.producers(v, &mut from);
        let value = &self.g.values[v].label;
        let (label, style) = match cross {
            None => (value.clone(), String::new()),
            Some(route) => {
                let ranks = match route {
                    Route::Zip => "rank i → i".to_string(),
                    Route::Fan { from, skip_from } => {
                        let to = if skip_from { "the others" } else { "all" };
                        format!("rank {from} → {to}")
                    }
                    Route::One { from, to } => format!("rank {from} → {to}"),
                    Route::Gather { to, .. } => format!("gather: every rank → {to}"),
                    Route::GatherAll => "gather: every rank → all".to_string(),
                    Route::Scatter { from, .. } => format!("scatter: rank {from} → each"),
                };
                (
                    format!("{value} ({ranks})"),
                    format!(", style=bold, color=\"{CROSS}\", fontcolor=\"{CROSS}\""),
                )
            }
        };
        for f in from {
            if self.seen.insert((f.clone(), to.to_string(), label.clone())) {
                let line = format!("{f} -> {to} [label={}{style}];", quoted(&label));
                self.line(1, &line);
            }
        }
    }
}

/// A DOT string literal.
fn quoted(s: &str) -> String {
    quoted_raw(&s.replace('\\', "\\\\"))
}

/// A DOT string literal of text that may hold DOT escapes (`\n`) already.
fn quoted_raw(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

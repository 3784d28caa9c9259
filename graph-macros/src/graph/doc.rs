//! The docs of a graph's generated items that depend on the graph: what one rank's output
//! holds, in terms of the user's methods, inputs and collectives. rustdoc shows the output's
//! type only as the projection the graph spells it with (the macro sees no types, see
//! `types`), so these words are what tells a reader which value is where.

use super::ir::{Graph, OpKind, Origin, Place, ValueId};

/// One rank's output: `(a, b)` for a tuple, each part as `value` says, and a part that only
/// one actor makes marked as such.
pub(crate) fn output(g: &Graph) -> String {
    let parts: Vec<String> = g
        .output
        .parts
        .iter()
        .map(|&v| match g.values[v].place() {
            Some(Place::Actor(group, rank)) => format!(
                "{} (`Some` in the entry of `{}[{rank}]` only)",
                value(g, v),
                g.groups[group].name
            ),
            _ => value(g, v),
        })
        .collect();
    if g.output.tuple {
        format!("({})", parts.join(", "))
    } else {
        parts.concat()
    }
}

/// Where value `v` comes from, in the user's words: "`comp1`'s output", "the `allreduce`
/// of `comp1`'s output", "input `x`".
fn value(g: &Graph, v: ValueId) -> String {
    let op = match g.values[v].origin {
        Origin::Input(i) => return format!("input `{}`", g.inputs[i].name),
        Origin::Op { op, .. } => &g.ops[op],
    };
    let nth = op.outs.iter().position(|&o| o == v).unwrap_or(0);
    match &op.kind {
        OpKind::Call {
            method, receiver, ..
        } => match op.place {
            Place::Group(_) => format!("`{method}`'s output"),
            Place::Actor(..) => format!("`{receiver}.{method}`'s output"),
        },
        OpKind::Collective {
            spec,
            op: name,
            args,
            ..
        } => {
            let of = args.get(nth).map_or_else(String::new, |&a| value(g, a));
            match name {
                Some(name) => format!("the `{}` (`{}`) of {of}", spec.name, name.name),
                None => format!("the `{}` of {of}", spec.name),
            }
        }
        OpKind::Tuple { parts } => {
            let parts: Vec<String> = parts.iter().map(|&p| value(g, p)).collect();
            format!("({})", parts.join(", "))
        }
        OpKind::Pick { src } => match op.place {
            Place::Actor(group, rank) => {
                format!("{} on `{}[{rank}]`", value(g, *src), g.groups[group].name)
            }
            Place::Group(_) => value(g, *src),
        },
        OpKind::Gather { src, .. } => {
            format!("every rank's {}, in rank order", value(g, *src))
        }
        OpKind::Scatter { src, .. } => format!("this rank's part of {}", value(g, *src)),
        OpKind::Fields { src, .. } => format!("field {nth} of {}", value(g, *src)),
    }
}

//! The collectives `graph!` knows, described as data: adding one is a row here and an arm
//! in the runtime's `Collective`.

use proc_macro2::Span;

/// How a collective is written and what it takes.
pub(crate) struct CollectiveSpec {
    pub(crate) name: &'static str,
    /// Whether it takes a reduce op as its second argument (`Sum` when omitted).
    pub(crate) takes_op: bool,
}

pub(crate) const COLLECTIVES: &[CollectiveSpec] = &[CollectiveSpec {
    name: "allreduce",
    takes_op: true,
}];

pub(crate) const REDUCE_OPS: &[&str] = &["Sum", "Prod", "Min", "Max", "Avg"];

pub(crate) fn find(name: &str) -> Option<&'static CollectiveSpec> {
    COLLECTIVES.iter().find(|c| c.name == name)
}

pub(crate) fn names() -> String {
    COLLECTIVES
        .iter()
        .map(|c| format!("`{}`", c.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A reduce op as written by the user (`Avg` or `ReduceOp::Avg`).
#[derive(Clone)]
pub(crate) struct OpName {
    pub(crate) name: &'static str,
    pub(crate) span: Span,
}

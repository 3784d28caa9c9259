//! The collectives `graph!` knows, described as data: adding one is a row here, an arm in
//! codegen's `collective_expr`, and an arm in the runtime's `Collective`.

use proc_macro2::Span;

use crate::diag::code_list;

/// How a collective is written and what it makes of its values.
pub(crate) struct CollectiveSpec {
    pub(crate) name: &'static str,
    /// What it does to its values, for messages: "nothing to {verb}".
    pub(crate) verb: &'static str,
    /// Its arguments after the value or list of values, in order.
    pub(crate) params: &'static [Param],
    /// The type each value becomes, and the runtime methods that move it.
    pub(crate) kind: Kind,
    /// How it is written, for messages.
    pub(crate) usage: &'static str,
}

/// An argument after the values.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Param {
    /// A reduce op (`Sum`, `ReduceOp::Avg`, ..); `Sum` when omitted unless required.
    Op { required: bool },
    /// The root rank: an integer literal, required.
    Root,
}

/// What a collective makes of each value `T`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A `T` in place of the value (`Bucketable`).
    InPlace,
    /// `<T as Gather>::Gathered`.
    Gather,
    /// A `T` holding this rank's part (`Scatter`).
    Scatter,
    /// `Option<T>`: `Some` on the root only (`Bucketable`).
    Rooted,
}

pub(crate) const COLLECTIVES: &[CollectiveSpec] = &[
    CollectiveSpec {
        name: "allreduce",
        verb: "reduce",
        params: &[Param::Op { required: false }],
        kind: Kind::InPlace,
        usage: "`allreduce(x)`, `allreduce(x, Avg)` or `allreduce([a, b], Avg)`",
    },
    CollectiveSpec {
        name: "allgather",
        verb: "gather",
        params: &[],
        kind: Kind::Gather,
        usage: "`allgather(x)` or `allgather([a, b])`",
    },
    CollectiveSpec {
        name: "reducescatter",
        verb: "scatter",
        params: &[Param::Op { required: false }],
        kind: Kind::Scatter,
        usage: "`reducescatter(x)`, `reducescatter(x, Avg)` or `reducescatter([a, b], Avg)`",
    },
    CollectiveSpec {
        name: "broadcast",
        verb: "broadcast",
        params: &[Param::Root],
        kind: Kind::InPlace,
        usage: "`broadcast(x, 0)` or `broadcast([a, b], 0)`, with the root rank as an integer literal",
    },
    CollectiveSpec {
        name: "reduce",
        verb: "reduce",
        params: &[Param::Op { required: true }, Param::Root],
        kind: Kind::Rooted,
        usage: "`reduce(x, Sum, 0)` or `reduce([a, b], Sum, 0)`, with the root rank as an integer literal",
    },
];

pub(crate) const REDUCE_OPS: &[&str] = &["Sum", "Prod", "Min", "Max", "Avg"];

impl CollectiveSpec {
    pub(crate) fn takes_op(&self) -> bool {
        self.params.iter().any(|p| matches!(p, Param::Op { .. }))
    }
}

pub(crate) fn find(name: &str) -> Option<&'static CollectiveSpec> {
    COLLECTIVES.iter().find(|c| c.name == name)
}

/// The collectives' names, for messages.
pub(crate) fn names() -> String {
    code_list(COLLECTIVES.iter().map(|c| c.name))
}

/// The reduce ops' names, for messages.
pub(crate) fn reduce_op_names() -> String {
    code_list(REDUCE_OPS.iter().copied())
}

/// A reduce op as written by the user (`Avg` or `ReduceOp::Avg`).
#[derive(Clone)]
pub(crate) struct OpName {
    pub(crate) name: &'static str,
    pub(crate) span: Span,
}

/// A root rank as written by the user.
#[derive(Clone)]
pub(crate) struct Root {
    pub(crate) rank: usize,
    pub(crate) span: Span,
}

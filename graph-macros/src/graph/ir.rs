//! The IR of one graph: values (each living on a group, on one actor of a group, or being a
//! graph input) and ops (calls, collectives, tuple plumbing) in program order, keyed by
//! index. `lower` builds it from the parsed graph, `schedule` orders it per actor, and
//! codegen turns it into code. Nothing here is checked or rendered: it is the model only.
//!
//! Program order is a topological order of the dataflow graph (see `lower`): the schedule
//! relies on it.

use proc_macro2::{Ident, Span, TokenStream};

use super::ops::{CollectiveSpec, OpName, Root};
use super::parse::GraphDef;

pub(crate) type ValueId = usize;
pub(crate) type OpId = usize;

pub(crate) struct Graph<'a> {
    pub(crate) def: &'a GraphDef,
    pub(crate) groups: Vec<GroupDecl>,
    pub(crate) inputs: Vec<InputDecl>,
    pub(crate) values: Vec<Value>,
    pub(crate) ops: Vec<Op>,
    pub(crate) output: Output,
    /// Value types checked in a constant of the graph (`Checked<K>`, see codegen).
    pub(crate) checks: Vec<Check>,
    /// The second parameter of the graph's `Checked` impls (see `types::checked_type`).
    pub(crate) privacy: TokenStream,
}

/// A value type that must satisfy a bound, checked once, at the user's `at`.
pub(crate) struct Check {
    pub(crate) ty: TokenStream,
    pub(crate) at: Span,
    pub(crate) kind: CheckKind,
}

pub(crate) enum CheckKind {
    /// An `allgather` takes it: `Gather`.
    Gather,
    /// It leaves its actor's thread (an output, a value sent to other actors): `Send`.
    Send,
    /// A graph input, cloned for every actor that reads it: `Clone + Send + 'static`.
    Input,
    /// A per-rank input's element, moved to its actor's thread: `Send + 'static`.
    RankInput,
    /// `scatter` splits it over a group: `Split` (a `Vec`).
    Split,
    /// `let (a, b, ..) = ` takes it apart: a tuple of that many fields.
    Fields(usize),
}

pub(crate) struct GroupDecl {
    pub(crate) name: Ident,
    pub(crate) actor: syn::Type,
    /// The actor type as written, for messages and the picture.
    pub(crate) actor_text: String,
    /// The size of a fixed-size group (`[Worker; 2]`): its expression, and its value when
    /// that is an integer literal.
    pub(crate) size: Option<(syn::Expr, Option<usize>)>,
    /// The actor indices the graph uses (`workers[1]`), each once, with its first span;
    /// checked against the group's size at launch (or at compile time when it is known).
    pub(crate) indices: Vec<(usize, Span)>,
    /// The number of collective stages this group runs, and their names.
    pub(crate) stages: Vec<String>,
    /// The rooted stages' names and roots, checked against the group's size at launch.
    pub(crate) roots: Vec<(String, usize)>,
}

pub(crate) struct InputDecl {
    pub(crate) name: Ident,
    /// The type `execute` takes (a `Vec` of the elements of a per-rank input).
    pub(crate) ty: TokenStream,
    /// What an actor gets, checked to be a valid input (`Clone + Send + 'static`; a
    /// per-rank input's element, `Send + 'static`).
    pub(crate) checked: TokenStream,
    /// The type as written, for the picture.
    pub(crate) text: String,
    /// A per-rank input (`PerRank<T>`): rank k of the one group that reads it gets the
    /// k-th value, moved.
    pub(crate) per_rank: bool,
}

/// Where an op runs, and so where the values it makes live: always on the actors of a
/// group. A graph input has no place (every actor reads it, see `Origin`), so an op cannot
/// be placed on one: there is no such `Place`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Place {
    /// Every actor of the group: a per-actor value, one on each.
    Group(usize),
    /// One actor, `group[index]`, only.
    Actor(usize, usize),
}

impl Place {
    /// The group whose actors it names.
    pub(crate) fn group(self) -> usize {
        match self {
            Place::Group(g) | Place::Actor(g, _) => g,
        }
    }
}

/// Where a value comes from: recorded once, when lowering makes the value, and read by
/// every later stage.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Origin {
    /// Graph input `i` (`Graph::inputs[i]`), the same on every actor.
    Input(usize),
    /// An output of op `op`, living where the op runs (`place` is `ops[op].place`).
    Op { op: OpId, place: Place },
}

pub(crate) struct Value {
    /// The local variable that holds it in the generated step.
    pub(crate) ident: Ident,
    /// Whether `ident` is the user's name (else a generated temporary).
    pub(crate) named: bool,
    /// How the user wrote it: its name, or the expression that made it.
    pub(crate) label: String,
    pub(crate) origin: Origin,
    /// Its type on an actor that holds it (a single-actor value is an `Option` of it in
    /// the generated step, `Some` on its actor).
    pub(crate) ty: TokenStream,
}

impl Value {
    /// Where it lives; `None` for a graph input, which every actor reads.
    pub(crate) fn place(&self) -> Option<Place> {
        match self.origin {
            Origin::Input(_) => None,
            Origin::Op { place, .. } => Some(place),
        }
    }

    /// The op that made it; `None` for a graph input.
    pub(crate) fn made_by(&self) -> Option<OpId> {
        match self.origin {
            Origin::Input(_) => None,
            Origin::Op { op, .. } => Some(op),
        }
    }

    pub(crate) fn is_input(&self) -> bool {
        matches!(self.origin, Origin::Input(_))
    }
}

pub(crate) struct Op {
    pub(crate) place: Place,
    pub(crate) kind: OpKind,
    /// The values it makes, each with `Origin::Op` naming this op.
    pub(crate) outs: Vec<ValueId>,
}

impl Op {
    pub(crate) fn group(&self) -> usize {
        self.place.group()
    }
}

pub(crate) enum OpKind {
    Call {
        /// The graph's `MethodCall` index of this call.
        call: usize,
        method: Ident,
        /// How the receiver is written: `workers` or `workers[0]`.
        receiver: String,
        args: Vec<ValueId>,
        /// The user's expression for each argument, for error spans.
        arg_spans: Vec<Span>,
        /// The user's `(..)` around the arguments.
        parens: Span,
    },
    Collective {
        spec: &'static CollectiveSpec,
        op: Option<OpName>,
        root: Option<Root>,
        args: Vec<ValueId>,
        /// The user's expression for each argument, for error spans.
        arg_spans: Vec<Span>,
        /// For an `allgather`, the check of each argument's type (`Checked<K>`).
        checks: Vec<usize>,
        stage: usize,
        span: Span,
    },
    /// `outs[0] = (parts..)`
    Tuple { parts: Vec<ValueId> },
    /// `outs[0] = src[k]`: one rank's value of a per-actor value (`losses[k]`), at
    /// `Place::Actor(group, k)`.
    Pick { src: ValueId },
    /// `outs[0] = gather(src)`: every rank's value of per-actor value `src`, in rank
    /// order (a `Vec`), on the one actor where the op runs: the call that reads it.
    Gather { src: ValueId, span: Span },
    /// `outs[0] = scatter(src)`: the k-th value of `src` (a `Vec` on one actor, its type
    /// checked `Split` by `check`), on rank k of the group where the op runs.
    Scatter {
        src: ValueId,
        span: Span,
        check: usize,
    },
    /// `outs = src.0, src.1, ..` (destructuring), `src`'s type checked by `check`, unless
    /// it is a tuple the graph built.
    Fields { src: ValueId, check: Option<usize> },
}

pub(crate) struct Output {
    pub(crate) parts: Vec<ValueId>,
    /// Each part's type, checked `Send` (it goes back to the caller's thread).
    pub(crate) tys: Vec<TokenStream>,
    pub(crate) tuple: bool,
}

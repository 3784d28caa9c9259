//! The runtime of actorgraph: tensors, actor threads, communicators and fused stages.
//!
//! Users reach it through the `actorgraph` facade; the code that `graph!` generates uses
//! the `#[doc(hidden)]` [`__private`] module.
#![warn(missing_docs)]

mod bucket;
pub mod comm;
mod element;
mod error;
mod exec;
#[cfg(feature = "nccl")]
mod gpu;
mod interop;
mod method;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;
mod sync;
mod tensor;
pub mod threads;
mod trace;
pub mod travel;

pub use bucket::{Bucketable, Gather, GatherList, Hand, Layout, Parts, Reduced, Scatter};
pub use comm::{Backend, Communicator, Cpu, ReduceOp};
pub use element::{DType, Element};
pub use error::{BoxError, Error, RemoteError};
pub use exec::{Actors, Ctx, LaunchOptions, Ticket, TEARDOWN_GRACE};
pub use tensor::Tensor;

/// The `half` crate, whose `f16` and `bf16` are element types.
pub use half;

/// The `ndarray` crate (feature `ndarray`), whose arrays go through collectives.
#[cfg(feature = "ndarray")]
pub use ndarray;

/// The `candle-core` crate (feature `candle`), whose CPU tensors go through collectives.
#[cfg(feature = "candle")]
pub use candle_core;

// The items of `__private` that compiler messages about a user's graph can name (an
// unknown method, a type that is not an actor, an unmet bound) are also here, hidden, so
// that rustc writes them `actorgraph::MethodCall` rather than through `__private`.
#[doc(hidden)]
pub use __private::{
    clone_value, destructures, gatherable, input, method_index, rank_input, sendable, splittable,
    Actor, Checked, EdgeValue, Fallible, Fields, FusedStage, Input, Method, MethodCall, MethodId,
    RankInput, Sendable, Signature, Split, Stage, StepCtx, TupleField, Valid,
};

/// Items the generated code uses. Not a public API: it changes without notice.
#[doc(hidden)]
pub mod __private {
    pub use crate::bucket::{FusedStage, SlotIdx};
    pub use crate::comm::{Backend, Collective, Communicator, GraphInfo, Progress, ReduceOp};
    pub use crate::exec::Ctx;
    pub use crate::exec::GroupSpec;
    pub use crate::exec::{
        group_sizes, Actors, Deal, Done, Driven, Driver, Edge, EdgeValue, Elements, GraphDriver,
        Group, LaunchOptions, Links, PerRankValues, RankInputs, Route, Stage, Started, StepCtx,
        StepFn, SyncPoint, Ticket,
    };
    pub use crate::method::{
        checked, destructures, gatherable, input, method_index, rank_input, sendable, splittable,
        Actor, Checked, Fallible, Fields, Input, Method, MethodCall, MethodId, MethodInfo,
        RankInput, Sendable, Signature, Split, Valid,
    };
    pub use crate::travel::{NoTravel, Probe, ViaSerde, ViaTravel};
    pub use crate::{
        BoxError, Bucketable, Error, Gather, GatherList, Hand, Layout, Parts, Reduced, Scatter,
    };
    pub use std::convert::From;
    pub use std::default::Default;
    pub use std::marker::PhantomData;
    pub use std::option::Option;
    pub use std::result::Result;
    pub use std::string::String;
    pub use std::sync::Arc;
    pub use std::time::Duration;
    pub use std::vec::Vec;

    /// Starts a launch: asks `backend` for the size of each group (see
    /// [`Backend::join`](crate::Backend::join)), one per group of the graph.
    pub fn join<B: Backend, const N: usize>(
        backend: &B,
        graph: &crate::comm::GraphInfo<'_>,
    ) -> Result<[usize; N], Error> {
        let sizes = backend.join(graph)?;
        let got = sizes.len();
        <[usize; N]>::try_from(sizes).map_err(|_| {
            Error::Backend(format!(
                "the backend gave {got} group sizes for the {N} groups of graph `{}`",
                graph.name
            ))
        })
    }

    /// Ends a launch: tells `backend` whether this process launched every group (see
    /// [`Backend::confirm`](crate::Backend::confirm)) and hands back the groups, or the
    /// error of this process or of another (then dropping the groups stops their threads).
    pub fn settle<B: Backend, T>(backend: &B, launched: Result<T, Error>) -> Result<T, Error> {
        backend.confirm(launched.as_ref().err())?;
        launched
    }

    /// Checks, at launch, that a rooted stage's root is a rank of its group. An empty group
    /// is reported as such: no root could be right, and the user's mistake is the group.
    pub fn check_root(
        group: &'static str,
        size: usize,
        stage: &'static str,
        root: usize,
    ) -> Result<(), Error> {
        if size == 0 {
            Err(Error::EmptyGroup { group })
        } else if root < size {
            Ok(())
        } else {
            Err(Error::RootOutOfRange {
                group,
                stage,
                root,
                size,
            })
        }
    }

    /// Checks, at launch, that an actor the graph addresses (`group[index]`) exists; an
    /// empty group is reported as such.
    pub fn check_index(group: &'static str, size: usize, index: usize) -> Result<(), Error> {
        if size == 0 {
            Err(Error::EmptyGroup { group })
        } else if index < size {
            Ok(())
        } else {
            Err(Error::IndexOutOfRange { group, index, size })
        }
    }

    /// Checks, at launch, that a group reading another group's per-actor value (actor i
    /// reads actor i's) has the same size.
    pub fn check_edge(
        value: &'static str,
        from: (&'static str, usize),
        to: (&'static str, usize),
    ) -> Result<(), Error> {
        if from.1 == to.1 {
            Ok(())
        } else {
            Err(Error::EdgeSizeMismatch {
                value,
                from: from.0,
                from_len: from.1,
                to: to.0,
                to_len: to.1,
            })
        }
    }

    /// Checks, at launch, that a value of one actor (`coord[0].f(..)`) in an output zipped
    /// by the ranks of group `group` has its rank there.
    pub fn check_output_rank(
        value: &'static str,
        rank: usize,
        group: &'static str,
        size: usize,
    ) -> Result<(), Error> {
        if rank < size {
            Ok(())
        } else {
            Err(Error::OutputRank {
                value,
                rank,
                group,
                size,
            })
        }
    }

    /// A value that several actors read, cloned for one of them.
    pub fn clone_value<T: EdgeValue>(value: &T) -> T {
        value.clone()
    }

    /// A fixed-size group's actors (`[Worker; N]`) as `teardown` hands them back: an array,
    /// as `launch` took them. A process that hosts only some of them (a graph over several
    /// processes) cannot fill one: that is an error, and `teardown_each` the way to get
    /// them back.
    pub fn fixed_group<A, const N: usize>(
        group: &'static str,
        actors: Vec<A>,
    ) -> Result<[A; N], Error> {
        let got = actors.len();
        <[A; N]>::try_from(actors).map_err(|_| {
            Error::Unsupported(format!(
                "group `{group}` has {N} actors and this process hosts {got} of them: \
                 `teardown` hands a fixed-size group back as an array only from a process \
                 that hosts all of it; `teardown_each` hands back each hosted actor"
            ))
        })
    }

    /// Checks, at launch, that a group of fixed size (`[Worker; N]`) got `N` actors.
    pub fn check_size(group: &'static str, expected: usize, got: usize) -> Result<(), Error> {
        if expected == got {
            Ok(())
        } else {
            Err(Error::GroupSize {
                group,
                expected,
                got,
            })
        }
    }

    /// Checks that groups whose values are zipped into one output have the same size.
    pub fn same_size(groups: &[(&'static str, usize)]) -> Result<(), Error> {
        let Some(&(first, first_len)) = groups.first() else {
            return Ok(());
        };
        match groups.iter().find(|&&(_, n)| n != first_len) {
            Some(&(second, second_len)) => Err(Error::GroupSizeMismatch {
                first,
                first_len,
                second,
                second_len,
            }),
            None => Ok(()),
        }
    }

    /// Destructuring a tuple-valued method output by position.
    pub trait TupleField<const I: usize> {
        /// The type of field `I`.
        type Type;
    }

    /// `Fields<N>` and `TupleField<I>` for the tuples of 1 to 24 fields (std's traits stop
    /// at 12, but a method that returns a model's gradients may return more). Each entry of the
    /// list is a field: the arity of the tuple it ends, its index, its type parameter.
    /// (Literal arities: rustc names a computed one by its path in error messages.)
    macro_rules! tuples {
        // Every prefix of the list: `[..]` holds the fields before `$i $t`.
        (@prefixes [$($done:tt)*] $n:literal $i:tt $t:ident $(, $($rest:tt)*)?) => {
            tuples!(@tuple $n [$($done)* $i $t]);
            tuples!(@prefixes [$($done)* $i $t] $($($rest)*)?);
        };
        (@prefixes [$($done:tt)*]) => {};
        // One tuple: its arity, and the type of each field.
        (@tuple $n:literal [$($i:tt $t:ident)*]) => {
            impl<$($t),*> Fields<$n> for ($($t,)*) {}
            tuples!(@fields [$($t)*] $($i $t)*);
        };
        (@fields $all:tt $($i:tt $t:ident)*) => {
            $(tuples!(@field $i $t $all);)*
        };
        (@field $i:tt $t:ident [$($all:ident)*]) => {
            impl<$($all),*> TupleField<$i> for ($($all,)*) {
                type Type = $t;
            }
        };
    }
    tuples!(@prefixes []
        1 0 A, 2 1 B, 3 2 C, 4 3 D, 5 4 E, 6 5 F, 7 6 G, 8 7 H, 9 8 I, 10 9 J, 11 10 K, 12 11 L,
        13 12 M, 14 13 N, 15 14 O, 16 15 P, 17 16 Q, 18 17 R, 19 18 S, 20 19 T, 21 20 U,
        22 21 V, 23 22 W, 24 23 X
    );
}

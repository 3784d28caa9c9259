//! How a failed stage reads to the user: the communicator's [`StageError`] becomes the
//! [`Error`] that names the group, the stage and the value as written in the graph. It
//! depends on no other file of `bucket`.

use crate::comm::{Call, Disagreement, StageError};
use crate::Error;

/// The error a failed stage reports: `stage` is its name and `rank` this rank;
/// `value_of(slot)` gives the position and name of the value that slot `slot` is a part
/// of.
pub(super) fn stage_error(
    e: StageError,
    group: &'static str,
    (stage, rank): (&'static str, usize),
    value_of: impl Fn(usize) -> (usize, &'static str),
) -> Error {
    match e {
        StageError::Comm(e) => e,
        StageError::Aborted => Error::Broken {
            group,
            reason: format!("the communicator was aborted during stage `{stage}`"),
        },
        StageError::Disagreed(Disagreement::Failed { rank: failed_rank }) => Error::Aborted {
            group,
            rank,
            failed_rank,
        },
        StageError::Disagreed(Disagreement::Calls { calls }) => Error::Broken {
            group,
            reason: format!(
                "in stage `{stage}`, the ranks made different calls into their \
                 communicator ({}), so their calls no longer pair up",
                fmt_calls(&calls)
            ),
        },
        StageError::Disagreed(Disagreement::BucketSize { counts }) => {
            Error::BucketMismatch { stage, counts }
        }
        StageError::Disagreed(Disagreement::Slot {
            slot,
            counts,
            shapes,
        }) => Error::ShapeMismatch {
            stage,
            value: value_of(slot).1,
            slot: value_of(slot).0,
            counts,
            shapes,
        },
        StageError::Disagreed(Disagreement::NotDivisible { slot, len, size }) => {
            Error::NotDivisible {
                stage,
                slot: value_of(slot).0,
                len,
                ranks: size,
            }
        }
        StageError::Disagreed(Disagreement::Root { root, size }) => Error::RootOutOfRange {
            group,
            stage,
            root,
            size,
        },
        StageError::Disagreed(Disagreement::Buffers { reason }) => {
            Error::Backend(format!("stage `{stage}`: {reason}"))
        }
    }
}

/// Each rank's call, for an error message.
fn fmt_calls(calls: &[Option<Call>]) -> String {
    let each = calls.iter().enumerate().map(|(rank, call)| match call {
        Some(call) => format!("rank {rank}: {call}"),
        None => format!("rank {rank}: none in this round"),
    });
    each.collect::<Vec<_>>().join(", ")
}

//! How a failed stage reads to the user: the communicator's [`StageError`] becomes the
//! [`Error`] that names the group, the stage and the value as written in the graph. It
//! depends on no other file of `bucket`.

use crate::comm::{Call, Disagreement, StageError};
use crate::Error;

/// What a slot of the stage is, as an error names it.
pub(super) struct SlotOf {
    /// The position of the value it is a part of.
    pub(super) value: usize,
    /// That value's name as written in the graph (empty when not known).
    pub(super) name: &'static str,
    /// The item of the value it belongs to, when the value is a list.
    pub(super) item: Option<usize>,
    /// Whether it holds a list's length rather than elements.
    pub(super) length: bool,
}

/// The error a failed stage reports: `stage` is its name and `rank` this rank;
/// `slot_of(slot)` says what slot `slot` is.
pub(super) fn stage_error(
    e: StageError,
    group: &'static str,
    (stage, rank): (&'static str, usize),
    slot_of: impl Fn(usize) -> SlotOf,
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
        }) => {
            let of = slot_of(slot);
            match lengths(&of, &counts, &shapes) {
                Some(lens) => Error::LengthMismatch {
                    stage,
                    value: of.name,
                    slot: of.value,
                    item: of.item,
                    lens,
                },
                None => Error::ShapeMismatch {
                    stage,
                    value: of.name,
                    slot: of.value,
                    item: of.item,
                    counts,
                    shapes,
                },
            }
        }
        StageError::Disagreed(Disagreement::NotDivisible { slot, len, size }) => {
            Error::NotDivisible {
                stage,
                slot: slot_of(slot).value,
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

/// Each rank's length of the list whose length slot disagreed; `None` when the slot is
/// not a length on every rank (a value whose walk lays out other parts on another rank),
/// which is then reported as the shapes it has.
fn lengths(
    of: &SlotOf,
    counts: &[(crate::DType, usize)],
    shapes: &[Vec<usize>],
) -> Option<Vec<usize>> {
    let empty = counts.iter().all(|&c| c == (crate::DType::U8, 0));
    if !of.length || !empty || shapes.len() != counts.len() {
        return None;
    }
    // The length is the shape's last dimension (the first is 0 in an `allgather`).
    shapes.iter().map(|s| s.last().copied()).collect()
}

/// Each rank's call, for an error message.
fn fmt_calls(calls: &[Option<Call>]) -> String {
    let each = calls.iter().enumerate().map(|(rank, call)| match call {
        Some(call) => format!("rank {rank}: {call}"),
        None => format!("rank {rank}: none in this round"),
    });
    each.collect::<Vec<_>>().join(", ")
}

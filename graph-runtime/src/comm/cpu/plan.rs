//! Which algorithm a stage runs: a pure function of what the ranks agree on (the
//! collective and the bytes of their values), of whether the rank failed, and of the
//! backend's capabilities, which are the same on every rank. Every threshold of this
//! backend is here, beside its reason; the measurements behind each are in
//! BENCHMARKS.md#thresholds.
//!
//! A rank plans before it posts, from its own header, because an eager plan decides what
//! goes into the post. Ranks whose headers agree plan alike (equal slots make equal bytes,
//! and the capabilities are the group's), so every rank runs the same executor; ranks
//! whose headers do not agree run none (the header check refuses them first, and a round
//! in which some ranks posted eagerly and others not is refused as such).

use crate::comm::{Collective, Header, Status};
use crate::ReduceOp;

/// An allreduce of at most this many bytes per rank runs eagerly ([`Plan::Eager`]): above
/// it, reading every peer's whole copy costs more than the second barrier it saves. See
/// BENCHMARKS.md#thresholds. (Under Miri, 32 B, and under loom 4 B, so that tests and
/// models reach both paths with few elements.)
pub(crate) const EAGER_BYTES: usize = if cfg!(loom) {
    4
} else if cfg!(miri) {
    32
} else {
    256
};

/// [`EAGER_BYTES`] when the ranks outnumber the cores: then at least one rank is not
/// running when the others arrive at a barrier, so each barrier waits for the scheduler,
/// and saving one pays for reading larger copies. See BENCHMARKS.md#thresholds. (Under
/// Miri and loom, `EAGER_BYTES`: the tests' limits do not depend on the machine there.)
pub(crate) const EAGER_BYTES_CROWDED: usize = if cfg!(any(loom, miri)) {
    EAGER_BYTES
} else {
    1024
};

/// An allreduce whose values add up to at least this many bytes writes its result once,
/// into rank 0's regions, which every rank's outputs then view ([`Plan::Shared`]): one
/// copy instead of one per rank, and no writes into lines another rank's core last held,
/// which from here on pays for the extra barrier of the hand-over. See
/// BENCHMARKS.md#thresholds. (Under Miri, 1 KiB, so that tests reach the shared path with
/// few elements.)
pub(crate) const SHARE_BYTES: usize = if cfg!(miri) { 1 << 10 } else { 256 << 10 };

// An eager allreduce never shares its result: `Communicator::shares_results` asks the plan
// of a rank that did not fail, and must answer alike whatever the eager limit in force.
const _: () = assert!(EAGER_BYTES <= EAGER_BYTES_CROWDED && EAGER_BYTES_CROWDED < SHARE_BYTES);

/// The algorithm of one stage. The barriers counted are those of the stage itself, the
/// round's first included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// An allreduce small enough to ride in the post: every rank copies its header and
    /// values into its post before the round's barrier, then checks every copy and
    /// reduces all of them, in rank order, into its own region. One barrier; a failed rank
    /// joins with an empty copy.
    Eager(ReduceOp),
    /// Each rank reduces its 1/N chunk of every region, in rank order, block by block, and
    /// writes each block into every rank's region (allreduce, `root: None`) or into the
    /// root's only (reduce). Two barriers.
    Chunked {
        /// How values are combined.
        op: ReduceOp,
        /// The only rank that gets the result (reduce); `None`: every rank.
        root: Option<usize>,
    },
    /// An allreduce whose result each rank writes, chunk by chunk, into rank 0's regions
    /// only, which rank 0 then hands to every rank (`shares_results`, then
    /// `exchange_results`). Two barriers, and one more for the hand-over.
    Shared(ReduceOp),
    /// Each rank reduces its chunk of every value, in rank order, into its output region.
    /// Two barriers.
    ReduceScatter(ReduceOp),
    /// Allgather: each rank copies every rank's part of every value into its output
    /// region. Two barriers.
    Gather,
    /// Every rank but the root copies the root's values over its own. Two barriers.
    Broadcast {
        /// The rank whose values every rank gets.
        root: usize,
    },
}

/// What the plan needs of a rank's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Facts {
    /// The bytes of all its values together (saturating).
    pub(crate) bytes: usize,
    /// Whether the rank failed before the stage.
    pub(crate) failed: bool,
}

impl Facts {
    /// The facts of `header`.
    #[inline]
    pub(crate) fn of(header: &Header<'_>) -> Self {
        Self {
            bytes: header.bytes(),
            failed: header.status == Status::Failed,
        }
    }
}

/// What the backend brings to the plan: the same on every rank of a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Caps {
    /// The number of ranks.
    pub(crate) ranks: usize,
    /// Whether the ranks outnumber the cores (see [`EAGER_BYTES_CROWDED`]).
    pub(crate) crowded: bool,
}

impl Caps {
    /// The capabilities of `ranks` ranks on a machine of `cores` cores.
    pub(crate) fn new(ranks: usize, cores: usize) -> Self {
        Self {
            ranks,
            crowded: ranks > cores,
        }
    }

    /// The largest allreduce, in bytes per rank, that runs eagerly.
    #[inline]
    pub(crate) const fn eager_bytes(self) -> usize {
        if self.crowded {
            EAGER_BYTES_CROWDED
        } else {
            EAGER_BYTES
        }
    }
}

/// The plan of a stage of `collective` over values of `facts` on a backend of `caps`.
///
/// Alone, a rank has nobody to meet: its allreduce is chunked (one chunk, its own), never
/// eager or shared. A failed rank joins an allreduce eagerly, with an empty copy, so that
/// a stage of small values still takes one barrier when a rank failed.
#[inline]
pub(crate) fn plan(facts: Facts, collective: Collective, caps: Caps) -> Plan {
    match collective {
        Collective::AllReduce(op) if caps.ranks > 1 => {
            if facts.failed || facts.bytes <= caps.eager_bytes() {
                Plan::Eager(op)
            } else if facts.bytes >= SHARE_BYTES {
                Plan::Shared(op)
            } else {
                Plan::Chunked { op, root: None }
            }
        }
        Collective::AllReduce(op) => Plan::Chunked { op, root: None },
        Collective::Reduce { op, root } => Plan::Chunked {
            op,
            root: Some(root),
        },
        Collective::ReduceScatter(op) => Plan::ReduceScatter(op),
        Collective::AllGather => Plan::Gather,
        Collective::Broadcast { root } => Plan::Broadcast { root },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUM: Collective = Collective::AllReduce(ReduceOp::Sum);
    const ROOMY: Caps = Caps {
        ranks: 2,
        crowded: false,
    };
    const CROWDED: Caps = Caps {
        ranks: 4,
        crowded: true,
    };

    fn ok(bytes: usize) -> Facts {
        Facts {
            bytes,
            failed: false,
        }
    }

    fn failed(bytes: usize) -> Facts {
        Facts {
            bytes,
            failed: true,
        }
    }

    const CHUNKED: Plan = Plan::Chunked {
        op: ReduceOp::Sum,
        root: None,
    };

    #[test]
    fn the_eager_limit_is_inclusive() {
        let eager = Plan::Eager(ReduceOp::Sum);
        assert_eq!(plan(ok(0), SUM, ROOMY), eager);
        assert_eq!(plan(ok(EAGER_BYTES - 1), SUM, ROOMY), eager);
        assert_eq!(plan(ok(EAGER_BYTES), SUM, ROOMY), eager);
        assert_eq!(plan(ok(EAGER_BYTES + 1), SUM, ROOMY), CHUNKED);
    }

    #[test]
    fn crowded_ranks_have_the_crowded_limit() {
        let eager = Plan::Eager(ReduceOp::Sum);
        assert_eq!(ROOMY.eager_bytes(), EAGER_BYTES);
        assert_eq!(CROWDED.eager_bytes(), EAGER_BYTES_CROWDED);
        assert_eq!(plan(ok(EAGER_BYTES_CROWDED - 1), SUM, CROWDED), eager);
        assert_eq!(plan(ok(EAGER_BYTES_CROWDED), SUM, CROWDED), eager);
        assert_eq!(plan(ok(EAGER_BYTES_CROWDED + 1), SUM, CROWDED), CHUNKED);
        // Not crowded, the same bytes run eagerly only up to the smaller limit.
        let between = plan(ok(EAGER_BYTES_CROWDED), SUM, ROOMY);
        let want = if EAGER_BYTES_CROWDED > EAGER_BYTES {
            CHUNKED
        } else {
            eager
        };
        assert_eq!(between, want);
    }

    #[test]
    fn crowded_is_more_ranks_than_cores() {
        assert!(!Caps::new(2, 2).crowded);
        assert!(Caps::new(3, 2).crowded);
        assert!(!Caps::new(1, 1).crowded);
    }

    #[test]
    fn the_share_limit_is_inclusive() {
        let shared = Plan::Shared(ReduceOp::Max);
        let max = Collective::AllReduce(ReduceOp::Max);
        let chunked = Plan::Chunked {
            op: ReduceOp::Max,
            root: None,
        };
        for caps in [ROOMY, CROWDED] {
            assert_eq!(plan(ok(SHARE_BYTES - 1), max, caps), chunked);
            assert_eq!(plan(ok(SHARE_BYTES), max, caps), shared);
            assert_eq!(plan(ok(SHARE_BYTES + 1), max, caps), shared);
            assert_eq!(plan(ok(usize::MAX), max, caps), shared);
        }
    }

    #[test]
    fn one_rank_neither_runs_eagerly_nor_shares() {
        let alone = Caps::new(1, 1);
        for bytes in [0, EAGER_BYTES, SHARE_BYTES, usize::MAX] {
            assert_eq!(plan(ok(bytes), SUM, alone), CHUNKED);
            assert_eq!(plan(failed(bytes), SUM, alone), CHUNKED);
        }
    }

    #[test]
    fn a_failed_rank_joins_an_allreduce_eagerly() {
        for caps in [ROOMY, CROWDED] {
            for bytes in [0, EAGER_BYTES + 1, SHARE_BYTES, usize::MAX] {
                let avg = Collective::AllReduce(ReduceOp::Avg);
                assert_eq!(plan(failed(bytes), avg, caps), Plan::Eager(ReduceOp::Avg));
            }
        }
    }

    #[test]
    fn the_other_collectives_have_one_plan_each() {
        let cases = [
            (
                Collective::Reduce {
                    op: ReduceOp::Prod,
                    root: 1,
                },
                Plan::Chunked {
                    op: ReduceOp::Prod,
                    root: Some(1),
                },
            ),
            (
                Collective::ReduceScatter(ReduceOp::Min),
                Plan::ReduceScatter(ReduceOp::Min),
            ),
            (Collective::AllGather, Plan::Gather),
            (
                Collective::Broadcast { root: 3 },
                Plan::Broadcast { root: 3 },
            ),
        ];
        for (collective, want) in cases {
            for caps in [Caps::new(1, 1), ROOMY, CROWDED] {
                for bytes in [0, EAGER_BYTES, SHARE_BYTES, usize::MAX] {
                    // Whatever the size, and whether the rank failed or not.
                    assert_eq!(plan(ok(bytes), collective, caps), want);
                    assert_eq!(plan(failed(bytes), collective, caps), want);
                }
            }
        }
    }

    #[test]
    fn facts_come_from_the_header() {
        use crate::comm::SlotDesc;
        use crate::DType;
        let slots = [SlotDesc::flat(DType::F32, 3), SlotDesc::flat(DType::U8, 5)];
        let header = Header {
            status: Status::Ok,
            slots: &slots,
            dims: &[],
            data: &[],
        };
        assert_eq!(Facts::of(&header), ok(17));
        assert_eq!(Facts::of(&Header::FAILED), failed(0));
    }
}

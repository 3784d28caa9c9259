//! Which algorithm a stage runs, and every threshold that decides it.
//!
//! [`plan`] is a pure function of what every process knows alike once the leaders have
//! agreed: the header's [`Facts`] (each dtype region's length, the number of values), the
//! collective, and the group's [`Caps`] (its processes and their ranks, fixed at launch).
//! So every process computes the same [`Plan`], and runs the same MPI calls in the same
//! order, without a word exchanged about it. The leader computes it once per stage, from
//! its own header, before the agreement: the agreement's record says whether the data
//! rides along ([`Plan::Small`]), and the header it agrees on has these very facts.
//!
//! The thresholds are here, each with its reason; their figures are in
//! `BENCHMARKS.md#thresholds`.

use crate::comm::{Collective, SlotDesc};
use crate::{DType, ReduceOp};

/// The most bytes of data a process sends with its record in the leaders' first round:
/// a stage whose every process contributes at most this much costs one round (agreement
/// and data together); a larger one agrees first, then runs its payload, which moves less
/// than every rank's data to every leader. See `BENCHMARKS.md#thresholds`.
pub(crate) const SMALL: usize = 64 << 10;

/// The bytes from which a lent value is copied straight into its rank's post, or read
/// where it is by the leader of a large payload ([`keeps_lent`]); smaller ones are packed
/// first and posted in one copy. The post's lines were last read by the leader's core: a
/// small copy's stores each wait for a line to move over, where a large copy's full-line
/// stores do not. See `BENCHMARKS.md#thresholds`.
pub(crate) const POST_IN_PLACE: usize = 8 << 10;

/// The most values a large allgather moves by one MPI call each ([`Plan::GatherBySlot`]),
/// each sent from where it is and received where the output wants it; with more, the
/// per-call cost adds up, and one call per dtype region ([`Plan::GatherByRegion`]) is
/// cheaper. See `BENCHMARKS.md#thresholds`.
pub(crate) const GATHER_CALLS: usize = 16;

/// The bytes of one piece of a large broadcast: the root's leader packs each piece just
/// before it starts that piece's `MPI_Ibcast`, so the other processes read the first
/// pieces while it packs the rest. See `BENCHMARKS.md#thresholds`.
pub(crate) const BROADCAST_PIECE: usize = 256 << 10;

/// The most pieces a large broadcast cuts a region in, one `MPI_Ibcast` each, all started
/// together: past it the pieces grow rather than the requests in flight. See
/// `BENCHMARKS.md#thresholds`.
pub(crate) const BROADCAST_PIECES: usize = 16;

/// The algorithm a stage runs once its leaders have agreed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// The data rides in the leaders' agreement round ([`SMALL`]): every leader then has
    /// every contributing rank's data and computes the results itself.
    Small,
    /// A large reduction: a reduce-scatter in rank order, then an allgather, point to
    /// point; each leader moves and folds `1/P` of each region.
    ScatterGather { op: ReduceOp },
    /// A large allgather of at most [`GATHER_CALLS`] values: one `MPI_Iallgatherv` per
    /// value, from where it is, into its place in the output.
    GatherBySlot,
    /// A large allgather of more values: one `MPI_Iallgatherv` per dtype region.
    GatherByRegion,
    /// A large broadcast from rank `root`: each dtype region in `pieces[d]` pieces, one
    /// `MPI_Ibcast` each, all started together.
    Broadcast {
        root: usize,
        pieces: [usize; DType::COUNT],
    },
}

impl Plan {
    /// Whether the payload reads the leader's large lent values where they are, rather
    /// than from its regions (see `pack::Unpacked`): every large plan but
    /// [`Plan::GatherByRegion`], which sends the regions whole.
    #[inline]
    pub(crate) fn reads_lent(self) -> bool {
        matches!(
            self,
            Plan::ScatterGather { .. } | Plan::GatherBySlot | Plan::Broadcast { .. }
        )
    }
}

/// What the plan reads of the agreed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Facts {
    /// Each dtype region's length in elements (one rank's).
    pub(crate) lens: [usize; DType::COUNT],
    /// The number of values (slots).
    pub(crate) values: usize,
}

impl Facts {
    /// The facts of a header with these slots.
    #[inline]
    pub(crate) fn of(slots: &[SlotDesc]) -> Self {
        let mut lens = [0; DType::COUNT];
        for s in slots {
            lens[s.dtype.index()] += s.len;
        }
        Self {
            lens,
            values: slots.len(),
        }
    }

    /// The bytes of one rank's region of dtype `d`.
    #[inline]
    pub(crate) fn bytes(&self, d: DType) -> usize {
        self.lens[d.index()] * d.size()
    }

    /// The dtypes whose regions are not empty, in region order.
    #[inline]
    pub(crate) fn dtypes(&self) -> impl Iterator<Item = DType> + Clone + '_ {
        DType::ALL.into_iter().filter(|d| self.lens[d.index()] > 0)
    }
}

/// What the plan reads of the group: where its ranks are, fixed at launch and the same on
/// every process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Caps {
    /// Each process's number of ranks, in process order.
    pub(crate) counts: Vec<usize>,
    /// Each process's first global rank.
    pub(crate) offsets: Vec<usize>,
    /// This process.
    pub(crate) process: usize,
    /// The number of ranks in every process together.
    pub(crate) size: usize,
}

impl Caps {
    /// The layout of `counts[p]` ranks on each process `p`, from `offsets[p]` on, seen from
    /// `process`.
    pub(crate) fn new(counts: Vec<usize>, offsets: Vec<usize>, process: usize) -> Self {
        let size = counts.iter().sum();
        Self {
            counts,
            offsets,
            process,
            size,
        }
    }

    /// The number of processes.
    #[inline]
    pub(crate) fn processes(&self) -> usize {
        self.counts.len()
    }

    /// This process's first global rank.
    #[inline]
    pub(crate) fn first(&self) -> usize {
        self.offsets[self.process]
    }

    /// The process that hosts global rank `rank`.
    #[inline]
    pub(crate) fn process_of(&self, rank: usize) -> Option<usize> {
        (0..self.counts.len())
            .find(|&p| (self.offsets[p]..self.offsets[p] + self.counts[p]).contains(&rank))
    }
}

/// The plan of a stage: [`Plan::Small`] when every process's data fits the agreement
/// round ([`round_bytes`] at most [`SMALL`]), else the [`large`] plan of the collective.
#[inline]
pub(crate) fn plan(facts: &Facts, collective: Collective, caps: &Caps) -> Plan {
    let rides = (0..caps.processes()).all(|q| round_bytes(facts, collective, caps, q) <= SMALL);
    match rides {
        true => Plan::Small,
        false => large(facts, collective),
    }
}

/// The plan of a stage whose data does not ride in the agreement round: too large for it,
/// or (rarely) the round could not carry it, as when ranks agree on a header without
/// posting the same words (see `agree`).
pub(crate) fn large(facts: &Facts, collective: Collective) -> Plan {
    match collective {
        Collective::AllReduce(op)
        | Collective::ReduceScatter(op)
        | Collective::Reduce { op, .. } => Plan::ScatterGather { op },
        Collective::Broadcast { root } => Plan::Broadcast {
            root,
            pieces: DType::ALL.map(|d| broadcast_pieces(facts.bytes(d))),
        },
        Collective::AllGather if facts.values <= GATHER_CALLS => Plan::GatherBySlot,
        Collective::AllGather => Plan::GatherByRegion,
    }
}

/// The bytes process `q` contributes to the agreement round when the data rides: for each
/// dtype, each contributing rank's region, [`pad`]ded (every rank's, or a broadcast's
/// root's).
#[inline]
pub(crate) fn round_bytes(facts: &Facts, collective: Collective, caps: &Caps, q: usize) -> usize {
    let ranks = match collective {
        Collective::Broadcast { root } => usize::from(caps.process_of(root) == Some(q)),
        _ => caps.counts[q],
    };
    DType::ALL
        .iter()
        .map(|&d| ranks * pad(facts.bytes(d)))
        .sum()
}

/// Whether this process's leader keeps its lent values of at least [`POST_IN_PLACE`] bytes
/// out of its regions for a stage with this plan (see `pack::Unpacked`): when the payload
/// reads them where they are, across processes, and this process's data is too large to
/// ride in the agreement round (which sends the leader's regions whole).
#[inline]
pub(crate) fn keeps_lent(plan: Plan, facts: &Facts, collective: Collective, caps: &Caps) -> bool {
    plan.reads_lent()
        && caps.processes() > 1
        && round_bytes(facts, collective, caps, caps.process) > SMALL
}

/// Whether a rank copies a lent value of `bytes` straight into its post, and the leader
/// of a large payload may read it where it is ([`POST_IN_PLACE`]).
#[inline]
pub(crate) fn in_place(bytes: usize) -> bool {
    bytes >= POST_IN_PLACE
}

/// Whether a stage of `bytes()` on a process of `ranks` ranks leaves its results in the
/// leader's regions only, the others viewing its buffers: a large `allreduce` ([`SMALL`])
/// where there are others, which spares the leader a copy into the board and each other
/// rank a copy out of it. The bytes are counted only for an allreduce over several
/// ranks: every stage asks, and most are neither.
#[inline]
pub(crate) fn shares_results(
    collective: Collective,
    ranks: usize,
    bytes: impl FnOnce() -> usize,
) -> bool {
    matches!(collective, Collective::AllReduce(_)) && ranks > 1 && bytes() > SMALL
}

/// The pieces a large broadcast sends a region of `bytes` in: about [`BROADCAST_PIECE`]
/// each, at least one, at most [`BROADCAST_PIECES`] (the same on every process).
#[inline]
pub(crate) fn broadcast_pieces(bytes: usize) -> usize {
    (bytes / BROADCAST_PIECE).clamp(1, BROADCAST_PIECES)
}

/// `len` rounded up to a multiple of 8: each region in a message of the agreement round
/// starts aligned for every element type.
#[inline]
pub(crate) fn pad(len: usize) -> usize {
    len.div_ceil(8) * 8
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ReduceOp::Sum;

    const SUM: Collective = Collective::AllReduce(Sum);

    /// Values of `len` elements of `dtype` each.
    fn facts(values: &[(DType, usize)]) -> Facts {
        let slots: Vec<SlotDesc> = values
            .iter()
            .map(|&(d, len)| SlotDesc::flat(d, len))
            .collect();
        Facts::of(&slots)
    }

    /// One region of `bytes` bytes of `u8`.
    fn bytes(bytes: usize) -> Facts {
        facts(&[(DType::U8, bytes)])
    }

    /// `counts[p]` ranks on process `p`, seen from process 0.
    fn caps(counts: &[usize]) -> Caps {
        let offsets = counts
            .iter()
            .scan(0, |at, &n| Some(std::mem::replace(at, *at + n)))
            .collect();
        Caps::new(counts.to_vec(), offsets, 0)
    }

    #[test]
    fn facts_sum_each_dtype_and_count_the_values() {
        let f = facts(&[(DType::F32, 3), (DType::U8, 5), (DType::F32, 4)]);
        assert_eq!(f.lens[DType::F32.index()], 7);
        assert_eq!(f.bytes(DType::F32), 28);
        assert_eq!(f.bytes(DType::U8), 5);
        assert_eq!(f.values, 3);
        assert_eq!(f.dtypes().collect::<Vec<_>>(), [DType::F32, DType::U8]);
    }

    #[test]
    fn a_stage_is_small_up_to_small_bytes_per_process() {
        let two = caps(&[1, 1]);
        assert_eq!(plan(&bytes(SMALL), SUM, &two), Plan::Small);
        assert_eq!(
            plan(&bytes(SMALL + 1), SUM, &two),
            Plan::ScatterGather { op: Sum }
        );
        // A process's ranks all ride: two of half each fill the round.
        let crowded = caps(&[2, 1]);
        assert_eq!(plan(&bytes(SMALL / 2), SUM, &crowded), Plan::Small);
        assert_eq!(
            plan(&bytes(SMALL / 2 + 1), SUM, &crowded),
            Plan::ScatterGather { op: Sum }
        );
    }

    #[test]
    fn each_region_rides_padded_to_8_bytes() {
        let two = caps(&[1, 1]);
        // 7 bytes of `u8` take 8 in the round, beside a region that fills the rest.
        let f = facts(&[(DType::U8, 7), (DType::F64, (SMALL - 8) / 8)]);
        assert_eq!(round_bytes(&f, SUM, &two, 0), SMALL);
        assert_eq!(plan(&f, SUM, &two), Plan::Small);
        let f = facts(&[(DType::U8, 9), (DType::F64, (SMALL - 8) / 8)]);
        assert_eq!(round_bytes(&f, SUM, &two, 0), SMALL + 8);
        assert_eq!(plan(&f, SUM, &two), Plan::ScatterGather { op: Sum });
        assert_eq!(pad(0), 0);
        assert_eq!(pad(1), 8);
        assert_eq!(pad(8), 8);
    }

    #[test]
    fn only_the_roots_process_carries_a_broadcast() {
        let layout = caps(&[3, 1]);
        let root_alone = Collective::Broadcast { root: 3 };
        assert_eq!(round_bytes(&bytes(SMALL), root_alone, &layout, 0), 0);
        assert_eq!(round_bytes(&bytes(SMALL), root_alone, &layout, 1), SMALL);
        assert_eq!(plan(&bytes(SMALL), root_alone, &layout), Plan::Small);
        // A root beyond the group: no process carries anything.
        let beyond = Collective::Broadcast { root: 9 };
        assert_eq!(plan(&bytes(2 * SMALL), beyond, &layout), Plan::Small);
    }

    #[test]
    fn every_collective_has_its_large_plan() {
        let two = caps(&[1, 1]);
        let big = bytes(SMALL + 1);
        for c in [
            Collective::AllReduce(Sum),
            Collective::ReduceScatter(Sum),
            Collective::Reduce { op: Sum, root: 1 },
        ] {
            assert_eq!(
                plan(&big, c, &two),
                Plan::ScatterGather { op: Sum },
                "{c:?}"
            );
        }
        assert_eq!(plan(&big, Collective::AllGather, &two), Plan::GatherBySlot);
        let mut pieces = [1; DType::COUNT];
        pieces[DType::U8.index()] = broadcast_pieces(SMALL + 1);
        assert_eq!(
            plan(&big, Collective::Broadcast { root: 1 }, &two),
            Plan::Broadcast { root: 1, pieces }
        );
    }

    #[test]
    fn an_allgather_gathers_by_slot_up_to_gather_calls_values() {
        let each = (SMALL / GATHER_CALLS) + 1;
        let by_slot = facts(&[(DType::U8, each); GATHER_CALLS]);
        let by_region = facts(&[(DType::U8, each); GATHER_CALLS + 1]);
        let two = caps(&[1, 1]);
        assert_eq!(
            plan(&by_slot, Collective::AllGather, &two),
            Plan::GatherBySlot
        );
        assert_eq!(
            plan(&by_region, Collective::AllGather, &two),
            Plan::GatherByRegion
        );
        assert!(Plan::GatherBySlot.reads_lent());
        assert!(!Plan::GatherByRegion.reads_lent());
        assert!(!Plan::Small.reads_lent());
    }

    #[test]
    fn a_broadcast_is_cut_in_pieces_of_broadcast_piece_bytes_up_to_broadcast_pieces() {
        assert_eq!(broadcast_pieces(0), 1);
        assert_eq!(broadcast_pieces(BROADCAST_PIECE - 1), 1);
        assert_eq!(broadcast_pieces(2 * BROADCAST_PIECE - 1), 1);
        assert_eq!(broadcast_pieces(2 * BROADCAST_PIECE), 2);
        assert_eq!(
            broadcast_pieces(BROADCAST_PIECES * BROADCAST_PIECE),
            BROADCAST_PIECES
        );
        assert_eq!(broadcast_pieces(usize::MAX), BROADCAST_PIECES);
    }

    #[test]
    fn one_process_plans_alike_but_keeps_nothing_lent() {
        let one = caps(&[2]);
        assert_eq!(plan(&bytes(SMALL / 2), SUM, &one), Plan::Small);
        let big = bytes(SMALL);
        let p = plan(&big, SUM, &one);
        assert_eq!(p, Plan::ScatterGather { op: Sum });
        assert!(!keeps_lent(p, &big, SUM, &one));
        let two = caps(&[2, 2]);
        assert!(keeps_lent(plan(&big, SUM, &two), &big, SUM, &two));
    }

    #[test]
    fn the_leader_keeps_lent_values_only_when_its_own_data_is_over_small() {
        // Process 1's ranks are over the round, process 0's are not: a large payload, but
        // process 0's leader packs its values.
        let layout = caps(&[1, 2]);
        let f = bytes(SMALL / 2 + 8);
        let p = plan(&f, SUM, &layout);
        assert_eq!(p, Plan::ScatterGather { op: Sum });
        assert!(!keeps_lent(p, &f, SUM, &layout));
        let layout = caps(&[2, 1]);
        assert!(keeps_lent(plan(&f, SUM, &layout), &f, SUM, &layout));
        // The same data over the gather of many values, which reads the regions whole.
        let many = facts(&[(DType::U8, SMALL); GATHER_CALLS + 1]);
        let p = plan(&many, Collective::AllGather, &layout);
        assert!(!keeps_lent(p, &many, Collective::AllGather, &layout));
    }

    #[test]
    fn a_value_goes_in_place_from_post_in_place_bytes() {
        assert!(!in_place(POST_IN_PLACE - 1));
        assert!(in_place(POST_IN_PLACE));
    }

    #[test]
    fn a_large_allreduce_over_several_ranks_here_shares_its_results() {
        assert!(!shares_results(SUM, 2, || SMALL));
        assert!(shares_results(SUM, 2, || SMALL + 1));
        assert!(!shares_results(SUM, 1, || SMALL + 1));
        for c in [
            Collective::AllGather,
            Collective::ReduceScatter(Sum),
            Collective::Reduce { op: Sum, root: 0 },
            Collective::Broadcast { root: 0 },
        ] {
            assert!(!shares_results(c, 2, || SMALL + 1), "{c:?}");
        }
    }

    #[test]
    fn every_process_finds_every_rank() {
        let layout = caps(&[2, 1, 3]);
        assert_eq!(layout.size, 6);
        assert_eq!(layout.processes(), 3);
        let at: Vec<_> = (0..7).map(|r| layout.process_of(r)).collect();
        let want = [0, 0, 1, 2, 2, 2].map(Some);
        assert_eq!(at[..6], want);
        assert_eq!(at[6], None);
    }
}

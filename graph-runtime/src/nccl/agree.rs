//! The header agreement of a GPU stage, as data for one tiny all-gather.
//!
//! The CPU communicator agrees by reading every rank's header in shared memory. Over NCCL
//! each rank contributes a fixed summary of `SUMMARY_WORDS` words (status, number of
//! values, a digest of their dtypes and lengths, whether a `reducescatter` value does not
//! divide); one all-gather hands every rank every summary, and every rank reaches the same
//! verdict. Only when the summaries show layouts that differ does a second all-gather move
//! the full layouts, so that the error names the value and each rank's count exactly as
//! [`agree`] does on the CPU.

use crate::comm::{agree, Collective, Disagreement, Header, SlotDesc, Status};
use crate::DType;

/// Words per rank in the first round.
pub(crate) const SUMMARY_WORDS: usize = 4;
/// Words per value in the second round: dtype index + 1 (0 pads), length, rows.
pub(crate) const SLOT_WORDS: usize = 3;

/// What the first round decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FirstRound {
    /// Same layout everywhere: run the payload.
    Agreed,
    /// No payload, and the summaries say why.
    Disagreed(Disagreement),
    /// The layouts differ: exchange them, `max_slots` values' worth per rank.
    NeedLayouts { max_slots: usize },
}

/// This rank's summary.
pub(crate) fn summary(
    header: &Header<'_>,
    collective: Collective,
    size: usize,
) -> [u64; SUMMARY_WORDS] {
    let ok = header.status == Status::Ok;
    // FNV-1a over (dtype, len): equal layouts give equal digests. Two different layouts
    // with one digest (odds about 2^-64) would pass; NCCL would then move mismatched counts.
    let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
    for s in header.slots {
        for word in [s.dtype.index() as u64, s.len as u64] {
            for byte in word.to_le_bytes() {
                digest = (digest ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
    }
    let scatter_bad = matches!(collective, Collective::ReduceScatter(_))
        && header
            .slots
            .iter()
            .any(|s| s.rows % size.max(1) != 0 || s.len % size.max(1) != 0);
    [
        u64::from(ok),
        header.slots.len() as u64,
        digest,
        u64::from(scatter_bad),
    ]
}

/// The verdict from every rank's summary (`all`: rank 0's words, then rank 1's, ...), in
/// the order [`agree`] checks: a failed rank, the root, the number of values, then the
/// layouts.
pub(crate) fn first_round(all: &[u64], size: usize, collective: Collective) -> FirstRound {
    let ranks = || all.chunks_exact(SUMMARY_WORDS).take(size);
    if let Some(rank) = ranks().position(|w| w[0] != 1) {
        return FirstRound::Disagreed(Disagreement::Failed { rank });
    }
    if let Some(root) = collective.root().filter(|&r| r >= size) {
        return FirstRound::Disagreed(Disagreement::Root { root, size });
    }
    let counts: Vec<usize> = ranks().map(|w| w[1] as usize).collect();
    if counts.iter().any(|&c| c != counts[0]) {
        return FirstRound::Disagreed(Disagreement::BucketSize { counts });
    }
    let first = &all[..SUMMARY_WORDS];
    if ranks().all(|w| w[2] == first[2] && w[3] == 0) {
        return FirstRound::Agreed;
    }
    FirstRound::NeedLayouts {
        max_slots: counts[0],
    }
}

/// This rank's layout for the second round, `max_slots` values long (padded with zeros).
pub(crate) fn layout_words(header: &Header<'_>, max_slots: usize, out: &mut Vec<u64>) {
    out.clear();
    out.resize(max_slots * SLOT_WORDS, 0);
    for (w, s) in out.chunks_exact_mut(SLOT_WORDS).zip(header.slots) {
        w.copy_from_slice(&[s.dtype.index() as u64 + 1, s.len as u64, s.rows as u64]);
    }
}

/// The verdict from every rank's layout (`all`: rank 0's words, then rank 1's, ...).
pub(crate) fn second_round(
    all: &[u64],
    size: usize,
    max_slots: usize,
    collective: Collective,
) -> Result<(), Disagreement> {
    let per_rank = max_slots * SLOT_WORDS;
    let layouts: Vec<Vec<SlotDesc>> = (0..size)
        .map(|q| {
            all.get(q * per_rank..(q + 1) * per_rank)
                .unwrap_or(&[])
                .chunks_exact(SLOT_WORDS)
                .filter_map(|w| {
                    let dtype = *DType::ALL.get((w[0] as usize).checked_sub(1)?)?;
                    Some(SlotDesc {
                        dtype,
                        len: w[1] as usize,
                        rows: w[2] as usize,
                    })
                })
                .collect()
        })
        .collect();
    agree(size, collective, |q| Header {
        status: Status::Ok,
        slots: &layouts[q],
        data: &[],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ReduceOp;
    use proptest::prelude::*;

    /// What the two rounds decide, given every rank's header, with the all-gathers done
    /// by concatenation.
    fn over_nccl(headers: &[Header<'_>], collective: Collective) -> Result<(), Disagreement> {
        let size = headers.len();
        let all: Vec<u64> = headers
            .iter()
            .flat_map(|h| summary(h, collective, size))
            .collect();
        match first_round(&all, size, collective) {
            FirstRound::Agreed => Ok(()),
            FirstRound::Disagreed(d) => Err(d),
            FirstRound::NeedLayouts { max_slots } => {
                let mut words = Vec::new();
                let mut all = Vec::new();
                for h in headers {
                    layout_words(h, max_slots, &mut words);
                    all.extend_from_slice(&words);
                }
                second_round(&all, size, max_slots, collective)
            }
        }
    }

    fn slot() -> impl Strategy<Value = SlotDesc> {
        (0..3usize, 0..7usize, 0..4usize).prop_map(|(d, len, rows)| SlotDesc {
            dtype: [DType::F32, DType::I64, DType::BF16][d],
            len,
            rows,
        })
    }

    fn collective() -> impl Strategy<Value = Collective> {
        prop_oneof![
            Just(Collective::AllReduce(ReduceOp::Sum)),
            Just(Collective::AllGather),
            Just(Collective::ReduceScatter(ReduceOp::Max)),
            (0..4usize).prop_map(|root| Collective::Broadcast { root }),
            (0..4usize).prop_map(|root| Collective::Reduce {
                op: ReduceOp::Min,
                root
            }),
        ]
    }

    proptest! {
        /// The summary rounds reach exactly the verdict of `agree` over the full headers,
        /// for layouts that mostly agree (so that every branch is taken).
        #[test]
        fn two_rounds_decide_like_agree(
            size in 1..4usize,
            base in proptest::collection::vec(slot(), 0..4),
            changes in proptest::collection::vec((0..4usize, 0..5usize, slot()), 0..3),
            failed in proptest::option::of(0..4usize),
            collective in collective(),
        ) {
            let mut layouts: Vec<Vec<SlotDesc>> = vec![base; size];
            for (rank, at, s) in changes {
                let l = &mut layouts[rank % size];
                match at {
                    0 => { l.pop(); }
                    _ if l.is_empty() => l.push(s),
                    i => { let n = l.len(); l[i % n] = s; }
                }
            }
            let headers: Vec<Header<'_>> = layouts
                .iter()
                .enumerate()
                .map(|(q, l)| {
                    let status = if failed == Some(q) { Status::Failed } else { Status::Ok };
                    let slots: &[SlotDesc] = if status == Status::Failed { &[] } else { l };
                    Header { status, slots, data: &[] }
                })
                .collect();
            let want = agree(size, collective, |q| headers[q]);
            prop_assert_eq!(over_nccl(&headers, collective), want);
        }
    }

    #[test]
    fn equal_layouts_need_one_round() {
        let slots = [SlotDesc::flat(DType::F32, 8), SlotDesc::flat(DType::U8, 3)];
        let h = Header {
            status: Status::Ok,
            slots: &slots,
            data: &[],
        };
        let sum = Collective::AllReduce(ReduceOp::Sum);
        let all: Vec<u64> = (0..3).flat_map(|_| summary(&h, sum, 3)).collect();
        assert_eq!(first_round(&all, 3, sum), FirstRound::Agreed);
    }
}

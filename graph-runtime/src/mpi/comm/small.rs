//! [`Plan::Small`](super::plan::Plan): the data came with the agreement's records, so
//! every leader has every contributing rank's region and computes the results itself, in
//! no further MPI call. A reduction folds every rank's region in rank order, as the large
//! plans do, so every process has the same bits.

use super::agree::RECORD;
use super::leader::{Leader, Parts};
use super::pack::{fold, input, Mine};
use super::plan::pad;
use crate::comm::Collective;
use crate::element::with_dtype;
use crate::DType;

/// The payload of a small stage. Whether the leader's regions hold its results already: a
/// reduction folds into them in place (as `scatter_gather` does), which spares the leader
/// copying its results out, and the process's other ranks copy theirs from
/// `shared.result`.
pub(super) fn run(parts: &mut Parts<'_>) -> Result<bool, String> {
    let (caps, facts, collective, posts) =
        (parts.caps, &parts.facts, parts.collective, parts.posts);
    let leader: &Leader = parts.leader;
    let shared = &mut *parts.shared;
    let dtypes = facts.dtypes();
    let in_place = matches!(
        collective,
        Collective::AllReduce(_) | Collective::Reduce { .. }
    ) && dtypes.clone().all(|d| {
        parts.mine[d.index()]
            .as_ref()
            .is_some_and(|r| r.len() == facts.bytes(d))
    });
    // In place, the leader's regions are results, not inputs: `region` never reads them.
    let mut own: Mine<'_> = Default::default();
    if in_place {
        std::mem::swap(&mut own, &mut parts.mine);
    }
    let mine: &Mine<'_> = &parts.mine;
    let first = caps.first();
    // Rank `r`'s region of dtype `d`: here, or in its process's message (laid out as
    // `agree` wrote it).
    let region = |r: usize, d: DType| -> Result<&[u8], String> {
        let q = caps.process_of(r).ok_or("a rank beyond the group")?;
        let bytes = facts.bytes(d);
        if q == caps.process {
            return input(mine, posts, r - caps.offsets[q], d, bytes);
        }
        let (ranks, within) = match collective {
            Collective::Broadcast { .. } => (1, 0),
            _ => (caps.counts[q], r - caps.offsets[q]),
        };
        let before: usize = DType::ALL[..d.index()]
            .iter()
            .map(|&e| ranks * pad(facts.bytes(e)))
            .sum();
        let at = RECORD * 8 + before + within * pad(bytes);
        leader
            .message(q)
            .get(at..at.saturating_add(bytes))
            .ok_or_else(|| "a process's message is too short".to_string())
    };
    for d in dtypes {
        let bytes = facts.bytes(d);
        match collective {
            Collective::Broadcast { root } => {
                let src = region(root, d)?;
                shared.result[d.index()]
                    .bytes_mut(bytes)
                    .copy_from_slice(src);
            }
            Collective::AllGather => {
                let all = shared.all[d.index()].bytes_mut(caps.size * bytes);
                for (r, dst) in all.chunks_exact_mut(bytes).enumerate() {
                    dst.copy_from_slice(region(r, d)?);
                }
            }
            Collective::AllReduce(op)
            | Collective::ReduceScatter(op)
            | Collective::Reduce { op, .. } => {
                let srcs = (0..caps.size)
                    .map(|r| match in_place && r == first {
                        true => Ok(&[][..]),
                        false => region(r, d),
                    })
                    .collect::<Result<Vec<&[u8]>, String>>()?;
                if in_place {
                    let Some(dst) = own[d.index()].as_deref_mut() else {
                        return Err(format!("the leader has no {d} region"));
                    };
                    with_dtype!(d, E => fold::<E>(&srcs, Some(first), op, dst));
                    if posts.len() > 1 && !shared.lent {
                        shared.result[d.index()]
                            .bytes_mut(bytes)
                            .copy_from_slice(dst);
                    }
                } else {
                    let dst = shared.result[d.index()].bytes_mut(bytes);
                    with_dtype!(d, E => fold::<E>(&srcs, None, op, dst));
                }
            }
        }
    }
    Ok(in_place)
}

//! The header check of a round, after the call check: every rank's header against every
//! other's ([`agree()`]), then every rank's buffers and value entries against the agreed
//! slots, so that no executor reads or writes out of bounds whatever the callers passed.
//! Every rank reads the same posts, so every rank reaches the same verdict.

use std::sync::atomic::Ordering::Relaxed;

use super::peer::Round;
use crate::comm::{agree, Collective, Disagreement, Header, SlotData, SlotDesc};
use crate::DType;

/// Each dtype's element count over `slots`.
#[inline]
pub(super) fn wanted(slots: &[SlotDesc]) -> Result<[usize; DType::COUNT], Disagreement> {
    let mut want = [0usize; DType::COUNT];
    for s in slots {
        let sum = &mut want[s.dtype.index()];
        *sum = sum
            .checked_add(s.len)
            .ok_or_else(|| Disagreement::Buffers {
                reason: format!(
                    "the {} slots add up to more than usize::MAX elements",
                    s.dtype
                ),
            })?;
    }
    Ok(want)
}

/// Whether a rank's value data matches its slots, one entry per slot.
#[inline]
pub(super) fn data_fits(slots: &[SlotDesc], data: &[SlotData<'_>]) -> bool {
    data.len() == slots.len()
        && data.iter().zip(slots).all(|(data, slot)| {
            slot.len == 0 || (data.dtype() == slot.dtype && data.len() == slot.len)
        })
}

/// What the buffer check says of a rank whose value data does not match its slots.
pub(super) fn data_mismatch(q: usize) -> Disagreement {
    Disagreement::Buffers {
        reason: format!("rank {q} passed value data that does not match its slots"),
    }
}

/// Each slot with its offset in its dtype's region (the values of a dtype lie back to back
/// in bucket order).
#[inline]
pub(super) fn slot_offsets(slots: &[SlotDesc]) -> impl Iterator<Item = (SlotDesc, usize)> + '_ {
    let mut next = [0usize; DType::COUNT];
    slots.iter().map(move |&s| {
        let at = &mut next[s.dtype.index()];
        let offset = *at;
        *at += s.len;
        (s, offset)
    })
}

/// The header check of a round in which every rank published its header and regions:
/// [`agree()`] over the published headers, then every rank's buffers and input data
/// against the agreed slots.
///
/// # Safety
/// No post of the round is eager (see `Round::header`).
#[inline]
pub(super) unsafe fn agree_published(
    round: &Round<'_>,
    header: &Header<'_>,
    collective: Collective,
) -> Result<(), Disagreement> {
    // SAFETY: no post is eager (forwarded to the caller).
    agree(round.size(), collective, |q| unsafe { round.header(q) })?;
    let want = wanted(header.slots)?;
    for q in 0..round.size() {
        // SAFETY: as above.
        let theirs = unsafe { round.header(q) };
        if !data_fits(header.slots, theirs.data) {
            return Err(data_mismatch(q));
        }
    }
    check_regions(round, &want, collective, |_| true)
}

/// The part of the buffer check that reads only the posts' atomics: the regions of every
/// rank that `posted` them against `want` elements per dtype.
#[inline]
pub(super) fn check_regions(
    round: &Round<'_>,
    want: &[usize; DType::COUNT],
    collective: Collective,
    posted: impl Fn(usize) -> bool,
) -> Result<(), Disagreement> {
    let size = round.size();
    let need = |d: DType| {
        let len = want[d.index()];
        let out_len = match collective.output_len(len, size) {
            Some(n) if collective.has_outputs() && len > 0 => n,
            _ => 0,
        };
        (len, out_len)
    };
    // The common case first: every rank posted regions of just the dtypes we need, of
    // the lengths we need (a post's regions of the other dtypes read as empty). Only a
    // mismatch takes the full pass below, which names the first one.
    let mut mask = 0u32;
    let mut needs = [(0, 0); DType::COUNT];
    for d in DType::ALL {
        needs[d.index()] = need(d);
        if needs[d.index()] != (0, 0) {
            mask |= 1 << d.index();
        }
    }
    let matches = |q: usize| {
        round.post(q).dtypes.load(Relaxed) == mask
            && DType::ALL
                .into_iter()
                .filter(|d| mask & (1 << d.index()) != 0)
                .all(|d| {
                    let b = round.region(q, d);
                    (b.len, b.out_len) == needs[d.index()]
                })
    };
    if (0..size).filter(|&q| posted(q)).all(matches) {
        return Ok(());
    }
    for d in DType::ALL {
        let (len, out_len) = need(d);
        for q in (0..size).filter(|&q| posted(q)) {
            let b = round.region(q, d);
            let (b_len, b_out_len) = (b.len, b.out_len);
            if b_len != len || b_out_len != out_len {
                return Err(Disagreement::Buffers {
                    reason: format!(
                        "rank {q} passed a {d} region of {b_len} elements and an output of {b_out_len}, where its slots need {len} and {out_len}",
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The verdict when some ranks but not all posted an eager copy: some rank failed, or
/// the ranks' slots differ (an eager rank's bytes are at most the eager limit, the
/// others' above). An eager rank may have published no addresses, so its header comes
/// from its copy; every rank reads the same posts, so reaches the same verdict.
pub(super) fn mixed_verdict(round: &Round<'_>, collective: Collective) -> Disagreement {
    match agree(round.size(), collective, |q| round.posted_header(q)) {
        Err(why) => why,
        // Unreachable: equal slots make equal bytes, so equal eagerness unless a rank
        // failed, which `agree` reports. Still a verdict, and the same on every rank.
        Ok(()) => Disagreement::Buffers {
            reason: "the ranks disagree on whether the allreduce is small".into(),
        },
    }
}

//! [`Plan::Eager`](super::plan::Plan::Eager): an allreduce small enough to ride in the
//! post. Each rank copies its header and values into its post's [`Eager`] copy before the
//! round's barrier ([`Eager::fill`]); after it, every rank checks every copied header and
//! reduces every rank's copy, in rank order, into its own region. A peer never reads the
//! caller's memory, so no rank waits for its peers to finish reading before it returns,
//! and the stage takes one barrier. Every rank runs the same kernels over the same copies
//! in the same rank order, which gives the same bits.

use super::check::{check_regions, data_fits, data_mismatch, slot_offsets, wanted};
use super::chunked::{reduce_range, Push};
use super::peer::Round;
use super::post::{Buf, Eager};
use crate::comm::{agree as agree_headers, Collective, Disagreement, Header};
use crate::element::with_dtype;
use crate::{DType, ReduceOp};

/// Makes `v` hold `new`, writing nothing when it already does (see [`Eager`]).
#[inline]
fn refill<A: smallvec::Array>(v: &mut smallvec::SmallVec<A>, new: &[A::Item])
where
    A::Item: Copy + PartialEq,
{
    // Element by element: a slice comparison calls `memcmp`, which costs more here than
    // comparing a header's few words.
    if v.len() != new.len() || v.iter().zip(new).any(|(a, b)| a != b) {
        v.clear();
        v.extend_from_slice(new);
    }
}

/// Makes `flag` hold `new`, writing nothing when it already does (see [`Eager`]).
#[inline]
fn set(flag: &mut bool, new: bool) {
    if *flag != new {
        *flag = new;
    }
}

// The payload's 8-byte alignment suits every element type.
const _: () = {
    let mut d = 0;
    while d < DType::COUNT {
        assert!(DType::ALL[d].size() <= 8 && 8 % DType::ALL[d].size() == 0);
        d += 1;
    }
};

/// Where each dtype's section starts in an [`Eager`] payload, in `u64`s, for `want[d]`
/// elements of dtype `d`, and the payload's length.
#[inline]
fn sections(want: &[usize; DType::COUNT]) -> ([usize; DType::COUNT], usize) {
    let mut at = [0; DType::COUNT];
    let mut end = 0;
    for d in DType::ALL {
        at[d.index()] = end;
        end += (want[d.index()] * d.size()).div_ceil(8);
    }
    (at, end)
}

impl Eager {
    /// Copies this rank's header and values in, and says whether it copied the values.
    /// Nothing is read out of bounds whatever the caller passed: values are copied only
    /// when their data matches the slots and every region holds exactly its slots (which
    /// the buffer check requires anyway).
    ///
    /// # Safety
    /// `header`'s lent data is live; `bufs` are the regions this rank passed to `stage`,
    /// which nobody else touches now.
    #[inline]
    pub(super) unsafe fn fill(&mut self, header: &Header<'_>, bufs: &[Buf; DType::COUNT]) -> bool {
        refill(&mut self.slots, header.slots);
        refill(&mut self.dims, header.dims);
        let fits = data_fits(header.slots, header.data);
        set(&mut self.fits, fits);
        let want = wanted(header.slots);
        // Copied only when the data matches the slots and every region holds its slots'
        // total, with no output region (an allreduce has none): else the buffer check
        // fails on every rank and nobody reads them.
        let copied = fits
            && want.as_ref().is_ok_and(|want| {
                DType::ALL.iter().all(|d| {
                    let b = &bufs[d.index()];
                    b.len == want[d.index()] && b.out_len == 0
                })
            });
        set(&mut self.copied, copied);
        let Ok(want) = want else {
            return false;
        };
        if !copied {
            return false;
        }
        let (at, end) = sections(&want);
        self.payload.resize(end, 0);
        let base = self.payload.as_mut_ptr().cast::<u8>();
        for (k, (slot, offset)) in slot_offsets(header.slots).enumerate() {
            if slot.len == 0 {
                continue;
            }
            let size = slot.dtype.size();
            let src = match header.data[k].lent_ptr() {
                Some(ptr) => ptr,
                None => bufs[slot.dtype.index()]
                    .ptr
                    .cast_const()
                    .wrapping_add(offset * size),
            };
            // SAFETY: `src` is the value's live elements (lent, or at its place in our
            // region, which holds exactly its slots' total); the destination is its place
            // in the payload, sized by `sections` for the same slots; our own
            // payload and caller's memory never overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src,
                    base.add(at[slot.dtype.index()] * 8 + offset * size),
                    slot.len * size,
                )
            };
        }
        true
    }
}

/// The header check of an eager round (every post holds its owner's copy for it): every
/// copied header against every other, then every rank's copy (or, where a rank could not
/// copy, its regions) against the agreed slots. Returns each dtype's element count. Every
/// rank reads the same copies, so reaches the same verdict, and returns without another
/// barrier: no peer reads its caller's memory.
#[inline]
pub(super) fn agree(
    round: &Round<'_>,
    header: &Header<'_>,
    collective: Collective,
) -> Result<[usize; DType::COUNT], Disagreement> {
    agree_headers(round.size(), collective, |q| round.eager_header(q))?;
    let want = wanted(header.slots)?;
    if !(0..round.size()).all(|q| round.copy(q).copied) {
        // Someone's buffers do not fit: find which, as the two-barrier stage would.
        for q in 0..round.size() {
            if !round.copy(q).fits {
                return Err(data_mismatch(q));
            }
        }
        // Only the ranks that did not copy published their regions; those that did
        // had regions of the lengths these slots need.
        let copied = |q: usize| round.copy(q).copied;
        check_regions(round, &want, collective, |q| !copied(q))?;
    }
    Ok(want)
}

/// Reduces every rank's copy, in rank order, into this rank's regions.
///
/// # Safety
/// Every post of `round` is eager, [`agree`] returned `want` for it, and `bufs` are this
/// rank's regions as it passed them to `stage`.
#[inline]
pub(super) unsafe fn run(
    round: &Round<'_>,
    want: &[usize; DType::COUNT],
    bufs: &[Buf; DType::COUNT],
    op: ReduceOp,
) {
    // Every rank's slots are ours (agreed) and its regions hold exactly them (checked),
    // so every rank copied its values into sections laid out as ours.
    let (at, _) = sections(want);
    for d in DType::ALL.into_iter().filter(|d| want[d.index()] > 0) {
        // The section of `d` lies within each rank's payload.
        let section = |q: usize| {
            round
                .copy(q)
                .payload
                .as_ptr()
                .wrapping_add(at[d.index()])
                .cast::<u8>()
        };
        let dst = bufs[d.index()].ptr;
        // SAFETY: each rank's section holds `want[d]` elements of `d` (= `E`), which
        // nobody writes before we reach the next barrier (the invariant in `peer.rs`);
        // `dst` is our own region of `d`, `want[d]` long (checked), which no peer touches
        // in an eager stage.
        with_dtype!(d, E => unsafe {
            reduce_range::<E>(
                round,
                &|q| section(q).cast::<E>(),
                want[d.index()],
                dst.cast(),
                op,
                (Push::None, d, 0),
            )
        });
    }
}

//! The plans that read the peers' inputs and write only this rank's memory:
//! [`ReduceScatter`](super::plan::Plan::ReduceScatter) (rank r reduces its chunk of every
//! value, in rank order, into its output region), [`Gather`](super::plan::Plan::Gather)
//! (rank r copies every rank's part of every value into its output region) and
//! [`Broadcast`](super::plan::Plan::Broadcast) (every rank but the root copies the root's
//! values over its own). Inputs are read-only in these stages, so the only writes are a
//! rank's own, into memory no peer reads.

use super::check::slot_offsets;
use super::chunked::{reduce_range, Push};
use super::peer::Round;
use super::post::Buf;
use crate::comm::{Header, SlotDesc};
use crate::element::with_dtype;
use crate::{DType, Element, ReduceOp};

/// Runs [`Plan::ReduceScatter`](super::plan::Plan::ReduceScatter) with `op`.
///
/// # Safety
/// As for [`chunked::run`](super::chunked::run).
#[inline]
pub(super) unsafe fn reduce_scatter(
    round: &Round<'_>,
    header: &Header<'_>,
    bufs: &[Buf; DType::COUNT],
    op: ReduceOp,
) {
    let slots = slot_offsets(header.slots).enumerate();
    for (k, (slot, offset)) in slots.filter(|(_, (s, _))| s.len > 0) {
        let out = bufs[slot.dtype.index()].out;
        // SAFETY: validity: the header check (the invariant in `peer.rs`). Aliasing:
        // inputs are read-only in this phase (lent values are borrowed immutably, and
        // nobody writes a region for this collective), and only we write our output
        // region, through its base pointer.
        with_dtype!(slot.dtype, E => unsafe {
            reduce_scatter_slot::<E>(round, k, slot, offset, out.cast(), op)
        });
    }
}

/// Runs [`Plan::Gather`](super::plan::Plan::Gather).
///
/// # Safety
/// As for [`chunked::run`](super::chunked::run).
#[inline]
pub(super) unsafe fn gather(round: &Round<'_>, header: &Header<'_>, bufs: &[Buf; DType::COUNT]) {
    let slots = slot_offsets(header.slots).enumerate();
    for (k, (slot, offset)) in slots.filter(|(_, (s, _))| s.len > 0) {
        let out = bufs[slot.dtype.index()].out;
        // SAFETY: as in `reduce_scatter`.
        unsafe { gather_slot(round, k, slot, offset, out) };
    }
}

/// Runs [`Plan::Broadcast`](super::plan::Plan::Broadcast) from `root`.
///
/// # Safety
/// As for [`chunked::run`](super::chunked::run).
#[inline]
pub(super) unsafe fn broadcast(round: &Round<'_>, header: &Header<'_>, root: usize) {
    let slots = slot_offsets(header.slots).enumerate();
    for (k, (slot, offset)) in slots.filter(|(_, (s, _))| s.len > 0) {
        // SAFETY: validity: the header check (the invariant in `peer.rs`). Aliasing:
        // nobody writes the root's inputs in this phase (the root writes its region only
        // at the places of values it lent, which peers read from the lent elements
        // instead), and only we write our region, through its base pointer.
        unsafe { copy_slot_from(round, root, k, slot, offset) };
    }
}

/// Copies rank `root`'s value `k` into its place in our region.
///
/// # Safety
/// Every rank posted a live region of the slot's dtype holding the slot at `offset`,
/// and live inputs; nobody writes the root's input or touches our region in this phase.
unsafe fn copy_slot_from(round: &Round<'_>, root: usize, k: usize, slot: SlotDesc, offset: usize) {
    let size = slot.dtype.size();
    // SAFETY: forwarded to the caller.
    let src = unsafe { round.input(root, k, slot.dtype, offset) };
    let own = round.region(round.rank(), slot.dtype).ptr::<u8>();
    let dst = own.wrapping_add(offset * size);
    if src != dst.cast_const() {
        // SAFETY: `slot.len` elements of the root's live input and of our region, at
        // different places (our region is ours, the root's input read-only, and a
        // value is in one region only at its own place).
        unsafe { std::ptr::copy_nonoverlapping(src, dst, slot.len * size) };
    }
}

/// Reduces our chunk of one value into our output region.
///
/// # Safety
/// Every rank's input of the slot (= `E`) is live, read-only in this phase and, if
/// packed, at `offset` of its region; `out` is our output region of that dtype, `1/N`
/// of the input long; the slot's length divides by N.
unsafe fn reduce_scatter_slot<E: Element>(
    round: &Round<'_>,
    k: usize,
    slot: SlotDesc,
    offset: usize,
    out: *mut E,
    op: ReduceOp,
) {
    let chunk = slot.len / round.size();
    let start = round.rank() * chunk;
    let dst = out.wrapping_add(offset / round.size());
    let d = slot.dtype;
    // SAFETY: forwarded to the caller; our chunk lies within value k of every rank.
    let src = |q: usize| unsafe { round.input(q, k, d, offset).cast::<E>().add(start) };
    // SAFETY: forwarded to the caller; `dst` is in our output region, which no one
    // else touches.
    unsafe { reduce_range::<E>(round, &src, chunk, dst, op, (Push::None, d, 0)) };
}

/// Copies every rank's part of one value into our output region, in rank order.
///
/// # Safety
/// Every rank's input of the slot is live, read-only in this phase and, if packed, at
/// `offset` of its region; `out` is our output region of that dtype, N times the input
/// long.
unsafe fn gather_slot(round: &Round<'_>, k: usize, slot: SlotDesc, offset: usize, out: *mut u8) {
    let size = slot.dtype.size();
    let part = slot.len * size;
    let base = offset * round.size() * size;
    for q in 0..round.size() {
        // SAFETY: forwarded to the caller.
        let src = unsafe { round.input(q, k, slot.dtype, offset) };
        // SAFETY: value k of rank q is live and read-only; its place in our output
        // region is `N * offset + q * len` elements, within the output's length, and
        // only we touch our output.
        unsafe { std::ptr::copy_nonoverlapping(src, out.add(base + q * part), part) };
    }
}

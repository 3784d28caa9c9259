//! [`Plan::Chunked`](super::plan::Plan::Chunked): rank r reduces its 1/N chunk of every
//! region, in rank order, block by block, and writes each reduced block into the regions
//! of the ranks that get the result (every rank's for an allreduce, the root's for a
//! reduce): every rank then holds the whole result after one barrier, without a second
//! pass that copies chunks. Each element is reduced exactly once, by one rank, in rank
//! order, and everything else is a copy, so every rank holds bitwise-identical results.
//!
//! Also the kernel driver of the other reducing plans ([`reduce_range`]).

use std::any::TypeId;

use super::check::slot_offsets;
use super::peer::Round;
use super::post::Buf;
use crate::comm::reduce::{fold_block, needs_acc, BLOCK};
use crate::comm::Header;
use crate::element::with_dtype;
use crate::{DType, Element, ReduceOp};

/// Which other ranks' regions a reduced block is also written to.
#[derive(Clone, Copy)]
pub(super) enum Push {
    /// Nobody's: the result stays in our output.
    None,
    /// Every rank's (allreduce).
    All,
    /// The root's only (reduce).
    To(usize),
}

impl Push {
    /// The ranks to write to besides ourselves.
    #[inline]
    fn targets(self, rank: usize, size: usize) -> impl Iterator<Item = usize> {
        let (lo, hi) = match self {
            Push::None => (0, 0),
            Push::All => (0, size),
            Push::To(root) => (root, root + 1),
        };
        (lo..hi).filter(move |&q| q != rank)
    }
}

/// Runs [`Plan::Chunked`](super::plan::Plan::Chunked) with `op`, for every rank (`root:
/// None`) or for `root` only.
///
/// # Safety
/// The header check has passed for `round` (see the invariant in `peer.rs`) against
/// `header`, no post is eager, `bufs` are this rank's regions as it posted them, and
/// every rank runs this plan for this round.
#[inline]
pub(super) unsafe fn run(
    round: &Round<'_>,
    header: &Header<'_>,
    bufs: &[Buf; DType::COUNT],
    op: ReduceOp,
    root: Option<usize>,
) {
    let push = match root {
        Some(root) => Push::To(root),
        None => Push::All,
    };
    // SAFETY: forwarded to the caller; each rank reduces its own chunk into its own
    // region.
    unsafe { reduce_chunks(round, header, bufs, op, round.rank(), push) };
}

/// Reduces this rank's chunk of every region into rank `owner`'s region (ours, or rank
/// 0's when results are shared), and writes each reduced block into the regions of `push`
/// too.
///
/// # Safety
/// As for [`run`]; every rank passes the same `owner` and `push`, or its own rank as
/// `owner`.
#[inline]
pub(super) unsafe fn reduce_chunks(
    round: &Round<'_>,
    header: &Header<'_>,
    bufs: &[Buf; DType::COUNT],
    op: ReduceOp,
    owner: usize,
    push: Push,
) {
    for d in DType::ALL.into_iter().filter(|d| bufs[d.index()].len > 0) {
        // SAFETY: validity: the header check (the invariant in `peer.rs`). Aliasing: in
        // this phase the elements of chunk `rank` of every region, and of every value,
        // are read and written by us alone (each rank reduces its own chunk, and reads
        // every rank's block before it writes it anywhere); every access to a region goes
        // through the base pointer its owner posted, so no reference of another rank
        // covers them.
        with_dtype!(d, E => unsafe { reduce_own_chunk::<E>(round, header, d, op, owner, push) });
    }
}

/// Elements `[lo, hi)` of a region of `len` elements: rank `q`'s chunk of `size`.
#[inline]
fn chunk(len: usize, q: usize, size: usize) -> (usize, usize) {
    (len * q / size, len * (q + 1) / size)
}

/// Reduces `n` elements of every rank's input, in rank order, into `dst`; rank `q`'s
/// elements start at `src(q)`. Each reduced block is also written to the regions of
/// dtype `d` of the ranks in `push`, at element `at`.
///
/// # Safety
/// Every `src(q)` points to `n` live elements that nobody writes in this phase except
/// through `dst` or the pushes; `dst` points to `n` elements that only we use, and
/// that may be our own input (each block is read from every rank before it is written
/// anywhere); the pushed regions hold `at + n` elements, of which only we touch these.
// Not inlined into the stage: there LLVM turns the block loops into slower code than in
// a function of their own.
#[inline(never)]
pub(super) unsafe fn reduce_range<E: Element>(
    round: &Round<'_>,
    src: &dyn Fn(usize) -> *const E,
    n: usize,
    dst: *mut E,
    op: ReduceOp,
    push: (Push, DType, usize),
) {
    let (push, d, at) = push;
    let (rank, size) = (round.rank(), round.size());
    if size == 1 && op != ReduceOp::Avg && TypeId::of::<E>() == TypeId::of::<E::Acc>() {
        // Alone, with an op and a type that leave a value as it is, the result is the
        // input bit for bit (what the kernel below would compute, without the copies).
        let src = src(0);
        if src != dst.cast_const() && n > 0 {
            // SAFETY: `n` live input elements, and `dst`, ours alone; a copy between
            // two places that are not the same cannot overlap: inputs and results
            // share memory only place for place.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
        }
        return;
    }
    // The rank whose input is the result itself, in place, if any: `fold_block` reads
    // it through `out`, never through a slice of its own.
    let own = (0..size).find(|&q| src(q) == dst.cast_const());
    // Only as much of the accumulator as the range needs is initialised, and only if
    // the fold uses one: zeroing all of it costs more than the whole reduction of a
    // small allreduce, and even the range's part is much of the work of an allreduce
    // that folds in place.
    let mut store = [std::mem::MaybeUninit::<E::Acc>::uninit(); BLOCK];
    let first = match needs_acc::<E>(size, own) {
        true => BLOCK.min(n),
        false => 0,
    };
    for a in &mut store[..first] {
        a.write(E::Acc::default());
    }
    // SAFETY: the first `first` entries were just initialised, and `MaybeUninit<T>` has
    // `T`'s layout; `store` is a local that nothing else refers to.
    let acc_all =
        unsafe { std::slice::from_raw_parts_mut(store.as_mut_ptr().cast::<E::Acc>(), first) };
    let mut done = 0;
    while done < n {
        let len = BLOCK.min(n - done);
        // SAFETY: `dst + done .. + len` is ours alone in this phase. No input but
        // `own`'s overlaps it (inputs and results share memory only place for place),
        // and that one is read through this slice only.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.add(done), len) };
        let input = |q: usize| {
            // SAFETY: within rank q's live input, which is not `out` (`fold_block`
            // never asks for `own`'s); nobody writes these elements now (the pushes
            // below come after the block's last read), and the slice dies before them.
            unsafe { std::slice::from_raw_parts(src(q).add(done), len) }
        };
        fold_block(size, input, own, op, out, acc_all);
        for q in push.targets(rank, size) {
            // SAFETY: the same elements of rank q's live region (the check found it
            // `at + n` long), touched by nobody but us in this phase, and already read
            // by us above if they were an input; `out` is ours, elsewhere.
            unsafe { round.region(q, d).write(at + done, out) };
        }
        done += len;
    }
}

/// Reduces chunk `rank` of the dtype-`d` region, value by value, into the region of
/// rank `owner`, and writes each reduced block into the regions of `push` too.
///
/// # Safety
/// Every rank posted a live region of `d` (= `E`) of the agreed length and live
/// inputs for the agreed slots; no one else reads or writes chunk `rank` of any
/// region, or the elements of any input that fall into it, in this phase.
#[inline]
unsafe fn reduce_own_chunk<E: Element>(
    round: &Round<'_>,
    header: &Header<'_>,
    d: DType,
    op: ReduceOp,
    owner: usize,
    push: Push,
) {
    let own = round.region(owner, d);
    let (lo, hi) = chunk(own.len, round.rank(), round.size());
    let slots = slot_offsets(header.slots).enumerate();
    for (k, (slot, off)) in slots.filter(|(_, (s, _))| s.dtype == d) {
        let (a, b) = (lo.max(off), hi.min(off + slot.len));
        if a >= b {
            continue;
        }
        // SAFETY: forwarded to the caller (the check found an entry per agreed slot);
        // element `a - off` of value k is within it.
        let src = |q: usize| unsafe { round.input(q, k, d, off).cast::<E>().add(a - off) };
        let dst = own.ptr::<E>().wrapping_add(a);
        // SAFETY: forwarded to the caller; `dst` is within our own chunk.
        unsafe { reduce_range::<E>(round, &src, b - a, dst, op, (push, d, a)) };
    }
}

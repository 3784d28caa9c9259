//! What a rank reads of its peers: their posts for a round that every rank opened with the
//! same call. Every dereference of memory a peer posted (its header's slices, its value
//! entries, its eager copy, its regions) goes through the [`Round`] guard and the
//! [`PeerBuf`] it hands out, here.
//!
//! # The invariant
//!
//! A [`Round`] stands for one barrier round `r` for which `post::open_round` found that
//! every rank posted the same call (or a call that pairs with it), and lasts until this
//! rank next arrives at a barrier ([`Round::close`], or the first barrier of its next
//! call, which needs the communicator the guard borrows). While it lives:
//! - every peer has posted for round `r` and is inside the same call: it wrote its post
//!   before the round's barrier, which orders those writes before our reads, and it
//!   writes the post for round `r` again at round `r + 2` at the earliest, after a barrier
//!   that we have not reached;
//! - a post with `eager` clear holds its owner's header: slices its caller lends to that
//!   call by shared reference, alive and unchanged until the call returns, which is after
//!   the round's next barrier (a stage that posts its header takes two barriers at least);
//! - a post's eager copy is written by its owner only before it posts a round, so nobody
//!   writes it while we read it (it holds round `r`'s values if `eager` is set, else those
//!   of an earlier round);
//! - once the header check has passed (`check::agree_published`), every rank's posted
//!   regions are alive until the stage's last barrier and of the lengths the agreed slots
//!   need, and its value entries hold one per agreed slot. Every access to a region, its
//!   owner's and its peers', goes through the base pointer its owner posted, so no
//!   reference of another rank covers what we touch; which elements a rank may read or
//!   write in each phase of a stage is the executor's part of the argument (each rank
//!   writes only its own chunk, or only its own output, and reads a block before anyone
//!   writes it).

use std::sync::atomic::Ordering::Relaxed;

use super::post::{Eager, Post};
use crate::comm::{Header, SlotData, Status};
use crate::sync::Barrier;
use crate::DType;

/// A peer's region of one dtype as it posted it for the round: the input's base pointer
/// and length, and the output's length (in elements). A null pointer and zero lengths
/// when it posted none.
#[derive(Clone, Copy)]
pub(super) struct PeerBuf {
    ptr: *mut u8,
    pub(super) len: usize,
    pub(super) out_len: usize,
}

impl PeerBuf {
    /// The input region's base pointer, as `E`s: every access to the region goes through
    /// it (see the module's invariant).
    #[inline]
    pub(super) fn ptr<E>(self) -> *mut E {
        self.ptr.cast()
    }

    /// Writes `block` into the region at element `at`.
    ///
    /// # Safety
    /// The header check has passed for the round (see the module's invariant): the region
    /// is alive, of `E`s, and at least `at + block.len()` long. Nobody but us reads or
    /// writes these elements in this phase of the stage, and `block` is not among them.
    #[inline]
    pub(super) unsafe fn write<E>(self, at: usize, block: &[E]) {
        // SAFETY: forwarded to the caller: the elements are within the peer's live region,
        // ours alone in this phase, and elsewhere than `block`; the write goes through
        // the base pointer the peer posted.
        unsafe {
            std::ptr::copy_nonoverlapping(block.as_ptr(), self.ptr::<E>().add(at), block.len())
        };
    }
}

/// Every rank's post for one round that every rank opened with the same call, until this
/// rank next arrives at a barrier: see the module's invariant.
pub(super) struct Round<'r> {
    barrier: &'r Barrier<Post>,
    round: u64,
    rank: usize,
    size: usize,
}

impl<'r> Round<'r> {
    /// The guard of `round`, which `rank` (of `size`) has just opened.
    ///
    /// # Safety
    /// `post::open_round` returned `round` for `rank` on `barrier`, and `rank` has not
    /// arrived at a barrier since; the guard is dropped (or closed) before it does.
    #[inline]
    pub(super) unsafe fn new(
        barrier: &'r Barrier<Post>,
        round: u64,
        rank: usize,
        size: usize,
    ) -> Self {
        Self {
            barrier,
            round,
            rank,
            size,
        }
    }

    /// This rank.
    #[inline]
    pub(super) fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    #[inline]
    pub(super) fn size(&self) -> usize {
        self.size
    }

    /// Rank `q`'s post for this round, for its atomics.
    #[inline]
    pub(super) fn post(&self, q: usize) -> &'r Post {
        self.barrier.post(q, self.round)
    }

    /// The number of ranks whose post holds an eager copy for this round.
    #[inline]
    pub(super) fn eager_posts(&self) -> usize {
        (0..self.size)
            .filter(|&q| self.post(q).eager.load(Relaxed))
            .count()
    }

    /// Rank `q`'s region of dtype `d` as it posted it (empty if it posted none).
    #[inline]
    pub(super) fn region(&self, q: usize, d: DType) -> PeerBuf {
        let post = self.post(q);
        if post.dtypes.load(Relaxed) & (1 << d.index()) == 0 {
            return PeerBuf {
                ptr: std::ptr::null_mut(),
                len: 0,
                out_len: 0,
            };
        }
        let b = &post.bufs[d.index()];
        PeerBuf {
            ptr: b.ptr.load(Relaxed),
            len: b.len.load(Relaxed),
            out_len: b.out_len.load(Relaxed),
        }
    }

    /// Rank `q`'s eager copy: its header and values for this round if its post is eager,
    /// else those of an earlier round.
    #[inline]
    pub(super) fn copy(&self, q: usize) -> &Eager {
        // SAFETY: the module's invariant: the owner wrote the copy, if at all, before it
        // posted a round whose barrier we passed, and writes it again only after a barrier
        // that we have not reached; nobody writes it while the borrow, which ends with the
        // guard's, lives.
        self.post(q).copy.with(|e| unsafe { &*e })
    }

    /// Rank `q`'s header from its eager copy: the caller's header slices are not read.
    /// Meaningful only if its post is eager.
    #[inline]
    pub(super) fn eager_header(&self, q: usize) -> Header<'_> {
        let copy = self.copy(q);
        Header {
            status: if self.post(q).failed.load(Relaxed) {
                Status::Failed
            } else {
                Status::Ok
            },
            slots: &copy.slots,
            dims: &copy.dims,
            data: &[],
        }
    }

    /// The header rank `q` published.
    ///
    /// # Safety
    /// Rank `q`'s post is not eager for this round (it published its header for it).
    #[inline]
    pub(super) unsafe fn header(&self, q: usize) -> Header<'_> {
        /// The slice at `ptr`, `len` long.
        ///
        /// # Safety
        /// `ptr`/`len` were taken from a live `&[T]` that stays borrowed for `'a`.
        unsafe fn slice<'a, T>(ptr: *mut T, len: usize) -> &'a [T] {
            if ptr.is_null() {
                &[]
            } else {
                // SAFETY: forwarded to the caller: the address and length of a live shared
                // slice, which nobody writes while it is borrowed.
                unsafe { std::slice::from_raw_parts(ptr, len) }
            }
        }
        let post = self.post(q);
        let data: *mut SlotData<'_> = post.data.load(Relaxed).cast();
        // SAFETY: the module's invariant, for a post that is not eager: the owner's caller
        // lends these slices to the call by shared reference until after the round's next
        // barrier, which we have not reached (the borrow ends with the guard's);
        // `Post::publish` stored each pointer with its slice's length.
        unsafe {
            Header {
                status: if post.failed.load(Relaxed) {
                    Status::Failed
                } else {
                    Status::Ok
                },
                slots: slice(post.slots.load(Relaxed), post.nslots.load(Relaxed)),
                dims: slice(post.dims.load(Relaxed), post.ndims.load(Relaxed)),
                data: slice(data, post.ndata.load(Relaxed)),
            }
        }
    }

    /// Rank `q`'s header, from its copy if its post is eager (it may have published no
    /// addresses), else as it published it.
    pub(super) fn posted_header(&self, q: usize) -> Header<'_> {
        if self.post(q).eager.load(Relaxed) {
            self.eager_header(q)
        } else {
            // SAFETY: the post is not eager.
            unsafe { self.header(q) }
        }
    }

    /// Where rank `q`'s value `k`, of dtype `d` at `offset` in its region, starts: its lent
    /// elements, or its place in the region.
    ///
    /// # Safety
    /// The header check has passed for the round, and no post is eager: rank `q`'s value
    /// entries are alive and unchanged (its caller lends them to the call by shared
    /// reference), one per agreed slot, and `k` is an agreed slot.
    #[inline]
    pub(super) unsafe fn input(&self, q: usize, k: usize, d: DType, offset: usize) -> *const u8 {
        let data: *const SlotData<'_> = self.post(q).data.load(Relaxed).cast();
        // SAFETY: forwarded to the caller: entry `k` is among rank q's live entries.
        let data = unsafe { data.add(k).read() };
        match data.lent_ptr() {
            Some(ptr) => ptr,
            // The value lies in q's region at its place in the layout, which the check
            // found long enough for every slot.
            None => self
                .region(q, d)
                .ptr::<u8>()
                .cast_const()
                .wrapping_add(offset * d.size()),
        }
    }

    /// The stage's last barrier: every rank passed the first, so every rank comes here in
    /// bounded time, and none may leave before the others are done reading its buffers
    /// (an abort meanwhile is seen at the next round's first barrier). That holds because
    /// nothing between a stage's barriers can panic or block: no user code runs there,
    /// only the checked layout and the reduction kernels of the sealed element types.
    /// The guard ends here.
    #[inline]
    pub(super) fn close(self) {
        if self.size > 1 {
            self.barrier.wait_all(self.rank);
        }
    }
}

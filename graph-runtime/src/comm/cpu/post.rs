//! What a rank posts for a round, and how a round opens: the rank posts its call (and, for
//! a stage, its header and regions, or its eager copy), waits at the round's barrier, and
//! checks that every rank posted the same call for this very round. Only then may anything
//! a peer posted be dereferenced (see `peer.rs`, which does that).
//!
//! Everything here is the owner's side: stores into its own post before the barrier, and
//! the loads of the peers' atomics that the call check needs, which dereference nothing.

use std::sync::atomic::Ordering::Relaxed;

use smallvec::SmallVec;

use super::plan::EAGER_BYTES_CROWDED;
use crate::comm::{
    Call, Collective, Disagreement, Header, RegionMut, SlotData, SlotDesc, StageError,
};
use crate::sync::prims::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, UnsafeCell};
use crate::sync::Barrier;
use crate::{DType, ReduceOp};

/// A round no barrier ever reaches: what an unused post says.
pub(super) const NO_ROUND: u64 = u64::MAX;

/// What a rank publishes for one call: the round and the call, then, for a stage, its
/// status, the addresses of its header's slices (in its caller's hands for the whole call)
/// and of its regions, unless its eager copy holds them (then the addresses are those of
/// an earlier round, which nobody reads). Every field is an atomic written before the
/// round's barrier with a relaxed store: the barrier orders them (and what they point to)
/// before every peer's reads, and a peer whose calls are out of step with ours reads a
/// stale or a newer value, never a torn one, and dereferences nothing (see the module's
/// docs).
///
/// The fields come in the order a peer reads them, right after the owner's count of
/// arrivals in the barrier, and an eager stage reads only those up to `copy`, whose storage
/// is inline: a peer then reads a few adjacent lines at fixed addresses, the first of which
/// it has just fetched to see the arrival, instead of following pointers from line to
/// line, each a cache miss that waits for the last.
#[repr(C)]
pub(super) struct Post {
    pub(super) round: AtomicU64,
    /// The call, [encoded](encode) with its root apart.
    pub(super) call: AtomicU64,
    pub(super) root: AtomicUsize,
    pub(super) failed: AtomicBool,
    /// Whether `copy` holds this round's header and values (a small allreduce, see
    /// [`Eager`]).
    pub(super) eager: AtomicBool,
    pub(super) copy: UnsafeCell<Eager>,
    /// Bit `d`: whether `bufs[d]` holds a region of dtype index `d` (else there is none).
    pub(super) dtypes: AtomicU32,
    pub(super) slots: AtomicPtr<SlotDesc>,
    pub(super) nslots: AtomicUsize,
    pub(super) dims: AtomicPtr<usize>,
    pub(super) ndims: AtomicUsize,
    /// Where each value's input elements are: `ndata` entries.
    pub(super) data: AtomicPtr<SlotData<'static>>,
    pub(super) ndata: AtomicUsize,
    /// By dtype index: the input region's base pointer and length, and the output
    /// region's length (its address is never needed by a peer: each rank writes only its
    /// own output).
    pub(super) bufs: [PostedBuf; DType::COUNT],
}

// SAFETY: every field but `copy` is an atomic. `copy` is written by its owner only before
// it posts a round (`open_round`'s `publish`) and read by peers only after that round's
// barrier and before they arrive at the next one; the owner writes the same post again
// two rounds later, after the next barrier, which no peer passes before it is done
// reading: the barrier orders every write before every read of it, and every read before
// the next write (see `Round::copy` in `peer.rs`).
unsafe impl Sync for Post {}

/// A rank's own copy of a small allreduce's header and input values, in its post: with
/// them in memory the communicator owns, a peer never reads the caller's memory, so no
/// rank has to wait for its peers to finish reading before it returns, and the stage takes
/// one barrier instead of two (see `Plan::Eager`; the eager executor fills and reads it).
///
/// The payload comes first, next to the post's round (the lines that change every round),
/// and the rest is written only when it changes: from one execution to the next it
/// rarely does, so the peers keep those lines in their caches instead of fetching them
/// again from this rank's core.
#[derive(Default)]
#[repr(C)]
pub(super) struct Eager {
    /// Each dtype's values back to back in bucket order, the dtypes in [`DType::ALL`]
    /// order, each starting at a multiple of 8 bytes (see `eager::sections`). Inline up
    /// to [`EAGER_BYTES_CROWDED`] of one dtype.
    pub(super) payload: SmallVec<[u64; EAGER_BYTES_CROWDED / 8]>,
    /// Whether the values were copied: the data matched the slots and every region held
    /// exactly its slots (what the buffer check checks of every rank). When every rank
    /// copied, nobody reads a peer's regions.
    pub(super) copied: bool,
    /// Whether the data matched the slots (what the buffer check checks of every rank).
    pub(super) fits: bool,
    pub(super) slots: SmallVec<[SlotDesc; 2]>,
    pub(super) dims: SmallVec<[usize; 4]>,
}

/// One dtype's regions as a rank posts them (see [`Post::bufs`]); `peer.rs` reads them.
pub(super) struct PostedBuf {
    pub(super) ptr: AtomicPtr<u8>,
    pub(super) len: AtomicUsize,
    pub(super) out_len: AtomicUsize,
}

/// One dtype's regions, as this rank passed them to `stage`: the base pointers that every
/// access of the stage goes through, and the lengths in elements.
#[derive(Clone, Copy)]
pub(super) struct Buf {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    pub(super) out: *mut u8,
    pub(super) out_len: usize,
}

impl Buf {
    pub(super) const EMPTY: Buf = Buf {
        ptr: std::ptr::null_mut(),
        len: 0,
        out: std::ptr::null_mut(),
        out_len: 0,
    };
}

/// A length no real region has: marks a dtype passed twice, so that the check fails.
const DUPLICATE: usize = usize::MAX;

/// Each region's base pointer, taken once, before any peer can see it: every access to a
/// region in this stage, ours and the peers', goes through it, and the caller's `&mut`
/// slices are not touched again before the stage returns. `bufs` starts empty; it is
/// filled in place rather than returned, which would copy the whole array at every stage.
#[inline]
pub(super) fn own_bufs(
    bufs: &mut [Buf; DType::COUNT],
    regions: &mut [RegionMut<'_>],
    outputs: &mut [RegionMut<'_>],
) {
    for region in regions.iter_mut() {
        let b = &mut bufs[region.dtype().index()];
        b.len = if b.ptr.is_null() {
            region.len()
        } else {
            DUPLICATE
        };
        b.ptr = region.as_mut_ptr();
    }
    for out in outputs.iter_mut() {
        let b = &mut bufs[out.dtype().index()];
        b.out_len = if b.out.is_null() {
            out.len()
        } else {
            DUPLICATE
        };
        b.out = out.as_mut_ptr();
    }
}

impl Default for Post {
    fn default() -> Self {
        Self {
            round: AtomicU64::new(NO_ROUND),
            call: AtomicU64::new(0),
            root: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            slots: AtomicPtr::new(std::ptr::null_mut()),
            nslots: AtomicUsize::new(0),
            dims: AtomicPtr::new(std::ptr::null_mut()),
            ndims: AtomicUsize::new(0),
            data: AtomicPtr::new(std::ptr::null_mut()),
            ndata: AtomicUsize::new(0),
            dtypes: AtomicU32::new(0),
            bufs: std::array::from_fn(|_| PostedBuf {
                ptr: AtomicPtr::new(std::ptr::null_mut()),
                len: AtomicUsize::new(0),
                out_len: AtomicUsize::new(0),
            }),
            eager: AtomicBool::new(false),
            copy: UnsafeCell::new(Eager::default()),
        }
    }
}

impl Post {
    /// Publishes a stage's header and regions (the round, call and status come after).
    #[inline]
    pub(super) fn publish(&self, header: &Header<'_>, bufs: &[Buf; DType::COUNT]) {
        // The pointers are only read back, by `Round::header`, as shared slices: the
        // `cast_mut`s are for `AtomicPtr`'s type alone.
        self.slots.store(header.slots.as_ptr().cast_mut(), Relaxed);
        self.nslots.store(header.slots.len(), Relaxed);
        self.dims.store(header.dims.as_ptr().cast_mut(), Relaxed);
        self.ndims.store(header.dims.len(), Relaxed);
        let data: *const SlotData<'_> = header.data.as_ptr();
        self.data.store(data.cast_mut().cast(), Relaxed);
        self.ndata.store(header.data.len(), Relaxed);
        // Only the dtypes passed: a stage of one dtype writes (and its peers read) one
        // entry, not ten.
        let mut mask = 0;
        for (d, (posted, b)) in self.bufs.iter().zip(bufs).enumerate() {
            if b.len > 0 || b.out_len > 0 {
                mask |= 1 << d;
                posted.ptr.store(b.ptr, Relaxed);
                posted.len.store(b.len, Relaxed);
                posted.out_len.store(b.out_len, Relaxed);
            }
        }
        self.dtypes.store(mask, Relaxed);
    }
}

/// A call as one word and a root, for a post's atomics.
#[inline]
pub(super) fn encode(call: Call) -> (u64, usize) {
    let op = |op: ReduceOp| ReduceOp::ALL.iter().position(|&o| o == op).unwrap_or(0) as u64;
    let (tag, op, root) = match call {
        Call::Stage(Collective::AllReduce(o)) => (1, op(o), 0),
        Call::Stage(Collective::AllGather) => (2, 0, 0),
        Call::Stage(Collective::ReduceScatter(o)) => (3, op(o), 0),
        Call::Stage(Collective::Broadcast { root }) => (4, 0, root),
        Call::Stage(Collective::Reduce { op: o, root }) => (5, op(o), root),
        Call::ExchangeResults => (6, 0, 0),
        Call::Launched => (7, 0, 0),
    };
    (tag | op << 8, root)
}

/// The call `encode` gave `(code, root)` for; `None` for a post never written.
pub(super) fn decode(code: u64, root: usize) -> Option<Call> {
    let op = *ReduceOp::ALL.get((code >> 8) as usize)?;
    Some(match code & 0xff {
        1 => Call::Stage(Collective::AllReduce(op)),
        2 => Call::Stage(Collective::AllGather),
        3 => Call::Stage(Collective::ReduceScatter(op)),
        4 => Call::Stage(Collective::Broadcast { root }),
        5 => Call::Stage(Collective::Reduce { op, root }),
        6 => Call::ExchangeResults,
        7 => Call::Launched,
        _ => return None,
    })
}

/// Opens the next barrier round of `rank` (of `size`) for `call`: fills in its post
/// (`publish` first, then the call, the status and the round), waits at the round's
/// barrier, and checks that every rank made the same call for this round. Returns the
/// round; from then until this rank's next barrier, the peers' posts for it may be
/// dereferenced (see `peer::Round`).
///
/// `failed`: whether this rank joins a stage as failed (see [`Call::pairs_with`]). The
/// error: [`StageError::Aborted`], or [`Disagreement::Calls`] when the calls differ, which
/// every rank then returns alike, without another barrier.
#[inline]
pub(super) fn open_round(
    barrier: &Barrier<Post>,
    rank: usize,
    size: usize,
    call: Call,
    failed: bool,
    publish: impl FnOnce(&Post),
) -> Result<u64, StageError> {
    // Our count of arrivals moves only when we arrive: it is the round that the wait
    // below completes, the same on every rank that passes it.
    let round = barrier.generation(rank);
    let (code, root) = encode(call);
    let mine = barrier.post(rank, round);
    publish(mine);
    mine.call.store(code, Relaxed);
    mine.root.store(root, Relaxed);
    mine.failed.store(failed, Relaxed);
    mine.round.store(round, Relaxed);
    // Alone, there is nobody to wait for: a group of one runs the same code, barriers
    // aside (as before, a group of one cannot be aborted mid-stage either).
    if size > 1 {
        barrier.wait(rank).map_err(|_| StageError::Aborted)?;
    }
    let post = |q: usize| barrier.post(q, round);
    let same = |p: &Post| {
        p.round.load(Relaxed) == round
            && p.call.load(Relaxed) == code
            && p.root.load(Relaxed) == root
    };
    if (0..size).all(|q| same(post(q))) {
        return Ok(round);
    }
    // Not the very same call everywhere: still a match if a rank joins as failed.
    let posted = |q: usize| {
        let p = post(q);
        (p.round.load(Relaxed) == round)
            .then(|| decode(p.call.load(Relaxed), p.root.load(Relaxed)))
            .flatten()
    };
    let any_failed = (0..size).any(|q| post(q).failed.load(Relaxed));
    let pairs = |q| posted(q).is_some_and(|c| c.pairs_with(call, any_failed));
    if (0..size).all(pairs) {
        return Ok(round);
    }
    // Every rank reads the same posts (none is written again before every rank has
    // passed the next barrier, which none of them reaches now), so every rank gets
    // this same verdict and stops here, without another barrier.
    let calls = (0..size).map(posted).collect();
    Err(StageError::Disagreed(Disagreement::Calls { calls }))
}

//! The shared-memory communicator: ranks are threads of this process.
//!
//! A stage is one sequence of barrier epochs over every dtype region at once. First every
//! rank posts its call (the collective, with its op and root), its header and the
//! addresses of its regions, then waits at the barrier; each rank then checks that every
//! rank posted the same call for this barrier round, and only then reads the headers and
//! reaches the same verdict. Then the payload, reading the peers' buffers directly (no
//! locks: the barriers order every write before the reads of it, and a final barrier keeps
//! every buffer alive and unchanged until no peer reads it):
//!
//! | collective | after the header epoch | barriers |
//! | --- | --- | --- |
//! | allreduce of at most 256 B per rank (`EAGER_BYTES`; 1 KiB when the ranks outnumber the cores) | nothing: every rank copied its header and values into its post before the barrier (see `Eager`), and now checks every copy and reduces all of them, in rank order, into its own region | 1 |
//! | allreduce | rank r reduces its 1/N chunk of every region, in rank order, block by block, and writes each block into every rank's region | 2 |
//! | allreduce of 256 KiB or more | the same, but each block goes into rank 0's region only, which rank 0 then hands to every rank (`exchange_results`) | 3 |
//! | reduce | the same, but writes each block into the root's region only | 2 |
//! | reducescatter | rank r reduces its chunk of every value, in rank order, into its output region | 2 |
//! | allgather | rank r copies every rank's part of every value into its output region | 2 |
//! | broadcast | every rank but the root copies the root's regions over its own | 2 |
//!
//! Inputs are read where they are (`Header::data`): in the values themselves when they
//! lend their elements, else at their place in the packed region. Each element is reduced
//! exactly once, by one rank, in rank order, and everything else is a copy (or, for a
//! shared result, the same memory), so every rank holds bitwise-identical results; in an
//! eager allreduce every rank reduces every element, with the same kernels over the same
//! copies in the same rank order, which gives the same bits.
//!
//! # What makes it sound whatever the callers do
//!
//! The communicator is public: code in other crates may call `stage` and
//! `exchange_results` in any order, with any arguments, on any rank. None of it can make a
//! rank read memory that a peer no longer keeps or is writing:
//! - Each post is tied to one barrier round (the rank's count of its barrier waits, which
//!   is the same on every rank for the waits that pass together) and names its call.
//!   After the round's barrier, a rank reads every peer's round and call from atomics,
//!   and dereferences nothing a peer posted unless every rank made the same call for this
//!   very round. A rank that posted for the round is inside the same call, and stays in
//!   it until the call's last barrier.
//! - When the calls differ, every rank sees the same posts and returns the same
//!   [`Disagreement::Calls`]; the ranks no longer pair their calls, so each endpoint is
//!   broken from then on, and every later call fails at once with the same error: no
//!   rank waits at a barrier that the others will not reach. (The limit: a rank that
//!   simply stops calling, or calls `stage` more often than its peers before they notice,
//!   still leaves its peers at the barrier until the group is aborted, as a rank stuck in
//!   a method would; it never makes them read anything.)
//! - Then the headers are checked ([`agree`]) and every rank's buffers against them, and
//!   the payload touches only memory the checked layout gives it. Each rank takes the
//!   base pointer of each of its regions once, before it posts, and from then on every
//!   access to the region, its own and its peers', goes through that pointer; no rank
//!   creates a reference over memory that another rank may touch at the same time (a
//!   kernel's slices cover one block of one rank's chunk, which only that rank touches in
//!   that phase).

use std::any::TypeId;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::reduce::{fold_block, needs_acc, BLOCK};
use super::{
    agree, AbortHandle, Backend, Call, Collective, Communicator, Disagreement, Header, RegionMut,
    SharedBuffers, SlotData, SlotDesc, StageError, Status,
};
use crate::element::with_dtype;
use crate::sync::prims::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, UnsafeCell};
use crate::sync::Barrier;
use crate::{DType, Element, Error, ReduceOp};
use smallvec::SmallVec;

/// The shared-memory CPU backend, the default: no set-up, ranks are the actor threads.
///
/// ```
/// use actorgraph::{Backend, Communicator, Cpu};
/// let comms = Cpu::default().communicators(3)?;
/// assert_eq!(comms[2].rank(), 2);
/// assert_eq!(comms[2].size(), 3);
/// # Ok::<(), actorgraph::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

impl Backend for Cpu {
    type Comm = CpuComm;

    fn communicators(&self, size: usize) -> Result<Vec<CpuComm>, Error> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let shared = Arc::new(Shared {
            barrier: Barrier::new(size),
            eager_bytes: if size > cores {
                EAGER_BYTES_CROWDED
            } else {
                EAGER_BYTES
            },
            mailbox: std::sync::Mutex::new(
                (0..size).map(|_| (NO_ROUND, Default::default())).collect(),
            ),
        });
        Ok((0..size)
            .map(|rank| CpuComm {
                rank,
                size,
                shared: Arc::clone(&shared),
                round: NO_ROUND,
                broken: None,
            })
            .collect())
    }
}

/// One rank's endpoint of a [`Cpu`] communicator.
///
/// Every rank must make the same calls in the same order; when they do not, every rank
/// gets [`Disagreement::Calls`] (see [`Call`]) and the communicator is broken for good:
/// every later call returns that error again, at once.
pub struct CpuComm {
    rank: usize,
    size: usize,
    shared: Arc<Shared>,
    /// The barrier round of the call in progress (see `open_round`).
    round: u64,
    /// Set when the ranks' calls disagreed: they no longer pair up.
    broken: Option<Disagreement>,
}

struct Shared {
    /// The barrier, with each rank's posts beside its arrivals: two per rank, for even and
    /// odd rounds. A rank writes a post again for round r + 2 at the earliest, so after
    /// the barrier of round r + 1, which every peer reaches only once it is done reading
    /// the post of round r.
    barrier: Barrier<Post>,
    /// The largest allreduce, in bytes per rank, that runs eagerly (see [`Eager`]): the
    /// same for every rank, so that they all take the same path.
    eager_bytes: usize,
    /// Per rank, the result buffers rank 0 hands it after a stage that shares results
    /// (see `SHARE_BYTES`), with the round of the exchange. Each rank takes its own entry,
    /// so the box is empty again without another barrier.
    mailbox: std::sync::Mutex<Vec<(u64, SharedBuffers)>>,
}

impl Shared {
    fn mailbox(&self) -> std::sync::MutexGuard<'_, Vec<(u64, SharedBuffers)>> {
        self.mailbox.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A round no barrier ever reaches: what an unused post says.
const NO_ROUND: u64 = u64::MAX;

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
/// line, each a cache miss that waits for the last (issue 16: ~0.2 µs each here).
#[repr(C)]
struct Post {
    round: AtomicU64,
    /// The call, [encoded](encode) with its root apart.
    call: AtomicU64,
    root: AtomicUsize,
    failed: AtomicBool,
    /// Whether `copy` holds this round's header and values (a small allreduce, see
    /// [`Eager`]).
    eager: AtomicBool,
    copy: UnsafeCell<Eager>,
    /// Bit `d`: whether `bufs[d]` holds a region of dtype index `d` (else there is none).
    dtypes: AtomicU32,
    slots: AtomicPtr<SlotDesc>,
    nslots: AtomicUsize,
    dims: AtomicPtr<usize>,
    ndims: AtomicUsize,
    /// Where each value's input elements are: `ndata` entries.
    data: AtomicPtr<SlotData<'static>>,
    ndata: AtomicUsize,
    /// By dtype index: the input region's base pointer and length, and the output
    /// region's length (its address is never needed by a peer: each rank writes only its
    /// own output).
    bufs: [PostedBuf; DType::COUNT],
}

// SAFETY: every field but `copy` is an atomic. `copy` is written by its owner only before
// it posts a round (`open_round`'s `publish`) and read by peers only after that round's
// barrier and before they arrive at the next one; the owner writes the same post again
// two rounds later, after the next barrier, which no peer passes before it is done
// reading: the barrier orders every write before every read of it, and every read before
// the next write (see `Post::eager_copy`).
unsafe impl Sync for Post {}

/// A rank's own copy of a small allreduce's header and input values, in its post: with
/// them in memory the communicator owns, a peer never reads the caller's memory, so no
/// rank has to wait for its peers to finish reading before it returns, and the stage takes
/// one barrier instead of two. After it, every rank checks every copied header and reduces
/// every rank's copy, in rank order, into its own region: the same kernels over the same
/// inputs in the same order, so every rank holds bitwise-identical results.
///
/// The payload comes first, next to the post's round (the lines that change every round),
/// and the rest is written only when it changes: from one execution to the next it
/// rarely does, so the peers keep those lines in their caches instead of fetching them
/// again from this rank's core.
#[derive(Default)]
#[repr(C)]
struct Eager {
    /// Each dtype's values back to back in bucket order, the dtypes in [`DType::ALL`]
    /// order, each starting at a multiple of 8 bytes (see [`eager_sections`]). Inline up
    /// to [`EAGER_BYTES_CROWDED`] of one dtype.
    payload: SmallVec<[u64; EAGER_BYTES_CROWDED / 8]>,
    /// Whether the values were copied: the data matched the slots and every region held
    /// exactly its slots (what `check_buffers` checks of every rank). When every rank
    /// copied, nobody reads a peer's regions.
    copied: bool,
    /// Whether the data matched the slots (what `check_buffers` checks of every rank).
    fits: bool,
    slots: SmallVec<[SlotDesc; 2]>,
    dims: SmallVec<[usize; 4]>,
}

/// Makes `v` hold `new`, writing nothing when it already does (see [`Eager`]).
fn refill<A: smallvec::Array>(v: &mut SmallVec<A>, new: &[A::Item])
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
fn set(flag: &mut bool, new: bool) {
    if *flag != new {
        *flag = new;
    }
}

/// An allreduce of at most this many bytes per rank runs eagerly (see [`Eager`]): each
/// rank copies its values in, and reads every peer's copy. Above it, reading N whole
/// copies costs more than the second barrier it saves: on a quiet 2-core machine 1 KiB
/// over 2 ranks took 2.4-2.5 µs eagerly against 2.1-2.2 µs with two barriers, while 4 B
/// over 4 ranks took 4.6-4.7 µs against 5.5-5.6 µs (BENCHMARKS.md, issue 16). (Under
/// Miri, 32 B, and under loom 4 B, so that tests and models reach both paths with few
/// elements.)
const EAGER_BYTES: usize = if cfg!(loom) {
    4
} else if cfg!(miri) {
    32
} else {
    256
};

/// [`EAGER_BYTES`] when the ranks outnumber the cores: then at least one rank is not
/// running when the others arrive at a barrier, so each barrier waits for the scheduler,
/// and saving one pays for reading larger copies. 1 KiB over 4 ranks on 2 cores took
/// 5.1-5.7 µs eagerly against 5.9-6.5 µs with two barriers, while over 2 ranks (as many as
/// the cores) two barriers stayed faster (BENCHMARKS.md, issue 16). (Under Miri and loom,
/// `EAGER_BYTES`: the tests' limits do not depend on the machine there.)
const EAGER_BYTES_CROWDED: usize = if cfg!(any(loom, miri)) {
    EAGER_BYTES
} else {
    1024
};

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
fn eager_sections(want: &[usize; DType::COUNT]) -> ([usize; DType::COUNT], usize) {
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
    unsafe fn fill(&mut self, header: &Header<'_>, bufs: &[Buf; DType::COUNT]) -> bool {
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
        let (at, end) = eager_sections(&want);
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
            // in the payload, sized by `eager_sections` for the same slots; our own
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

/// Each dtype's element count over `slots`.
fn wanted(slots: &[SlotDesc]) -> Result<[usize; DType::COUNT], Disagreement> {
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
fn data_fits(slots: &[SlotDesc], data: &[SlotData<'_>]) -> bool {
    data.len() == slots.len()
        && data.iter().zip(slots).all(|(data, slot)| {
            slot.len == 0 || (data.dtype() == slot.dtype && data.len() == slot.len)
        })
}

struct PostedBuf {
    ptr: AtomicPtr<u8>,
    len: AtomicUsize,
    out_len: AtomicUsize,
}

/// One dtype's regions, as this rank passed them to `stage`: the base pointers that every
/// access of the stage goes through, and the lengths in elements.
#[derive(Clone, Copy)]
struct Buf {
    ptr: *mut u8,
    len: usize,
    out: *mut u8,
    out_len: usize,
}

impl Buf {
    const EMPTY: Buf = Buf {
        ptr: std::ptr::null_mut(),
        len: 0,
        out: std::ptr::null_mut(),
        out_len: 0,
    };
}

/// A length no real region has: marks a dtype passed twice, so that the check fails.
const DUPLICATE: usize = usize::MAX;

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
    /// The eager copy its owner made for the current round.
    ///
    /// # Safety
    /// Every rank posted the same call for the current round (checked by `open_round`),
    /// this post with `eager` set, and the caller has not yet arrived at the round's next
    /// barrier: the owner wrote the copy before the round's barrier and writes it again
    /// only after the next one.
    unsafe fn eager_copy(&self) -> &Eager {
        // SAFETY: forwarded to the caller; nobody writes the copy while it is borrowed.
        self.copy.with(|e| unsafe { &*e })
    }

    /// [`Post::header`] from the eager copy: the caller's own header slices are not read.
    ///
    /// # Safety
    /// As for [`Post::eager_copy`].
    unsafe fn eager_header(&self) -> Header<'_> {
        // SAFETY: forwarded to the caller.
        let copy = unsafe { self.eager_copy() };
        Header {
            status: if self.failed.load(Relaxed) {
                Status::Failed
            } else {
                Status::Ok
            },
            slots: &copy.slots,
            dims: &copy.dims,
            data: &[],
        }
    }

    /// Publishes a stage's header and regions (the round, call and status come after).
    fn publish(&self, header: &Header<'_>, bufs: &[Buf; DType::COUNT]) {
        // The pointers are only read back, by `header`, as shared slices: the `cast_mut`s
        // are for `AtomicPtr`'s type alone.
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

    /// The header its owner published.
    ///
    /// # Safety
    /// The post is for the current round, and every rank made the same `stage` call for
    /// it (checked by `open_round`); the caller has not yet reached the round's next
    /// barrier. Its owner is then inside that call, which borrows the header's slices
    /// immutably until it returns, after that barrier.
    unsafe fn header(&self) -> Header<'_> {
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
        let data: *mut SlotData<'_> = self.data.load(Relaxed).cast();
        // SAFETY: see above; `publish` stored each pointer with its slice's length.
        unsafe {
            Header {
                status: if self.failed.load(Relaxed) {
                    Status::Failed
                } else {
                    Status::Ok
                },
                slots: slice(self.slots.load(Relaxed), self.nslots.load(Relaxed)),
                dims: slice(self.dims.load(Relaxed), self.ndims.load(Relaxed)),
                data: slice(data, self.ndata.load(Relaxed)),
            }
        }
    }

    /// Its owner's regions of dtype `d`: the input's base pointer and length, and the
    /// output's length.
    fn buf(&self, d: DType) -> (*mut u8, usize, usize) {
        if self.dtypes.load(Relaxed) & (1 << d.index()) == 0 {
            return (std::ptr::null_mut(), 0, 0);
        }
        let b = &self.bufs[d.index()];
        (
            b.ptr.load(Relaxed),
            b.len.load(Relaxed),
            b.out_len.load(Relaxed),
        )
    }
}

/// A call as one word and a root, for a post's atomics.
fn encode(call: Call) -> (u64, usize) {
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
fn decode(code: u64, root: usize) -> Option<Call> {
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

/// Turns a panic between a round's first and last barrier into an abort: peers may be
/// reading this rank's regions and header there, so its frame must not unwind away.
/// Nothing there can panic (no user code runs between those barriers, only the checked
/// layout and the kernels); this only makes a bug in them fail loudly instead of unsoundly.
struct NoUnwind;

impl Drop for NoUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            std::process::abort();
        }
    }
}

impl CpuComm {
    fn post(&self, q: usize) -> &Post {
        self.shared.barrier.post(q, self.round)
    }

    /// Fails at once once the ranks' calls have disagreed.
    fn check_unbroken(&self) -> Result<(), StageError> {
        match &self.broken {
            Some(why) => Err(StageError::Disagreed(why.clone())),
            None => Ok(()),
        }
    }

    /// Posts `call` for the next barrier round (after `publish` has filled in the rest of
    /// the post), waits at the round's barrier, and checks that every rank made the same
    /// call for this round: only then may a peer's post be dereferenced.
    /// `failed`: whether this rank joins a stage as failed (see [`Call::pairs_with`]).
    fn open_round(
        &mut self,
        call: Call,
        failed: bool,
        publish: impl FnOnce(&Post),
    ) -> Result<(), StageError> {
        // Our count of arrivals moves only when we arrive: it is the round that the wait
        // below completes, the same on every rank that passes it.
        self.round = self.shared.barrier.generation(self.rank);
        let (code, root) = encode(call);
        let mine = self.post(self.rank);
        publish(mine);
        mine.call.store(code, Relaxed);
        mine.root.store(root, Relaxed);
        mine.failed.store(failed, Relaxed);
        mine.round.store(self.round, Relaxed);
        self.wait()?;
        let same = |p: &Post| {
            p.round.load(Relaxed) == self.round
                && p.call.load(Relaxed) == code
                && p.root.load(Relaxed) == root
        };
        if (0..self.size).all(|q| same(self.post(q))) {
            return Ok(());
        }
        // Not the very same call everywhere: still a match if a rank joins as failed.
        let posted = |q: usize| {
            let p = self.post(q);
            (p.round.load(Relaxed) == self.round)
                .then(|| decode(p.call.load(Relaxed), p.root.load(Relaxed)))
                .flatten()
        };
        let any_failed = (0..self.size).any(|q| self.post(q).failed.load(Relaxed));
        let pairs = |q| posted(q).is_some_and(|c| c.pairs_with(call, any_failed));
        if (0..self.size).all(pairs) {
            return Ok(());
        }
        // Every rank reads the same posts (none is written again before every rank has
        // passed the next barrier, which none of them reaches now), so every rank gets
        // this same verdict and stops here, without another barrier.
        let calls = (0..self.size).map(posted).collect();
        let why = Disagreement::Calls { calls };
        self.broken = Some(why.clone());
        // Results rank 0 left for us will never be taken: let them go now.
        self.shared.mailbox()[self.rank] = (NO_ROUND, SharedBuffers::default());
        Err(StageError::Disagreed(why))
    }
}

impl Communicator for CpuComm {
    fn rank(&self) -> usize {
        self.rank
    }

    // Nothing here is bound to a thread: the peers meet in memory this process shares.
    fn runs_on_any_thread(&self) -> bool {
        true
    }

    fn size(&self) -> usize {
        self.size
    }

    fn stage(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        regions: &mut [RegionMut<'_>],
        outputs: &mut [RegionMut<'_>],
    ) -> Result<(), StageError> {
        self.check_unbroken()?;
        // Each region's base pointer, taken once, before any peer can see it: every access
        // to a region in this stage, ours and the peers', goes through it, and the `&mut`
        // slices are not touched again before the stage returns.
        let mut bufs = [Buf::EMPTY; DType::COUNT];
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
        let failed = header.status == Status::Failed;
        // Small allreduces take one barrier (see `Eager`); a failed rank joins them with
        // an empty copy. Whether the stage runs eagerly is decided after the barrier, from
        // every post alike: only if every rank copied.
        let eager = match collective {
            Collective::AllReduce(op) if self.size > 1 => {
                let bytes = header.slots.iter().fold(0usize, |sum, s| {
                    sum.saturating_add(s.len.saturating_mul(s.dtype.size()))
                });
                (failed || bytes <= self.shared.eager_bytes).then_some(op)
            }
            _ => None,
        };
        self.open_round(Call::Stage(collective), failed, |post| {
            post.eager.store(eager.is_some(), Relaxed);
            // SAFETY: the caller's header and regions are live and ours for the call.
            // Aliasing: no peer reads this post's copy now (it was last read for the round
            // two before, before every peer arrived at the barrier we passed to get here),
            // and we post it only after this write.
            let copied = eager.is_some()
                && post
                    .copy
                    .with_mut(|copy| unsafe { (*copy).fill(header, &bufs) });
            // A rank whose copy holds its values publishes no addresses: no peer reads
            // them (see `eager_stage` and `mixed_verdict`), and the stores would take
            // lines from the peers at every stage, a third of a 2-rank stage's time
            // (BENCHMARKS.md, issue 16).
            if !copied {
                post.publish(header, &bufs);
            }
        })?;
        let eager_posts = (0..self.size)
            .filter(|&q| self.post(q).eager.load(Relaxed))
            .count();
        if let Some(op) = eager.filter(|_| eager_posts == self.size) {
            return self.eager_stage(header, collective, op, &bufs);
        }
        // From here until the last barrier, peers may read our header and regions.
        let armed = NoUnwind;
        if eager_posts > 0 {
            let why = self.mixed_verdict(collective);
            self.wait_all();
            drop(armed);
            return Err(StageError::Disagreed(why));
        }

        // SAFETY: `open_round` checked that every rank made this call for this round, so
        // every post is its owner's for this round, and its owner stays in this call until
        // the round's next barrier, which we have not reached: the header slices it points
        // to are alive, and nobody writes them (their owner's caller lends them to `stage`
        // by shared reference).
        let verdict = agree(self.size, collective, |q| unsafe { self.post(q).header() });
        // SAFETY: as above.
        let verdict = verdict.and_then(|()| unsafe { self.check_buffers(header, collective) });
        if let Err(why) = verdict {
            // Every rank reaches this verdict, but a slower peer may still be reading our
            // header, whose slices live in the caller's fused stage: with executions in
            // flight, a rank that returned now could reach this stage again in the next
            // execution and rewrite them. Return only once every rank is done reading (a
            // barrier that costs only on this failure path).
            self.wait_all();
            drop(armed);
            return Err(StageError::Disagreed(why));
        }

        // From here on, the verdict says every rank posted, for each dtype, an input region
        // of the length its slots add up to and an output region of the length the
        // collective needs, all alive until the stage's last barrier, and input data for
        // every slot that matches it.
        match collective {
            Collective::AllReduce(op) | Collective::Reduce { op, .. } => {
                // Shared results: everyone writes its chunk into rank 0's regions only.
                let (owner, push) = match collective.root() {
                    Some(root) => (self.rank, Push::To(root)),
                    None if self.shares_results(collective, header) => (0, Push::None),
                    None => (self.rank, Push::All),
                };
                for d in DType::ALL.into_iter().filter(|d| bufs[d.index()].len > 0) {
                    // SAFETY: see above for validity. Aliasing: in this phase the elements
                    // of chunk `rank` of every region, and of every value, are read and
                    // written by us alone (each rank reduces its own chunk, and reads every
                    // rank's block before it writes it anywhere); every access to a region
                    // goes through the base pointer its owner posted, so no reference of
                    // another rank covers them.
                    with_dtype!(d, E => unsafe { self.reduce_own_chunk::<E>(header, d, op, owner, push) });
                }
            }
            Collective::ReduceScatter(op) => {
                let slots = slot_offsets(header.slots).enumerate();
                for (k, (slot, offset)) in slots.filter(|(_, (s, _))| s.len > 0) {
                    let out = bufs[slot.dtype.index()].out;
                    // SAFETY: see above for validity. Aliasing: inputs are read-only in
                    // this phase (lent values are borrowed immutably, and nobody writes a
                    // region for this collective), and only we write our output region,
                    // through its base pointer.
                    with_dtype!(slot.dtype, E => unsafe {
                        self.reduce_scatter_slot::<E>(k, slot, offset, out.cast(), op)
                    });
                }
            }
            Collective::AllGather => {
                let slots = slot_offsets(header.slots).enumerate();
                for (k, (slot, offset)) in slots.filter(|(_, (s, _))| s.len > 0) {
                    let out = bufs[slot.dtype.index()].out;
                    // SAFETY: as for ReduceScatter.
                    unsafe { self.gather_slot(k, slot, offset, out) };
                }
            }
            Collective::Broadcast { root } => {
                let slots = slot_offsets(header.slots).enumerate();
                for (k, (slot, offset)) in slots.filter(|(_, (s, _))| s.len > 0) {
                    // SAFETY: see above for validity. Aliasing: nobody writes the root's
                    // inputs in this phase (the root writes its region only at the places
                    // of values it lent, which peers read from the lent elements instead),
                    // and only we write our region, through its base pointer.
                    unsafe { self.copy_slot_from(root, k, slot, offset) };
                }
            }
        }
        self.wait_all();
        drop(armed);
        Ok(())
    }

    fn reads_in_place(&self) -> bool {
        true
    }

    fn shares_results(&self, collective: Collective, header: &Header<'_>) -> bool {
        matches!(collective, Collective::AllReduce(_))
            && self.size > 1
            && header.bytes() >= SHARE_BYTES
    }

    fn exchange_results(&mut self, buffers: &mut SharedBuffers) -> Result<(), StageError> {
        self.check_unbroken()?;
        // The round that `open_round` is about to open: rank 0 fills every entry for it
        // before it posts, and each rank empties its own after the round's barrier, before
        // the stage that could fill it again (one barrier later at least).
        let round = self.shared.barrier.generation(self.rank);
        if self.rank == 0 {
            let mut boxes = self.shared.mailbox();
            for entry in boxes.iter_mut().skip(1) {
                *entry = (round, buffers.clone());
            }
        }
        let opened = self.open_round(Call::ExchangeResults, false, |_| {});
        let (entry_round, mine) = std::mem::replace(
            &mut self.shared.mailbox()[self.rank],
            (NO_ROUND, SharedBuffers::default()),
        );
        opened?;
        if self.rank != 0 {
            if entry_round != round {
                return Err(StageError::Disagreed(Disagreement::Buffers {
                    reason: "rank 0 handed no results for this round".into(),
                }));
            }
            *buffers = mine;
        }
        Ok(())
    }

    fn abort_handle(&self) -> AbortHandle {
        let shared = Arc::clone(&self.shared);
        AbortHandle::new(move || shared.barrier.abort())
    }
}

/// An allreduce whose values add up to at least this many bytes writes its results once,
/// into rank 0's buffers, which every rank's outputs then view (one extra barrier to hand
/// them over): writing one copy instead of one per rank halves the writes of 2 ranks, and
/// removes those into the lines of another rank's buffer, which its core last held.
/// Smaller ones write every rank's own buffer, which costs no extra barrier. On the 2-vCPU
/// AMD host, sharing made 256 KiB allreduces of 2 to 8 actors 20-35 % faster, and did not
/// pay at 64 or 128 KiB (BENCHMARKS.md, issue 16, 2026-12-03, fifth session; it was 1 MiB
/// before, a choice not measured). (Under Miri, 1 KiB, so that tests reach the shared
/// path with few elements.)
const SHARE_BYTES: usize = if cfg!(miri) { 1 << 10 } else { 256 << 10 };

/// Which other ranks' regions a reduced block is also written to.
#[derive(Clone, Copy)]
enum Push {
    /// Nobody's: the result stays in our output.
    None,
    /// Every rank's (allreduce).
    All,
    /// The root's only (reduce).
    To(usize),
}

impl Push {
    /// The ranks to write to besides ourselves.
    fn targets(self, rank: usize, size: usize) -> impl Iterator<Item = usize> {
        let (lo, hi) = match self {
            Push::None => (0, 0),
            Push::All => (0, size),
            Push::To(root) => (root, root + 1),
        };
        (lo..hi).filter(move |&q| q != rank)
    }
}

/// What `check_buffers` says of a rank whose value data does not match its slots.
fn data_mismatch(q: usize) -> Disagreement {
    Disagreement::Buffers {
        reason: format!("rank {q} passed value data that does not match its slots"),
    }
}

/// Each slot with its offset in its dtype's region (the values of a dtype lie back to back
/// in bucket order).
fn slot_offsets(slots: &[SlotDesc]) -> impl Iterator<Item = (SlotDesc, usize)> + '_ {
    let mut next = [0usize; DType::COUNT];
    slots.iter().map(move |&s| {
        let at = &mut next[s.dtype.index()];
        let offset = *at;
        *at += s.len;
        (s, offset)
    })
}

impl CpuComm {
    /// A round's first barrier, where ranks wait for peers that may never come: an abort
    /// ends it, on every rank alike.
    fn wait(&self) -> Result<(), StageError> {
        // Alone, there is nobody to wait for: a group of one runs the same code, barriers
        // aside (as before, a group of one cannot be aborted mid-stage either).
        if self.size == 1 {
            return Ok(());
        }
        self.shared
            .barrier
            .wait(self.rank)
            .map_err(|_| StageError::Aborted)
    }

    /// A later barrier of a stage: every rank passed the first, so every rank comes here in
    /// bounded time, and none may leave before the others are done reading its buffers
    /// (an abort meanwhile is seen at the next round's first barrier). That holds because
    /// nothing between a stage's barriers can panic or block: no user code runs there,
    /// only the checked layout and the reduction kernels of the sealed element types.
    fn wait_all(&self) {
        if self.size > 1 {
            self.shared.barrier.wait_all(self.rank);
        }
    }

    /// Checks every rank's buffers and input data against the agreed slots, so that the
    /// payload never reads or writes out of bounds whatever the caller passed. Every rank
    /// checks every rank's, so the verdict is the same everywhere.
    ///
    /// # Safety
    /// As for [`Post::header`].
    unsafe fn check_buffers(
        &self,
        header: &Header<'_>,
        collective: Collective,
    ) -> Result<(), Disagreement> {
        let want = wanted(header.slots)?;
        for q in 0..self.size {
            // SAFETY: forwarded to the caller.
            let theirs = unsafe { self.post(q).header() };
            if !data_fits(header.slots, theirs.data) {
                return Err(data_mismatch(q));
            }
        }
        self.check_regions(&want, collective, |_| true)
    }

    /// The part of [`check_buffers`](Self::check_buffers) that reads only the posts'
    /// atomics: the regions of every rank that `posted` them against `want` elements per
    /// dtype.
    fn check_regions(
        &self,
        want: &[usize; DType::COUNT],
        collective: Collective,
        posted: impl Fn(usize) -> bool,
    ) -> Result<(), Disagreement> {
        let need = |d: DType| {
            let len = want[d.index()];
            let out_len = match collective.output_len(len, self.size) {
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
            let post = self.post(q);
            post.dtypes.load(Relaxed) == mask
                && DType::ALL
                    .into_iter()
                    .filter(|d| mask & (1 << d.index()) != 0)
                    .all(|d| {
                        let (_, len, out_len) = post.buf(d);
                        (len, out_len) == needs[d.index()]
                    })
        };
        if (0..self.size).filter(|&q| posted(q)).all(matches) {
            return Ok(());
        }
        for d in DType::ALL {
            let (len, out_len) = need(d);
            for q in (0..self.size).filter(|&q| posted(q)) {
                let (_, b_len, b_out_len) = self.post(q).buf(d);
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
    /// the ranks' slots differ (an eager rank's bytes are at most `eager_bytes`, the
    /// others' above). An eager rank may have published no addresses, so its header comes
    /// from its copy; every rank reads the same posts, so reaches the same verdict.
    fn mixed_verdict(&self, collective: Collective) -> Disagreement {
        let header_of = |q: usize| {
            let post = self.post(q);
            // SAFETY: `open_round` checked that every rank made this call for this round,
            // and we have not reached the round's next barrier: an eager post holds its
            // owner's copy for this round, and any other post its owner's header (see
            // `Post::header`).
            unsafe {
                if post.eager.load(Relaxed) {
                    post.eager_header()
                } else {
                    post.header()
                }
            }
        };
        match agree(self.size, collective, header_of) {
            Err(why) => why,
            // Unreachable: equal slots make equal bytes, so equal eagerness unless a rank
            // failed, which `agree` reports. Still a verdict, and the same on every rank.
            Ok(()) => Disagreement::Buffers {
                reason: "the ranks disagree on whether the allreduce is small".into(),
            },
        }
    }

    /// An eager allreduce (see [`Eager`]) after its only barrier: every post holds its
    /// owner's copy for this round. Every rank reads the same copies, so reaches the same
    /// verdict, and returns without another barrier: no peer reads its caller's memory.
    fn eager_stage(
        &self,
        header: &Header<'_>,
        collective: Collective,
        op: ReduceOp,
        bufs: &[Buf; DType::COUNT],
    ) -> Result<(), StageError> {
        // SAFETY: every rank posted this call for this round with its copy, and we have
        // not reached the next barrier (the same holds for each `eager_copy` below).
        let header_of = |q: usize| unsafe { self.post(q).eager_header() };
        agree(self.size, collective, header_of).map_err(StageError::Disagreed)?;
        let want = wanted(header.slots).map_err(StageError::Disagreed)?;
        // SAFETY: as above.
        if !(0..self.size).all(|q| unsafe { self.post(q).eager_copy() }.copied) {
            // Someone's buffers do not fit: find which, as the two-barrier stage would.
            for q in 0..self.size {
                // SAFETY: as above.
                if !unsafe { self.post(q).eager_copy() }.fits {
                    return Err(StageError::Disagreed(data_mismatch(q)));
                }
            }
            // Only the ranks that did not copy published their regions; those that did
            // had regions of the lengths these slots need.
            // SAFETY: as above.
            let copied = |q: usize| unsafe { self.post(q).eager_copy() }.copied;
            self.check_regions(&want, collective, |q| !copied(q))
                .map_err(StageError::Disagreed)?;
        }
        // Every rank's slots are ours (agreed) and its regions hold exactly them (checked),
        // so every rank copied its values into sections laid out as ours.
        let (at, _) = eager_sections(&want);
        for d in DType::ALL.into_iter().filter(|d| want[d.index()] > 0) {
            let section = |q: usize| {
                // SAFETY: as above; the section of `d` lies within the payload.
                let copy = unsafe { self.post(q).eager_copy() };
                copy.payload
                    .as_ptr()
                    .wrapping_add(at[d.index()])
                    .cast::<u8>()
            };
            let dst = bufs[d.index()].ptr;
            // SAFETY: each rank's section holds `want[d]` elements of `d` (= `E`), which
            // nobody writes before we reach the next barrier; `dst` is our own region of
            // `d`, `want[d]` long (checked), which no peer touches in an eager stage.
            with_dtype!(d, E => unsafe {
                self.reduce_range::<E>(
                    &|q| section(q).cast::<E>(),
                    want[d.index()],
                    dst.cast(),
                    op,
                    (Push::None, d, 0),
                )
            });
        }
        Ok(())
    }

    fn chunk(&self, len: usize, q: usize) -> (usize, usize) {
        (len * q / self.size, len * (q + 1) / self.size)
    }

    /// Where rank `q`'s value `k`, of dtype `d` at `offset` in its region, starts: its lent
    /// elements, or its place in the region.
    ///
    /// # Safety
    /// Between this stage's first barrier and its last, after the buffer check.
    unsafe fn input(&self, q: usize, k: usize, d: DType, offset: usize) -> *const u8 {
        let post = self.post(q);
        let data: *const SlotData<'_> = post.data.load(Relaxed).cast();
        // SAFETY: forwarded to the caller: rank q's entries are alive and unchanged (its
        // caller lends them to `stage` by shared reference), and the check found one per
        // agreed slot, so entry `k` is among them.
        let data = unsafe { data.add(k).read() };
        match data.lent_ptr() {
            Some(ptr) => ptr,
            // The value lies in q's region at its place in the layout, which the check
            // found long enough for every slot.
            None => post.buf(d).0.wrapping_add(offset * d.size()),
        }
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
    // Not inlined into `stage`: there LLVM turns the block loops into slower code than
    // in a function of their own (10% more instructions for an 8 x 1024 f32 allreduce).
    #[inline(never)]
    unsafe fn reduce_range<E: Element>(
        &self,
        src: &dyn Fn(usize) -> *const E,
        n: usize,
        dst: *mut E,
        op: ReduceOp,
        push: (Push, DType, usize),
    ) {
        let (push, d, at) = push;
        if self.size == 1 && op != ReduceOp::Avg && TypeId::of::<E>() == TypeId::of::<E::Acc>() {
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
        let own = (0..self.size).find(|&q| src(q) == dst.cast_const());
        // Only as much of the accumulator as the range needs is initialised, and only if
        // the fold uses one: zeroing all of it cost more than the whole reduction of a
        // small allreduce (2,100 instructions for 4 bytes), and even the range's part was
        // 40 % of the instructions of an 8 x 1024 f32 allreduce over 2 ranks, which folds
        // in place.
        let mut store = [std::mem::MaybeUninit::<E::Acc>::uninit(); BLOCK];
        let first = match needs_acc::<E>(self.size, own) {
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
            fold_block(self.size, input, own, op, out, acc_all);
            for q in push.targets(self.rank, self.size) {
                let peer = self.post(q).buf(d).0.cast::<E>();
                // SAFETY: the same elements of rank q's live region (the check found it
                // `at + n` long), touched by nobody but us in this phase, and already read
                // by us above if they were an input; `out` is ours, elsewhere.
                unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), peer.add(at + done), len) };
            }
            done += len;
        }
    }

    /// Reduces chunk `rank` of the dtype-`d` region, value by value, into the region of
    /// rank `owner` (ours, or rank 0's when results are shared), and writes each reduced
    /// block into the regions of `push` too: every rank then holds the whole result after
    /// one barrier, without a second pass that copies chunks.
    ///
    /// # Safety
    /// Every rank posted a live region of `d` (= `E`) of the agreed length and live
    /// inputs for the agreed slots; no one else reads or writes chunk `self.rank` of any
    /// region, or the elements of any input that fall into it, in this phase.
    unsafe fn reduce_own_chunk<E: Element>(
        &self,
        header: &Header<'_>,
        d: DType,
        op: ReduceOp,
        owner: usize,
        push: Push,
    ) {
        let (own, own_len, _) = self.post(owner).buf(d);
        let (lo, hi) = self.chunk(own_len, self.rank);
        let slots = slot_offsets(header.slots).enumerate();
        for (k, (slot, off)) in slots.filter(|(_, (s, _))| s.dtype == d) {
            let (a, b) = (lo.max(off), hi.min(off + slot.len));
            if a >= b {
                continue;
            }
            // SAFETY: forwarded to the caller; element `a - off` of value k is within it.
            let src = |q: usize| unsafe { self.input(q, k, d, off).cast::<E>().add(a - off) };
            let dst = own.cast::<E>().wrapping_add(a);
            // SAFETY: forwarded to the caller; `dst` is within our own chunk.
            unsafe { self.reduce_range::<E>(&src, b - a, dst, op, (push, d, a)) };
        }
    }

    /// Copies rank `root`'s value `k` into its place in our region.
    ///
    /// # Safety
    /// Every rank posted a live region of the slot's dtype holding the slot at `offset`,
    /// and live inputs; nobody writes the root's input or touches our region in this phase.
    unsafe fn copy_slot_from(&self, root: usize, k: usize, slot: SlotDesc, offset: usize) {
        let size = slot.dtype.size();
        // SAFETY: forwarded to the caller.
        let src = unsafe { self.input(root, k, slot.dtype, offset) };
        let own = self.post(self.rank).buf(slot.dtype).0;
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
        &self,
        k: usize,
        slot: SlotDesc,
        offset: usize,
        out: *mut E,
        op: ReduceOp,
    ) {
        let chunk = slot.len / self.size;
        let start = self.rank * chunk;
        let dst = out.wrapping_add(offset / self.size);
        let d = slot.dtype;
        // SAFETY: forwarded to the caller; our chunk lies within value k of every rank.
        let src = |q: usize| unsafe { self.input(q, k, d, offset).cast::<E>().add(start) };
        // SAFETY: forwarded to the caller; `dst` is in our output region, which no one
        // else touches.
        unsafe { self.reduce_range::<E>(&src, chunk, dst, op, (Push::None, d, 0)) };
    }

    /// Copies every rank's part of one value into our output region, in rank order.
    ///
    /// # Safety
    /// Every rank's input of the slot is live, read-only in this phase and, if packed, at
    /// `offset` of its region; `out` is our output region of that dtype, N times the input
    /// long.
    unsafe fn gather_slot(&self, k: usize, slot: SlotDesc, offset: usize, out: *mut u8) {
        let size = slot.dtype.size();
        let part = slot.len * size;
        let base = offset * self.size * size;
        for q in 0..self.size {
            // SAFETY: forwarded to the caller.
            let src = unsafe { self.input(q, k, slot.dtype, offset) };
            // SAFETY: value k of rank q is live and read-only; its place in our output
            // region is `N * offset + q * len` elements, within the output's length, and
            // only we touch our output.
            unsafe { std::ptr::copy_nonoverlapping(src, out.add(base + q * part), part) };
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::comm::reduce::reduce_reference;
    use crate::comm::Disagreement;

    /// Runs one in-place stage over `inputs[rank]` on `inputs.len()` threads.
    fn run<E: Element>(inputs: Vec<Vec<E>>, collective: Collective) -> Vec<Vec<E>> {
        let comms = Cpu.communicators(inputs.len()).unwrap();
        let threads: Vec<_> = comms
            .into_iter()
            .zip(inputs)
            .map(|(mut comm, mut data)| {
                std::thread::spawn(move || {
                    let slots = [SlotDesc::flat(E::DTYPE, data.len())];
                    // The communicator reads the inputs in place and writes the results
                    // into the region: here a copy of the same values.
                    let input = data.clone();
                    let header = Header {
                        status: Status::Ok,
                        slots: &slots,
                        dims: &[],
                        data: &[SlotData::new(&input[..])],
                    };
                    let mut regions = [E::region_mut(&mut data)];
                    let regions = if slots[0].len == 0 {
                        &mut regions[..0]
                    } else {
                        &mut regions[..]
                    };
                    comm.stage(&header, collective, regions, &mut []).unwrap();
                    data
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[test]
    fn matches_the_reference_bit_for_bit() {
        // Under Miri, one rank (a path of its own) and a few.
        let ranks: &[usize] = if cfg!(miri) { &[1, 3] } else { &[1, 2, 3, 5] };
        for &n in ranks {
            for len in [0, 1, 7, BLOCK + 3, 3 * BLOCK] {
                let inputs: Vec<Vec<f32>> = (0..n)
                    .map(|r| {
                        (0..len)
                            .map(|i| ((i * 7 + r * 13) % 17) as f32 * 0.37)
                            .collect()
                    })
                    .collect();
                for op in ReduceOp::ALL {
                    let srcs: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
                    let want = reduce_reference(&srcs, op);
                    for got in run(inputs.clone(), Collective::AllReduce(op)) {
                        let got: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
                        let want: Vec<u32> = want.iter().map(|x| x.to_bits()).collect();
                        assert_eq!(got, want, "n={n} len={len} op={op:?}");
                    }
                    let reduced = run(inputs.clone(), Collective::Reduce { op, root: n - 1 });
                    assert_eq!(reduced[n - 1], want, "reduce n={n} len={len} op={op:?}");
                }
            }
        }
    }

    #[test]
    fn broadcast_copies_the_root_everywhere() {
        let inputs: Vec<Vec<u8>> = (0..4).map(|r| vec![r as u8; 5]).collect();
        for got in run(inputs, Collective::Broadcast { root: 2 }) {
            assert_eq!(got, vec![2u8; 5]);
        }
    }

    #[test]
    fn a_root_out_of_range_is_refused_on_every_rank() {
        let comms = Cpu.communicators(2).unwrap();
        let threads: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                std::thread::spawn(move || {
                    let header = Header {
                        status: Status::Ok,
                        slots: &[],
                        dims: &[],
                        data: &[],
                    };
                    comm.stage(&header, Collective::Broadcast { root: 2 }, &mut [], &mut [])
                })
            })
            .collect();
        for t in threads {
            match t.join().unwrap() {
                Err(StageError::Disagreed(Disagreement::Root { root: 2, size: 2 })) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    #[test]
    fn buffers_that_do_not_match_the_slots_are_refused() {
        let comms = Cpu.communicators(1).unwrap();
        for mut comm in comms {
            let mut data = vec![1.0f64; 3];
            let slots = [SlotDesc::flat(DType::F64, 4)];
            let input = [1.0f64; 4];
            let header = Header {
                status: Status::Ok,
                slots: &slots,
                dims: &[],
                data: &[SlotData::new(&input[..])],
            };
            let mut regions = [f64::region_mut(&mut data)];
            let r = comm.stage(&header, Collective::AllGather, &mut regions, &mut []);
            assert!(matches!(
                r,
                Err(StageError::Disagreed(Disagreement::Buffers { .. }))
            ));
        }
    }

    #[test]
    fn mismatched_lengths_are_refused_on_every_rank() {
        let comms = Cpu.communicators(2).unwrap();
        let threads: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, mut comm)| {
                std::thread::spawn(move || {
                    let mut data = vec![1i64; 10 * (rank + 1)];
                    let slots = [SlotDesc::flat(DType::I64, data.len())];
                    let input = data.clone();
                    let header = Header {
                        status: Status::Ok,
                        slots: &slots,
                        dims: &[],
                        data: &[SlotData::new(&input[..])],
                    };
                    let mut regions = [i64::region_mut(&mut data)];
                    let r = comm.stage(
                        &header,
                        Collective::AllReduce(ReduceOp::Sum),
                        &mut regions,
                        &mut [],
                    );
                    (r, data)
                })
            })
            .collect();
        for t in threads {
            let (r, data) = t.join().unwrap();
            match r {
                Err(StageError::Disagreed(Disagreement::Slot {
                    slot: 0, counts, ..
                })) => {
                    assert_eq!(counts, vec![(DType::I64, 10), (DType::I64, 20)])
                }
                other => panic!("unexpected {other:?}"),
            }
            assert!(data.iter().all(|&x| x == 1), "payload must not run");
        }
    }

    /// Runs `rounds` in-place f64 allreduces on `lens.len()` threads, rank r's
    /// `lens[r]` elements in round i being `r + i + k / 8` (k the element's index), rank
    /// r failing `fail[r]` rounds' stages; each rank's results.
    fn allreduce_rounds(
        lens: &[usize],
        fail: &[Option<usize>],
        rounds: usize,
    ) -> Vec<Vec<Result<Vec<f64>, StageError>>> {
        let comms = Cpu.communicators(lens.len()).unwrap();
        let threads: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, mut comm)| {
                let (len, fail) = (lens[rank], fail[rank]);
                std::thread::spawn(move || {
                    (0..rounds)
                        .map(|i| {
                            let mut data: Vec<f64> = (0..len)
                                .map(|k| (rank + i) as f64 + k as f64 / 8.0)
                                .collect();
                            let slots = [SlotDesc::flat(DType::F64, len)];
                            let input = data.clone();
                            let values = [SlotData::new(&input[..])];
                            let header = match fail == Some(i) {
                                true => Header::FAILED,
                                false => Header {
                                    status: Status::Ok,
                                    slots: &slots,
                                    dims: &[],
                                    data: &values,
                                },
                            };
                            let mut regions = [f64::region_mut(&mut data)];
                            let sum = Collective::AllReduce(ReduceOp::Sum);
                            comm.stage(&header, sum, &mut regions, &mut [])
                                .map(|()| data)
                        })
                        .collect()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    /// The largest eager allreduce of `n` ranks, in f64 elements.
    fn eager_len(n: usize) -> usize {
        Cpu.communicators(n).unwrap()[0].shared.eager_bytes / 8
    }

    /// Small allreduces (one barrier each, see `Eager`) back to back give every rank
    /// every round's sum, on either side of the size limit, with as many ranks as the
    /// cores or fewer and with more.
    #[test]
    fn eager_allreduces_back_to_back() {
        let rounds = if cfg!(miri) { 3 } else { 200 };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut sizes = vec![2, 3, cores + 1];
        sizes.sort_unstable();
        sizes.dedup();
        for n in sizes {
            let eager = eager_len(n);
            for len in [1, eager, eager + 1] {
                let results = allreduce_rounds(&vec![len; n], &vec![None; n], rounds);
                for rank in results {
                    for (i, got) in rank.into_iter().enumerate() {
                        let want: Vec<f64> = (0..len)
                            .map(|k| (0..n).map(|r| (r + i) as f64 + k as f64 / 8.0).sum())
                            .collect();
                        assert_eq!(got.unwrap(), want, "len={len} n={n} round={i}");
                    }
                }
            }
        }
    }

    /// Ranks that outnumber the cores run larger allreduces eagerly, and only then.
    #[test]
    fn crowded_ranks_run_larger_allreduces_eagerly() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(eager_len(cores) * 8, EAGER_BYTES);
        assert_eq!(eager_len(cores + 1) * 8, EAGER_BYTES_CROWDED);
    }

    /// One rank's value is small enough for one barrier and the other's is not: both
    /// ranks refuse with the same error, and the communicator still works.
    #[test]
    fn an_eager_and_a_two_barrier_rank_refuse_alike() {
        let big = eager_len(2) + 1;
        let results = allreduce_rounds(&[1, big], &[None, None], 1);
        for rank in &results {
            match &rank[0] {
                Err(StageError::Disagreed(Disagreement::Slot {
                    slot: 0, counts, ..
                })) => {
                    assert_eq!(counts, &vec![(DType::F64, 1), (DType::F64, big)])
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// A rank that failed joins a small allreduce with an empty copy: every rank skips
    /// it as failed, and the next round runs.
    #[test]
    fn a_failed_rank_skips_an_eager_allreduce_on_every_rank() {
        for n in [2, 3] {
            let mut fail = vec![None; n];
            fail[1] = Some(0);
            for rank in allreduce_rounds(&vec![2; n], &fail, 2) {
                assert!(
                    matches!(
                        rank[0],
                        Err(StageError::Disagreed(Disagreement::Failed { rank: 1 }))
                    ),
                    "{:?}",
                    rank[0]
                );
                let sum: f64 = (0..n).map(|r| (r + 1) as f64).sum();
                assert_eq!(
                    rank[1].as_ref().unwrap(),
                    &vec![sum, sum + 0.125 * n as f64]
                );
            }
        }
    }

    /// A rank that failed before it knew its stage joins it with a collective of its
    /// own: the others skip the stage because it failed, not because the calls differ.
    #[test]
    fn a_failed_rank_joins_with_any_collective() {
        let comms = Cpu.communicators(2).unwrap();
        let threads: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, mut comm)| {
                std::thread::spawn(move || {
                    let (mut data, input) = (vec![1u8; 3], [1u8; 3]);
                    let slots = [SlotDesc::flat(DType::U8, 3)];
                    let values = [SlotData::new(&input[..])];
                    let (status, slots, values, collective) = match rank {
                        0 => (Status::Ok, &slots[..], &values[..], Collective::AllGather),
                        _ => (
                            Status::Failed,
                            &[][..],
                            &[][..],
                            Collective::Broadcast { root: 0 },
                        ),
                    };
                    let header = Header {
                        status,
                        slots,
                        dims: &[],
                        data: values,
                    };
                    let mut out = vec![0u8; 6];
                    let (mut regions, mut outputs) =
                        ([u8::region_mut(&mut data)], [u8::region_mut(&mut out)]);
                    let (regions, outputs) = match rank {
                        0 => (&mut regions[..], &mut outputs[..]),
                        _ => (&mut regions[..0], &mut outputs[..0]),
                    };
                    let first = comm.stage(&header, collective, regions, outputs);
                    // The communicator is not broken: the next stage runs.
                    let ok = Header {
                        status: Status::Ok,
                        slots: &[],
                        dims: &[],
                        data: &[],
                    };
                    (
                        first,
                        comm.stage(&ok, Collective::AllGather, &mut [], &mut []),
                    )
                })
            })
            .collect();
        for t in threads {
            let (first, second) = t.join().unwrap();
            assert!(
                matches!(
                    first,
                    Err(StageError::Disagreed(Disagreement::Failed { rank: 1 }))
                ),
                "{first:?}"
            );
            assert!(second.is_ok(), "{second:?}");
        }
    }

    #[test]
    fn every_call_decodes_to_itself() {
        let mut calls = vec![
            Call::ExchangeResults,
            Call::Launched,
            Call::Stage(Collective::AllGather),
        ];
        for op in ReduceOp::ALL {
            calls.push(Call::Stage(Collective::AllReduce(op)));
            calls.push(Call::Stage(Collective::ReduceScatter(op)));
            calls.push(Call::Stage(Collective::Reduce {
                op,
                root: usize::MAX,
            }));
        }
        calls.push(Call::Stage(Collective::Broadcast { root: 7 }));
        for call in calls {
            let (code, root) = encode(call);
            assert_eq!(decode(code, root), Some(call));
        }
        assert_eq!(decode(0, 0), None, "a post never written");
    }
}

/// Model checks of the two-epoch stages (run by `.ci/run` with `--cfg loom`): under every
/// interleaving, an `allgather` and a `reducescatter` over two ranks finish with the right
/// results, reading the peers' inputs only while they are alive and unchanged.
#[cfg(all(test, loom))]
mod loom_tests {
    use loom::thread;

    use super::*;

    /// Two ranks run one stage with outputs: rank r's input is `[r + 1; 2]`.
    fn output_pair(collective: Collective) -> Vec<(Result<(), StageError>, Vec<u32>)> {
        let comms = Cpu.communicators(2).unwrap();
        let threads: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, mut comm)| {
                thread::spawn(move || {
                    let mut input = vec![rank as u32 + 1; 2];
                    let out_len = collective.output_len(2, 2).unwrap();
                    let mut output = vec![0u32; out_len];
                    let slots = [SlotDesc::flat(DType::U32, 2)];
                    let values = input.clone();
                    let data = [SlotData::new(&values[..])];
                    let header = Header {
                        status: Status::Ok,
                        slots: &slots,
                        dims: &[],
                        data: &data,
                    };
                    let mut regions = [u32::region_mut(&mut input)];
                    let mut outputs = [u32::region_mut(&mut output)];
                    let r = comm.stage(&header, collective, &mut regions, &mut outputs);
                    (r, output)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    /// Unbounded, each model takes about 15 s on CI's two cores; with at most three
    /// preemptions it still interleaves the two ranks' phases (post, barrier, copy,
    /// barrier) every way, in a few seconds.
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(3);
        model.check(f);
    }

    #[test]
    fn loom_allgather_gathers_in_rank_order() {
        model(|| {
            for (r, out) in output_pair(Collective::AllGather) {
                assert!(r.is_ok());
                assert_eq!(out, vec![1, 1, 2, 2]);
            }
        });
    }

    #[test]
    fn loom_reducescatter_gives_each_rank_its_chunk() {
        model(|| {
            for (r, out) in output_pair(Collective::ReduceScatter(ReduceOp::Sum)) {
                assert!(r.is_ok());
                assert_eq!(out, vec![3]);
            }
        });
    }
}

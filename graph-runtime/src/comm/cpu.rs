//! The shared-memory communicator: ranks are threads of this process.
//!
//! A stage is one sequence of barrier epochs over every dtype region at once. First every
//! rank posts its header and the addresses of its regions, then waits at the barrier; each
//! rank then reads every header and reaches the same verdict. Then the payload, reading
//! the peers' buffers directly (no locks: the barriers order every write before the reads
//! of it, and a final barrier keeps every buffer alive and unchanged until no peer reads it):
//!
//! | collective | after the header epoch | barriers |
//! | --- | --- | --- |
//! | allreduce | rank r reduces its 1/N chunk of every region, in rank order, block by block, and writes each block into every rank's region | 2 |
//! | allreduce of 1 MiB or more | the same, but each block goes into rank 0's region only, which rank 0 then hands to every rank (`exchange_results`) | 3 |
//! | reduce | the same, but writes each block into the root's region only | 2 |
//! | reducescatter | rank r reduces its chunk of every value, in rank order, into its output region | 2 |
//! | allgather | rank r copies every rank's part of every value into its output region | 2 |
//! | broadcast | every rank but the root copies the root's regions over its own | 2 |
//!
//! Inputs are read where they are (`Header::data`): in the values themselves, or in the
//! packed region for values that cannot lend their elements. Each element is reduced
//! exactly once, by one rank, in rank order, and everything else is a copy (or, for a
//! shared result, the same memory), so every rank holds bitwise-identical results.

use std::any::TypeId;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::reduce::{combine, finish, load, BLOCK};
use super::{
    agree, AbortHandle, Backend, Collective, Communicator, Disagreement, Header, RegionMut,
    SharedBuffers, SlotData, SlotDesc, StageError, Status,
};
use crate::element::with_dtype;
use crate::sync::prims::AtomicUsize;
use crate::sync::Barrier;
use crate::{DType, Element, Error, ReduceOp};

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
        let shared = Arc::new(Shared {
            barrier: Barrier::new(size),
            mailbox: std::sync::Mutex::new((0..size).map(|_| Default::default()).collect()),
            posts: (0..size)
                .map(|_| Padded(std::array::from_fn(|_| Post::new())))
                .collect(),
        });
        Ok((0..size)
            .map(|rank| CpuComm {
                rank,
                size,
                shared: Arc::clone(&shared),
                round: 0,
            })
            .collect())
    }
}

/// One rank's endpoint of a [`Cpu`] communicator.
pub struct CpuComm {
    rank: usize,
    size: usize,
    shared: Arc<Shared>,
    round: usize,
}

struct Shared {
    barrier: Barrier,
    /// Per rank, the result buffers rank 0 hands it after a stage that shares results
    /// (see `SHARE_BYTES`). Each rank takes its own entry, so the box is empty again
    /// without another barrier.
    mailbox: std::sync::Mutex<Vec<SharedBuffers>>,
    /// Per rank, two posts used in alternate stages: a rank can only write a post again
    /// after the next stage's barrier, which every peer reaches after reading this one.
    posts: Box<[Padded<[Post; 2]>]>,
}

#[repr(align(128))]
struct Padded<T>(T);

/// What a rank publishes for one stage: the addresses of its header's slots and of its
/// buffer table, both on its own stack or in its caller's hands for the whole stage.
/// Written before the barrier with relaxed stores; the barrier orders them (and the data
/// they point to) before every peer's reads.
struct Post {
    failed: AtomicUsize,
    slots: AtomicUsize,
    nslots: AtomicUsize,
    /// `*const Bufs`.
    bufs: AtomicUsize,
    /// `*const SlotData`, `nslots` of them: where each value's input elements are.
    data: AtomicUsize,
}

/// One rank's regions, by dtype index.
type Bufs = [Buf; DType::COUNT];

/// One dtype's input region (its address and length in elements) and the length of its
/// output region. The output's address is never needed by a peer: each rank writes only
/// its own output.
#[derive(Clone, Copy, Default)]
struct Buf {
    ptr: usize,
    len: usize,
    out_len: usize,
}

/// A length no real region has: marks a dtype passed twice, so that the check fails.
const DUPLICATE: usize = usize::MAX;

impl Post {
    fn new() -> Self {
        Self {
            failed: AtomicUsize::new(0),
            slots: AtomicUsize::new(0),
            nslots: AtomicUsize::new(0),
            bufs: AtomicUsize::new(0),
            data: AtomicUsize::new(0),
        }
    }

    /// # Safety
    /// The post must be published for the current stage and its owner still in it: true
    /// between the stage's first barrier and the owner's next barrier.
    unsafe fn header(&self) -> Header<'_> {
        let ptr = self.slots.load(Relaxed) as *const SlotDesc;
        let data = self.data.load(Relaxed) as *const SlotData<'_>;
        let len = self.nslots.load(Relaxed);
        Header {
            status: if self.failed.load(Relaxed) != 0 {
                Status::Failed
            } else {
                Status::Ok
            },
            slots: if len == 0 {
                &[]
            } else {
                // SAFETY: the owner published `ptr`/`len` of a live slice that it does not
                // touch until it passes a barrier that we have not yet reached (see above).
                unsafe { std::slice::from_raw_parts(ptr, len) }
            },
            data: if len == 0 || data.is_null() {
                &[]
            } else {
                // SAFETY: as for the slots; the owner's header has as many data entries
                // as slots (checked in `stage` before it posts).
                unsafe { std::slice::from_raw_parts(data, len) }
            },
        }
    }

    /// # Safety
    /// As for [`Post::header`].
    unsafe fn bufs(&self) -> &Bufs {
        // SAFETY: the owner published the address of its `Bufs`, which lives on its stack
        // until its stage returns, after the stage's last barrier (see above).
        unsafe { &*(self.bufs.load(Relaxed) as *const Bufs) }
    }
}

impl CpuComm {
    fn post(&self, q: usize) -> &Post {
        &self.shared.posts[q].0[self.round & 1]
    }

    /// Where rank `q`'s value `k` is.
    ///
    /// # Safety
    /// Between this stage's first barrier and its last, after the buffer check.
    unsafe fn data(&self, q: usize, k: usize) -> *const u8 {
        // SAFETY: forwarded to the caller; the check made sure rank q posted one entry per
        // agreed slot.
        unsafe { self.post(q).header() }.data[k].as_ptr()
    }

    /// Rank `q`'s buffer of dtype `d`.
    ///
    /// # Safety
    /// Between this stage's first barrier and its last.
    unsafe fn buf(&self, q: usize, d: DType) -> Buf {
        // SAFETY: forwarded to the caller.
        unsafe { self.post(q).bufs()[d.index()] }
    }
}

impl Communicator for CpuComm {
    fn rank(&self) -> usize {
        self.rank
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
        // Our table of buffers: peers read it through the post until our last barrier,
        // which we pass before this frame ends.
        let mut bufs: Bufs = [Buf::default(); DType::COUNT];
        for region in regions.iter_mut() {
            let b = &mut bufs[region.dtype().index()];
            b.len = if b.ptr != 0 { DUPLICATE } else { region.len() };
            b.ptr = region.as_mut_ptr() as usize;
        }
        let mut out_ptrs = [std::ptr::null_mut::<u8>(); DType::COUNT];
        for out in outputs.iter_mut() {
            let d = out.dtype().index();
            bufs[d].out_len = if out_ptrs[d].is_null() {
                out.len()
            } else {
                DUPLICATE
            };
            out_ptrs[d] = out.as_mut_ptr();
        }

        self.round = self.round.wrapping_add(1);
        let mine = self.post(self.rank);
        mine.failed
            .store(usize::from(header.status == Status::Failed), Relaxed);
        mine.slots.store(header.slots.as_ptr() as usize, Relaxed);
        mine.nslots.store(header.slots.len(), Relaxed);
        mine.bufs.store(&bufs as *const Bufs as usize, Relaxed);
        // A header whose data does not match its slots is posted without data, and the
        // buffer check below then fails on every rank.
        let data_ok = header.data.len() == header.slots.len();
        mine.data.store(
            if data_ok {
                header.data.as_ptr() as usize
            } else {
                0
            },
            Relaxed,
        );
        self.wait()?;

        // SAFETY: every rank posted for this round before the barrier we just passed, and
        // keeps its post and slots until it passes its next barrier.
        let verdict = agree(self.size, collective, |q| unsafe { self.post(q).header() });
        if let Err(why) = verdict {
            // Every rank reaches this verdict, but a slower peer may still be reading our
            // header, whose slots live in the caller's fused stage: with executions in
            // flight, a rank that returned now could reach this stage again in the next
            // execution and rewrite them. Return only once every rank is done reading (a
            // barrier that costs only on this failure path).
            self.wait_all();
            return Err(StageError::Disagreed(why));
        }
        // SAFETY: as above; every rank keeps its buffer table (on its stack) until its last
        // barrier of this stage, which it reaches only after this check.
        if let Err(why) = unsafe { self.check_buffers(header, collective) } {
            // Every rank reaches this verdict, but a slower peer may still be reading our
            // table: return only once every rank is done with the check.
            self.wait_all();
            return Err(StageError::Disagreed(why));
        }

        // From here on, the verdict says every rank posted, for each dtype, an input region
        // of the length its slots add up to and an output region of the length the
        // collective needs, all alive until the stage's last barrier.
        match collective {
            Collective::AllReduce(op) | Collective::Reduce { op, .. } => {
                // Shared results: everyone writes its chunk into rank 0's regions only.
                let (owner, push) = match collective.root() {
                    Some(root) => (self.rank, Push::To(root)),
                    None if self.shares_results(collective, header) => (0, Push::None),
                    None => (self.rank, Push::All),
                };
                for d in DType::ALL.into_iter().filter(|d| bufs[d.index()].len > 0) {
                    // SAFETY: see above; in this phase chunk `rank` of every region, and of
                    // every value, is read and written only by us (each block read from
                    // every rank before it is written to any).
                    with_dtype!(d, E => unsafe { self.reduce_own_chunk::<E>(header, d, op, owner, push) });
                }
            }
            Collective::ReduceScatter(op) => {
                let slots = slot_offsets(header.slots).enumerate();
                for (k, (slot, offset)) in slots.filter(|(_, (s, _))| s.len > 0) {
                    let out = out_ptrs[slot.dtype.index()];
                    // SAFETY: see above; inputs are read-only in this phase, and each rank
                    // writes only its own output region.
                    with_dtype!(slot.dtype, E => unsafe {
                        self.reduce_scatter_slot::<E>(k, slot, offset, out.cast(), op)
                    });
                }
            }
            Collective::AllGather => {
                let slots = slot_offsets(header.slots).enumerate();
                for (k, (slot, offset)) in slots.filter(|(_, (s, _))| s.len > 0) {
                    let out = out_ptrs[slot.dtype.index()];
                    // SAFETY: as for ReduceScatter.
                    unsafe { self.gather_slot(k, slot, offset, out) };
                }
            }
            Collective::Broadcast { root } => {
                let slots = slot_offsets(header.slots).enumerate();
                for (k, (slot, offset)) in slots.filter(|(_, (s, _))| s.len > 0) {
                    // SAFETY: see above; nobody writes the root's inputs in this phase,
                    // and only we touch our region.
                    unsafe { self.copy_slot_from(root, k, slot, offset) };
                }
            }
        }
        self.wait_all();
        Ok(())
    }

    fn reads_in_place(&self) -> bool {
        true
    }

    fn shares_results(&self, collective: Collective, header: &Header<'_>) -> bool {
        let bytes: usize = header
            .slots
            .iter()
            .map(|s| s.len.saturating_mul(s.dtype.size()))
            .sum();
        matches!(collective, Collective::AllReduce(_)) && self.size > 1 && bytes >= SHARE_BYTES
    }

    fn exchange_results(&mut self, buffers: &mut SharedBuffers) -> Result<(), StageError> {
        let mailbox = || {
            self.shared
                .mailbox
                .lock()
                .unwrap_or_else(|e| e.into_inner())
        };
        if self.rank == 0 {
            let mut boxes = mailbox();
            for entry in boxes.iter_mut().skip(1) {
                *entry = buffers.clone();
            }
        }
        // Rank 0 filled every entry before this barrier, and each rank empties its own
        // after it, before the stage that could fill it again (one barrier later at least).
        self.wait_all();
        if self.rank != 0 {
            *buffers = std::mem::take(&mut mailbox()[self.rank]);
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
/// them over): large results are bound by memory bandwidth, and writing one copy instead of
/// one per rank halves the writes of 2 ranks. Smaller ones write every rank's own buffer,
/// which costs no extra barrier.
const SHARE_BYTES: usize = 1 << 20;

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
    /// A stage's first barrier, where ranks wait for peers that may never come: an abort
    /// ends it, on every rank alike.
    fn wait(&self) -> Result<(), StageError> {
        // Alone, there is nobody to wait for: a group of one runs the same code, barriers
        // aside (as before, a group of one cannot be aborted mid-stage either).
        if self.size == 1 {
            return Ok(());
        }
        self.shared.barrier.wait().map_err(|_| StageError::Aborted)
    }

    /// A later barrier of a stage: every rank passed the first, so every rank comes here in
    /// bounded time, and none may leave before the others are done reading its buffers
    /// (an abort meanwhile is seen at the next stage's first barrier). That holds because
    /// nothing between a stage's barriers can panic or block: no user code runs there,
    /// only the checked layout and the reduction kernels of the sealed element types.
    fn wait_all(&self) {
        if self.size > 1 {
            self.shared.barrier.wait_all();
        }
    }

    /// Checks every rank's buffers against the agreed slots, so that the payload never
    /// reads or writes out of bounds whatever the caller passed. Every rank checks every
    /// rank's buffers, so the verdict is the same everywhere.
    ///
    /// # Safety
    /// Between this stage's first barrier and its last.
    unsafe fn check_buffers(
        &self,
        header: &Header<'_>,
        collective: Collective,
    ) -> Result<(), Disagreement> {
        let mut want = [0usize; DType::COUNT];
        for s in header.slots {
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
        for q in 0..self.size {
            // SAFETY: forwarded to the caller.
            let theirs = unsafe { self.post(q).header() };
            let fits = theirs.data.len() == header.slots.len()
                && theirs.data.iter().zip(header.slots).all(|(data, slot)| {
                    slot.len == 0 || (data.dtype() == slot.dtype && data.len() == slot.len)
                });
            if !fits {
                return Err(Disagreement::Buffers {
                    reason: format!("rank {q} passed value data that does not match its slots"),
                });
            }
        }
        for d in DType::ALL {
            let len = want[d.index()];
            let out_len = match collective.output_len(len, self.size) {
                Some(n) if collective.has_outputs() && len > 0 => n,
                _ => 0,
            };
            for q in 0..self.size {
                // SAFETY: forwarded to the caller.
                let b = unsafe { self.buf(q, d) };
                if b.len != len || b.out_len != out_len {
                    return Err(Disagreement::Buffers {
                        reason: format!(
                            "rank {q} passed a {d} region of {} elements and an output of {}, where its slots need {len} and {out_len}",
                            b.len, b.out_len
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    fn chunk(&self, len: usize, q: usize) -> (usize, usize) {
        (len * q / self.size, len * (q + 1) / self.size)
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
        let mut acc = [E::Acc::default(); BLOCK];
        let mut done = 0;
        while done < n {
            let len = BLOCK.min(n - done);
            let acc = &mut acc[..len];
            for q in 0..self.size {
                // SAFETY: within rank q's live input; nobody writes it now (our own writes
                // below come after the last read of this block).
                let src = unsafe { std::slice::from_raw_parts(src(q).add(done), len) };
                if q == 0 {
                    load(acc, src);
                } else {
                    combine(acc, src, op);
                }
            }
            // SAFETY: `dst + done .. + len` is ours alone, and the shared slices above are
            // no longer used.
            let out = unsafe { std::slice::from_raw_parts_mut(dst.add(done), len) };
            finish(acc, op, self.size, out);
            for q in push.targets(self.rank, self.size) {
                // SAFETY: forwarded to the caller.
                let peer = unsafe { self.buf(q, d) }.ptr as *mut E;
                // SAFETY: the same elements of rank q's live region, touched by nobody but
                // us in this phase, and already read by us above if they were an input.
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
        // SAFETY: forwarded to the caller.
        let own = unsafe { self.buf(owner, d) };
        let (lo, hi) = self.chunk(own.len, self.rank);
        let slots = slot_offsets(header.slots).enumerate();
        for (k, (slot, off)) in slots.filter(|(_, (s, _))| s.dtype == d) {
            let (a, b) = (lo.max(off), hi.min(off + slot.len));
            if a >= b {
                continue;
            }
            // SAFETY: forwarded to the caller; element `a - off` of value k is within it.
            let src = |q: usize| unsafe { (self.data(q, k) as *const E).add(a - off) };
            let dst = (own.ptr as *mut E).wrapping_add(a);
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
        let (src, own) = unsafe { (self.data(root, k), self.buf(self.rank, slot.dtype)) };
        let dst = (own.ptr as *mut u8).wrapping_add(offset * size);
        if src != dst.cast_const() {
            // SAFETY: `slot.len` elements of the root's live input and of our region, at
            // different places (our region is ours, the root's input read-only).
            unsafe { std::ptr::copy_nonoverlapping(src, dst, slot.len * size) };
        }
    }

    /// Reduces our chunk of one value into our output region.
    ///
    /// # Safety
    /// Every rank's input region of the slot's dtype (= `E`) is live, read-only in this
    /// phase and holds the slot at `offset`; `out` is our output region of that dtype,
    /// `1/N` of the input long; the slot's length divides by N.
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
        // SAFETY: forwarded to the caller; our chunk lies within value k of every rank.
        let src = |q: usize| unsafe { (self.data(q, k) as *const E).add(start) };
        // SAFETY: forwarded to the caller; `dst` is in our output region, which no one
        // else touches.
        unsafe { self.reduce_range::<E>(&src, chunk, dst, op, (Push::None, slot.dtype, 0)) };
    }

    /// Copies every rank's part of one value into our output region, in rank order.
    ///
    /// # Safety
    /// Every rank's input region of the slot's dtype is live, read-only in this phase and
    /// holds the slot at `offset`; `out` is our output region of that dtype, N times the
    /// input long.
    unsafe fn gather_slot(&self, k: usize, slot: SlotDesc, offset: usize, out: *mut u8) {
        let size = slot.dtype.size();
        let part = slot.len * size;
        let base = offset * self.size * size;
        for q in 0..self.size {
            // SAFETY: forwarded to the caller.
            let src = unsafe { self.data(q, k) };
            // SAFETY: value k of rank q is live and read-only; its place in our output
            // region is `N * offset + q * len` elements, within the output's length.
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

    const OPS: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    #[test]
    fn matches_the_reference_bit_for_bit() {
        for n in [1, 2, 3, 5] {
            for len in [0, 1, 7, BLOCK + 3, 3 * BLOCK] {
                let inputs: Vec<Vec<f32>> = (0..n)
                    .map(|r| {
                        (0..len)
                            .map(|i| ((i * 7 + r * 13) % 17) as f32 * 0.37)
                            .collect()
                    })
                    .collect();
                for op in OPS {
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
                Err(StageError::Disagreed(Disagreement::Slot { slot: 0, counts })) => {
                    assert_eq!(counts, vec![(DType::I64, 10), (DType::I64, 20)])
                }
                other => panic!("unexpected {other:?}"),
            }
            assert!(data.iter().all(|&x| x == 1), "payload must not run");
        }
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

//! The shared-memory communicator: ranks are threads of this process.
//!
//! A stage is three barrier epochs. (1) Every rank posts its header and the addresses of
//! its regions, then waits at the barrier; each rank then reads every header and reaches
//! the same verdict. (2) Reduce-scatter: rank r reduces its 1/N chunk of every region,
//! reading the peers' buffers directly in rank order, and writes the result into its own
//! buffer. (3) All-gather: rank r copies every other chunk from its owner. A final barrier
//! keeps every buffer alive and unchanged until no peer reads it. Each element is reduced
//! exactly once, by one rank, in rank order, so every rank holds bitwise-identical results.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::reduce::{combine, finish, BLOCK};
use super::{
    agree, AbortHandle, Backend, Collective, Communicator, Header, RegionMut, SlotDesc, StageError,
    Status,
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
    /// Per rank, two posts used in alternate stages: a rank can only write a post again
    /// after the next stage's barrier, which every peer reaches after reading this one.
    posts: Box<[Padded<[Post; 2]>]>,
}

#[repr(align(128))]
struct Padded<T>(T);

/// What a rank publishes for one stage. Written before the barrier with relaxed stores;
/// the barrier orders them before every peer's reads.
struct Post {
    failed: AtomicUsize,
    slots: AtomicUsize,
    nslots: AtomicUsize,
    regions: [AtomicUsize; DType::COUNT],
    lens: [AtomicUsize; DType::COUNT],
}

impl Post {
    fn new() -> Self {
        Self {
            failed: AtomicUsize::new(0),
            slots: AtomicUsize::new(0),
            nslots: AtomicUsize::new(0),
            regions: std::array::from_fn(|_| AtomicUsize::new(0)),
            lens: std::array::from_fn(|_| AtomicUsize::new(0)),
        }
    }

    /// # Safety
    /// The post's slots must be published for the current stage and still alive: true
    /// between the stage's first barrier and the owner's next barrier.
    unsafe fn header(&self) -> Header<'_> {
        let ptr = self.slots.load(Relaxed) as *const SlotDesc;
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
        }
    }
}

impl CpuComm {
    fn post(&self, q: usize) -> &Post {
        &self.shared.posts[q].0[self.round & 1]
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
    ) -> Result<(), StageError> {
        if self.size == 1 {
            agree(1, |_| *header).map_err(StageError::Disagreed)?;
            let Collective::AllReduce(op) = collective;
            for region in regions.iter_mut() {
                with_dtype!(region.dtype(), E => {
                    let (ptr, len) = (region.as_mut_ptr().cast::<E>(), region.len());
                    // SAFETY: `ptr`/`len` come from the `&mut` slice in `region`.
                    finish(unsafe { std::slice::from_raw_parts_mut(ptr, len) }, op, 1)
                });
            }
            return Ok(());
        }
        self.round = self.round.wrapping_add(1);
        let mine = self.post(self.rank);
        mine.failed
            .store(usize::from(header.status == Status::Failed), Relaxed);
        mine.slots.store(header.slots.as_ptr() as usize, Relaxed);
        mine.nslots.store(header.slots.len(), Relaxed);
        for d in 0..DType::COUNT {
            mine.regions[d].store(0, Relaxed);
            mine.lens[d].store(0, Relaxed);
        }
        for region in regions.iter_mut() {
            let d = region.dtype().index();
            mine.regions[d].store(region.as_mut_ptr() as usize, Relaxed);
            mine.lens[d].store(region.len(), Relaxed);
        }
        self.wait()?;

        // SAFETY: every rank posted for this round before the barrier we just passed, and
        // keeps its post and slots until it passes its next barrier.
        let verdict = agree(self.size, |q| unsafe { self.post(q).header() });
        let verdict = verdict.and_then(|()| self.check_regions());
        verdict.map_err(StageError::Disagreed)?;

        let Collective::AllReduce(op) = collective;
        for d in DType::ALL {
            if self.post(self.rank).lens[d.index()].load(Relaxed) > 0 {
                // SAFETY: the verdict says every rank posted a region of this dtype and
                // length; chunk `rank` is read and written only by us in this phase.
                with_dtype!(d, E => unsafe { self.reduce_scatter::<E>(d, op) });
            }
        }
        self.wait()?;
        for d in DType::ALL {
            if self.post(self.rank).lens[d.index()].load(Relaxed) > 0 {
                // SAFETY: chunk q of every buffer is final after the barrier and nobody
                // writes it in this phase; we write only chunks we do not own.
                with_dtype!(d, E => unsafe { self.all_gather::<E>(d) });
            }
        }
        self.wait()
    }

    fn abort_handle(&self) -> AbortHandle {
        let shared = Arc::clone(&self.shared);
        AbortHandle::new(move || shared.barrier.abort())
    }
}

impl CpuComm {
    fn wait(&self) -> Result<(), StageError> {
        self.shared.barrier.wait().map_err(|_| StageError::Aborted)
    }

    /// The slot agreement implies equal regions; this guards the communicator itself
    /// against a caller whose regions do not match its slots.
    fn check_regions(&self) -> Result<(), super::Disagreement> {
        for d in 0..DType::COUNT {
            let want = self.post(0).lens[d].load(Relaxed);
            if (1..self.size).any(|q| self.post(q).lens[d].load(Relaxed) != want) {
                return Err(super::Disagreement::BucketSize {
                    counts: (0..self.size)
                        .map(|q| self.post(q).lens[d].load(Relaxed))
                        .collect(),
                });
            }
        }
        Ok(())
    }

    fn chunk(&self, len: usize, q: usize) -> (usize, usize) {
        (len * q / self.size, len * (q + 1) / self.size)
    }

    fn region<E>(&self, q: usize, d: DType) -> (*mut E, usize) {
        let post = self.post(q);
        (
            post.regions[d.index()].load(Relaxed) as *mut E,
            post.lens[d.index()].load(Relaxed),
        )
    }

    /// # Safety
    /// Every rank posted a live region of dtype `d` (= `E`) with the same length, and no
    /// one else writes chunk `self.rank` of any of them until the next barrier.
    unsafe fn reduce_scatter<E: Element>(&self, d: DType, op: ReduceOp) {
        let (dst, len) = self.region::<E>(self.rank, d);
        let (lo, hi) = self.chunk(len, self.rank);
        let mut acc = [E::default(); BLOCK];
        let mut start = lo;
        while start < hi {
            let n = BLOCK.min(hi - start);
            let acc = &mut acc[..n];
            for q in 0..self.size {
                let (src, _) = self.region::<E>(q, d);
                // SAFETY: `start + n <= len` of rank q's live region; nobody writes this
                // chunk now (we write our own copy of it only after the last read below).
                let src = unsafe { std::slice::from_raw_parts(src.add(start), n) };
                if q == 0 {
                    acc.copy_from_slice(src);
                } else {
                    combine(acc, src, op);
                }
            }
            finish(acc, op, self.size);
            // SAFETY: our own region, chunk `rank`: no peer reads it in this phase, and the
            // shared slices above are no longer used.
            unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), dst.add(start), n) };
            start += n;
        }
    }

    /// # Safety
    /// Every rank's chunk of its own region of dtype `d` (= `E`) is final and nobody writes
    /// it until the next barrier.
    unsafe fn all_gather<E: Element>(&self, d: DType) {
        let (dst, len) = self.region::<E>(self.rank, d);
        for q in (0..self.size).filter(|&q| q != self.rank) {
            let (src, _) = self.region::<E>(q, d);
            let (lo, hi) = self.chunk(len, q);
            // SAFETY: chunk q of rank q's region is final and read-only in this phase; we
            // are the only writer of our own region outside our chunk.
            unsafe { std::ptr::copy_nonoverlapping(src.add(lo), dst.add(lo), hi - lo) };
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::comm::reduce::reduce_reference;
    use crate::comm::Disagreement;

    /// Runs one allreduce stage over `inputs[rank]` on `inputs.len()` threads.
    fn run<E: Element>(inputs: Vec<Vec<E>>, op: ReduceOp) -> Vec<Vec<E>> {
        let comms = Cpu.communicators(inputs.len()).unwrap();
        let threads: Vec<_> = comms
            .into_iter()
            .zip(inputs)
            .map(|(mut comm, mut data)| {
                std::thread::spawn(move || {
                    let slots = [SlotDesc {
                        dtype: E::DTYPE,
                        len: data.len(),
                    }];
                    let header = Header {
                        status: Status::Ok,
                        slots: &slots,
                    };
                    let mut regions = [E::region_mut(&mut data)];
                    comm.stage(&header, Collective::AllReduce(op), &mut regions)
                        .unwrap();
                    data
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

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
                for op in [
                    ReduceOp::Sum,
                    ReduceOp::Prod,
                    ReduceOp::Min,
                    ReduceOp::Max,
                    ReduceOp::Avg,
                ] {
                    let srcs: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
                    let want = reduce_reference(&srcs, op);
                    for got in run(inputs.clone(), op) {
                        let got: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
                        let want: Vec<u32> = want.iter().map(|x| x.to_bits()).collect();
                        assert_eq!(got, want, "n={n} len={len} op={op:?}");
                    }
                }
            }
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
                    let slots = [SlotDesc {
                        dtype: DType::I64,
                        len: data.len(),
                    }];
                    let header = Header {
                        status: Status::Ok,
                        slots: &slots,
                    };
                    let mut regions = [i64::region_mut(&mut data)];
                    let r = comm.stage(&header, Collective::AllReduce(ReduceOp::Sum), &mut regions);
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

//! `Nccl`, the backend, and `NcclComm`, one rank's NCCL communicator.

use std::ffi::c_int;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier};

use cudarc::driver::{CudaEvent, CudaSlice, DevicePtrMut};
use cudarc::nccl::result::{self as nccl, NcclError};
use cudarc::nccl::sys;

use super::agree::Board;
use super::{alloc_zeros, device_count, gpu, require_cuda, require_nccl, set_current, Device};
use crate::bucket::DevRegion;
use crate::comm::{AbortHandle, Backend, Collective, Communicator, Header, RegionMut, StageError};
use crate::{DType, Error, ReduceOp};

/// The NCCL backend: actor `r` of a group runs on GPU `devices[r]`, and the group's fused
/// stages run as NCCL collectives on the actors' GPUs.
///
/// Each actor thread binds its GPU's context and creates its own stream and NCCL
/// communicator when the group is launched. GPU tensors in a bucket are copied into the
/// stage's flat device buffer and their results are views of it; host values (a scalar
/// loss, a `Vec`, a host tensor) are copied to the GPU and back.
///
/// ```no_run
/// # fn main() -> Result<(), actorgraph::Error> {
/// use actorgraph::nccl::Nccl;
/// let backend = Nccl::all()?; // one actor per visible GPU
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Nccl {
    devices: Vec<usize>,
}

impl Nccl {
    /// A backend that puts actor `r` of a group on GPU `devices[r]`.
    ///
    /// An error, before anything is opened, if libcuda or libnccl cannot be loaded
    /// ([`Error::LibraryMissing`]), if a GPU does not exist ([`Error::NoSuchDevice`]), if
    /// there is none, or if one appears twice (NCCL cannot hold one GPU twice in a
    /// communicator).
    pub fn new(devices: impl IntoIterator<Item = usize>) -> Result<Self, Error> {
        require_cuda()?;
        require_nccl()?;
        // `ncclAvg` and bf16 came with NCCL 2.10.
        let version = super::nccl_version()?;
        if version < (2, 10, 0) {
            return Err(Error::Backend(format!(
                "NCCL {}.{}.{} is too old: the Nccl backend needs NCCL 2.10 or newer",
                version.0, version.1, version.2
            )));
        }
        let devices: Vec<usize> = devices.into_iter().collect();
        if devices.is_empty() {
            return Err(Error::Backend(
                "the Nccl backend needs at least one GPU".into(),
            ));
        }
        let count = device_count()?;
        for (i, &ordinal) in devices.iter().enumerate() {
            if ordinal >= count {
                return Err(Error::NoSuchDevice { ordinal, count });
            }
            if devices[..i].contains(&ordinal) {
                return Err(Error::Backend(format!(
                    "GPU {ordinal} is given twice: NCCL cannot hold one GPU twice in a \
                     communicator (put one actor per GPU)"
                )));
            }
        }
        Ok(Self { devices })
    }

    /// A backend over every GPU the driver sees, in order.
    pub fn all() -> Result<Self, Error> {
        Self::new(0..device_count()?)
    }

    /// The GPU of each rank.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }
}

impl Backend for Nccl {
    type Comm = NcclComm;

    fn communicators(&self, size: usize) -> Result<Vec<NcclComm>, Error> {
        if size != self.devices.len() {
            return Err(Error::Backend(format!(
                "the Nccl backend has {} GPU(s) for a group of {size} actors: give it one GPU \
                 per actor",
                self.devices.len()
            )));
        }
        let id = nccl::get_uniqueid().map_err(nccl_err("ncclGetUniqueId"))?;
        let shared = Arc::new(Shared {
            barrier: Barrier::new(size),
            failed: AtomicBool::new(false),
            aborted: AtomicBool::new(false),
            board: Board::new(size),
            failed_launch: AtomicUsize::new(usize::MAX),
        });
        let devices: Arc<[usize]> = self.devices.as_slice().into();
        Ok(self
            .devices
            .iter()
            .enumerate()
            .map(|(rank, &ordinal)| NcclComm {
                rank,
                size,
                ordinal,
                id,
                devices: Arc::clone(&devices),
                shared: Arc::clone(&shared),
                attached: None,
                round: 0,
            })
            .collect())
    }
}

/// What the ranks of one group share.
#[derive(Debug)]
struct Shared {
    /// Every rank opens its GPU before any calls `ncclCommInitRank`, which blocks until
    /// all ranks call it: a rank that could not open its GPU must not leave the others
    /// waiting there.
    barrier: Barrier,
    failed: AtomicBool,
    aborted: AtomicBool,
    /// Where the ranks agree on each stage's headers.
    board: Board,
    /// The stage in which a rank's launch failed (`usize::MAX`: none).
    failed_launch: AtomicUsize,
}

impl Shared {
    /// Ends the group: waits and agreements give up, now and later.
    fn abort(&self) {
        self.aborted.store(true, SeqCst);
        self.board.abort();
    }
}

/// One rank's endpoint on the [`Nccl`] backend: its GPU, stream and NCCL communicator,
/// created on the actor's thread when the group is launched.
#[derive(Debug)]
pub struct NcclComm {
    rank: usize,
    size: usize,
    ordinal: usize,
    id: sys::ncclUniqueId,
    /// Every rank's GPU.
    devices: Arc<[usize]>,
    shared: Arc<Shared>,
    attached: Option<Attached>,
    /// Stages agreed on so far.
    round: usize,
}

/// The per-thread part, made by `attach`.
#[derive(Debug)]
struct Attached {
    comm: RawComm,
    device: Device,
    /// Recorded after the work a stage waits for; polled so that a wait can be aborted.
    done: CudaEvent,
    /// Recorded before and after this rank's last launch: `after` covers every collective
    /// it launched, `before` all but the last.
    before: CudaEvent,
    after: CudaEvent,
    /// The stage (`NcclComm::round`) of that launch.
    launched: usize,
    /// The warm-up allreduce's byte.
    warm: CudaSlice<u8>,
    /// Device copies of the regions handed to the host-memory `stage`.
    scratch: Vec<CudaSlice<u8>>,
}

/// An NCCL communicator handle, until aborted.
#[derive(Debug)]
struct RawComm {
    handle: sys::ncclComm_t,
    live: bool,
}

impl RawComm {
    /// An error NCCL met on this communicator after the call that queued the work (a
    /// failed connection, say), if any.
    fn async_error(&self) -> Result<(), Error> {
        if !self.live {
            return Ok(());
        }
        let mut result = sys::ncclResult_t::ncclSuccess;
        // SAFETY: a live handle from `ncclCommInitRank`, and an out-pointer to a local.
        let called = unsafe { sys::ncclCommGetAsyncError(self.handle, &mut result) };
        for code in [called, result] {
            if !matches!(
                code,
                sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
            ) {
                return Err(Error::Gpu {
                    call: "ncclCommGetAsyncError",
                    message: format!("{code:?}"),
                });
            }
        }
        Ok(())
    }

    /// Aborts the communicator: NCCL work of it still queued or running on the GPU stops,
    /// so that the stream drains.
    fn abort(&mut self) {
        if std::mem::take(&mut self.live) {
            // SAFETY: a handle from `ncclCommInitRank`, aborted once (`live`), and used by
            // nothing after: every entry point checks the group's abort flag first.
            unsafe {
                let _ = nccl::comm_abort(self.handle);
            }
        }
    }
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time. `RawComm`
// is owned by one `NcclComm`, whose `&mut self` methods serialise every use; it moves
// threads at most once, with the communicator, before the actor's first step.
unsafe impl Send for RawComm {}

impl Drop for RawComm {
    fn drop(&mut self) {
        // Abort rather than destroy: it does not wait for peers, which may be gone.
        self.abort();
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // The collectives whose results the caller may still hold finish before the
        // communicator is aborted (teardown aborts the group first, so no wait here would
        // otherwise let them).
        self.let_collectives_finish();
    }
}

impl NcclComm {
    /// This rank's GPU, once attached (on the actor's thread).
    pub fn device(&self) -> Option<&Device> {
        self.attached.as_ref().map(|a| &a.device)
    }

    /// The ordinal of this rank's GPU.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn attached(&mut self) -> Result<&mut Attached, StageError> {
        self.attached.as_mut().ok_or_else(|| {
            StageError::Comm(Error::Backend(
                "the NCCL communicator is used before being attached to its actor's thread".into(),
            ))
        })
    }

    /// Runs a stage whose regions are on this rank's GPU (the fused stage's device mode):
    /// agreement, then one NCCL group over every region. Returns once the work is queued
    /// on the stream; [`wait`](Self::wait) waits for it.
    pub(crate) fn stage_device(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        ins: &[DevRegion],
        outs: &[DevRegion],
    ) -> Result<(), StageError> {
        let r = self.stage_device_inner(header, collective, ins, outs);
        self.settle(r)
    }

    fn stage_device_inner(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        ins: &[DevRegion],
        outs: &[DevRegion],
    ) -> Result<(), StageError> {
        self.ready()?;
        self.agree(header, collective)?;
        self.launch(header, collective, ins, outs)
    }

    /// Whether a stage may start: not when the group is aborted, nor when NCCL reported an
    /// error on this communicator since the last stage (its collectives never complete).
    fn ready(&mut self) -> Result<(), StageError> {
        if self.shared.aborted.load(SeqCst) {
            return Err(StageError::Aborted);
        }
        self.attached()?
            .comm
            .async_error()
            .map_err(StageError::Comm)
    }

    /// Waits for the work queued on this rank's stream; gives up with
    /// [`StageError::Aborted`] if the group is aborted meanwhile.
    pub(crate) fn wait(&mut self) -> Result<(), StageError> {
        let r = self.wait_inner();
        self.settle(r)
    }

    /// A CUDA or NCCL failure on one rank leaves its NCCL calls out of step with its
    /// peers' (NCCL pairs collectives by order only), so it ends the whole group: the
    /// peers' waits and agreements give up, and this rank's communicator is aborted so that
    /// its stream drains. An abort from outside does the same here.
    ///
    /// Before the abort, the collectives that every rank launched finish
    /// ([`let_collectives_finish`](Self::let_collectives_finish)).
    fn settle<T>(&mut self, r: Result<T, StageError>) -> Result<T, StageError> {
        if matches!(r, Err(StageError::Comm(_) | StageError::Aborted)) {
            self.shared.abort();
            self.let_collectives_finish();
            if let Some(a) = &mut self.attached {
                a.comm.abort();
            }
        }
        r
    }

    /// Waits, up to [`GRACE`], for the collectives this rank launched, except those of a
    /// stage where a rank's launch failed (they never complete): their results may
    /// already be in the caller's hands (GPU views are handed out before the GPU is done),
    /// and every rank waits for its own before aborting, so they complete.
    fn let_collectives_finish(&mut self) {
        let failed = self.shared.failed_launch.load(SeqCst);
        let Some(a) = &mut self.attached else { return };
        if !a.comm.live {
            return;
        }
        let last = if failed == a.launched {
            &a.before
        } else {
            &a.after
        };
        let deadline = std::time::Instant::now() + GRACE;
        poll(|| {
            let done = last.try_is_complete().unwrap_or(true);
            (done || std::time::Instant::now() >= deadline).then_some(())
        });
    }

    /// Waits for the work queued on this rank's stream, polling an event so that the wait
    /// can end otherwise: with [`StageError::Aborted`] when the group is aborted, with the
    /// error when NCCL reports one on this communicator (a collective that met it never
    /// completes).
    fn wait_inner(&mut self) -> Result<(), StageError> {
        let shared = Arc::clone(&self.shared);
        let a = self.attached()?;
        a.done
            .record(a.device.stream())
            .map_err(|e| StageError::Comm(gpu("cuEventRecord")(e)))?;
        poll(|| match a.done.try_is_complete() {
            Ok(true) => Some(Ok(())),
            Err(e) => Some(Err(StageError::Comm(gpu("cuEventQuery")(e)))),
            Ok(false) if shared.aborted.load(SeqCst) => Some(Err(StageError::Aborted)),
            Ok(false) => a.comm.async_error().err().map(|e| Err(StageError::Comm(e))),
        })
    }

    /// `Communicator::stage` over host regions: agreement, then copies to the GPU, the
    /// collective, and copies back.
    fn stage_host(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        regions: &mut [RegionMut<'_>],
        outputs: &mut [RegionMut<'_>],
    ) -> Result<(), StageError> {
        self.ready()?;
        self.agree(header, collective)?;
        if regions.is_empty() {
            return Ok(());
        }
        let a = self.attached()?;
        let (n_ins, n) = (regions.len(), regions.len() + outputs.len());
        let mut regs = [DevRegion::EMPTY; 2 * DType::COUNT];
        for (i, r) in regions.iter_mut().enumerate() {
            regs[i] = a.upload_scratch(i, r, true)?;
        }
        for (i, r) in outputs.iter_mut().enumerate() {
            regs[n_ins + i] = a.upload_scratch(n_ins + i, r, false)?;
        }
        let (ins, outs) = regs[..n].split_at(n_ins);
        self.launch(header, collective, ins, outs)?;
        self.wait_inner()?;
        let a = self.attached()?;
        // The results: in the outputs for the collectives that have them, else in place.
        if collective.has_outputs() {
            for (i, r) in outputs.iter_mut().enumerate() {
                a.download_scratch(n_ins + i, r)?;
            }
        } else {
            for (i, r) in regions.iter_mut().enumerate() {
                a.download_scratch(i, r)?;
            }
        }
        Ok(())
    }

    /// The failure model's header agreement, on the host (see `agree.rs`).
    fn agree(&mut self, header: &Header<'_>, collective: Collective) -> Result<(), StageError> {
        self.round = self.round.wrapping_add(1);
        self.shared
            .board
            .agree(self.rank, self.round, header, collective)
    }

    /// Queues `collective` over every region as one NCCL group: one launch.
    fn launch(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        ins: &[DevRegion],
        outs: &[DevRegion],
    ) -> Result<(), StageError> {
        let (size, round) = (self.size, self.round);
        let shared = Arc::clone(&self.shared);
        let a = self.attached()?;
        let record = |event: &CudaEvent, stream| {
            event
                .record(stream)
                .map_err(|e| StageError::Comm(gpu("cuEventRecord")(e)))
        };
        record(&a.before, a.device.stream())?;
        let (comm, stream) = (
            a.comm.handle,
            a.device.stream().cu_stream() as sys::cudaStream_t,
        );
        let launched = nccl::group_start()
            .map_err(nccl_stage_err("ncclGroupStart"))
            .and_then(|_| {
                let queued = queue_ops(comm, stream, size, header, collective, ins, outs);
                let ended = nccl::group_end().map_err(nccl_stage_err("ncclGroupEnd"));
                queued.and(ended.map(drop))
            });
        if launched.is_err() {
            // The peers' collectives of this stage wait for ours, which NCCL dropped.
            shared.failed_launch.store(round, SeqCst);
            return launched;
        }
        a.launched = round;
        record(&a.after, a.device.stream())
    }
}

/// The NCCL calls of one stage, between `ncclGroupStart` and `ncclGroupEnd`.
///
/// In-place collectives take one call per region. `allgather` and `reducescatter` take one
/// call per value: NCCL's own layout for them is rank-major over the whole buffer, and a
/// stage's is per value (see `Communicator`'s layout), which per-value calls inside one
/// group give with no extra copy.
fn queue_ops(
    comm: sys::ncclComm_t,
    stream: sys::cudaStream_t,
    size: usize,
    header: &Header<'_>,
    collective: Collective,
    ins: &[DevRegion],
    outs: &[DevRegion],
) -> Result<(), StageError> {
    let err = nccl_stage_err;
    // SAFETY (every call below): each region is a live device buffer of `len` elements
    // of its dtype on this rank's GPU, owned by the fused stage for the whole execution
    // and freed only on this stream, so after these calls complete. Offsets stay within
    // the regions: the layout was agreed, and `Collective::output_len` sized the outputs.
    unsafe {
        match collective {
            Collective::AllReduce(op) => {
                for r in ins {
                    let p = r.ptr as *mut std::ffi::c_void;
                    nccl::all_reduce(p, p, r.len, dtype(r.dtype), red(op), comm, stream)
                        .map_err(err("ncclAllReduce"))?;
                }
            }
            Collective::Broadcast { root } => {
                for r in ins {
                    let p = r.ptr as *mut std::ffi::c_void;
                    nccl::broadcast(p, p, r.len, dtype(r.dtype), root as c_int, comm, stream)
                        .map_err(err("ncclBroadcast"))?;
                }
            }
            Collective::Reduce { op, root } => {
                for r in ins {
                    let p = r.ptr as *mut std::ffi::c_void;
                    nccl::reduce(
                        p,
                        p,
                        r.len,
                        dtype(r.dtype),
                        red(op),
                        root as c_int,
                        comm,
                        stream,
                    )
                    .map_err(err("ncclReduce"))?;
                }
            }
            Collective::AllGather | Collective::ReduceScatter(_) => {
                let mut offsets = [0usize; DType::COUNT];
                for slot in header.slots {
                    let at = &mut offsets[slot.dtype.index()];
                    let (o, len) = (*at, slot.len);
                    *at += len;
                    if len == 0 {
                        continue;
                    }
                    let (Some(i), Some(out)) = (
                        ins.iter().find(|r| r.dtype == slot.dtype),
                        outs.iter().find(|r| r.dtype == slot.dtype),
                    ) else {
                        return Err(StageError::Comm(Error::Backend(
                            "internal error: a value has no region".into(),
                        )));
                    };
                    let bytes = slot.dtype.size() as u64;
                    let src = (i.ptr + o as u64 * bytes) as *const std::ffi::c_void;
                    match collective {
                        Collective::ReduceScatter(op) => {
                            let dst = (out.ptr + (o / size) as u64 * bytes) as *mut _;
                            nccl::reduce_scatter(
                                src,
                                dst,
                                len / size,
                                dtype(slot.dtype),
                                red(op),
                                comm,
                                stream,
                            )
                            .map_err(err("ncclReduceScatter"))?;
                        }
                        _ => {
                            let dst = (out.ptr + (o * size) as u64 * bytes) as *mut _;
                            nccl::all_gather(src, dst, len, dtype(slot.dtype), comm, stream)
                                .map_err(err("ncclAllGather"))?;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    /// Host regions: copied to the GPU, run there, copied back. (Fused stages of a graph
    /// run in device mode instead, through `stage_device`.)
    fn stage(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        regions: &mut [RegionMut<'_>],
        outputs: &mut [RegionMut<'_>],
    ) -> Result<(), StageError> {
        let r = self.stage_host(header, collective, regions, outputs);
        self.settle(r)
    }

    fn abort_handle(&self) -> AbortHandle {
        let shared = Arc::clone(&self.shared);
        AbortHandle::new(move || shared.abort())
    }

    fn attach(&mut self) -> Result<(), Error> {
        // Everything that can fail on one rank alone happens before the barrier: after
        // `ncclCommInitRank`, a rank that gave up would leave its peers inside NCCL.
        let opened = Device::new(self.ordinal)
            .and_then(|d| share_pool_with_peers(&d, &self.devices).map(|()| d))
            .and_then(|device| {
                let event = || {
                    device
                        .context()
                        .new_event(None)
                        .map_err(gpu("cuEventCreate"))
                };
                let warm = alloc_zeros::<u8>(device.stream(), 1)?;
                Ok(([event()?, event()?, event()?], warm, device))
            });
        if opened.is_err() {
            self.shared.failed.store(true, SeqCst);
        }
        self.shared.barrier.wait();
        let ([done, before, after], warm, device) = opened?;
        if self.shared.failed.load(SeqCst) {
            return Err(Error::Backend(format!(
                "rank {}: another rank of the group could not open its GPU",
                self.rank
            )));
        }
        let mut raw = MaybeUninit::uninit();
        // SAFETY: `raw` is written by a successful call and read only then; this thread has
        // the GPU's context current (bound by `Device::new`); every rank calls with the
        // same id and size and its own rank, as NCCL requires.
        let comm = unsafe {
            nccl::comm_init_rank(
                raw.as_mut_ptr(),
                self.size as c_int,
                self.id,
                self.rank as c_int,
            )
            .map_err(nccl_err("ncclCommInitRank"))?;
            RawComm {
                handle: raw.assume_init(),
                live: true,
            }
        };
        set_current(Some(device.clone()));
        self.attached = Some(Attached {
            comm,
            device,
            done,
            before,
            after,
            launched: 0,
            warm,
            scratch: Vec::new(),
        });
        self.warm_up().map_err(|e| match e {
            StageError::Comm(e) => e,
            other => Error::Backend(format!("NCCL warm-up failed: {other:?}")),
        })
    }

    fn nccl(&mut self) -> Option<&mut NcclComm> {
        Some(self)
    }
}

impl NcclComm {
    /// One tiny allreduce while every rank is here, waited for abortably: NCCL connects
    /// peers on a communicator's first collective and blocks there until they come, where
    /// an abort could not reach it.
    fn warm_up(&mut self) -> Result<(), StageError> {
        let a = self.attached()?;
        let stream = Arc::clone(a.device.stream());
        let ptr = a.warm.device_ptr_mut(&stream).0;
        let region = DevRegion {
            dtype: DType::U8,
            ptr,
            len: 1,
        };
        let empty = Header {
            status: crate::comm::Status::Ok,
            slots: &[],
            data: &[],
        };
        let max = Collective::AllReduce(ReduceOp::Max);
        let r = self.launch(&empty, max, &[region], &[]);
        let r = r.and_then(|()| self.wait_inner());
        self.settle(r)
    }
}

impl Attached {
    /// Copies host region `r` (if `upload`) to scratch buffer `i`, which it sizes.
    fn upload_scratch(
        &mut self,
        i: usize,
        r: &mut RegionMut<'_>,
        upload: bool,
    ) -> Result<DevRegion, StageError> {
        let stream = Arc::clone(self.device.stream());
        let bytes = host_bytes(r);
        let need = bytes.len().max(1);
        if self.scratch.get(i).is_none_or(|s| s.len() < need) {
            let buf = stream
                .alloc_zeros::<u8>(need)
                .map_err(|e| StageError::Comm(gpu("cuMemAlloc")(e)))?;
            match self.scratch.get_mut(i) {
                Some(s) => *s = buf,
                None => self.scratch.push(buf),
            }
        }
        let dev = &mut self.scratch[i];
        if upload && !bytes.is_empty() {
            let mut dst = dev.slice_mut(..bytes.len());
            stream
                .memcpy_htod(&*bytes, &mut dst)
                .map_err(|e| StageError::Comm(gpu("cuMemcpyHtoD")(e)))?;
        }
        let (ptr, _record) = dev.device_ptr_mut(&stream);
        Ok(DevRegion {
            dtype: r.dtype(),
            ptr,
            len: r.len(),
        })
    }

    /// Copies scratch buffer `i` back to host region `r`.
    fn download_scratch(&mut self, i: usize, r: &mut RegionMut<'_>) -> Result<(), StageError> {
        let bytes = host_bytes(r);
        if bytes.is_empty() {
            return Ok(());
        }
        let src = self.scratch[i].slice(..bytes.len());
        let stream = self.device.stream();
        stream
            .memcpy_dtoh(&src, bytes)
            .map_err(|e| StageError::Comm(gpu("cuMemcpyDtoH")(e)))?;
        stream
            .synchronize()
            .map_err(|e| StageError::Comm(gpu("cuStreamSynchronize")(e)))
    }
}

/// Lets the other GPUs of the group read and write memory that this rank allocates from
/// its GPU's default memory pool (where cudarc allocates when the GPU supports
/// `cuMemAllocAsync`). NCCL reads and writes the stage buffers of a peer in the same
/// process directly over P2P, and pool memory, unlike `cuMemAlloc`'s, is not open to peers
/// until its pool says so.
fn share_pool_with_peers(device: &Device, devices: &[usize]) -> Result<(), Error> {
    use cudarc::driver::sys as cu;
    let me = device.ordinal();
    if !device.context().has_async_alloc() || devices.iter().all(|&d| d == me) {
        return Ok(());
    }
    let check = |call: &'static str, r: cu::CUresult| {
        r.result().map_err(|e| super::probe::driver_error(call, e))
    };
    // SAFETY: plain driver calls with out-pointers to locals; the context of `device` is
    // current on this thread (`Device::new` bound it), and every ordinal is a GPU that
    // `Nccl::new` checked exists.
    unsafe {
        let mut pool = MaybeUninit::uninit();
        check(
            "cuDeviceGetDefaultMemPool",
            cu::cuDeviceGetDefaultMemPool(pool.as_mut_ptr(), device.context().cu_device()),
        )?;
        let pool = pool.assume_init();
        for &peer in devices.iter().filter(|&&d| d != me) {
            let mut peer_dev = MaybeUninit::uninit();
            check(
                "cuDeviceGet",
                cu::cuDeviceGet(peer_dev.as_mut_ptr(), peer as c_int),
            )?;
            let peer_dev = peer_dev.assume_init();
            let mut can = 0;
            check(
                "cuDeviceCanAccessPeer",
                cu::cuDeviceCanAccessPeer(&mut can, peer_dev, device.context().cu_device()),
            )?;
            if can == 0 {
                // No P2P between the two: NCCL goes through its own buffers instead.
                continue;
            }
            let desc = cu::CUmemAccessDesc {
                location: cu::CUmemLocation {
                    type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: peer_dev,
                },
                flags: cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            check("cuMemPoolSetAccess", cu::cuMemPoolSetAccess(pool, &desc, 1))?;
        }
    }
    Ok(())
}

/// A host region's bytes.
fn host_bytes<'r>(r: &'r mut RegionMut<'_>) -> &'r mut [u8] {
    let bytes = r.len() * r.dtype().size();
    // SAFETY: the region is a `&mut [T]` of `len` plain-data elements of `dtype`, so
    // `len * size` initialised bytes, borrowed mutably for `'r`.
    unsafe { std::slice::from_raw_parts_mut(r.as_mut_ptr(), bytes) }
}

fn dtype(d: DType) -> sys::ncclDataType_t {
    use sys::ncclDataType_t as T;
    match d {
        DType::F16 => T::ncclFloat16,
        DType::BF16 => T::ncclBfloat16,
        DType::F32 => T::ncclFloat32,
        DType::F64 => T::ncclFloat64,
        DType::I8 => T::ncclInt8,
        DType::U8 => T::ncclUint8,
        DType::I32 => T::ncclInt32,
        DType::U32 => T::ncclUint32,
        DType::I64 => T::ncclInt64,
        DType::U64 => T::ncclUint64,
    }
}

fn red(op: ReduceOp) -> sys::ncclRedOp_t {
    use sys::ncclRedOp_t as R;
    match op {
        ReduceOp::Sum => R::ncclSum,
        ReduceOp::Prod => R::ncclProd,
        ReduceOp::Min => R::ncclMin,
        ReduceOp::Max => R::ncclMax,
        ReduceOp::Avg => R::ncclAvg,
    }
}

fn nccl_err(call: &'static str) -> impl FnOnce(NcclError) -> Error {
    // cudarc's `NcclError` prints only its own name; the result code says what failed.
    move |e| Error::Gpu {
        call,
        message: format!("{:?}", e.0),
    }
}

fn nccl_stage_err(call: &'static str) -> impl FnOnce(NcclError) -> StageError {
    move |e| StageError::Comm(nccl_err(call)(e))
}

/// How long a failing rank lets the collectives of earlier stages finish before it aborts
/// its communicator (they normally take microseconds to milliseconds).
const GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Calls `step` until it gives a value: hot first, since a stage's payload takes
/// microseconds to milliseconds, then leaving the core to others.
fn poll<T>(mut step: impl FnMut() -> Option<T>) -> T {
    let mut polls = 0u32;
    loop {
        if let Some(value) = step() {
            return value;
        }
        polls += 1;
        if polls < 64 {
            std::hint::spin_loop();
        } else if polls < 1024 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
}

//! `NcclComm`, one rank's NCCL communicator: attach, agreement, launch, waits, and the
//! failure model on the GPU.

use std::ffi::c_int;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier};

use cudarc::driver::{CudaEvent, CudaSlice, DevicePtrMut};
use cudarc::nccl::result as nccl;
use cudarc::nccl::sys;

use super::agree::Board;
use super::calls::{nccl_err, nccl_stage_err, queue_ops, RawComm};
use super::pool::share_pool_with_peers;
use crate::comm::{
    AbortHandle, Collective, Communicator, DevRegion, DeviceComm, Disagreement, Header, RegionMut,
    StageError,
};
use crate::gpu::{alloc_zeros, gpu, set_current, take_stored, Device, Pinned, TRACKING};
use crate::{DType, Error, ReduceOp};

/// What the ranks of one group share.
#[derive(Debug)]
struct Shared {
    /// Every rank opens its GPU before any calls `ncclCommInitRank`, which blocks until
    /// all ranks call it: a rank that could not open its GPU must not leave the others
    /// waiting there.
    barrier: Barrier,
    /// Whether a rank could not open its GPU (read after `barrier`).
    failed: AtomicBool,
    /// Whether the group is over: every wait and stage gives up.
    aborted: AtomicBool,
    /// Where the ranks agree on each stage's headers.
    board: Board,
    /// The stage in which a rank's launch failed (`usize::MAX`: none).
    failed_launch: AtomicUsize,
    /// Whether a rank saw an asynchronous NCCL error.
    async_failed: AtomicBool,
    /// Whether the group ended in a failure (a rank's stage or wait failed, or met the
    /// abort): its communicators are then aborted at teardown, not destroyed. The abort
    /// flag alone does not say so: teardown raises it too.
    broken: AtomicBool,
}

impl Shared {
    /// Ends the group: waits and agreements give up, now and later.
    fn abort(&self) {
        self.aborted.store(true, SeqCst);
        self.board.abort();
    }
}

/// One rank's endpoint on the [`Nccl`](super::Nccl) backend: its GPU, stream and NCCL
/// communicator, created on the actor's thread when the group is launched.
#[derive(Debug)]
pub struct NcclComm {
    /// Its rank in the whole group, which may span processes.
    rank: usize,
    /// Its place among this process's ranks of the group.
    local: usize,
    size: usize,
    ordinal: usize,
    id: sys::ncclUniqueId,
    /// The GPU of every rank in this process.
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
    /// The page-locked buffers their inputs go to the GPU through, by region.
    staging: Vec<Pinned>,
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        if self.shared.broken.load(SeqCst) || std::thread::panicking() {
            // After a failure: the collectives whose results the caller may still hold
            // finish (if they can) before the communicator is aborted (by `RawComm`'s
            // drop), which discards what is still queued.
            self.let_collectives_finish();
        } else {
            self.finish_and_destroy();
        }
    }
}

impl NcclComm {
    /// The ranks of one group: rank `r` on GPU `devices[r]`, all with communicator id `id`.
    pub(super) fn group(devices: &[usize], id: sys::ncclUniqueId) -> Vec<NcclComm> {
        Self::group_of(devices, id, 0, devices.len(), Board::new(devices.len()))
    }

    /// This process's ranks of a group of `size`: global rank `first + l` on GPU
    /// `devices[l]`, agreeing on `board`.
    pub(super) fn group_of(
        devices: &[usize],
        id: sys::ncclUniqueId,
        first: usize,
        size: usize,
        board: Board,
    ) -> Vec<NcclComm> {
        let shared = Arc::new(Shared {
            barrier: Barrier::new(devices.len()),
            failed: AtomicBool::new(false),
            aborted: AtomicBool::new(false),
            board,
            failed_launch: AtomicUsize::new(usize::MAX),
            async_failed: AtomicBool::new(false),
            broken: AtomicBool::new(false),
        });
        let all: Arc<[usize]> = devices.into();
        devices
            .iter()
            .enumerate()
            .map(|(local, &ordinal)| NcclComm {
                rank: first + local,
                local,
                size,
                ordinal,
                id,
                devices: Arc::clone(&all),
                shared: Arc::clone(&shared),
                attached: None,
                round: 0,
            })
            .collect()
    }

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

    fn stage_device_inner(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        ins: &[DevRegion<'_>],
        outs: &[DevRegion<'_>],
    ) -> Result<(), StageError> {
        self.ready()?;
        // `DeviceComm` is public: the regions may come from anywhere the crate made one,
        // so they are checked against the header like a host stage's.
        let lens = |rs: &[DevRegion<'_>]| region_lens(rs.iter().map(|r| (r.dtype, r.len)));
        self.agree_if_fit(header, collective, lens(ins), lens(outs))?;
        if ins.is_empty() && outs.is_empty() {
            // Nothing to launch (the empty stage that ends a step across processes): the
            // agreement is the whole stage. Every rank agreed on the same layout, so none
            // launches, and none waits for a confirmation.
            return Ok(());
        }
        self.launch(header, collective, ins, outs)
    }

    /// Whether a stage may start: not when the group is aborted, nor when NCCL reported an
    /// error on this communicator since the last stage (its collectives never complete).
    fn ready(&mut self) -> Result<(), StageError> {
        if self.shared.aborted.load(SeqCst) {
            return Err(StageError::Aborted);
        }
        let found = self.attached()?.comm.async_error();
        self.async_failed(found)
    }

    /// Notes an asynchronous NCCL error for the whole group: some collective will never
    /// complete, so nobody waits for its collectives before aborting.
    fn async_failed(&self, found: Result<(), Error>) -> Result<(), StageError> {
        found.map_err(|e| {
            self.shared.async_failed.store(true, SeqCst);
            StageError::Comm(e)
        })
    }

    /// A CUDA or NCCL failure on one rank leaves its NCCL calls out of step with its
    /// peers' (NCCL pairs collectives by order only), so it ends the whole group: the
    /// peers' waits and agreements give up, and this rank's communicator is aborted so that
    /// its stream drains. An abort from outside does the same here.
    ///
    /// Before the abort, the collectives that every rank launched finish
    /// ([`let_collectives_finish`](Self::let_collectives_finish)).
    fn settle<T>(&mut self, r: Result<T, StageError>) -> Result<T, StageError> {
        // Calls out of step with the peers' no longer pair up, in NCCL either.
        let calls = matches!(r, Err(StageError::Disagreed(Disagreement::Calls { .. })));
        if calls || matches!(r, Err(StageError::Comm(_) | StageError::Aborted)) {
            self.shared.broken.store(true, SeqCst);
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
    ///
    /// After an asynchronous NCCL error nothing is waited for: some collective is stuck,
    /// and those queued behind it with it.
    fn let_collectives_finish(&mut self) {
        let shared = Arc::clone(&self.shared);
        let failed = shared.failed_launch.load(SeqCst);
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
            let done = last.try_is_complete().unwrap_or(true)
                || shared.async_failed.load(SeqCst)
                || a.comm.async_error().is_err();
            (done || std::time::Instant::now() >= deadline).then_some(())
        });
    }

    /// A healthy teardown: every collective this rank launched, every rank launched
    /// (each confirmed its launch), so they complete. Waits for this rank's stream,
    /// polling so that a failure ends the wait (NCCL's error, a peer's failure, or
    /// [`TEARDOWN_WAIT`]), then destroys the communicator, which keeps the results of
    /// that work; an abort would discard what is still queued, results the caller may
    /// already hold. When the wait ends in a failure, the group counts as broken and
    /// `RawComm`'s drop aborts the communicator instead.
    fn finish_and_destroy(&mut self) {
        let shared = Arc::clone(&self.shared);
        let Some(a) = &mut self.attached else { return };
        if !a.comm.live {
            return;
        }
        let deadline = std::time::Instant::now() + TEARDOWN_WAIT;
        let finished = a.done.record(a.device.stream()).is_ok()
            && poll(|| match a.done.try_is_complete() {
                Ok(true) => Some(true),
                Err(_) => Some(false),
                Ok(false)
                    if shared.broken.load(SeqCst)
                        || a.comm.async_error().is_err()
                        || std::time::Instant::now() >= deadline =>
                {
                    Some(false)
                }
                Ok(false) => None,
            });
        if finished {
            a.comm.destroy();
        } else {
            shared.broken.store(true, SeqCst);
        }
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
            Ok(false) => a.comm.async_error().err().map(|e| {
                shared.async_failed.store(true, SeqCst);
                Err(StageError::Comm(e))
            }),
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
        let lens = |rs: &[RegionMut<'_>]| region_lens(rs.iter().map(|r| (r.dtype(), r.len())));
        self.agree_if_fit(header, collective, lens(regions), lens(outputs))?;
        if regions.is_empty() {
            return Ok(());
        }
        let (n_ins, n) = (regions.len(), regions.len() + outputs.len());
        let mut regs = [DevRegion::EMPTY; 2 * DType::COUNT];
        let uploaded = self.attached().and_then(|a| {
            for (i, r) in regions.iter_mut().enumerate() {
                regs[i] = a.upload_scratch(i, r, true)?;
            }
            for (i, r) in outputs.iter_mut().enumerate() {
                regs[n_ins + i] = a.upload_scratch(n_ins + i, r, false)?;
            }
            Ok(())
        });
        if uploaded.is_err() {
            // The peers launch this stage: tell them it will not pair up.
            return self.confirm_launch(uploaded);
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

    /// The agreement, when the regions (dtype, length) are what `header` lays out.
    /// Regions that do not match it would have NCCL run past them: this rank then takes
    /// part as failed, so that every rank skips the stage.
    fn agree_if_fit(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        regions: RegionLens,
        outputs: RegionLens,
    ) -> Result<(), StageError> {
        if let Err(why) = regions_fit(header, collective, self.size, &regions, &outputs) {
            let _ = self.agree(&Header::FAILED, collective);
            return Err(StageError::Disagreed(why));
        }
        self.agree(header, collective)
    }

    /// The failure model's header agreement, on the host (see `agree.rs`).
    fn agree(&mut self, header: &Header<'_>, collective: Collective) -> Result<(), StageError> {
        self.round = self.round.wrapping_add(1);
        self.shared.board.agree(self.local, header, collective)
    }

    /// Queues `collective` over every region as one NCCL group: one launch.
    ///
    /// Then every rank says whether its launch succeeded: when one failed, its peers'
    /// collectives wait for calls that NCCL dropped, so every rank ends the group now
    /// (they return [`StageError::Aborted`], the failed rank its error) rather than at
    /// its next stage, leaving a stream that a copy of an earlier result would wait on.
    fn launch(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        ins: &[DevRegion<'_>],
        outs: &[DevRegion<'_>],
    ) -> Result<(), StageError> {
        let launched = self.launch_here(header, collective, ins, outs);
        self.confirm_launch(launched)
    }

    /// Tells the peers whether this rank's launch of the stage went through (`launched`),
    /// and learns whether theirs did. Every rank that agreed on a stage calls it once.
    fn confirm_launch(&mut self, launched: Result<(), StageError>) -> Result<(), StageError> {
        if launched.is_err() {
            // The peers' collectives of this stage wait for ours, which will not come.
            self.shared.failed_launch.store(self.round, SeqCst);
        }
        let confirmed = self.shared.board.confirm(self.local, launched.is_ok());
        launched.and(confirmed)
    }

    fn launch_here(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        ins: &[DevRegion<'_>],
        outs: &[DevRegion<'_>],
    ) -> Result<(), StageError> {
        let (size, round) = (self.size, self.round);
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
        launched?;
        a.launched = round;
        record(&a.after, a.device.stream())
    }
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
        let r = self.settle(r);
        self.with_remote_failure(r)
    }

    fn abort_handle(&self) -> AbortHandle {
        let shared = Arc::clone(&self.shared);
        let abort = AbortHandle::new(move || shared.abort());
        // Over MPI: after a timeout, every process names every late rank.
        #[cfg(feature = "mpi")]
        if self.spans_processes() {
            let shared = Arc::clone(&self.shared);
            return abort.with_census(move |mine, timeout| {
                shared.board.other_processes()?.census(mine, timeout)
            });
        }
        abort
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
        let all_opened = if self.shared.board.spans_processes() {
            // Every rank of every process, in one agreement round.
            self.shared
                .board
                .confirm(self.local, opened.is_ok())
                .is_ok()
        } else {
            if opened.is_err() {
                self.shared.failed.store(true, SeqCst);
            }
            self.shared.barrier.wait();
            !self.shared.failed.load(SeqCst)
        };
        let ([done, before, after], warm, device) = opened?;
        if !all_opened {
            return Err(Error::Backend(format!(
                "rank {}: another rank of the group could not open its GPU",
                self.rank
            )));
        }
        let mut raw = MaybeUninit::uninit();
        // SAFETY: `raw` is a local that nothing else refers to, written by a successful
        // call and read only then; this thread has the GPU's context current (bound by
        // `Device::new`); every rank calls with the same id and size and its own rank, as
        // NCCL requires.
        let comm = unsafe {
            nccl::comm_init_rank(
                raw.as_mut_ptr(),
                self.size as c_int,
                self.id,
                self.rank as c_int,
            )
            .map_err(|e| {
                // Peers that got through their init wait for this rank's warm-up in vain.
                self.shared.failed_launch.store(0, SeqCst);
                nccl_err("ncclCommInitRank")(e)
            })?;
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
            staging: Vec::new(),
        });
        self.warm_up().map_err(|e| match e {
            StageError::Comm(e) => e,
            other => Error::Backend(format!("NCCL warm-up failed: {other:?}")),
        })
    }

    fn device_comm(&mut self) -> Option<&mut dyn DeviceComm> {
        Some(self)
    }

    /// Over MPI ([`Nccl::over_mpi`](super::Nccl::over_mpi)), when the group has ranks in
    /// other processes: a step then ends with an empty stage, whose agreement carries an
    /// error after the last stage to every process.
    fn spans_processes(&self) -> bool {
        #[cfg(feature = "mpi")]
        return self
            .shared
            .board
            .other_processes()
            .is_some_and(|a| a.processes() > 1);
        #[cfg(not(feature = "mpi"))]
        false
    }

    fn note_failure(&mut self, error: &Error) {
        #[cfg(feature = "mpi")]
        if let Some(across) = self.shared.board.other_processes() {
            across.note_failure(self.local, error);
        }
        #[cfg(not(feature = "mpi"))]
        let _ = error;
    }
}

impl NcclComm {
    /// A stage that a failed rank skipped: when the first failed rank is in another
    /// process, its own error, which travelled with its post, so that every process
    /// reports the same one (a failed rank here that comes later reports it instead of its
    /// own, see `StepCtx::drain`). The group stays usable.
    fn with_remote_failure(&self, r: Result<(), StageError>) -> Result<(), StageError> {
        #[cfg(feature = "mpi")]
        if let Err(StageError::Disagreed(Disagreement::Failed { .. })) = &r {
            let across = self.shared.board.other_processes();
            if let Some(error) = across.and_then(|a| a.remote_failure()) {
                return Err(StageError::Comm(error));
            }
        }
        r
    }
}

/// The fused stage's device mode: regions on this rank's GPU.
impl DeviceComm for NcclComm {
    fn device(&self) -> Option<&Device> {
        NcclComm::device(self)
    }

    /// Agreement, then one NCCL group over every region; returns once the work is
    /// queued on the stream.
    fn stage_device(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        ins: &[DevRegion<'_>],
        outs: &[DevRegion<'_>],
    ) -> Result<(), StageError> {
        let r = self.stage_device_inner(header, collective, ins, outs);
        let r = self.settle(r);
        self.with_remote_failure(r)
    }

    fn wait(&mut self) -> Result<(), StageError> {
        let r = self.wait_inner();
        self.settle(r)
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
        // cudarc keeps a failure to record that use; read it here.
        take_stored(stream.context(), TRACKING).map_err(StageError::Comm)?;
        let region = DevRegion::new(DType::U8, ptr, 1);
        let empty = Header {
            status: crate::comm::Status::Ok,
            slots: &[],
            dims: &[],
            data: &[],
        };
        let max = Collective::AllReduce(ReduceOp::Max);
        let r = self.launch(&empty, max, &[region], &[]);
        let r = r.and_then(|()| self.wait_inner());
        self.settle(r)
    }
}

impl Attached {
    /// Copies host region `r` (if `upload`) to scratch buffer `i`, which it sizes. The
    /// region stays valid until the next stage resizes the buffer: `stage_host` uses it
    /// only before then.
    fn upload_scratch(
        &mut self,
        i: usize,
        r: &mut RegionMut<'_>,
        upload: bool,
    ) -> Result<DevRegion<'static>, StageError> {
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
            // Through page-locked memory: a copy from pageable memory could wait inside the
            // driver behind earlier stages' collectives, where no abort reaches it.
            if self.staging.get(i).is_none_or(|p| p.bytes() < need) {
                let p = Pinned::new(self.device.context(), need).map_err(StageError::Comm)?;
                match self.staging.get_mut(i) {
                    Some(s) => *s = p,
                    None => self.staging.push(p),
                }
            }
            let pinned = &mut self.staging[i];
            // The copies from it last time ran before that stage's collective, which
            // `stage_host` waited for: this returns at once.
            pinned.wait_free().map_err(StageError::Comm)?;
            pinned
                .elements_mut::<u8>(0, bytes.len())
                .ok_or_else(|| StageError::Comm(Error::Backend("internal error: staging".into())))?
                .copy_from_slice(bytes);
            let mut dst = dev.slice_mut(..bytes.len());
            pinned
                .upload(0, &mut dst, &stream)
                .map_err(StageError::Comm)?;
        }
        let (ptr, record) = dev.device_ptr_mut(&stream);
        drop(record);
        // cudarc keeps a failure to record that use; read it here.
        take_stored(stream.context(), TRACKING).map_err(StageError::Comm)?;
        Ok(DevRegion::new(r.dtype(), ptr, r.len()))
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

/// The length of a stage's region of each dtype, by dtype index (`None`: no region).
type RegionLens = [Option<usize>; DType::COUNT];

/// The [`RegionLens`] of regions given as (dtype, length).
fn region_lens(regions: impl Iterator<Item = (DType, usize)>) -> RegionLens {
    let mut got = [None; DType::COUNT];
    for (dtype, len) in regions {
        let at = &mut got[dtype.index()];
        // A dtype passed twice never fits.
        *at = Some(if at.is_none() { len } else { usize::MAX });
    }
    got
}

/// Whether `regions` and `outputs` are what `header` lays out: one region per dtype that
/// has elements, as long as its slots add up to, and an output of each for a collective
/// that has outputs, [`Collective::output_len`] long.
fn regions_fit(
    header: &Header<'_>,
    collective: Collective,
    size: usize,
    regions: &RegionLens,
    outputs: &RegionLens,
) -> Result<(), Disagreement> {
    let mut want = [0usize; DType::COUNT];
    for s in header.slots {
        let sum = &mut want[s.dtype.index()];
        *sum = sum.saturating_add(s.len);
    }
    for d in DType::ALL {
        let len = want[d.index()];
        let out_len = collective.output_len(len, size).filter(|_| len > 0);
        let need = |n: usize| (n > 0).then_some(n);
        if regions[d.index()] != need(len) || outputs[d.index()] != out_len.and_then(need) {
            return Err(Disagreement::Buffers {
                reason: format!("this rank's {d} regions do not match its header ({len} elements)"),
            });
        }
    }
    Ok(())
}

/// A host region's bytes.
fn host_bytes<'r>(r: &'r mut RegionMut<'_>) -> &'r mut [u8] {
    let bytes = r.len() * r.dtype().size();
    // SAFETY: the region is a `&mut [T]` of `len` plain-data elements of `dtype`, so
    // `len * size` initialised bytes that any byte pattern is valid for; the result
    // reborrows `r` mutably for `'r`, so nothing else reads or writes them meanwhile.
    unsafe { std::slice::from_raw_parts_mut(r.as_mut_ptr(), bytes) }
}

/// How long a failing rank lets the collectives of earlier stages finish before it aborts
/// its communicator (they normally take microseconds to milliseconds).
const GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a healthy teardown waits for this rank's queued work before it takes the
/// group as failed and aborts (a stage's work normally takes microseconds to
/// milliseconds; this only bounds a GPU that stopped).
const TEARDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

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

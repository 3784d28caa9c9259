//! The NCCL calls themselves: a communicator handle, a stage's collectives, and the
//! mapping of dtypes, operations and errors.

use std::ffi::c_int;

use cudarc::nccl::result::{self as nccl, NcclError};
use cudarc::nccl::sys;

use crate::comm::{Collective, DevRegion, Header, StageError};
use crate::element::with_dtype;
use crate::{DType, Error, ReduceOp};

/// An NCCL communicator handle, until aborted.
#[derive(Debug)]
pub(super) struct RawComm {
    pub(super) handle: sys::ncclComm_t,
    pub(super) live: bool,
}

impl RawComm {
    /// An error NCCL met on this communicator after the call that queued the work (a
    /// failed connection, say), if any.
    pub(super) fn async_error(&self) -> Result<(), Error> {
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

    /// Destroys the communicator after a healthy run: NCCL completes the work of it
    /// still queued (`ncclCommDestroy` finalizes first), then frees it. The caller has
    /// waited for that work already, so this does not wait for peers.
    pub(super) fn destroy(&mut self) {
        if std::mem::take(&mut self.live) {
            // SAFETY: a handle from `ncclCommInitRank`, destroyed once (`live`) and used
            // by nothing after: `live` is false from now on, and every use checks it or
            // the group's flags first; no other thread holds it (`&mut self`).
            let r = unsafe { sys::ncclCommDestroy(self.handle) };
            if r != sys::ncclResult_t::ncclSuccess {
                // Nothing can be returned from teardown: say it where it happens.
                eprintln!("actorgraph: ncclCommDestroy failed: {r:?}");
            }
        }
    }

    /// Aborts the communicator: NCCL work of it still queued or running on the GPU stops,
    /// so that the stream drains. Only after a failure: queued work is discarded.
    pub(super) fn abort(&mut self) {
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
        // Not destroyed by a healthy teardown: the group failed. Abort rather than
        // destroy: it does not wait for peers, which may be gone.
        self.abort();
    }
}

/// The NCCL calls of one stage, between `ncclGroupStart` and `ncclGroupEnd`.
///
/// In-place collectives take one call per region. `allgather` and `reducescatter` take one
/// call per value: NCCL's own layout for them is rank-major over the whole buffer, and a
/// stage's is per value (see `Communicator`'s layout), which per-value calls inside one
/// group give with no extra copy.
pub(super) fn queue_ops(
    comm: sys::ncclComm_t,
    stream: sys::cudaStream_t,
    size: usize,
    header: &Header<'_>,
    collective: Collective,
    ins: &[DevRegion<'_>],
    outs: &[DevRegion<'_>],
) -> Result<(), StageError> {
    let err = nccl_stage_err;
    // SAFETY: every call below gets addresses within regions that are live device
    // buffers of `len` elements of their dtype on this rank's GPU, owned by the fused
    // stage (or the communicator's scratch buffers) for the whole execution and freed
    // only on this stream, so after these calls complete. Offsets stay within the
    // regions: every rank agreed on the layout, the regions were checked against it
    // (`regions_fit`, for host and device stages alike) and
    // `Collective::output_len` sized the outputs. Aliasing: nothing on the host touches
    // these buffers (the fused stage holds them uniquely while it runs, and hands out
    // views only after); on the device, the in-place calls pass one pointer as input and
    // output, which NCCL allows, and `allgather`/`reducescatter` write an output buffer
    // separate from their inputs, each value's output range disjoint from the others'.
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

fn dtype(d: DType) -> sys::ncclDataType_t {
    use cudarc::nccl::NcclType;
    with_dtype!(d, E => E::as_nccl_type())
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

pub(super) fn nccl_err(call: &'static str) -> impl FnOnce(NcclError) -> Error {
    // cudarc's `NcclError` prints only its own name; the result code says what failed.
    move |e| Error::Gpu {
        call,
        message: format!("{:?}", e.0),
    }
}

pub(super) fn nccl_stage_err(call: &'static str) -> impl FnOnce(NcclError) -> StageError {
    move |e| StageError::Comm(nccl_err(call)(e))
}

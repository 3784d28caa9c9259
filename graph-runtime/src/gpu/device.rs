//! `Device`: one GPU and the stream an actor runs its work on.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::driver::{CudaContext, CudaStream, CudaViewMut};

use super::errors::{gpu, take_stored};
use super::staging::Staging;
use crate::Error;

/// One GPU as an actor uses it: its CUDA context and the stream that the actor's fused
/// stages run on.
///
/// Work a method queues on [`stream`](Self::stream) is ordered with the stages before and
/// after it, with no synchronisation in between. A method reaches its actor's device with
/// [`current_device`]; the launching thread makes its own with [`Device::new`] (to put
/// inputs on a GPU, say).
#[derive(Clone, Debug)]
pub struct Device {
    stream: Arc<CudaStream>,
    /// Page-locked buffers that copies from the host go through (see `staging`), shared
    /// by the clones of this `Device`.
    staging: Arc<Mutex<Staging>>,
}

impl Device {
    /// Opens GPU `ordinal` (its primary context, bound to the calling thread) and creates
    /// a stream on it.
    pub fn new(ordinal: usize) -> Result<Self, Error> {
        let count = super::probe::device_count()?;
        if ordinal >= count {
            return Err(Error::NoSuchDevice { ordinal, count });
        }
        let ctx = context(ordinal)?;
        ctx.bind_to_thread().map_err(gpu("cuCtxSetCurrent"))?;
        let stream = ctx.new_stream().map_err(gpu("cuStreamCreate"))?;
        Ok(Self {
            stream,
            staging: Arc::default(),
        })
    }

    /// The GPU's ordinal (its index among the GPUs the driver sees).
    pub fn ordinal(&self) -> usize {
        self.stream.context().ordinal()
    }

    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }

    /// The stream the actor's stages run on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Queues the copy of `src` (host memory) into `dst` on the stream, through the
    /// device's page-locked staging ([`Staging`]): it returns without waiting for the
    /// work queued before it, where a copy from pageable memory may wait inside the driver.
    pub(crate) fn upload<E: crate::Element>(
        &self,
        src: &[E],
        dst: &mut CudaViewMut<'_, E>,
    ) -> Result<(), Error> {
        self.staging
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .upload(self.context(), src, dst, &self.stream)
    }

    /// Waits until every operation queued on the stream is done.
    pub fn synchronize(&self) -> Result<(), Error> {
        self.stream
            .synchronize()
            .map_err(gpu("cuStreamSynchronize"))
    }
}

/// One `CudaContext` per GPU for the whole process. cudarc keeps its stream bookkeeping
/// (event tracking, the number of streams) per context object, and synchronises the whole
/// GPU the first time an object gets a second stream: with one object per GPU that
/// happens once, at the first `Device::new`, not while another rank's collective is
/// waiting on that GPU.
fn context(ordinal: usize) -> Result<Arc<CudaContext>, Error> {
    static CONTEXTS: OnceLock<Mutex<Vec<Option<Arc<CudaContext>>>>> = OnceLock::new();
    let mut all = CONTEXTS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if all.len() <= ordinal {
        all.resize(ordinal + 1, None);
    }
    if let Some(ctx) = &all[ordinal] {
        return Ok(Arc::clone(ctx));
    }
    let ctx = CudaContext::new(ordinal).map_err(gpu("cuDevicePrimaryCtxRetain"))?;
    all[ordinal] = Some(Arc::clone(&ctx));
    Ok(ctx)
}

/// Orders a copy on `stream` that reads `src`, a view that may belong to another stream
/// (a tensor the caller made on its own stream, or on another GPU): `stream` first waits
/// for the work queued on `src`'s stream, and `src`'s stream then waits for the copy, so
/// that freeing `src` there cannot overtake it. cudarc's own event tracking does this only
/// within one context object that has several streams.
pub(crate) fn copy_ordered<E>(
    stream: &Arc<CudaStream>,
    src: &cudarc::driver::CudaView<'_, E>,
    copy: impl FnOnce() -> Result<(), Error>,
) -> Result<(), Error> {
    use cudarc::driver::DeviceSlice;
    let other = src.stream();
    if other.cu_stream() == stream.cu_stream() {
        return copy();
    }
    stream.join(other).map_err(gpu("cuStreamWaitEvent"))?;
    copy()?;
    other.join(stream).map_err(gpu("cuStreamWaitEvent"))
}

thread_local! {
    /// The device of the actor that runs on this thread, set when its communicator is
    /// attached.
    static CURRENT: RefCell<Option<Device>> = const { RefCell::new(None) };
}

pub(crate) fn set_current(device: Option<Device>) {
    CURRENT.with(|c| *c.borrow_mut() = device);
}

/// The device of the actor whose method is running: call it from a method of an actor
/// launched on the [`Nccl`](crate::nccl::Nccl) backend, to allocate and compute on the actor's
/// GPU and stream.
///
/// An error on any other thread (a CPU-backend actor, the launching thread).
pub fn current_device() -> Result<Device, Error> {
    CURRENT.with(|c| c.borrow().clone()).ok_or_else(|| {
        Error::Placement(
            "no GPU on this thread: `current_device` is for methods of actors launched on the \
             Nccl backend"
                .into(),
        )
    })
}

/// `len` zeroed elements on `stream`'s GPU; at least one, since CUDA refuses to allocate
/// zero bytes (an empty tensor views none of them).
pub(crate) fn alloc_zeros<E: crate::Element>(
    stream: &Arc<CudaStream>,
    len: usize,
) -> Result<cudarc::driver::CudaSlice<E>, Error> {
    stream
        .alloc_zeros::<E>(len.max(1))
        .map_err(gpu("cuMemAlloc"))
}

thread_local! {
    /// An error met freeing GPU memory on this actor's thread, for its next stage.
    static DROPPED: RefCell<Option<Error>> = const { RefCell::new(None) };
}

/// Reports the error cudarc may have stored freeing GPU memory on `ctx` just now: on an
/// actor's thread, its next fused stage fails with it ([`take_dropped`]); elsewhere (a
/// result dropped by the caller) there is no call to fail, so it is printed on stderr.
pub(crate) fn dropped(ctx: &CudaContext) {
    let Err(e) = take_stored(ctx, "cuMemFreeAsync (freeing GPU memory)") else {
        return;
    };
    // `try_with`: a drop may run while the thread's locals are being destroyed.
    let actor = CURRENT
        .try_with(|c| c.try_borrow().is_ok_and(|c| c.is_some()))
        .unwrap_or(false);
    let mut e = Some(e);
    if actor {
        let _ = DROPPED.try_with(|d| {
            let mut d = d.borrow_mut();
            if d.is_none() {
                *d = e.take();
            }
        });
    }
    if let Some(e) = e {
        eprintln!("actorgraph: {e}");
    }
}

/// The error met freeing GPU memory on this actor's thread since the last call, if any.
pub(crate) fn take_dropped() -> Result<(), Error> {
    DROPPED
        .try_with(|d| d.borrow_mut().take())
        .ok()
        .flatten()
        .map_or(Ok(()), Err)
}

//! `Device`: one GPU and the stream an actor runs its work on.

use std::cell::RefCell;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DriverError};

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
}

impl Device {
    /// Opens GPU `ordinal` (its primary context, bound to the calling thread) and creates
    /// a stream on it.
    pub fn new(ordinal: usize) -> Result<Self, Error> {
        let count = super::device_count()?;
        if ordinal >= count {
            return Err(Error::NoSuchDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(gpu("cuDevicePrimaryCtxRetain"))?;
        let stream = ctx.new_stream().map_err(gpu("cuStreamCreate"))?;
        Ok(Self { stream })
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

    /// Waits until every operation queued on the stream is done.
    pub fn synchronize(&self) -> Result<(), Error> {
        self.stream
            .synchronize()
            .map_err(gpu("cuStreamSynchronize"))
    }
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
/// launched on the [`Nccl`](super::Nccl) backend, to allocate and compute on the actor's
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

/// Maps a CUDA driver error to [`Error::Gpu`] naming the call.
pub(crate) fn gpu(call: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |e| Error::Gpu {
        call,
        message: e.to_string(),
    }
}

//! The device capability of a communicator (feature `nccl`): collectives that run over a
//! GPU's memory. A communicator declares it through [`Communicator::device_comm`]; a fused
//! stage on such a communicator keeps its flat buffers on that GPU and hands it
//! [`DevRegion`]s, without knowing which backend it is.
//!
//! [`Communicator::device_comm`]: super::Communicator::device_comm

use std::marker::PhantomData;

use cudarc::driver::sys::CUdeviceptr;

use super::{Collective, Header, StageError};
use crate::gpu::Device;
use crate::DType;

/// One dtype region of a fused stage in a GPU's memory, as a device communicator sees it.
///
/// Only the crate makes one (a fused stage, from a buffer it allocated on the
/// communicator's [device](DeviceComm::device), [`len`](Self::len) elements of
/// [`dtype`](Self::dtype) long), and `'a` is the borrow of that buffer: an implementation
/// may hand its address to the GPU for the call it got it in, and cannot keep it longer.
#[derive(Clone, Copy, Debug)]
pub struct DevRegion<'a> {
    pub(crate) dtype: DType,
    pub(crate) ptr: CUdeviceptr,
    pub(crate) len: usize,
    _buf: PhantomData<&'a mut [u8]>,
}

impl DevRegion<'static> {
    pub(crate) const EMPTY: Self = Self::new(DType::U8, 0, 0);
}

impl DevRegion<'_> {
    /// `len` elements of `dtype` at device address `ptr`, which the caller keeps allocated
    /// and otherwise unused for `'a`.
    pub(crate) const fn new(dtype: DType, ptr: CUdeviceptr, len: usize) -> Self {
        Self {
            dtype,
            ptr,
            len,
            _buf: PhantomData,
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device address of the first element.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A communicator whose collectives run over a GPU's memory (see the module docs).
///
/// The stage calls, per execution: [`device`](Self::device) before it lays out its
/// buffers, then [`stage_device`](Self::stage_device) once on every rank, in the same
/// order on every rank, then [`wait`](Self::wait) when host values need their results.
pub trait DeviceComm {
    /// The GPU and stream the stage allocates and copies on; `None` until the
    /// communicator is attached to its actor's thread.
    fn device(&self) -> Option<&Device>;

    /// Runs one fused stage over device regions: header agreement (as
    /// [`Communicator::stage`](super::Communicator::stage)), then `collective` over every
    /// region, queued on [`device`](Self::device)'s stream. `ins` and `outs` follow the
    /// layout [`Communicator`](super::Communicator) describes.
    fn stage_device(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        ins: &[DevRegion<'_>],
        outs: &[DevRegion<'_>],
    ) -> Result<(), StageError>;

    /// Waits for the work queued by `stage_device`; gives up with
    /// [`StageError::Aborted`] if the group is aborted meanwhile.
    fn wait(&mut self) -> Result<(), StageError>;
}

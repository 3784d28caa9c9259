//! GPU tensors (feature `nccl`): copies between host and device, and views of device
//! memory for kernels.

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaView};

use super::{numel, Storage, Tensor};
use crate::gpu::{alloc_zeros, copy_ordered, gpu, Device};
use crate::{Element, Error};

/// What [`Storage::Device`] holds: GPU memory that, when it goes, reports the error cudarc
/// may have met freeing it (see [`crate::gpu::dropped`]), here rather than in whichever
/// call on that GPU comes next, on any thread.
#[derive(Debug)]
pub(crate) struct DeviceBuf<E>(ManuallyDrop<CudaSlice<E>>);

impl<E> DeviceBuf<E> {
    pub(crate) fn new(slice: CudaSlice<E>) -> Self {
        Self(ManuallyDrop::new(slice))
    }
}

impl<E> Deref for DeviceBuf<E> {
    type Target = CudaSlice<E>;
    fn deref(&self) -> &CudaSlice<E> {
        &self.0
    }
}

impl<E> DerefMut for DeviceBuf<E> {
    fn deref_mut(&mut self) -> &mut CudaSlice<E> {
        &mut self.0
    }
}

impl<E> Drop for DeviceBuf<E> {
    fn drop(&mut self) {
        let ctx = Arc::clone(self.0.stream().context());
        // SAFETY: the slice is dropped once, here, and never used after: `self` is being
        // dropped, and nothing else refers to the field.
        unsafe { ManuallyDrop::drop(&mut self.0) };
        crate::gpu::dropped(&ctx);
    }
}

/// The number of elements of a device buffer.
pub(super) fn len<E>(buf: &DeviceBuf<E>) -> usize {
    cudarc::driver::DeviceSlice::len(&**buf)
}

impl<E> Storage<E> {
    pub(crate) fn device(&self) -> Option<&CudaSlice<E>> {
        match self {
            Storage::Host(_) => None,
            Storage::Device(d) => Some(&**d),
        }
    }

    pub(crate) fn device_mut(&mut self) -> Option<&mut CudaSlice<E>> {
        match self {
            Storage::Host(_) => None,
            Storage::Device(d) => Some(&mut **d),
        }
    }
}

impl<E: Element> Tensor<E> {
    /// A tensor of `shape` over `data`, GPU memory the caller allocated (on any stream
    /// of its device); an error if the lengths differ.
    pub fn from_device(data: CudaSlice<E>, shape: impl AsRef<[usize]>) -> Result<Self, Error> {
        let shape = shape.as_ref();
        match numel(shape) {
            Some(n) if n == data.len() => Ok(Self::view(
                Arc::new(Storage::Device(DeviceBuf::new(data))),
                0,
                n,
                shape.into(),
            )),
            expected => Err(Error::ShapeData {
                shape: shape.to_vec(),
                expected: expected.unwrap_or(usize::MAX),
                got: data.len(),
            }),
        }
    }

    /// A copy of this tensor on `device`'s GPU, queued on its stream (from the host, or
    /// from any GPU). An error if the allocation or the copy fails.
    ///
    /// It never waits for the work queued before it on the stream: host data goes through
    /// page-locked buffers that the device keeps and reuses. (A copy from pageable memory,
    /// such as cudarc's `clone_htod` of a `Vec`, may wait inside the driver for the
    /// stream, so behind the group's collectives, where no abort reaches it: in a method,
    /// prefer `to_device`.)
    pub fn to_device(&self, device: &Device) -> Result<Self, Error> {
        let stream = device.stream();
        let mut buf = alloc_zeros::<E>(stream, self.len)?;
        if self.len > 0 {
            let mut dst = buf
                .try_slice_mut(..self.len)
                .ok_or_else(|| Error::Placement("a GPU allocation is shorter than asked".into()))?;
            match (self.host_slice(), self.device_view()) {
                // Through page-locked memory: it never waits behind the stream's work.
                (Some(src), _) => device.upload(src, &mut dst)?,
                // cudarc copies between GPUs (peer to peer) when the view is on another one.
                (None, Some(src)) => copy_ordered(stream, &src, || {
                    stream
                        .memcpy_dtod(&src, &mut dst)
                        .map_err(gpu("cuMemcpyDtoD"))
                })?,
                (None, None) => {
                    return Err(Error::Placement(
                        "a GPU tensor's view lies outside its storage".into(),
                    ))
                }
            }
        }
        // `buf` may hold one element more than the tensor: CUDA cannot allocate zero.
        Ok(Self::view(
            Arc::new(Storage::Device(DeviceBuf::new(buf))),
            0,
            self.len,
            self.shape_of().clone(),
        ))
    }

    /// A host copy of this tensor (a clone sharing the data when it is already on the
    /// host). Waits for the copy, so for every operation queued before it on the tensor's
    /// stream.
    pub fn to_host(&self) -> Result<Self, Error> {
        let Some(src) = self.device_view() else {
            return Ok(self.clone());
        };
        if self.len == 0 {
            return Tensor::from_vec(Vec::new(), self.shape());
        }
        let stream = self
            .data
            .device()
            .map(|d| Arc::clone(d.stream()))
            .ok_or_else(|| Error::Placement("tensor storage changed place".into()))?;
        let host = stream.clone_dtoh(&src).map_err(gpu("cuMemcpyDtoH"))?;
        stream.synchronize().map_err(gpu("cuStreamSynchronize"))?;
        Tensor::from_vec(host, self.shape())
    }

    /// The elements on the GPU, for a kernel or a cudarc copy (`None` on the host).
    pub fn device_view(&self) -> Option<CudaView<'_, E>> {
        self.data
            .device()
            .and_then(|d| d.try_slice(self.offset..self.offset + self.len))
    }

    /// The ordinal of the GPU the tensor is on (`None` on the host).
    pub fn device_ordinal(&self) -> Option<usize> {
        self.data.device().map(|d| d.ordinal())
    }
}

//! Device mode of a fused stage (feature `nccl`): the flat buffer of each dtype lives on
//! the actor's GPU. GPU values are copied in device to device, host values host to device
//! (through the host region when they cannot lend their elements); the communicator runs
//! the collective over the device buffers; GPU values get views of them back, host values
//! copies.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut, DeviceSlice};

use super::region::{Region, Regions, SlotIdx};
use super::{Bucketable, FusedStage};
use crate::comm::{Collective, Communicator, DevRegion, Header, Status};
pub(super) use crate::gpu::Device;
use crate::gpu::{alloc_zeros, copy_ordered, gpu, take_dropped, take_stored, Pinned, TRACKING};
use crate::tensor::{DeviceBuf, Storage};
use crate::{DType, Element, Error};

/// Whether a value lives on a GPU.
pub(super) fn on_device<T: Bucketable>(value: &T) -> bool {
    value.device_elements().is_some()
}

/// The GPU that `comm`'s collectives run on, if it has the device capability (see
/// [`DeviceComm`](crate::comm::DeviceComm)) and is attached.
pub(super) fn device_of<C: Communicator>(comm: &mut C) -> Option<Device> {
    comm.device_comm()?.device().cloned()
}

impl<E: Element> Region<E> {
    /// Makes `dev` an unshared device buffer of at least `len` elements (and `buf` a host
    /// one, when host values need staging), reusing last execution's when no view of it is
    /// alive.
    fn prepare_device(&mut self, device: &Device) -> Result<(), Error> {
        if self.len == 0 {
            // Only empty values: their (empty) results still go on the GPU.
            if self.device_values && self.dev.is_none() {
                let empty = alloc_zeros::<E>(device.stream(), 0)?;
                self.dev = Some(Arc::new(Storage::Device(DeviceBuf::new(empty))));
            }
            return Ok(());
        }
        let len = self.len;
        if self.host_values {
            self.prepare();
            self.prepare_pinned(device)?;
        }
        if self.dev_mut().is_some_and(|d| d.len() >= len) {
            return Ok(());
        }
        let buf = alloc_zeros::<E>(device.stream(), len)?;
        self.dev = Some(Arc::new(Storage::Device(DeviceBuf::new(buf))));
        Ok(())
    }

    /// Makes `pinned` a page-locked buffer of at least `len` elements, free to write.
    ///
    /// The copies queued from it last time have run, or are about to, so waiting for them
    /// cannot hang: they were queued in an earlier execution before this stage's
    /// collective, which that execution waited for (abortably), as a stage with host
    /// values does.
    fn prepare_pinned(&mut self, device: &Device) -> Result<(), Error> {
        let bytes = self.len.saturating_mul(std::mem::size_of::<E>());
        match &self.pinned {
            Some(p) if p.bytes() >= bytes => p.wait_free(),
            _ => {
                // The old buffer waits for its copies as it goes.
                self.pinned = Some(Pinned::new(device.context(), bytes)?);
                Ok(())
            }
        }
    }

    fn dev_mut(&mut self) -> Option<&mut CudaSlice<E>> {
        self.dev
            .as_mut()
            .and_then(Arc::get_mut)
            .and_then(Storage::device_mut)
    }

    /// The region for the communicator: its device address and length (`None` when
    /// empty). An error if a non-empty region has no unshared buffer: this rank would
    /// issue fewer NCCL calls than its peers.
    fn dev_region(&mut self, stream: &Arc<CudaStream>) -> Result<Option<DevRegion<'_>>, Error> {
        let len = self.len;
        if len == 0 {
            return Ok(None);
        }
        let buf = self.dev_mut().ok_or_else(missing_buffer)?;
        let (ptr, _record) = buf.device_ptr_mut(stream);
        Ok(Some(DevRegion::new(E::DTYPE, ptr, len)))
    }

    /// Records that the buffer is written up to this point of the stream (after the
    /// collective), so that cudarc makes other streams' later reads wait for it.
    fn touch(&mut self, stream: &Arc<CudaStream>) {
        if self.len > 0 {
            if let Some(d) = self.dev_mut() {
                drop(d.device_ptr_mut(stream));
            }
        }
    }

    /// Packs a host value into its range of the page-locked buffer (`fill`), then queues
    /// its copy to the device buffer: it never waits for the stream.
    fn upload(
        &mut self,
        range: Range<usize>,
        fill: impl FnOnce(&mut [E]),
        stream: &Arc<CudaStream>,
    ) -> Result<(), Error> {
        let Region { dev, pinned, .. } = self;
        let pinned = pinned.as_mut().ok_or_else(missing_buffer)?;
        fill(
            pinned
                .elements_mut::<E>(range.start, range.len())
                .ok_or_else(missing_buffer)?,
        );
        let mut dst = dev
            .as_mut()
            .and_then(Arc::get_mut)
            .and_then(Storage::device_mut)
            .and_then(|d| d.try_slice_mut(range.clone()))
            .ok_or_else(missing_buffer)?;
        pinned.upload(range.start, &mut dst, stream)
    }

    /// Copies a GPU value to `range` of the device buffer.
    fn copy_in(
        &mut self,
        range: Range<usize>,
        src: &cudarc::driver::CudaView<'_, E>,
        stream: &Arc<CudaStream>,
    ) -> Result<(), Error> {
        let mut dst = self
            .dev_mut()
            .and_then(|d| d.try_slice_mut(range))
            .ok_or_else(missing_buffer)?;
        if dst.len() != src.len() {
            return Err(missing_buffer());
        }
        copy_ordered(stream, src, || {
            stream
                .memcpy_dtod(src, &mut dst)
                .map_err(gpu("cuMemcpyDtoD"))
        })?;
        // cudarc recorded the uses of both buffers as the copy returned, keeping a failure.
        take_stored(stream.context(), TRACKING)
    }

    /// Copies `range` of the device buffer (a host value's result) to the host buffer.
    fn download(&mut self, range: Range<usize>, stream: &Arc<CudaStream>) -> Result<(), Error> {
        let Region { buf, dev, .. } = self;
        let src = dev
            .as_ref()
            .and_then(|d| d.device())
            .and_then(|d| d.try_slice(range.clone()))
            .ok_or_else(missing_buffer)?;
        let dst = buf
            .as_mut()
            .and_then(Arc::get_mut)
            .and_then(Storage::host_mut)
            .and_then(|h| h.get_mut(range))
            .ok_or_else(missing_buffer)?;
        stream.memcpy_dtoh(&src, dst).map_err(gpu("cuMemcpyDtoH"))
    }
}

fn missing_buffer() -> Error {
    Error::Backend("internal error: a fused stage's device buffer does not match its layout".into())
}

macro_rules! regions_device {
    ($($field:ident: $t:ty [$($info:tt)*]),*) => {
        impl Regions {
            fn prepare_device(&mut self, device: &Device) -> Result<(), Error> {
                $(self.$field.prepare_device(device)?;)*
                Ok(())
            }
            /// The non-empty device regions, at most one per dtype, and how many there are.
            fn device_regions(
                &mut self,
                stream: &Arc<CudaStream>,
            ) -> Result<([DevRegion<'_>; DType::COUNT], usize), Error> {
                let mut all = [DevRegion::EMPTY; DType::COUNT];
                let mut n = 0;
                $(if let Some(r) = self.$field.dev_region(stream)? {
                    all[n] = r;
                    n += 1;
                })*
                Ok((all, n))
            }
            fn touch(&mut self, stream: &Arc<CudaStream>) {
                $(self.$field.touch(stream);)*
            }
            fn copy_places(&mut self, from: &Regions) {
                $(
                    self.$field.host_values = from.$field.host_values;
                    self.$field.device_values = from.$field.device_values;
                )*
            }
            fn download(&mut self, d: DType, range: Range<usize>, stream: &Arc<CudaStream>) -> Result<(), Error> {
                match d { $(DType::$field => self.$field.download(range, stream),)* }
            }
        }
    };
}
crate::element::for_each_dtype!(regions_device);

impl FusedStage {
    /// Device mode's `prepare`: takes the device buffers for this layout on `device`.
    pub(super) fn prepare_device(&mut self, device: Device) {
        if !self.end_layout() {
            return;
        }
        if let Err(e) = self.inputs.prepare_device(&device) {
            self.failed.get_or_insert(e);
        }
        self.device = Some(device);
    }

    /// Device mode's `pack`: copies a value into its place in the device buffer. A failed
    /// copy is kept for `run` to report.
    pub(super) fn pack_device<T: Bucketable>(&mut self, value: &T, at: SlotIdx) {
        if self.failed.is_some() || at.len == 0 {
            return;
        }
        if let Err(e) = self.try_pack_device(value, at) {
            self.failed = Some(e);
        }
    }

    /// Device mode's [`pack_slice`](FusedStage::pack_slice): copies host elements to
    /// their place in the device buffer.
    pub(super) fn pack_device_slice<E: Element>(&mut self, data: &[E], at: SlotIdx) {
        if self.failed.is_some() || at.len == 0 {
            return;
        }
        let result = match (self.device.as_ref(), self.inputs.get::<E>()) {
            (Some(device), Some(region)) => {
                let range = at.offset..at.offset + at.len;
                region.upload(range, |dst| dst.copy_from_slice(data), device.stream())
            }
            _ => Err(missing_buffer()),
        };
        if let Err(e) = result {
            self.failed = Some(e);
        }
    }

    fn try_pack_device<T: Bucketable>(&mut self, value: &T, at: SlotIdx) -> Result<(), Error> {
        let (Some(device), Some(region)) = (self.device.as_ref(), self.inputs.get::<T::Elem>())
        else {
            return Err(missing_buffer());
        };
        let stream = device.stream();
        let range = at.offset..at.offset + at.len;
        if at.device {
            let src = value.device_elements().ok_or_else(missing_buffer)?;
            let on = src.stream().context().ordinal();
            if on != device.ordinal() {
                return Err(Error::Placement(format!(
                    "stage `{}`: value {} is on GPU {on}, but this actor runs on GPU {}: \
                     copy it with `to_device(&current_device()?)` first",
                    self.name,
                    at.slot,
                    device.ordinal()
                )));
            }
            return region.copy_in(range, &src, stream);
        }
        match value.elements() {
            Some(src) if src.len() == at.len => {
                region.upload(range, |dst| dst.copy_from_slice(src), stream)
            }
            _ => region.upload(range, |dst| value.pack(dst), stream),
        }
    }

    /// Device mode's `run`: agreement (on the host) and collective (on the GPU), then the
    /// host values' results copied back.
    pub(super) fn run_device<C: Communicator>(
        &mut self,
        comm: &mut C,
        collective: Collective,
        group: &'static str,
    ) -> Result<(), Error> {
        let n = self.ranks;
        let prepared = self.prepare_outputs_device(collective);
        if let Err(e) = self.failed.take().map_or(prepared, Err) {
            self.skip(comm);
            return Err(e);
        }
        let Some(device) = self.device.clone() else {
            self.skip(comm);
            return Err(missing_buffer());
        };
        let stream = device.stream();
        let regions = self
            .inputs
            .device_regions(stream)
            .and_then(|i| Ok((i, self.outputs.device_regions(stream)?)));
        // What cudarc kept from this rank's frees and buffer tracking since its last
        // stage (the regions' addresses were just borrowed and given back): this stage
        // fails with it, named for what failed, rather than the next CUDA call on this
        // GPU, maybe on another thread, failing under its own name.
        let stored = take_dropped().and_then(|()| take_stored(device.context(), TRACKING));
        let ((ins, n_ins), (outs, n_outs)) = match regions.and_then(|r| stored.map(|()| r)) {
            Ok(r) => r,
            Err(e) => {
                self.skip(comm);
                return Err(e);
            }
        };
        let Some(dc) = comm.device_comm() else {
            return Err(Error::Backend(
                "internal error: a device-mode stage ran on a host communicator".into(),
            ));
        };
        let header = Header {
            status: Status::Ok,
            slots: &self.slots,
            dims: &self.dims,
            data: &[],
        };
        dc.stage_device(&header, collective, &ins[..n_ins], &outs[..n_outs])
            .map_err(|e| self.stage_error(e, group))?;
        self.inputs.touch(stream);
        self.outputs.touch(stream);
        if !self.places.iter().all(|p| p.idx.device) {
            // Host values: wait for the collective (abortably), then copy their results.
            dc.wait().map_err(|e| self.stage_error(e, group))?;
            self.download_host_results(collective, n, stream)?;
        }
        // The uses `touch` recorded.
        take_stored(device.context(), TRACKING)
    }

    fn prepare_outputs_device(&mut self, collective: Collective) -> Result<(), Error> {
        if !collective.has_outputs() {
            self.outputs.reset();
            return Ok(());
        }
        if self
            .outputs
            .size_outputs(&self.inputs, collective, self.ranks)
            .is_none()
        {
            return Err(Error::Backend(format!(
                "stage `{}`: the output of {} ranks does not fit in memory",
                self.name, self.ranks
            )));
        }
        self.outputs.copy_places(&self.inputs);
        match &self.device {
            Some(device) => self.outputs.prepare_device(device),
            None => Err(missing_buffer()),
        }
    }

    /// Copies each host value's result from the device buffers to the host ones, where
    /// `output` finds it, and waits for the copies.
    fn download_host_results(
        &mut self,
        collective: Collective,
        n: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<(), Error> {
        let mut offsets = [0usize; DType::COUNT];
        for (slot, place) in self.slots.iter().zip(&self.places) {
            let offset = &mut offsets[slot.dtype.index()];
            let (o, len) = (*offset, slot.len);
            *offset += len;
            if place.idx.device || len == 0 {
                continue;
            }
            match collective {
                Collective::AllGather => {
                    self.outputs
                        .download(slot.dtype, n * o..n * (o + len), stream)?
                }
                Collective::ReduceScatter(_) => {
                    self.outputs
                        .download(slot.dtype, o / n..(o + len) / n, stream)?
                }
                _ => self.inputs.download(slot.dtype, o..o + len, stream)?,
            }
        }
        // Device-to-pageable-host copies return when done; this only makes it explicit.
        stream.synchronize().map_err(gpu("cuStreamSynchronize"))
    }
}

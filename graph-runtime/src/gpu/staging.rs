//! Page-locked staging for copies from host memory to a GPU.
//!
//! A copy from pageable host memory may wait inside the driver for the work queued before
//! it on its stream: the driver stages pageable memory through buffers of its own that
//! drain only as fast as the stream runs. Behind a collective that never completes (a
//! peer that failed), an actor thread would hang there, where no abort reaches it. A copy
//! from page-locked memory returns at once and reads the memory when the stream gets to
//! it, so every upload of host values goes through a [`Pinned`] buffer, allocated once and
//! reused: the host thread then only ever waits where it polls abortably.
//!
//! The price of reuse: a buffer may be written again only once the copies queued from it
//! have run. Each owner says when that is ([`Pinned::is_free`], [`Pinned::wait_free`]): a
//! fused stage's region knows it from the stage's order, and a device's [`Staging`]
//! (for `Tensor::to_device`) fills its buffer front to back and reuses it once a poll
//! finds its copies done.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaStream, CudaViewMut, DevicePtrMut, PinnedHostSlice,
};

use super::errors::{gpu, take_stored, TRACKING};
use crate::{Element, Error};

/// A page-locked host buffer that uploads go through, and the point of its stream after
/// the last copy queued from it.
#[derive(Debug)]
pub(crate) struct Pinned {
    host: PinnedHostSlice<u8>,
    /// Recorded after each copy queued from `host`.
    used: CudaEvent,
}

impl Pinned {
    /// A buffer of `bytes` bytes (at least one) on `ctx`'s GPU.
    pub(crate) fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, Error> {
        // SAFETY: cudarc leaves the memory uninitialised; it is zeroed below, through a
        // raw pointer, before any reference to it is made.
        let mut host =
            unsafe { ctx.alloc_pinned::<u8>(bytes.max(1)) }.map_err(gpu("cuMemHostAlloc"))?;
        // cudarc's own event is never recorded: this does not wait.
        let ptr = host.as_mut_ptr().map_err(gpu("cuEventSynchronize"))?;
        // SAFETY: `ptr` starts a live allocation of `host.len()` bytes that nothing else
        // refers to yet (it was just made); writing bytes needs no alignment. Zeroed once
        // per buffer, so that `elements_mut` only ever lends initialised bytes.
        unsafe { std::ptr::write_bytes(ptr, 0, host.len()) };
        let used = ctx.new_event(None).map_err(gpu("cuEventCreate"))?;
        Ok(Self { host, used })
    }

    /// The capacity in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.host.len()
    }

    /// Whether every copy queued from the buffer has run: a poll, it never waits.
    pub(crate) fn is_free(&self) -> Result<bool, Error> {
        self.used.try_is_complete().map_err(gpu("cuEventQuery"))
    }

    /// Waits for the copies queued from the buffer so far.
    ///
    /// Only for an owner that knows they are done or about to be: they were queued before
    /// work it has since waited for (abortably).
    pub(crate) fn wait_free(&self) -> Result<(), Error> {
        self.used.synchronize().map_err(gpu("cuEventSynchronize"))
    }

    /// `len` elements at element offset `at`, to be written before their upload; `None`
    /// if they do not fit.
    ///
    /// The caller writes only ranges that no copy queued since the buffer was last free
    /// reads (each value its own range, in the fused stage).
    pub(crate) fn elements_mut<E: Element>(&mut self, at: usize, len: usize) -> Option<&mut [E]> {
        let size = std::mem::size_of::<E>();
        let start = at.checked_mul(size)?;
        let end = at.checked_add(len)?.checked_mul(size)?;
        // The event of cudarc's own tracking is never recorded (copies go through
        // `upload`), so this does not wait.
        let bytes = self.host.as_mut_slice().ok()?.get_mut(start..end)?;
        // SAFETY: validity: `E` is one of the crate's plain-data element types, for which
        // every bit pattern of `size_of::<E>()` bytes is a value, and the range starts at
        // a multiple of `size_of::<E>()` from a page-aligned allocation, which is aligned
        // for every element type; it holds exactly `len` elements. Aliasing: the result
        // reborrows `self.host` mutably for its lifetime, so nothing on the host reads or
        // writes these bytes meanwhile; the device reads them only in copies the caller
        // queues later with `upload` (the caller's contract rules out earlier ones).
        Some(unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<E>(), len) })
    }

    /// Queues the copy of `dst.len()` elements at element offset `at` of the buffer into
    /// `dst`, on `stream`; returns at once.
    pub(crate) fn upload<E: Element>(
        &mut self,
        at: usize,
        dst: &mut CudaViewMut<'_, E>,
        stream: &Arc<CudaStream>,
    ) -> Result<(), Error> {
        let len = dst.len();
        let size = std::mem::size_of::<E>();
        let range = at
            .checked_mul(size)
            .and_then(|start| Some(start..start.checked_add(len.checked_mul(size)?)?))
            .filter(|r| r.end <= self.host.len())
            .ok_or_else(|| Error::Backend("internal error: an upload past its staging".into()))?;
        // Taken before the copy and kept until it is queued: cudarc orders other streams'
        // later uses of `dst` after it.
        let (ptr, _record) = dst.device_ptr_mut(stream);
        // cudarc's own event of the buffer is never recorded: this does not wait.
        let base = self
            .host
            .as_mut_ptr()
            .map_err(gpu("cuEventSynchronize"))?
            .cast_const();
        // SAFETY: `src` is `range` of a live page-locked allocation, in bounds (checked
        // above); the allocation stays alive until `used`, recorded right after, has
        // completed (`Drop` waits for it), and its owner writes those bytes again only
        // once it has (`is_free`/`wait_free`), so the device reads them unchanged.
        // `ptr` is `dst`'s device address, `dst.len()` elements of `E`, so exactly
        // `range.len()` bytes, borrowed mutably (no other host use) and ordered on
        // `stream` by cudarc's events; the two cannot overlap (host vs device memory).
        unsafe {
            let src = std::slice::from_raw_parts(base.add(range.start), range.len());
            cudarc::driver::result::memcpy_htod_async(ptr, src, stream.cu_stream())
                .map_err(gpu("cuMemcpyHtoDAsync"))?;
        }
        // Ends the borrow of `dst`'s address: cudarc records its use, keeping a failure
        // for later; read it here rather than in the next call on this GPU.
        drop(_record);
        take_stored(stream.context(), TRACKING)?;
        self.used.record(stream).map_err(gpu("cuEventRecord"))
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // The device may still read the buffer: cudarc frees it right after this.
        let _ = self.used.synchronize();
    }
}

/// The page-locked buffers of one device's uploads (`Tensor::to_device`): each upload takes
/// the next bytes of the current buffer, which is reused from its start once its copies
/// have run; while they have not, another free buffer, or a new one, takes over. Only
/// that switch polls the GPU (an event query), never waits, so an upload never waits for
/// the stream; a few free buffers are kept for later.
#[derive(Debug, Default)]
pub(crate) struct Staging {
    /// The current buffer last.
    bufs: Vec<Pinned>,
    /// Bytes of the current buffer taken since it was last free.
    taken: usize,
}

impl Staging {
    /// Free buffers kept besides the current one.
    const KEEP: usize = 4;
    /// The smallest buffer made, so that small uploads share one.
    const MIN_BYTES: usize = 64 << 10;
    /// Where each upload starts: a multiple of every element size.
    const ALIGN: usize = 16;

    /// Queues the copy of `src` into `dst` on `stream` (of `ctx`'s GPU).
    pub(crate) fn upload<E: Element>(
        &mut self,
        ctx: &Arc<CudaContext>,
        src: &[E],
        dst: &mut CudaViewMut<'_, E>,
        stream: &Arc<CudaStream>,
    ) -> Result<(), Error> {
        if src.len() != dst.len() {
            return Err(Error::Backend(
                "internal error: an upload's source and destination differ in length".into(),
            ));
        }
        let bytes = std::mem::size_of_val(src);
        let at = self.taken.next_multiple_of(Self::ALIGN);
        let fits = self
            .bufs
            .last()
            .is_some_and(|b| at.checked_add(bytes).is_some_and(|end| end <= b.bytes()));
        let at = if fits { at } else { self.switch(ctx, bytes)? };
        let Some(buf) = self.bufs.last_mut() else {
            return Err(Error::Backend("internal error: no staging buffer".into()));
        };
        let size = std::mem::size_of::<E>();
        buf.elements_mut::<E>(at / size, src.len())
            .ok_or_else(|| Error::Backend("internal error: a staging buffer too short".into()))?
            .copy_from_slice(src);
        buf.upload(at / size, dst, stream)?;
        self.taken = at + bytes;
        Ok(())
    }

    /// Makes the current buffer one of at least `bytes` bytes whose copies have all run,
    /// and returns where its free bytes start (0).
    fn switch(&mut self, ctx: &Arc<CudaContext>, bytes: usize) -> Result<usize, Error> {
        let mut free = Vec::with_capacity(self.bufs.len());
        for b in &self.bufs {
            free.push(b.is_free()?);
        }
        let pick = (0..self.bufs.len())
            .rev()
            .find(|&i| free[i] && self.bufs[i].bytes() >= bytes);
        let next = match pick {
            Some(i) => {
                free.remove(i);
                self.bufs.remove(i)
            }
            None => {
                let size = bytes.max(Self::MIN_BYTES);
                Pinned::new(ctx, size.checked_next_power_of_two().unwrap_or(size))?
            }
        };
        // Free buffers beyond `KEEP` go (busy ones stay until their copies have run), so
        // the pool follows recent uploads, not the largest ever.
        let mut kept = 0;
        let mut is_free = free.into_iter();
        self.bufs.retain(|_| {
            let f = is_free.next().unwrap_or(false);
            kept += usize::from(f);
            !f || kept <= Self::KEEP
        });
        self.bufs.push(next);
        self.taken = 0;
        Ok(0)
    }
}

//! The flat-buffer layout of a stage: one region per dtype, every value of that dtype
//! packed into it back to back, each value's place a [`SlotIdx`].

use std::any::Any;
use std::sync::Arc;

use super::reduced::Reduced;
use crate::comm::{Collective, RegionMut, SharedBuffers};
use crate::tensor::Storage;
use crate::{DType, Element};

/// One dtype's part of a stage's flat buffer.
pub(crate) struct Region<E> {
    /// Reused across executions while no output view holds it.
    pub(super) buf: Option<Arc<Storage<E>>>,
    /// Rank 0's buffer, when the communicator wrote this stage's results there for every
    /// rank (see `Communicator::shares_results`); outputs then view it instead of `buf`.
    /// Dropped as soon as the outputs are made, so that rank 0 can reuse it.
    shared: Option<Arc<Storage<E>>>,
    /// `shared`'s length, read once: its count and length share a line that every rank
    /// writes while it makes its views.
    shared_len: usize,
    /// References to `shared` taken in one go, one per slot of this dtype, each handed to a
    /// view (see [`Reduced`]); those left over are dropped with `shared`. Every rank
    /// makes its views of rank 0's buffer at the same time, and a reference taken per view
    /// would move the count's line between their cores at every view (a stage of 64
    /// values makes 64 views a rank: the `64x1024 f32, 2 actors/one fused stage` row of
    /// `BENCHMARKS.md`).
    spares: Vec<Arc<Storage<E>>>,
    pub(super) len: usize,
    /// Whether a value of this execution is in host memory. In device mode, `buf` then
    /// stages those values (and their results) on the host.
    pub(super) host_values: bool,
    /// Whether a value of this execution is on a GPU (even an empty one: its result must
    /// be on the GPU too).
    pub(super) device_values: bool,
    /// Device mode: the flat buffer on the actor's GPU. Reused like `buf`.
    pub(super) dev: Option<Arc<Storage<E>>>,
    /// Device mode: the page-locked buffer that host values go to the GPU through (see
    /// `gpu::staging`): uploads from pageable memory could wait, inside the driver, behind
    /// a collective that never completes.
    #[cfg(feature = "nccl")]
    pub(super) pinned: Option<crate::gpu::Pinned>,
}

impl<E: Element> Region<E> {
    pub(super) const fn new() -> Self {
        Self {
            buf: None,
            shared: None,
            shared_len: 0,
            spares: Vec::new(),
            len: 0,
            host_values: false,
            device_values: false,
            dev: None,
            #[cfg(feature = "nccl")]
            pinned: None,
        }
    }

    /// Makes `buf` an unshared buffer of at least `len` elements, reusing the last one when
    /// no view of it is alive: in steady state this allocates nothing.
    pub(super) fn prepare(&mut self) {
        if self.len == 0 {
            return;
        }
        if let Some(v) = self
            .buf
            .as_mut()
            .and_then(Arc::get_mut)
            .and_then(Storage::host_mut)
        {
            if v.len() < self.len {
                v.resize(self.len, E::default());
            }
            return;
        }
        self.buf = Some(Arc::new(Storage::Host(vec![E::default(); self.len])));
    }

    pub(super) fn slice_mut(&mut self) -> &mut [E] {
        let len = self.len;
        self.buf
            .as_mut()
            .and_then(Arc::get_mut)
            .and_then(Storage::host_mut)
            .and_then(|v| v.get_mut(..len))
            .unwrap_or(&mut [])
    }

    /// [`result`](Self::result) of the device buffer for a value on a GPU.
    pub(super) fn result_at<R>(
        &mut self,
        device: bool,
        offset: usize,
        len: usize,
        f: impl FnOnce(Reduced<'_, E>) -> R,
    ) -> R {
        if device {
            if let Some(buf) = self.dev.as_ref().filter(|b| offset + len <= b.len()) {
                return f(Reduced::new(buf, offset, len));
            }
        }
        self.result(offset, len, f)
    }

    /// `len` elements at `offset` of the buffer, for a value's result.
    fn result<R>(&mut self, offset: usize, len: usize, f: impl FnOnce(Reduced<'_, E>) -> R) -> R {
        if let Some(buf) = &self.shared {
            if offset + len <= self.shared_len {
                let reduced = Reduced::new(buf, offset, len);
                reduced.spares.set(Some(&mut self.spares));
                return f(reduced);
            }
        } else if let Some(buf) = self.buf.as_ref().filter(|b| offset + len <= b.len()) {
            return f(Reduced::new(buf, offset, len));
        }
        // Only empty regions have no buffer: hand out an empty view.
        let buf = Arc::new(Storage::Host(Vec::new()));
        f(Reduced::new(&buf, 0, 0))
    }

    /// Views `buf`, rank 0's buffer, for the results of `views` slots.
    fn adopt(&mut self, buf: Arc<Storage<E>>, views: usize) {
        self.shared_len = buf.len();
        self.spares.clear();
        self.spares
            .extend(std::iter::repeat_n(&buf, views).cloned());
        self.shared = Some(buf);
    }

    fn release_shared(&mut self) {
        // Most regions of a stage hold neither (a stage has one or two of the ten
        // dtypes): tested first, they run no drop code.
        if self.shared.is_some() || !self.spares.is_empty() {
            self.shared = None;
            self.spares.clear();
        }
    }
}

macro_rules! regions {
    ($($field:ident: $t:ty [$($info:tt)*]),*) => {
        /// One region per dtype; fields are named after the `DType` variants so that one
        /// list drives both.
        #[allow(non_snake_case)]
        pub(super) struct Regions { $(pub(super) $field: Region<$t>,)* }

        impl Regions {
            pub(super) const fn new() -> Self {
                Self { $($field: Region::new(),)* }
            }
            pub(super) fn reset(&mut self) {
                $(
                    self.$field.len = 0;
                    self.$field.host_values = false;
                    self.$field.device_values = false;
                )*
                self.release_shared();
            }
            pub(super) fn release_shared(&mut self) {
                $(self.$field.release_shared();)*
            }
            /// Rank 0's side of a result exchange: its non-empty buffers, by dtype index.
            pub(super) fn offer(&self, out: &mut SharedBuffers) {
                $(if self.$field.len > 0 {
                    out[DType::$field.index()] = self.$field.buf.clone().map(|b| b as Arc<dyn Any + Send + Sync>);
                })*
            }
            /// The other ranks' side: view rank 0's buffers from now on, for the results
            /// of `views[d]` slots of each dtype `d`.
            pub(super) fn adopt(&mut self, from: &mut SharedBuffers, views: &[usize; DType::COUNT]) {
                $(if let Some(b) = from[DType::$field.index()].take() {
                    if let Ok(b) = b.downcast::<Storage<$t>>() {
                        self.$field.adopt(b, views[DType::$field.index()]);
                    }
                })*
            }
            pub(super) fn prepare(&mut self) {
                $(self.$field.prepare();)*
            }
            /// Makes room for `len` more elements of dtype `d` (on a GPU or not), and
            /// returns their offset; `None` if the region's length overflows.
            #[inline]
            pub(super) fn append(&mut self, d: DType, len: usize, device: bool) -> Option<usize> {
                match d { $(DType::$field => {
                    let r = &mut self.$field;
                    let offset = r.len;
                    r.len = offset.checked_add(len)?;
                    if device {
                        r.device_values = true;
                    } else {
                        r.host_values = true;
                    }
                    Some(offset)
                })* }
            }
            /// Sizes each region for `collective`'s output from `inputs`' lengths; `None`
            /// if a length overflows.
            pub(super) fn size_outputs(&mut self, inputs: &Regions, collective: Collective, ranks: usize) -> Option<()> {
                $(self.$field.len = if inputs.$field.len == 0 {
                    0
                } else {
                    collective.output_len(inputs.$field.len, ranks)?
                };)*
                Some(())
            }
            /// The non-empty regions, at most one per dtype, in dtype order, on the stack.
            /// Only the dtypes of the layout are made into regions (a stage has one or two
            /// of the ten): making and testing a region for each would be a visible part
            /// of a small stage.
            pub(super) fn with_slices<R>(&mut self, f: impl FnOnce(&mut [RegionMut<'_>]) -> R) -> R {
                let mut all: [RegionMut<'_>; DType::COUNT] =
                    std::array::from_fn(|_| RegionMut::U8(&mut []));
                let mut n = 0;
                $(if self.$field.len > 0 {
                    let region = <$t>::region_mut(self.$field.slice_mut());
                    // One place per field: `n` stays below `DType::COUNT`.
                    if let (false, Some(place)) = (region.is_empty(), all.get_mut(n)) {
                        *place = region;
                        n += 1;
                    }
                })*
                f(&mut all[..n])
            }
        }

        impl Regions {
            /// The region of `E`. Always `Some`: `Element` is sealed and every element type
            /// has its field (the downcast folds away, `E::DTYPE` being a constant).
            pub(super) fn get<E: Element>(&mut self) -> Option<&mut Region<E>> {
                let region: &mut dyn Any = match E::DTYPE { $(DType::$field => &mut self.$field,)* };
                region.downcast_mut()
            }
        }
    };
}

crate::element::for_each_dtype!(regions);

/// A slot's position in its dtype's region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotIdx {
    pub(super) slot: usize,
    pub(super) offset: usize,
    pub(super) len: usize,
    /// The value is on a GPU: its result is a view of the device buffer.
    pub(super) device: bool,
    /// How many slots the value takes, from `slot` on: 1 for a value of one part (then
    /// `offset`, `len` and `device` are that part's), more or none for a value made of
    /// parts (see `parts.rs`).
    pub(super) parts: usize,
}

impl SlotIdx {
    /// What `add` returns when it is called out of order: no slot, so that `pack` refuses
    /// it and `output` gives an empty result.
    pub(super) const NONE: SlotIdx = SlotIdx {
        slot: usize::MAX,
        offset: 0,
        len: 0,
        device: false,
        parts: 0,
    };
}

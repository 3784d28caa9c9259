//! Values made of several parts: a `Vec` of tensors, a struct of tensors and scalars
//! (`#[derive(Bucketable)]`), a value whose element type is known only at run time (a
//! candle tensor). Each part is one slot of the stage, in its own dtype's region, so a
//! value may mix dtypes, each part is read in place where it can be, and each result is a
//! view of the stage's buffer.
//!
//! A value walks its parts three times per execution, always in the same order: to lay
//! them out ([`Layout`], `Bucketable::add_parts`), to hand them to the stage ([`Hand`],
//! `Bucketable::hand_parts`) and to build its result from theirs ([`Parts`],
//! `Bucketable::unpack_parts`, `Gather::gather_parts`, `Scatter::scatter_parts`). The
//! defaults of those methods make the value itself one part, so a plain `Bucketable` is a
//! value of one part. The stage checks each part against the slot it was laid out in: a
//! value whose walks disagree gets an error from `run`, never a slice of another value.

use std::marker::PhantomData;
use std::sync::Arc;

use super::region::{Region, SlotIdx};
use super::stage::FusedStage;
use super::{Bucketable, Gather, Reduced, Scatter};
use crate::tensor::Storage;
use crate::{Element, Error};

/// Lays out a value's parts: one slot per part, in order (see
/// [`Bucketable::add_parts`]).
pub struct Layout<'a> {
    pub(super) st: &'a mut FusedStage,
    /// The stage concatenates along the first dimension (`allgather`), which the
    /// agreement then does not compare.
    pub(super) gather: bool,
}

impl Layout<'_> {
    /// Lays out `value` with all its parts.
    #[inline]
    pub fn add<T: Bucketable>(&mut self, value: &T) {
        value.add_parts(self)
    }

    /// [`add`](Self::add) in a `reducescatter` stage, where each part splits along its rows.
    #[inline]
    pub fn add_scatter<T: Scatter>(&mut self, value: &T) {
        value.add_scatter_parts(self)
    }

    /// Lays out `value` as one part: its own elements, as its `Bucketable` methods
    /// describe them.
    #[inline]
    pub fn leaf<T: Bucketable>(&mut self, value: &T) {
        self.st.add_leaf(value);
    }

    /// [`leaf`](Self::leaf) in a `reducescatter` stage.
    #[inline]
    pub fn scatter_leaf<T: Scatter>(&mut self, value: &T) {
        self.st.add_scatter_leaf(value);
    }

    /// Lays out one part of `len` elements of `E` in host memory, with `shape` (empty for
    /// a flat part) and, for `reducescatter`, `rows` rows (its first dimension). Hand its
    /// elements with [`Hand::copy`] and take its result with [`Parts::raw`] (or
    /// `raw_gathered`, `raw_scattered`): for values whose element type is known only at run
    /// time.
    pub fn raw<E: Element>(&mut self, len: usize, rows: usize, shape: &[usize]) {
        self.st.add_raw::<E>(len, rows, shape);
    }

    /// Lays out a count that every rank must agree on, a list's length, as a part
    /// without elements whose shape is the count: ranks with different counts get
    /// [`Error::ShapeMismatch`] naming the value, instead of misaligned parts. Hand it with
    /// [`Hand::agree_len`] and skip it with [`Parts::agree_len`].
    pub fn agree_len(&mut self, len: usize) {
        // `allgather` does not compare first dimensions: put the count in the second.
        let dims = [0, len];
        let shape = if self.gather { &dims[..] } else { &dims[1..] };
        self.st.add_raw::<u8>(0, 0, shape);
    }

    /// Refuses the value: `run` then fails on this rank with `error`, after taking part
    /// in the stage as failed so that its peers skip it too. A refused part lays out no
    /// slot: its `hand_parts` and `unpack_parts` must skip it too.
    pub fn refuse(&mut self, error: Error) {
        self.st.refuse(error);
    }
}

/// Hands a value's parts to the stage after the layout, in the same order (see
/// [`Bucketable::hand_parts`]): lent in place to a communicator that reads values in
/// place, else copied into the stage's buffer.
pub struct Hand<'a, 'v> {
    pub(super) st: &'a mut FusedStage,
    pub(super) next: usize,
    pub(super) end: usize,
    pub(super) lend: bool,
    /// The parts are borrowed for `'v`, which outlives the stage's use of lent elements.
    pub(super) values: PhantomData<&'v ()>,
}

impl<'v> Hand<'_, 'v> {
    /// Hands `value` with all its parts.
    #[inline]
    pub fn add<T: Bucketable>(&mut self, value: &'v T) {
        value.hand_parts(self)
    }

    /// Hands `value` as one part (see [`Layout::leaf`]).
    #[inline]
    pub fn leaf<T: Bucketable>(&mut self, value: &'v T) {
        let at = self.take();
        if self.lend {
            self.st.lend_leaf(value, at)
        } else {
            self.st.pack_leaf(value, at)
        }
    }

    /// Hands a part laid out with [`Layout::raw`] by copying `data` into the stage's
    /// buffer (it must hold as many elements as were laid out).
    pub fn copy<E: Element>(&mut self, data: &[E]) {
        let at = self.take();
        self.st.pack_slice(data, at);
    }

    /// Hands the count laid out with [`Layout::agree_len`].
    pub fn agree_len(&mut self) {
        self.copy::<u8>(&[]);
    }

    /// The next slot of this value; none past its last.
    #[inline]
    fn take(&mut self) -> SlotIdx {
        let at = if self.next < self.end {
            self.st.slot_at(self.next)
        } else {
            SlotIdx::NONE
        };
        self.next = self.next.saturating_add(1);
        at
    }
}

/// Where [`Parts`] takes each part's result from.
enum Source<'a> {
    /// The stage's buffers, from slot `next` to `end`.
    Stage {
        st: &'a mut FusedStage,
        next: usize,
        end: usize,
    },
    /// No stage: each part's result is a copy of the part itself, as if the collective ran
    /// on one rank (see [`Parts::detached`]).
    Detached,
}

/// Builds a value's result from its parts' results, in the order of the layout (see
/// [`Bucketable::unpack_parts`]).
pub struct Parts<'a> {
    src: Source<'a>,
}

/// Which result a part takes.
#[derive(Clone, Copy)]
enum Kind {
    /// `allreduce`, `broadcast`, `reduce`: the input buffer, in place.
    InPlace,
    /// `allgather`: every rank's elements.
    Gathered,
    /// `reducescatter`: this rank's share.
    Scattered,
}

impl<'a> Parts<'a> {
    pub(super) fn new(st: &'a mut FusedStage, at: SlotIdx) -> Self {
        Self {
            src: Source::Stage {
                st,
                next: at.slot,
                end: at.slot.saturating_add(at.parts),
            },
        }
    }

    /// Results without a stage: each part's result is a copy of the part, as if the
    /// collective ran on one rank. What a value made of parts returns from its own
    /// `Bucketable::unpack` (which a stage never calls for it: it calls `unpack_parts`).
    pub fn detached() -> Parts<'static> {
        Parts {
            src: Source::Detached,
        }
    }

    /// The number of ranks in the stage (1 when detached).
    pub fn ranks(&self) -> usize {
        match &self.src {
            Source::Stage { st, .. } => st.ranks.max(1),
            Source::Detached => 1,
        }
    }

    /// `value`'s result, with all its parts (`allreduce`, `broadcast`, `reduce`).
    #[inline]
    pub fn unpack<T: Bucketable>(&mut self, value: &T) -> T {
        value.unpack_parts(self)
    }

    /// `value`'s result in an `allgather`, with all its parts.
    #[inline]
    pub fn gather<T: Gather>(&mut self, value: &T) -> T::Gathered {
        value.gather_parts(self)
    }

    /// `value`'s result in a `reducescatter`, with all its parts.
    #[inline]
    pub fn scatter<T: Scatter>(&mut self, value: &T) -> T {
        value.scatter_parts(self)
    }

    /// The result of a part laid out with [`Layout::leaf`].
    #[inline]
    pub fn unpack_leaf<T: Bucketable>(&mut self, value: &T) -> T {
        match self.src {
            Source::Detached => detached(value, |r| value.unpack(r)),
            _ => self.result(Kind::InPlace, |r| value.unpack(r)),
        }
    }

    /// The `allgather` result of a part laid out with [`Layout::leaf`].
    #[inline]
    pub fn gather_leaf<T: Gather>(&mut self, value: &T) -> T::Gathered {
        let n = self.ranks();
        match self.src {
            Source::Detached => detached(value, |r| value.gathered(r, 1)),
            _ => self.result(Kind::Gathered, |r| value.gathered(r, n)),
        }
    }

    /// The `reducescatter` result of a part laid out with [`Layout::scatter_leaf`].
    #[inline]
    pub fn scatter_leaf<T: Scatter>(&mut self, value: &T) -> T {
        let n = self.ranks();
        match self.src {
            Source::Detached => detached(value, |r| value.scattered(r, 1)),
            _ => self.result(Kind::Scattered, |r| value.scattered(r, n)),
        }
    }

    /// The result of a part laid out with [`Layout::raw`] (`allreduce`, `broadcast`,
    /// `reduce`): as many elements as were laid out, on the host. Empty when detached.
    pub fn raw<E: Element, R>(&mut self, f: impl FnOnce(Reduced<'_, E>) -> R) -> R {
        self.result(Kind::InPlace, f)
    }

    /// [`raw`](Self::raw) for `allgather`: every rank's elements, in rank order.
    pub fn raw_gathered<E: Element, R>(&mut self, f: impl FnOnce(Reduced<'_, E>) -> R) -> R {
        self.result(Kind::Gathered, f)
    }

    /// [`raw`](Self::raw) for `reducescatter`: this rank's share of the elements.
    pub fn raw_scattered<E: Element, R>(&mut self, f: impl FnOnce(Reduced<'_, E>) -> R) -> R {
        self.result(Kind::Scattered, f)
    }

    /// Skips the count laid out with [`Layout::agree_len`].
    pub fn agree_len(&mut self) {
        self.result::<u8, ()>(Kind::InPlace, |_| ());
    }

    /// The next part's result, from the region of its kind; an empty one when the part
    /// is not there (a stage driven out of order, a walk that disagrees with the layout,
    /// no stage).
    fn result<E: Element, R>(&mut self, kind: Kind, f: impl FnOnce(Reduced<'_, E>) -> R) -> R {
        let mut none = Region::new();
        let Source::Stage { st, next, end } = &mut self.src else {
            return none.result_at(false, 0, 0, f);
        };
        let at = if *next < *end {
            st.slot_at(*next)
        } else {
            SlotIdx::NONE
        };
        *next = next.saturating_add(1);
        if st.slot_dtype(at) != Some(E::DTYPE) {
            return none.result_at(false, 0, 0, f);
        }
        let n = st.ranks.max(1);
        let (regions, offset, len) = match kind {
            Kind::InPlace => (&mut st.inputs, at.offset, at.len),
            Kind::Gathered => (&mut st.outputs, at.offset * n, at.len * n),
            Kind::Scattered => (&mut st.outputs, at.offset / n, at.len / n),
        };
        let region = regions.get::<E>().unwrap_or(&mut none);
        region.result_at(at.device, offset, len, f)
    }
}

/// `f` over a copy of `value`'s own elements: a part's result without a stage.
fn detached<T: Bucketable, R>(value: &T, f: impl FnOnce(Reduced<'_, T::Elem>) -> R) -> R {
    let mut data = vec![T::Elem::default(); value.bucket_len()];
    value.pack(&mut data);
    let len = data.len();
    let buf = Arc::new(Storage::Host(data));
    f(Reduced {
        buf: &buf,
        offset: 0,
        len,
    })
}

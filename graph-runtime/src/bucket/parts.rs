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
//!
//! The handles themselves are defined beside `FusedStage` in `stage.rs`, whose
//! per-value steps (`add`, `pack`, `output`, ..) hand them to a value; this file is what
//! they do, and depends on `stage.rs` for the stage's per-slot steps, never the other way.

use std::sync::Arc;

use super::reduced::Reduced;
use super::region::{Region, SlotIdx};
use super::stage::{Hand, Layout, Parts, Source};
use super::{Bucketable, Gather, Scatter};
use crate::tensor::Storage;
use crate::{Element, Error};

impl Layout<'_> {
    /// Lays out `value` with all its parts.
    #[inline]
    pub fn add<T: Bucketable>(&mut self, value: &T) {
        self.depth += 1;
        value.add_parts(self);
        self.depth -= 1;
    }

    /// [`add`](Self::add) in a `reducescatter` stage, where each part splits along its rows.
    #[inline]
    pub fn add_scatter<T: Scatter>(&mut self, value: &T) {
        self.depth += 1;
        value.add_scatter_parts(self);
        self.depth -= 1;
    }

    /// Lays out the items of a list with `add`, each with all its parts. When the list is
    /// the stage's value itself, each item's parts are noted as that item's, so that a
    /// disagreement names the item (in a list of hundreds of gradients, `slot` alone
    /// does not say which).
    #[inline]
    pub(crate) fn items<T>(&mut self, items: &[T], mut add: impl FnMut(&mut Self, &T)) {
        if self.depth > 0 {
            return items.iter().for_each(|item| add(self, item));
        }
        for (k, item) in items.iter().enumerate() {
            self.st.item = Some(k);
            add(self, item);
        }
        self.st.item = None;
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
    /// [`Error::LengthMismatch`] naming the value, instead of misaligned parts. Hand it with
    /// [`Hand::agree_len`] and skip it with [`Parts::agree_len`].
    pub fn agree_len(&mut self, len: usize) {
        // `allgather` does not compare first dimensions: put the count in the second.
        let dims = [0, len];
        let shape = if self.gather { &dims[..] } else { &dims[1..] };
        self.st.add_length(shape);
    }

    /// Refuses the value: `run` then fails on this rank with `error`, after taking part
    /// in the stage as failed so that its peers skip it too. A refused part lays out no
    /// slot: its `hand_parts` and `unpack_parts` must skip it too.
    pub fn refuse(&mut self, error: Error) {
        self.st.refuse(error);
    }
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
    f(Reduced::new(&buf, 0, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::FusedStage;
    use crate::comm::{reduce_reference, Backend, Collective};
    use crate::{Cpu, ReduceOp, Tensor};

    /// Runs `f` on `n` ranks of a CPU group, each with its own stage; their results.
    fn on_ranks<R: Send + 'static>(
        n: usize,
        f: impl Fn(usize, &mut FusedStage, &mut crate::comm::CpuComm) -> R + Send + Sync + 'static,
    ) -> Vec<R> {
        let f = Arc::new(f);
        let comms = Cpu.communicators(n).unwrap();
        let threads: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, mut comm)| {
                let f = Arc::clone(&f);
                std::thread::spawn(move || f(rank, &mut FusedStage::new("parts"), &mut comm))
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    fn list(rank: usize, n: usize) -> Vec<Tensor<f32>> {
        (0..n)
            .map(|k| Tensor::from_vec(vec![(rank * 3 + k) as f32; k + 1], [k + 1]).unwrap())
            .collect()
    }

    /// A list's items are lent in place, one slot each, and come back as views of the
    /// stage's buffer, reduced like each tensor alone.
    #[test]
    fn a_lent_list_reduces_item_by_item() {
        let results = on_ranks(2, |rank, st, comm| {
            let (l, s) = (list(rank, 3), rank as f64 + 0.5);
            st.begin();
            let (at_l, at_s) = (st.add(&l), st.add(&s));
            assert_eq!(
                (at_l.parts, at_s.parts),
                (4, 1),
                "the length, then each item"
            );
            st.prepare();
            st.lend(&l, at_l);
            st.lend(&s, at_s);
            st.run(comm, Collective::AllReduce(ReduceOp::Sum), "g")
                .unwrap();
            let out = st.output(&l, at_l);
            assert!(out[0].shares_storage(&out[2]));
            let out: Vec<Vec<f32>> = out.iter().map(Tensor::to_vec).collect();
            (out, st.output(&s, at_s))
        });
        for (out, s) in &results {
            for (k, got) in out.iter().enumerate() {
                let (a, b) = (list(0, 3), list(1, 3));
                let want = reduce_reference(&[a[k].as_slice(), b[k].as_slice()], ReduceOp::Sum);
                assert_eq!(got, &want);
            }
            assert_eq!(*s, 2.0);
        }
    }

    /// Lists of different lengths disagree at their length's slot, before any item.
    #[test]
    fn lists_of_different_lengths_disagree_at_their_length() {
        let results = on_ranks(2, |rank, st, comm| {
            let l = list(rank, 1 + rank);
            st.name_values(&["l"]);
            st.begin();
            let at = st.add_gather(&l);
            st.prepare();
            st.lend(&l, at);
            st.run(comm, Collective::AllGather, "g").map(|_| ())
        });
        for r in results {
            match r {
                Err(Error::LengthMismatch {
                    value: "l",
                    slot: 0,
                    item: None,
                    lens,
                    ..
                }) => assert_eq!(lens, [1, 2]),
                other => panic!("{other:?}"),
            }
        }
    }

    /// A value whose walks disagree (it hands fewer parts than it laid out) makes `run`
    /// fail on its rank and its peer skip the stage.
    #[test]
    fn a_value_that_hands_fewer_parts_than_it_laid_out_fails_the_stage() {
        struct Liar(Vec<Tensor<f32>>);
        impl Bucketable for Liar {
            type Elem = u8;
            fn bucket_len(&self) -> usize {
                0
            }
            fn pack(&self, _: &mut [u8]) {}
            fn unpack(&self, _: Reduced<'_, u8>) -> Self {
                Liar(Vec::new())
            }
            fn add_parts(&self, layout: &mut Layout<'_>) {
                self.0.iter().for_each(|t| layout.add(t));
            }
            fn hand_parts<'v>(&'v self, hand: &mut Hand<'_, 'v>) {
                hand.add(&self.0[0]);
            }
        }
        let results = on_ranks(2, |rank, st, comm| {
            let v = Liar(list(rank, 2));
            st.begin();
            let at = st.add(&v);
            st.prepare();
            st.lend(&v, at);
            st.run(comm, Collective::AllReduce(ReduceOp::Sum), "g")
                .map(|_| ())
        });
        for r in results {
            assert!(matches!(r, Err(Error::Backend(_))), "{r:?}");
        }
    }

    /// Without a stage, a part's result is a copy of the part.
    #[test]
    fn detached_results_are_copies() {
        let l = list(1, 2);
        let copy = Parts::detached().unpack(&l);
        assert_eq!(copy, l);
        assert!(!copy[0].shares_storage(&l[0]));
        assert_eq!(Parts::detached().gather(&l), l);
    }
}

//! The public traits of what goes into a fused stage ([`Bucketable`], [`Gather`],
//! [`Scatter`], [`GatherList`]) and their implementations for tensors, scalars and
//! vectors.

use super::reduced::Reduced;
use super::stage::{Hand, Layout, Parts};
use crate::{Element, Tensor};

/// A value that can travel through a fused collective stage.
///
/// A stage asks each value for its length, lets it copy its elements into the stage's flat
/// buffer, and, after the collective, asks it to build its result from the elements the
/// collective left for it (reduced for `allreduce`, the root's for `broadcast`).
///
/// Implemented for:
/// - [`Tensor<E>`]: the result is a zero-copy view into the stage's flat buffer, with the
///   input's shape;
/// - a scalar `E` (any [`Element`], e.g. an `f32` loss): one element, the result is the
///   value;
/// - `Vec<E>`: its elements, the result is a new `Vec` (a copy out of the flat buffer);
/// - `Vec<T>` of any other `Bucketable` `T` (tensors, your own types, structs, lists): a
///   list, one part per item, each read in place where it can be and each result a view
///   where `T`'s is; every rank must put a list of the same length (else
///   [`Error::LengthMismatch`]), and an item that disagrees is named by its position
///   ([`Error::ShapeMismatch`]'s `item`).
///
/// Implement it for your own types to put them in a bucket; implement [`Gather`] and
/// [`Scatter`] too for `allgather` and `reducescatter`. For a struct of tensors and
/// scalars, derive it (`#[derive(Bucketable)]`): each field is then a part of its own.
///
/// # Values made of parts
///
/// A value may be made of several parts, each one slot of the stage in its own dtype's
/// region: a `Vec` of tensors, a derived struct, a value whose element type is known only
/// at run time. Such a value overrides [`add_parts`](Self::add_parts),
/// [`hand_parts`](Self::hand_parts) and [`unpack_parts`](Self::unpack_parts), which walk
/// its parts in one order; the stage never calls its `pack` and `unpack` then. Their
/// defaults make the value one part, described by the other methods.
///
/// ```
/// use actorgraph::{Bucketable, Reduced};
///
/// /// A pair of gradients that travels as one value.
/// #[derive(Clone)]
/// struct Grad2([f32; 2]);
///
/// impl Bucketable for Grad2 {
///     type Elem = f32;
///     fn bucket_len(&self) -> usize { 2 }
///     fn pack(&self, dst: &mut [f32]) { dst.copy_from_slice(&self.0) }
///     fn unpack(&self, reduced: Reduced<'_, f32>) -> Self {
///         let s = reduced.as_slice();
///         Grad2([s[0], s[1]])
///     }
/// }
/// ```
///
/// [`Error::ShapeMismatch`]: crate::Error::ShapeMismatch
/// [`Error::LengthMismatch`]: crate::Error::LengthMismatch
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot go through a collective",
    label = "this value's type does not implement `Bucketable`",
    note = "collectives take `Tensor<E>`, a scalar `E` or `Vec<E>` with E one of f16, bf16, f32, f64, i8, u8, i32, u32, i64, u64, or a type that implements `actorgraph::Bucketable` (derive it for a struct: `#[derive(Bucketable)]`), or a `Vec` of any of these"
)]
pub trait Bucketable: Sized + Send + 'static {
    /// The element type the value is made of.
    type Elem: Element;
    /// The number of elements the value puts in the bucket.
    fn bucket_len(&self) -> usize;
    /// Copies the elements into `dst` (`dst.len() == self.bucket_len()`).
    fn pack(&self, dst: &mut [Self::Elem]);
    /// The elements in place, if the value holds them contiguously (`bucket_len()` of
    /// them, in the order `pack` writes them). A communicator that reads values in place
    /// then takes them from here and the stage skips the copy. The default, `None`, always
    /// packs.
    fn elements(&self) -> Option<&[Self::Elem]> {
        None
    }
    /// The value's shape, which every rank must agree on before a stage runs (every
    /// dimension but the first for `allgather`, which concatenates along it): ranks that
    /// put a `[2, 3]` and a `[3, 2]` value in one slot get [`Error::ShapeMismatch`]
    /// instead of a result. The default, empty, leaves only the element count to agree
    /// on, which suits flat values (a scalar, a `Vec`).
    ///
    /// [`Error::ShapeMismatch`]: crate::Error::ShapeMismatch
    fn shape(&self) -> &[usize] {
        &[]
    }
    /// The elements on a GPU, if the value lives there (feature `nccl`). On the NCCL
    /// backend the stage copies them device to device and the result is on the GPU too
    /// (its [`Reduced`] then views device memory: build the result with
    /// [`Reduced::to_tensor_like`] or [`Reduced::to_tensor`]). The default, `None`: the
    /// value is on the host.
    #[cfg(feature = "nccl")]
    fn device_elements(&self) -> Option<cudarc::driver::CudaView<'_, Self::Elem>> {
        None
    }
    /// Builds the result from the collective's elements (`bucket_len()` of them); `self`
    /// is this rank's input value.
    fn unpack(&self, reduced: Reduced<'_, Self::Elem>) -> Self;

    /// Lays out the value's parts, in order, each with [`Layout::add`] (a value with parts
    /// of its own) or [`Layout::leaf`] (one part). The default: the value is one part.
    #[inline]
    fn add_parts(&self, layout: &mut Layout<'_>) {
        layout.leaf(self)
    }

    /// Hands the value's parts to the stage in the order of `add_parts`, each with
    /// [`Hand::add`] or [`Hand::leaf`]. The default: the value is one part.
    #[inline]
    fn hand_parts<'v>(&'v self, hand: &mut Hand<'_, 'v>) {
        hand.leaf(self)
    }

    /// Builds the result from the parts' results, taken in the order of `add_parts` with
    /// [`Parts::unpack`] or [`Parts::unpack_leaf`]. The default: the value is one part.
    #[inline]
    fn unpack_parts(&self, parts: &mut Parts<'_>) -> Self {
        parts.unpack_leaf(self)
    }

    /// For a scalar element, a list of it as its elements: a `Vec` of scalars is then one
    /// flat part, not a list of parts. `None` for every other type.
    #[doc(hidden)]
    fn __flat(list: &[Self]) -> Option<&[Self::Elem]> {
        let _ = list;
        None
    }

    /// The inverse of `__flat`: a list of scalars from their elements.
    #[doc(hidden)]
    fn __from_flat(elements: &[Self::Elem]) -> Vec<Self> {
        let _ = elements;
        Vec::new()
    }
}

/// A value that `allgather` can collect from every rank.
///
/// The result has its own type: every rank's value, concatenated in rank order.
///
/// Implemented for:
/// - [`Tensor<E>`] -> `Tensor<E>`: shape `[d0, rest..]` becomes `[N * d0, rest..]` (a 0-d
///   tensor becomes `[N]`), a zero-copy view into the stage's output buffer;
/// - a scalar `E` -> `Vec<E>` of N values;
/// - `Vec<E>` -> `Vec<E>` of N times the length;
/// - `Vec<T>` of another `T` that implements [`GatherList`] -> `Vec<T::Gathered>`, each
///   item gathered on its own.
///
/// ```
/// use actorgraph::{Bucketable, Gather, Reduced};
///
/// /// A per-rank counter; gathered, the counts of every rank.
/// struct Count(u64);
///
/// impl Bucketable for Count {
///     type Elem = u64;
///     fn bucket_len(&self) -> usize { 1 }
///     fn pack(&self, dst: &mut [u64]) { dst[0] = self.0 }
///     fn unpack(&self, data: Reduced<'_, u64>) -> Self { Count(data.as_slice()[0]) }
/// }
///
/// impl Gather for Count {
///     type Gathered = Vec<Count>;
///     fn gathered(&self, data: Reduced<'_, u64>, _ranks: usize) -> Vec<Count> {
///         data.as_slice().iter().map(|&c| Count(c)).collect()
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be gathered",
    label = "this value's type does not implement `Gather`",
    note = "`allgather` takes `Tensor<E>`, a scalar `E` or `Vec<E>` with E one of f16, bf16, f32, f64, i8, u8, i32, u32, i64, u64, or a type that implements `actorgraph::Gather` (derive it for a struct of tensors: `#[derive(Gather)]`), or a `Vec` of any of these"
)]
pub trait Gather: Bucketable {
    /// What every rank gets: every rank's value, concatenated in rank order.
    type Gathered: Send + 'static;
    /// Builds the result from `ranks` times `bucket_len()` elements: rank 0's, then rank
    /// 1's, and so on.
    fn gathered(&self, data: Reduced<'_, Self::Elem>, ranks: usize) -> Self::Gathered;

    /// Builds the result of a value made of parts from theirs (see
    /// [`Bucketable::unpack_parts`]), with [`Parts::gather`] or [`Parts::gather_leaf`].
    /// The default: the value is one part.
    #[inline]
    fn gather_parts(&self, parts: &mut Parts<'_>) -> Self::Gathered {
        parts.gather_leaf(self)
    }
}

/// How a list of a [`Gather`] type gathers: what `Vec<Self>` becomes in an `allgather`.
///
/// Implemented for the scalars (a `Vec<E>` gathers into one `Vec<E>` of every rank's
/// elements), [`Tensor<E>`] (`Vec<Tensor<E>>`, each tensor gathered on its own), `Vec`s
/// of these, the integrations' types, and the structs that derive `Gather`. For a type of
/// your own, the list of each item's result:
///
/// ```
/// use actorgraph::{Bucketable, Gather, GatherList, Parts, Reduced};
///
/// struct Count(u64);
/// # impl Bucketable for Count {
/// #     type Elem = u64;
/// #     fn bucket_len(&self) -> usize { 1 }
/// #     fn pack(&self, dst: &mut [u64]) { dst[0] = self.0 }
/// #     fn unpack(&self, data: Reduced<'_, u64>) -> Self { Count(data.as_slice()[0]) }
/// # }
/// # impl Gather for Count {
/// #     type Gathered = Vec<u64>;
/// #     fn gathered(&self, data: Reduced<'_, u64>, _: usize) -> Vec<u64> { data.as_slice().to_vec() }
/// # }
///
/// impl GatherList for Count {
///     type List = Vec<Vec<u64>>;
///     fn gather_list(list: &[Self], parts: &mut Parts<'_>) -> Self::List {
///         list.iter().map(|c| parts.gather(c)).collect()
///     }
/// }
/// ```
pub trait GatherList: Gather {
    /// What a `Vec<Self>` gathers into.
    type List: Send + 'static;
    /// The result of gathering `list`, its items' parts taken in order from `parts`.
    fn gather_list(list: &[Self], parts: &mut Parts<'_>) -> Self::List;
    /// For a scalar element, the gathered list from the elements of a flat part.
    #[doc(hidden)]
    fn __flat_gathered(data: &[Self::Elem]) -> Option<Self::List> {
        let _ = data;
        None
    }
}

/// A value that `reducescatter` can split into N equal parts, one per rank.
///
/// A value splits along its rows: [`rows`](Scatter::rows) must be a multiple of the
/// number of ranks, or the stage fails on every rank with [`Error::NotDivisible`]. Rank r
/// gets elements `[r * len / N, (r + 1) * len / N)` of the reduced value.
///
/// Implemented for:
/// - [`Tensor<E>`]: shape `[d0, rest..]` becomes `[d0 / N, rest..]`, a zero-copy view into
///   the stage's output buffer; `d0` must be a multiple of N. A 0-d tensor counts as one
///   row: it can be scattered over one rank only;
/// - `Vec<E>`: its `len / N` elements (a new `Vec`);
/// - `Vec<T>` of another `Scatter` type: each item scattered on its own.
///
/// A scalar `E` does not implement it: one element cannot be split.
///
/// [`Error::NotDivisible`]: crate::Error::NotDivisible
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be scattered",
    label = "this value's type does not implement `Scatter`",
    note = "`reducescatter` takes `Tensor<E>` or `Vec<E>` with E one of f16, bf16, f32, f64, i8, u8, i32, u32, i64, u64 (a single element cannot be split), or a type that implements `actorgraph::Scatter` (derive it for a struct of tensors: `#[derive(Scatter)]`), or a `Vec` of any of these"
)]
pub trait Scatter: Bucketable {
    /// The number of rows the value splits into: its first dimension. The default, its
    /// length, suits flat values.
    fn rows(&self) -> usize {
        self.bucket_len()
    }
    /// Builds this rank's part from `bucket_len() / ranks` reduced elements.
    fn scattered(&self, data: Reduced<'_, Self::Elem>, ranks: usize) -> Self;

    /// [`Bucketable::add_parts`] for `reducescatter`, with [`Layout::add_scatter`] or
    /// [`Layout::scatter_leaf`]. The default: the value is one part.
    #[inline]
    fn add_scatter_parts(&self, layout: &mut Layout<'_>) {
        layout.scatter_leaf(self)
    }

    /// [`Bucketable::unpack_parts`] for `reducescatter`, with [`Parts::scatter`] or
    /// [`Parts::scatter_leaf`]. The default: the value is one part.
    #[inline]
    fn scatter_parts(&self, parts: &mut Parts<'_>) -> Self {
        parts.scatter_leaf(self)
    }
}

impl<E: Element> Bucketable for Tensor<E> {
    type Elem = E;
    fn bucket_len(&self) -> usize {
        self.len()
    }
    fn pack(&self, dst: &mut [E]) {
        // A GPU tensor is never packed on the host: the stage copies it on the device, or
        // reports it in the wrong place.
        if let Some(src) = self.host_slice() {
            dst.copy_from_slice(src);
        }
    }
    fn elements(&self) -> Option<&[E]> {
        self.host_slice()
    }
    fn shape(&self) -> &[usize] {
        Tensor::shape(self)
    }
    #[cfg(feature = "nccl")]
    fn device_elements(&self) -> Option<cudarc::driver::CudaView<'_, E>> {
        self.device_view()
    }
    fn unpack(&self, reduced: Reduced<'_, E>) -> Self {
        reduced.to_tensor_like(self)
    }
}

impl<E: Element> Gather for Tensor<E> {
    type Gathered = Tensor<E>;
    fn gathered(&self, data: Reduced<'_, E>, ranks: usize) -> Tensor<E> {
        // `[d0, rest..]` -> `[N * d0, rest..]`; the data holds N times our elements.
        // Saturating only matters for an empty tensor with an absurd first dimension.
        let shape = self.shape_of().map_first(|d0| d0.saturating_mul(ranks));
        let shape = shape.unwrap_or_else(|| [ranks].into());
        data.view(shape)
    }
}

impl<E: Element> GatherList for Tensor<E> {
    type List = Vec<Tensor<E>>;
    fn gather_list(list: &[Self], parts: &mut Parts<'_>) -> Self::List {
        list.iter().map(|t| parts.gather(t)).collect()
    }
}

impl<E: Element> Scatter for Tensor<E> {
    fn rows(&self) -> usize {
        self.shape().first().copied().unwrap_or(1)
    }
    fn scattered(&self, data: Reduced<'_, E>, ranks: usize) -> Tensor<E> {
        // The agreement checked that `d0` divides by `ranks`.
        match self.shape_of().map_first(|d0| d0 / ranks.max(1)) {
            Some(shape) => data.view(shape),
            // A 0-d tensor scatters over one rank only: itself.
            None => data.to_tensor_like(self),
        }
    }
}

/// A single element: one slot of length one. One impl per element type rather than a
/// blanket `impl<E: Element>`: with the blanket impl, rustc would answer a `String` in a
/// collective with "`String` is not an element type" at the macro instead of this trait's
/// message at the user's value.
macro_rules! scalar_bucketable {
    ($($d:ident: $t:ty [$($info:tt)*]),*) => {$(
        impl Bucketable for $t {
            type Elem = $t;
            fn bucket_len(&self) -> usize {
                1
            }
            fn pack(&self, dst: &mut [$t]) {
                if let Some(d) = dst.first_mut() {
                    *d = *self;
                }
            }
            fn elements(&self) -> Option<&[$t]> {
                Some(std::slice::from_ref(self))
            }
            fn unpack(&self, reduced: Reduced<'_, $t>) -> Self {
                reduced.as_slice().first().copied().unwrap_or(*self)
            }
            fn __flat(list: &[$t]) -> Option<&[$t]> {
                Some(list)
            }
            fn __from_flat(elements: &[$t]) -> Vec<$t> {
                elements.to_vec()
            }
        }

        impl Gather for $t {
            type Gathered = Vec<$t>;
            fn gathered(&self, data: Reduced<'_, $t>, _ranks: usize) -> Vec<$t> {
                data.as_slice().to_vec()
            }
        }

        /// A flat vector of scalars splits into its `len / N` elements (a new `Vec`).
        impl Scatter for Vec<$t> {
            fn scattered(&self, data: Reduced<'_, $t>, _ranks: usize) -> Vec<$t> {
                data.as_slice().to_vec()
            }
        }

        impl GatherList for $t {
            type List = Vec<$t>;
            fn gather_list(_: &[$t], parts: &mut Parts<'_>) -> Vec<$t> {
                parts.raw_gathered(|data: Reduced<'_, $t>| data.as_slice().to_vec())
            }
            fn __flat_gathered(data: &[$t]) -> Option<Vec<$t>> {
                Some(data.to_vec())
            }
        }
    )*};
}

crate::element::for_each_dtype!(scalar_bucketable);

/// A vector: of scalars, one flat part, copied out of the bucket; of anything else, a list
/// whose items are parts of their own, after its length, which every rank must agree on.
impl<T: Bucketable> Bucketable for Vec<T> {
    type Elem = T::Elem;
    fn bucket_len(&self) -> usize {
        T::__flat(self).map_or(0, <[_]>::len)
    }
    fn pack(&self, dst: &mut [T::Elem]) {
        if let Some(src) = T::__flat(self).filter(|s| s.len() == dst.len()) {
            dst.copy_from_slice(src);
        }
    }
    fn elements(&self) -> Option<&[T::Elem]> {
        T::__flat(self)
    }
    fn unpack(&self, reduced: Reduced<'_, T::Elem>) -> Self {
        match T::__flat(self) {
            Some(_) => T::__from_flat(reduced.as_slice()),
            None => self.unpack_parts(&mut Parts::detached()),
        }
    }
    fn add_parts(&self, layout: &mut Layout<'_>) {
        if T::__flat(self).is_some() {
            return layout.leaf(self);
        }
        layout.agree_len(self.len());
        layout.items(self, |layout, item| layout.add(item));
    }
    fn hand_parts<'v>(&'v self, hand: &mut Hand<'_, 'v>) {
        if T::__flat(self).is_some() {
            return hand.leaf(self);
        }
        hand.agree_len();
        self.iter().for_each(|item| hand.add(item));
    }
    fn unpack_parts(&self, parts: &mut Parts<'_>) -> Self {
        if T::__flat(self).is_some() {
            return parts.unpack_leaf(self);
        }
        parts.agree_len();
        self.iter().map(|item| parts.unpack(item)).collect()
    }
}

impl<T: GatherList> Gather for Vec<T> {
    type Gathered = T::List;
    fn gathered(&self, data: Reduced<'_, T::Elem>, _ranks: usize) -> T::List {
        match T::__flat_gathered(data.as_slice()) {
            Some(list) => list,
            None => self.gather_parts(&mut Parts::detached()),
        }
    }
    fn gather_parts(&self, parts: &mut Parts<'_>) -> T::List {
        if T::__flat(self).is_none() {
            parts.agree_len();
        }
        T::gather_list(self, parts)
    }
}

impl<T: GatherList> GatherList for Vec<T> {
    type List = Vec<T::List>;
    fn gather_list(list: &[Self], parts: &mut Parts<'_>) -> Self::List {
        list.iter().map(|v| parts.gather(v)).collect()
    }
}

impl<T: Scatter> Scatter for Vec<T> {
    fn scattered(&self, data: Reduced<'_, T::Elem>, _ranks: usize) -> Vec<T> {
        match T::__flat(self) {
            Some(_) => T::__from_flat(data.as_slice()),
            None => self.scatter_parts(&mut Parts::detached()),
        }
    }
    fn add_scatter_parts(&self, layout: &mut Layout<'_>) {
        if T::__flat(self).is_some() {
            return layout.scatter_leaf(self);
        }
        layout.agree_len(self.len());
        layout.items(self, |layout, item| layout.add_scatter(item));
    }
    fn scatter_parts(&self, parts: &mut Parts<'_>) -> Self {
        if T::__flat(self).is_some() {
            return parts.scatter_leaf(self);
        }
        parts.agree_len();
        self.iter().map(|item| parts.scatter(item)).collect()
    }
}

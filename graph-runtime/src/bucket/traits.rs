//! The public traits of what goes into a fused stage ([`Bucketable`], [`Gather`],
//! [`Scatter`]), the view of a value's result ([`Reduced`]), and their implementations for
//! tensors, scalars and vectors.

use std::sync::Arc;

use crate::tensor::Storage;
use crate::{Element, Error, Tensor};

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
/// - `Vec<E>`: its elements, the result is a new `Vec` (a copy out of the flat buffer).
///
/// Implement it for your own types to put them in a bucket; implement [`Gather`] and
/// [`Scatter`] too for `allgather` and `reducescatter`.
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
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot go through a collective",
    label = "this value's type does not implement `Bucketable`",
    note = "collectives take `Tensor<E>`, a scalar `E` or `Vec<E>` with E one of f16, bf16, f32, f64, i8, u8, i32, u32, i64, u64, or a type that implements `actorgraph::Bucketable`"
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
}

/// A value that `allgather` can collect from every rank.
///
/// The result has its own type: every rank's value, concatenated in rank order.
///
/// Implemented for:
/// - [`Tensor<E>`] -> `Tensor<E>`: shape `[d0, rest..]` becomes `[N * d0, rest..]` (a 0-d
///   tensor becomes `[N]`), a zero-copy view into the stage's output buffer;
/// - a scalar `E` -> `Vec<E>` of N values;
/// - `Vec<E>` -> `Vec<E>` of N times the length.
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
    note = "`allgather` takes `Tensor<E>`, a scalar `E` or `Vec<E>` with E one of f16, bf16, f32, f64, i8, u8, i32, u32, i64, u64, or a type that implements `actorgraph::Gather`"
)]
pub trait Gather: Bucketable {
    /// What every rank gets: every rank's value, concatenated in rank order.
    type Gathered: Send + 'static;
    /// Builds the result from `ranks` times `bucket_len()` elements: rank 0's, then rank
    /// 1's, and so on.
    fn gathered(&self, data: Reduced<'_, Self::Elem>, ranks: usize) -> Self::Gathered;
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
/// - `Vec<E>`: its `len / N` elements (a new `Vec`).
///
/// A scalar `E` does not implement it: one element cannot be split.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be scattered",
    label = "this value's type does not implement `Scatter`",
    note = "`reducescatter` takes `Tensor<E>` or `Vec<E>` with E one of f16, bf16, f32, f64, i8, u8, i32, u32, i64, u64 (a single element cannot be split), or a type that implements `actorgraph::Scatter`"
)]
pub trait Scatter: Bucketable {
    /// The number of rows the value splits into: its first dimension. The default, its
    /// length, suits flat values.
    fn rows(&self) -> usize {
        self.bucket_len()
    }
    /// Builds this rank's part from `bucket_len() / ranks` reduced elements.
    fn scattered(&self, data: Reduced<'_, Self::Elem>, ranks: usize) -> Self;
}

/// The elements a collective left for one value of a bucket, inside the stage's flat
/// buffer: reduced (`allreduce`, `reducescatter`, `reduce`), gathered (`allgather`) or
/// copied from the root (`broadcast`).
pub struct Reduced<'a, E> {
    pub(super) buf: &'a Arc<Storage<E>>,
    pub(super) offset: usize,
    pub(super) len: usize,
}

impl<E: Element> Reduced<'_, E> {
    /// The elements, when they are in host memory: always, but for the result of a value
    /// that lent device elements (`Bucketable::device_elements`, feature `nccl`), which is
    /// on the GPU (and reads here as empty).
    pub fn as_slice(&self) -> &[E] {
        self.buf
            .host()
            .and_then(|h| h.get(self.offset..self.offset + self.len))
            .unwrap_or(&[])
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A tensor with `like`'s shape viewing the elements without copying them.
    /// `like` must hold as many elements (true for the value being unpacked).
    pub fn to_tensor_like(&self, like: &Tensor<E>) -> Tensor<E> {
        Tensor::view(
            Arc::clone(self.buf),
            self.offset,
            self.len,
            Arc::clone(like.shape_arc()),
        )
    }

    /// A tensor of `shape` viewing the elements without copying them; an error if the
    /// shape does not hold exactly [`len`](Self::len) elements.
    pub fn to_tensor(&self, shape: impl AsRef<[usize]>) -> Result<Tensor<E>, Error> {
        let shape = shape.as_ref();
        let numel = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        if numel != Some(self.len) {
            return Err(Error::ShapeData {
                shape: shape.to_vec(),
                expected: numel.unwrap_or(usize::MAX),
                got: self.len,
            });
        }
        Ok(self.view(shape.into()))
    }

    /// A view with `shape`, which the caller checked holds `len` elements.
    fn view(&self, shape: Arc<[usize]>) -> Tensor<E> {
        Tensor::view(Arc::clone(self.buf), self.offset, self.len, shape)
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
        let shape: Arc<[usize]> = match self.shape().split_first() {
            // `[d0, rest..]` -> `[N * d0, rest..]`; the data holds N times our elements.
            // Saturating only matters for an empty tensor with an absurd first dimension.
            Some((&d0, rest)) => std::iter::once(d0.saturating_mul(ranks))
                .chain(rest.iter().copied())
                .collect(),
            None => Arc::from([ranks]),
        };
        data.view(shape)
    }
}

impl<E: Element> Scatter for Tensor<E> {
    fn rows(&self) -> usize {
        self.shape().first().copied().unwrap_or(1)
    }
    fn scattered(&self, data: Reduced<'_, E>, ranks: usize) -> Tensor<E> {
        match self.shape().split_first() {
            // The agreement checked that `d0` divides by `ranks`.
            Some((&d0, rest)) => data.view(
                std::iter::once(d0 / ranks.max(1))
                    .chain(rest.iter().copied())
                    .collect(),
            ),
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
        }

        impl Gather for $t {
            type Gathered = Vec<$t>;
            fn gathered(&self, data: Reduced<'_, $t>, _ranks: usize) -> Vec<$t> {
                data.as_slice().to_vec()
            }
        }
    )*};
}

crate::element::for_each_dtype!(scalar_bucketable);

/// A vector of elements: copied into the bucket and out of it.
impl<E: Element> Bucketable for Vec<E> {
    type Elem = E;
    fn bucket_len(&self) -> usize {
        self.len()
    }
    fn pack(&self, dst: &mut [E]) {
        dst.copy_from_slice(self);
    }
    fn elements(&self) -> Option<&[E]> {
        Some(self)
    }
    fn unpack(&self, reduced: Reduced<'_, E>) -> Self {
        reduced.as_slice().to_vec()
    }
}

impl<E: Element> Gather for Vec<E> {
    type Gathered = Vec<E>;
    fn gathered(&self, data: Reduced<'_, E>, _ranks: usize) -> Vec<E> {
        data.as_slice().to_vec()
    }
}

impl<E: Element> Scatter for Vec<E> {
    fn scattered(&self, data: Reduced<'_, E>, _ranks: usize) -> Vec<E> {
        data.as_slice().to_vec()
    }
}

//! `Tensor<E>`: shared storage, an offset and a shape.

use std::fmt;
use std::sync::Arc;

use crate::{Element, Error};

#[cfg_attr(not(feature = "nccl"), path = "no_device.rs")]
mod device;
mod shape;

pub(crate) use shape::Shape;

#[cfg(feature = "nccl")]
pub(crate) use device::DeviceBuf;

/// The memory a tensor points into. Shared by every view of it.
#[derive(Debug)]
pub(crate) enum Storage<E> {
    Host(Vec<E>),
    /// GPU memory, freed on its stream when the last view goes (feature `nccl`).
    #[allow(
        dead_code,
        reason = "without feature `nccl`, `DeviceBuf` has no values"
    )]
    Device(device::DeviceBuf<E>),
}

impl<E> Storage<E> {
    /// The elements, if they are in host memory.
    pub(crate) fn host(&self) -> Option<&[E]> {
        match self {
            Storage::Host(v) => Some(v),
            Storage::Device(_) => None,
        }
    }

    pub(crate) fn host_mut(&mut self) -> Option<&mut Vec<E>> {
        match self {
            Storage::Host(v) => Some(v),
            Storage::Device(_) => None,
        }
    }

    /// The number of elements, wherever they are.
    pub(crate) fn len(&self) -> usize {
        match self {
            Storage::Host(v) => v.len(),
            Storage::Device(d) => device::len(d),
        }
    }
}

/// An n-dimensional array of `E`, cheap to clone.
///
/// A tensor is an `Arc` to its storage plus an offset and a shape, so `clone` copies no
/// data, and the outputs of a fused collective are views into one flat buffer. Tensors are
/// immutable: a view that a caller holds never changes.
///
/// ```
/// use actorgraph::Tensor;
///
/// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3])?;
/// assert_eq!(t.shape(), &[2, 3]);
/// assert_eq!(t.len(), 6);
/// assert_eq!(t.as_slice()[4], 5.0);
/// let u = t.clone(); // shares the data
/// assert_eq!(u.to_vec(), t.to_vec());
/// assert!(Tensor::from_vec(vec![1i32, 2], [3]).is_err());
/// # Ok::<(), actorgraph::Error>(())
/// ```
pub struct Tensor<E> {
    data: Arc<Storage<E>>,
    offset: usize,
    len: usize,
    shape: Shape,
}

impl<E> Clone for Tensor<E> {
    fn clone(&self) -> Self {
        Self {
            data: Arc::clone(&self.data),
            offset: self.offset,
            len: self.len,
            shape: self.shape.clone(),
        }
    }
}

fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

impl<E: Element> Tensor<E> {
    /// A tensor of `shape` with every element equal to `value`.
    ///
    /// ```
    /// let t = actorgraph::Tensor::full([2, 2], 7u8);
    /// assert_eq!(t.to_vec(), vec![7; 4]);
    /// ```
    ///
    /// # Panics
    /// If the number of elements overflows `usize` (the allocation could not succeed anyway).
    pub fn full(shape: impl AsRef<[usize]>, value: E) -> Self {
        let shape = shape.as_ref();
        let n = numel(shape).expect("tensor shape overflows usize");
        Self::from_parts(vec![value; n], shape.into())
    }

    /// A tensor of `shape` filled with zeros.
    ///
    /// ```
    /// let t = actorgraph::Tensor::<f64>::zeros([3]);
    /// assert_eq!(t.to_vec(), vec![0.0; 3]);
    /// ```
    pub fn zeros(shape: impl AsRef<[usize]>) -> Self {
        Self::full(shape, E::default())
    }

    /// A tensor with `data` laid out row-major in `shape`; an error if the lengths differ.
    ///
    /// ```
    /// let t = actorgraph::Tensor::from_vec(vec![1i64, 2, 3], [3])?;
    /// assert_eq!(t.as_slice(), &[1, 2, 3]);
    /// # Ok::<(), actorgraph::Error>(())
    /// ```
    pub fn from_vec(data: Vec<E>, shape: impl AsRef<[usize]>) -> Result<Self, Error> {
        let shape = shape.as_ref();
        match numel(shape) {
            Some(n) if n == data.len() => Ok(Self::from_parts(data, shape.into())),
            expected => Err(Error::ShapeData {
                shape: shape.to_vec(),
                expected: expected.unwrap_or(usize::MAX),
                got: data.len(),
            }),
        }
    }

    /// A one-dimensional tensor holding a copy of `data`.
    ///
    /// ```
    /// let t = actorgraph::Tensor::from_slice(&[1.5f32, 2.5]);
    /// assert_eq!(t.shape(), &[2]);
    /// ```
    pub fn from_slice(data: &[E]) -> Self {
        Self::from_parts(data.to_vec(), [data.len()].into())
    }

    /// A zero-dimensional tensor holding one value.
    ///
    /// ```
    /// let t = actorgraph::Tensor::scalar(3i32);
    /// assert_eq!((t.shape(), t.len()), (&[][..], 1));
    /// ```
    pub fn scalar(value: E) -> Self {
        Self::from_parts(vec![value], [].into())
    }

    fn from_parts(data: Vec<E>, shape: Shape) -> Self {
        let len = data.len();
        Self {
            data: Arc::new(Storage::Host(data)),
            offset: 0,
            len,
            shape,
        }
    }

    /// A view of `len` elements of `data` starting at `offset`, with `shape`.
    ///
    /// The caller guarantees `offset + len <= data.len()` and that `shape` holds `len`.
    pub(crate) fn view(data: Arc<Storage<E>>, offset: usize, len: usize, shape: Shape) -> Self {
        debug_assert!(offset + len <= data.len());
        Self {
            data,
            offset,
            len,
            shape,
        }
    }

    /// The shape, to clone into a view of the same shape.
    pub(crate) fn shape_of(&self) -> &Shape {
        &self.shape
    }

    /// The elements, row-major.
    ///
    /// # Panics
    /// If the tensor is on a GPU (feature `nccl`): use [`host_slice`](Self::host_slice),
    /// which returns `None` there, or copy it to the host first with `to_host`.
    pub fn as_slice(&self) -> &[E] {
        match self.host_slice() {
            Some(s) => s,
            None => panic!("Tensor::as_slice on a GPU tensor: copy it with `to_host()` first"),
        }
    }

    /// The elements, row-major, if the tensor is in host memory (`None` on a GPU).
    ///
    /// ```
    /// let t = actorgraph::Tensor::full([2], 1u8);
    /// assert_eq!(t.host_slice(), Some(&[1u8, 1][..]));
    /// ```
    pub fn host_slice(&self) -> Option<&[E]> {
        let all = self.data.host()?;
        all.get(self.offset..self.offset + self.len)
    }

    /// Whether the elements are in host memory (always, without the `nccl` feature).
    pub fn is_host(&self) -> bool {
        self.data.host().is_some()
    }

    /// A copy of the elements, row-major.
    ///
    /// # Panics
    /// If the tensor is on a GPU, like [`as_slice`](Self::as_slice).
    pub fn to_vec(&self) -> Vec<E> {
        self.as_slice().to_vec()
    }

    /// The shape (empty for a scalar).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the tensor holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The run-time dtype of the elements.
    pub fn dtype(&self) -> crate::DType {
        E::DTYPE
    }

    /// Whether two tensors share storage (for example two outputs of one fused stage).
    ///
    /// ```
    /// let t = actorgraph::Tensor::full([2], 1.0f32);
    /// assert!(t.shares_storage(&t.clone()));
    /// assert!(!t.shares_storage(&actorgraph::Tensor::full([2], 1.0)));
    /// ```
    pub fn shares_storage(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.data, &other.data)
    }
}

/// Equal shapes and elements. A GPU tensor equals only a view of the same elements (its
/// elements are not copied to compare them): compare `to_host()` copies instead.
impl<E: Element> PartialEq for Tensor<E> {
    fn eq(&self, other: &Self) -> bool {
        if self.shape() != other.shape() {
            return false;
        }
        match (self.host_slice(), other.host_slice()) {
            (Some(a), Some(b)) => a == b,
            _ => self.shares_storage(other) && self.offset == other.offset,
        }
    }
}

impl<E: Element> fmt::Debug for Tensor<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Tensor");
        d.field("dtype", &E::DTYPE).field("shape", &self.shape());
        match self.host_slice() {
            Some(data) => d.field("data", &data),
            None => d.field("data", &format_args!("<on a GPU>")),
        };
        d.finish()
    }
}

impl<E: Element> From<Vec<E>> for Tensor<E> {
    fn from(data: Vec<E>) -> Self {
        let n = data.len();
        Self::from_parts(data, [n].into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_share_storage_and_keep_their_window() {
        let t = Tensor::from_vec((0..12).map(|i| i as f32).collect(), [3, 4]).unwrap();
        let v = Tensor::view(Arc::clone(&t.data), 4, 4, [4].into());
        assert_eq!(v.as_slice(), &[4.0, 5.0, 6.0, 7.0]);
        assert!(v.shares_storage(&t));
        assert_eq!(v.shape(), &[4]);
    }

    #[test]
    fn from_vec_rejects_a_wrong_length() {
        let err = Tensor::from_vec(vec![1u8, 2, 3], [2, 2]).unwrap_err();
        assert!(matches!(
            err,
            Error::ShapeData {
                expected: 4,
                got: 3,
                ..
            }
        ));
        assert_eq!(
            err.to_string(),
            "tensor shape [2, 2] holds 4 elements but 3 were given"
        );
    }

    #[test]
    fn overflowing_shape_is_an_error_not_a_panic() {
        assert!(Tensor::<u8>::from_vec(vec![], [usize::MAX, 2]).is_err());
    }

    #[test]
    fn scalar_and_empty() {
        assert_eq!(Tensor::scalar(2.0f64).len(), 1);
        let e = Tensor::<i32>::zeros([0]);
        assert!(e.is_empty());
        assert_eq!(e.to_vec(), Vec::<i32>::new());
    }
}

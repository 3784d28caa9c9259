//! ndarray (feature `ndarray`): an [`Array`] goes through a collective as one value, and
//! a host [`Tensor`] converts to and from ndarray without copying its elements.
//!
//! An array in standard (row-major, contiguous) layout lends its elements in place; any
//! other layout (a transposed or strided array) is copied into the stage's buffer once, in
//! logical order. The result is an array of the input's type and shape (for `allgather`
//! and `reducescatter`, the first dimension times or divided by the ranks), in standard
//! layout: one copy out of the stage's buffer, since an `Array` owns its elements. For
//! results without that copy, put a [`Tensor`] in the bucket and view it with
//! [`Tensor::as_array`].

use std::sync::Arc;

use ndarray::{Array, ArrayViewD, Dimension, IxDyn};

use crate::bucket::{Bucketable, Gather, GatherList, Parts, Reduced, Scatter};
use crate::tensor::{Shape, Storage};
use crate::{Element, Error, Tensor};

/// An array of the same dimension type as `like` with `shape`, holding a copy of `data`;
/// `like` itself (a copy) when they do not fit, which only a stage driven out of order
/// gives.
fn array_like<E: Element, D: Dimension>(
    like: &Array<E, D>,
    shape: D,
    data: Reduced<'_, E>,
) -> Array<E, D> {
    Array::from_shape_vec(shape, data.as_slice().to_vec()).unwrap_or_else(|_| like.clone())
}

/// An array in a bucket: its elements, in logical (row-major) order.
impl<E: Element, D: Dimension + 'static> Bucketable for Array<E, D> {
    type Elem = E;
    fn bucket_len(&self) -> usize {
        self.len()
    }
    fn pack(&self, dst: &mut [E]) {
        dst.iter_mut().zip(self.iter()).for_each(|(d, &s)| *d = s);
    }
    /// In place when the array is in standard layout.
    fn elements(&self) -> Option<&[E]> {
        self.as_slice()
    }
    fn shape(&self) -> &[usize] {
        ndarray::ArrayBase::shape(self)
    }
    fn unpack(&self, reduced: Reduced<'_, E>) -> Self {
        array_like(self, self.raw_dim(), reduced)
    }
}

/// Splits along the first axis: `[d0, rest..]` becomes `[d0 / N, rest..]`. A 0-d array
/// is one row, scattered over one rank only.
impl<E: Element, D: Dimension + 'static> Scatter for Array<E, D> {
    fn rows(&self) -> usize {
        ndarray::ArrayBase::shape(self)
            .first()
            .copied()
            .unwrap_or(1)
    }
    fn scattered(&self, data: Reduced<'_, E>, ranks: usize) -> Self {
        let mut dim = self.raw_dim();
        if dim.ndim() > 0 {
            dim[0] /= ranks.max(1);
        }
        array_like(self, dim, data)
    }
}

/// Concatenates along the first axis: `[d0, rest..]` becomes `[N * d0, rest..]`, an
/// array of the same dimension type. (A 0-d `IxDyn` array gathers into `[N]`; a 0-d
/// `Ix0` array, which cannot hold N elements, does not implement `Gather`: make it a
/// scalar or an `IxDyn` array.)
macro_rules! gather_arrays {
    ($($d:ty),*) => {$(
        impl<E: Element> Gather for Array<E, $d> {
            type Gathered = Array<E, $d>;
            fn gathered(&self, data: Reduced<'_, E>, ranks: usize) -> Self {
                let mut dim = self.raw_dim();
                if dim.ndim() == 0 {
                    let gathered = IxDyn(&[ranks]);
                    return match Array::from_shape_vec(gathered, data.as_slice().to_vec())
                        .map(|a| a.into_dimensionality::<$d>())
                    {
                        Ok(Ok(a)) => a,
                        _ => self.clone(),
                    };
                }
                dim[0] = dim[0].saturating_mul(ranks);
                array_like(self, dim, data)
            }
        }

        impl<E: Element> GatherList for Array<E, $d> {
            type List = Vec<Array<E, $d>>;
            fn gather_list(list: &[Self], parts: &mut Parts<'_>) -> Self::List {
                list.iter().map(|a| parts.gather(a)).collect()
            }
        }
    )*};
}

gather_arrays!(
    ndarray::Ix1,
    ndarray::Ix2,
    ndarray::Ix3,
    ndarray::Ix4,
    ndarray::Ix5,
    ndarray::Ix6,
    IxDyn
);

impl<E: Element> Tensor<E> {
    /// The tensor's elements as an ndarray view of its shape, without copying them (feature
    /// `ndarray`). An error if the tensor is on a GPU ([`Error::Placement`]).
    ///
    /// ```
    /// use actorgraph::Tensor;
    ///
    /// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3])?;
    /// let a = t.as_array()?;
    /// assert_eq!(a.shape(), &[2, 3]);
    /// assert_eq!(a[[1, 2]], 6.0);
    /// assert_eq!(a.as_ptr(), t.as_slice().as_ptr()); // the tensor's own elements
    /// # Ok::<(), actorgraph::Error>(())
    /// ```
    pub fn as_array(&self) -> Result<ArrayViewD<'_, E>, Error> {
        let data = self.host_slice().ok_or_else(|| {
            Error::Placement(
                "Tensor::as_array on a GPU tensor: copy it with `to_host()` first".into(),
            )
        })?;
        ArrayViewD::from_shape(IxDyn(self.shape()), data)
            .map_err(|e| Error::Backend(format!("internal error: a tensor's shape: {e}")))
    }
}

/// A tensor of the array's shape. An array in standard layout gives its elements to the
/// tensor without copying them; any other layout is copied once, in logical order.
///
/// ```
/// use actorgraph::Tensor;
/// use ndarray::{array, Array};
///
/// let a = array![[1i64, 2, 3], [4, 5, 6]];
/// let ptr = a.as_ptr();
/// let t = Tensor::from(a);
/// assert_eq!((t.shape(), t.as_slice().as_ptr()), (&[2, 3][..], ptr)); // not copied
///
/// let transposed: Array<i64, _> = array![[1i64, 2], [3, 4]].reversed_axes();
/// assert_eq!(Tensor::from(transposed).to_vec(), vec![1, 3, 2, 4]); // copied, in order
/// ```
impl<E: Element, D: Dimension> From<Array<E, D>> for Tensor<E> {
    fn from(array: Array<E, D>) -> Self {
        let shape = Shape::from(ndarray::ArrayBase::shape(&array));
        let len = array.len();
        if !array.is_standard_layout() {
            let data: Vec<E> = array.iter().copied().collect();
            return Tensor::view(Arc::new(Storage::Host(data)), 0, len, shape);
        }
        // Standard layout: the elements are `len` consecutive ones of the vector, from
        // `offset` on (none for an empty array).
        let (data, offset) = array.into_raw_vec_and_offset();
        let offset = offset.unwrap_or(0);
        if offset.checked_add(len).is_none_or(|end| end > data.len()) {
            // Not reached: ndarray's invariant. Copy rather than view out of bounds.
            let data = data
                .get(offset..)
                .unwrap_or(&[])
                .iter()
                .take(len)
                .copied()
                .collect();
            return Tensor::view(Arc::new(Storage::Host(data)), 0, len, shape);
        }
        Tensor::view(Arc::new(Storage::Host(data)), offset, len, shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{array, s, Array3};

    #[test]
    fn a_sliced_standard_array_becomes_a_view_with_an_offset() {
        let mut a = Array3::from_shape_fn((4, 2, 3), |(i, j, k)| (i * 6 + j * 3 + k) as u32);
        a.slice_collapse(s![2.., .., ..]);
        assert!(a.is_standard_layout());
        let ptr = a.as_ptr();
        let t = Tensor::from(a);
        assert_eq!(t.shape(), &[2, 2, 3]);
        assert_eq!(t.as_slice().as_ptr(), ptr);
        assert_eq!(t.to_vec(), (12..24).collect::<Vec<u32>>());
    }

    #[test]
    fn an_empty_array_and_a_view_round_trip() {
        let t = Tensor::from(Array::<f64, _>::zeros((0, 3)));
        assert_eq!((t.shape(), t.len()), (&[0, 3][..], 0));
        let v = Tensor::from(array![[1.0f32, 2.0], [3.0, 4.0]]);
        assert_eq!(
            v.as_array().unwrap(),
            array![[1.0f32, 2.0], [3.0, 4.0]].into_dyn()
        );
    }

    #[test]
    fn a_strided_array_packs_in_logical_order() {
        let a = array![[1i32, 2, 3], [4, 5, 6]].reversed_axes();
        assert_eq!(a.elements(), None);
        let mut dst = [0; 6];
        a.pack(&mut dst);
        assert_eq!(dst, [1, 4, 2, 5, 3, 6]);
        assert_eq!(Bucketable::shape(&a), &[3, 2]);
    }
}

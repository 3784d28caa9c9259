//! [`Reduced`]: the view of one value's result in a stage's buffer, which a value's
//! `unpack` turns into its result. It depends on no other file of `bucket`.

use std::cell::Cell;
use std::sync::Arc;

use crate::tensor::{Shape, Storage};
use crate::{Element, Error, Tensor};

/// The elements a collective left for one value of a bucket, inside the stage's flat
/// buffer: reduced (`allreduce`, `reducescatter`, `reduce`), gathered (`allgather`) or
/// copied from the root (`broadcast`).
pub struct Reduced<'a, E> {
    pub(super) buf: &'a Arc<Storage<E>>,
    pub(super) offset: usize,
    pub(super) len: usize,
    /// References to `buf` taken beforehand, one per view (see `Region::spares`); taken
    /// only by a view, so that a result copied out drops none of them here.
    pub(super) spares: Cell<Option<&'a mut Vec<Arc<Storage<E>>>>>,
}

impl<'a, E: Element> Reduced<'a, E> {
    pub(super) fn new(buf: &'a Arc<Storage<E>>, offset: usize, len: usize) -> Self {
        Reduced {
            buf,
            offset,
            len,
            spares: Cell::new(None),
        }
    }

    /// A reference to the buffer for a view: a spare one while there is one.
    fn handle(&self) -> Arc<Storage<E>> {
        let mut spares = self.spares.take();
        let spare = spares.as_mut().and_then(|s| s.pop());
        self.spares.set(spares);
        spare.unwrap_or_else(|| Arc::clone(self.buf))
    }
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
            self.handle(),
            self.offset,
            self.len,
            like.shape_of().clone(),
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
    #[inline]
    pub(super) fn view(&self, shape: Shape) -> Tensor<E> {
        Tensor::view(self.handle(), self.offset, self.len, shape)
    }
}

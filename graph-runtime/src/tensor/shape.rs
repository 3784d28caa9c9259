//! A tensor's shape, held inline up to [`INLINE`] dimensions: cloning or dropping a
//! tensor then touches one reference count (its storage's), not two, which a bucket of
//! many small tensors pays on every execution.

use std::ops::Deref;
use std::sync::Arc;

/// The most dimensions a shape holds without an allocation of its own.
const INLINE: usize = 4;

/// The dimensions of a tensor, as a `[usize]`.
#[derive(Clone)]
pub(crate) enum Shape {
    Inline { dims: [usize; INLINE], ndim: u8 },
    Shared(Arc<[usize]>),
}

impl Shape {
    /// The same shape with its first dimension mapped by `f`; `None` for a 0-d shape.
    pub(crate) fn map_first(&self, f: impl FnOnce(usize) -> usize) -> Option<Shape> {
        match self {
            Shape::Inline { ndim: 0, .. } => None,
            &Shape::Inline { mut dims, ndim } => {
                dims[0] = f(dims[0]);
                Some(Shape::Inline { dims, ndim })
            }
            Shape::Shared(dims) => {
                let mut dims = dims.to_vec();
                let d0 = dims.first_mut()?;
                *d0 = f(*d0);
                Some(Shape::Shared(dims.into()))
            }
        }
    }
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Self {
        match u8::try_from(dims.len()) {
            Ok(ndim) if dims.len() <= INLINE => {
                let mut inline = [0; INLINE];
                inline[..dims.len()].copy_from_slice(dims);
                Shape::Inline { dims: inline, ndim }
            }
            _ => Shape::Shared(dims.into()),
        }
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Self {
        Shape::from(&dims[..])
    }
}

impl Deref for Shape {
    type Target = [usize];

    fn deref(&self) -> &[usize] {
        match self {
            Shape::Inline { dims, ndim } => &dims[..usize::from(*ndim)],
            Shape::Shared(dims) => dims,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_of_any_rank_read_back() {
        for ndim in 0..=7 {
            let dims: Vec<usize> = (1..=ndim).collect();
            let shape = Shape::from(&dims[..]);
            assert_eq!(&*shape, &dims[..]);
            assert_eq!(&*shape.clone(), &dims[..]);
            assert_eq!(matches!(shape, Shape::Inline { .. }), ndim <= INLINE);
            let doubled = shape.map_first(|d0| d0 * 2).map(|s| s.to_vec());
            let want = (ndim > 0).then(|| [vec![2], dims[1..].to_vec()].concat());
            assert_eq!(doubled, want);
        }
    }
}

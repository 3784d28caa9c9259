//! Actor types defined in a library crate, for actorgraph's tests: graphs in other crates
//! use them (this package's binary, its test, and `tests/ui/pass/cross_crate.rs` of
//! actorgraph).

use actorgraph::prelude::*;
use actorgraph::Element;

/// A worker whose gradient is its rank.
pub struct Worker {
    /// Its rank, set by whoever builds it.
    pub rank: usize,
}

#[actor]
impl Worker {
    fn grad(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        Tensor::full(x.shape(), self.rank as f32)
    }

    /// A helper, not a graph node.
    pub fn rank(&self) -> &usize {
        &self.rank
    }
}

/// A generic actor: multiplies its input by `k`.
pub struct Scaled<T> {
    /// The factor.
    pub k: T,
}

#[actor]
impl<T: Element + std::ops::Mul<Output = T>> Scaled<T> {
    fn scale(&mut self, x: &Tensor<T>) -> Tensor<T> {
        let data = x.as_slice().iter().map(|&v| v * self.k).collect();
        Tensor::from_vec(data, x.shape()).expect("the input's own shape")
    }
}

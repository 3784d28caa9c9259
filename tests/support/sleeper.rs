//! An actor that blocks in its method on the rank a plan names (see [`nap`]).

use actorgraph::prelude::*;

use super::nap::nap;

/// Blocks in [`Sleeper::nap`] as its plan says, then gives `[1.0; 2]`.
#[derive(Debug)]
pub struct Sleeper {
    pub rank: usize,
}

#[actor]
impl Sleeper {
    pub fn nap(&mut self, plan: &(usize, u64)) -> Tensor<f32> {
        nap(self.rank, *plan);
        Tensor::full([2], 1.0)
    }
}

/// `n` sleepers, by rank.
pub fn sleepers(n: usize) -> Vec<Sleeper> {
    (0..n).map(|rank| Sleeper { rank }).collect()
}

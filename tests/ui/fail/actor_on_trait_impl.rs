use actorgraph::prelude::*;

trait Compute {
    fn compute(&mut self) -> Tensor<f32>;
}

struct Worker;

#[actor]
impl Compute for Worker {
    fn compute(&mut self) -> Tensor<f32> {
        Tensor::zeros([1])
    }
}

fn main() {}

use actorgraph::prelude::*;

#[actor]
struct Worker;

#[actor]
fn compute() -> Tensor<f32> {
    Tensor::zeros([1])
}

fn main() {}

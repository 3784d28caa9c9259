use actorgraph::prelude::*;

struct Worker;

#[actor(foo)]
impl Worker {
    fn comp1(&mut self) -> Tensor<f32> {
        Tensor::zeros([1])
    }
}

fn main() {}

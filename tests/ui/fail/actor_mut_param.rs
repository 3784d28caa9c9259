use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn comp1(&mut self, x: &mut Tensor<f32>) -> Tensor<f32> {
        x.clone()
    }
}

fn main() {}

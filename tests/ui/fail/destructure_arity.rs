use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn three(&mut self) -> (Tensor<f32>, Tensor<f32>, Tensor<f32>) {
        (Tensor::zeros([1]), Tensor::zeros([1]), Tensor::zeros([1]))
    }
    fn one(&mut self) -> Tensor<f32> {
        Tensor::zeros([1])
    }
}

graph! {
    G(workers: [Worker]) {
        let (a, b) = workers.three();
        let (c, d) = workers.one();
        allreduce([a, b, c, d])
    }
}

fn main() {}

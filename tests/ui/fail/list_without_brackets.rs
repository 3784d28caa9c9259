//! Several values passed to a collective without their brackets: one error per call, with
//! the call as it is written, and nothing about reduce ops or arguments too many.
use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn grad(&mut self) -> Tensor<f32> {
        Tensor::zeros([1])
    }
    fn loss(&mut self) -> Tensor<f32> {
        Tensor::zeros([1])
    }
}

graph! {
    G(workers: [Worker]) {
        let g = workers.grad();
        let l = workers.loss();
        let (a, b) = allreduce(g, l, Avg);
        let c = allgather(g, l);
        let d = broadcast(g, l, 0);
        (a, b, c, d)
    }
}

fn main() {}

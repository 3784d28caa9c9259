//! Types the graph names that do not exist: each reported where it is written, and
//! nothing more (rustc reports a type in the graph's declaration once for the struct and
//! once for its methods).
use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn comp1(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        x.clone()
    }
}

graph! {
    G(workers: [Worker], other: [Missing], x: Tensor<f32>, y: Nope) {
        let c = workers.comp1(x);
        let d = other.comp1(x);
        (allreduce(c), d)
    }
}

fn main() {}

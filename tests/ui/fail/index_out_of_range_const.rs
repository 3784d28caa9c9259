use actorgraph::prelude::*;

const WORKERS: usize = 2;

struct Worker;

#[actor]
impl Worker {
    fn send(&mut self) -> Tensor<f32> {
        Tensor::zeros([1])
    }
}

graph! {
    // The size is a constant the macro cannot read: the compiler checks the index.
    Pair(workers: [Worker; WORKERS]) {
        workers[3].send()
    }
}

fn main() {}

use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn weights(&mut self) -> Tensor<f32> {
        Tensor::zeros([4])
    }
}

graph! {
    G(workers: [Worker]) {
        let w = workers.weights();
        broadcast(w)
    }
}

fn main() {}

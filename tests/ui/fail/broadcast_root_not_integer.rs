use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn weights(&mut self) -> Tensor<f32> {
        Tensor::zeros([4])
    }
}

graph! {
    // The root is fixed when the graph is compiled: a literal, not a graph input.
    G(workers: [Worker], root: usize) {
        let w = workers.weights();
        broadcast(w, root)
    }

    H(workers: [Worker]) {
        let w = workers.weights();
        broadcast([w], -1)
    }
}

fn main() {}

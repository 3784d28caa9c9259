//! Helpers in an `#[actor]` block compile as they are; a graph that calls one gets an
//! error saying why it cannot be a node.
use actorgraph::prelude::*;

struct Worker {
    weights: Vec<f32>,
}

#[actor]
impl Worker {
    fn new() -> Self {
        Worker { weights: vec![] }
    }
    fn weights(&self) -> &[f32] {
        &self.weights
    }
    fn scaled<T: Into<f32>>(&self, k: T) -> Tensor<f32> {
        Tensor::full([1], k.into())
    }
    fn update(&mut self, g: &mut Tensor<f32>) {
        let _ = g;
    }
    fn into_weights(self) -> Vec<f32> {
        self.weights
    }
    fn grad(&mut self) -> Tensor<f32> {
        Tensor::from_slice(&self.weights)
    }
}

graph! {
    G(workers: [Worker]) {
        let w = workers.weights();
        let s = workers.scaled(w);
        let g = workers.grad();
        workers.update(g);
        let v = workers.into_weights();
        let n = workers.new();
        allreduce([g, s, v, n])
    }
}

fn main() {}

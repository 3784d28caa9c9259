//! `#[actor(foo)]` with a method that cannot be a node, called by a graph: exactly those
//! two errors, and the code using the graph reports nothing more.
use actorgraph::prelude::*;

struct Worker;

#[actor(foo)]
impl Worker {
    fn comp1(&mut self) -> Tensor<f32> {
        Tensor::zeros([1])
    }
    fn bad(&mut self, x: &mut Tensor<f32>) -> Tensor<f32> {
        x.clone()
    }
}

graph! {
    G(workers: [Worker]) {
        let c = workers.comp1();
        let d = workers.bad(c);
        allreduce([c, d])
    }
}

fn main() {
    let mut g = G::launch(vec![Worker, Worker], Cpu).unwrap();
    let out: Vec<(Tensor<f32>, Tensor<f32>)> = g.execute().unwrap();
    assert_eq!(out[0].0.to_vec(), vec![0.0]);
    let _workers: Vec<Worker> = g.teardown().unwrap();
}

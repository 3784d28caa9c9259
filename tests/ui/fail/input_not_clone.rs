//! A graph input whose type is not `Clone`: one error, at its type.
use actorgraph::prelude::*;

pub struct Config(u32);

struct Worker;

#[actor]
impl Worker {
    fn configure(&mut self, c: &Config) -> Tensor<u32> {
        Tensor::full([1], c.0)
    }
}

graph! {
    G(workers: [Worker], c: Config) {
        let t = workers.configure(c);
        allreduce(t)
    }
}

fn main() {
    let mut g = G::launch(vec![Worker], Cpu).unwrap();
    let out: Vec<Tensor<u32>> = g.execute(Config(1)).unwrap();
    assert_eq!(out[0].to_vec(), vec![1]);
}

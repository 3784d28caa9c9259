//! A method returning `Result<Tensor<f32>, String>`: the graph sees the `Tensor<f32>`.
use actorgraph::prelude::*;

struct Worker {
    fail: bool,
}

#[actor]
impl Worker {
    fn comp(&mut self) -> Result<Tensor<f32>, String> {
        if self.fail {
            Err(String::from("no"))
        } else {
            Ok(Tensor::full([1], 1.0))
        }
    }
}

graph! {
    G(workers: [Worker]) {
        let c = workers.comp();
        allreduce(c)
    }
}

fn main() {
    let mut g = G::launch(vec![Worker { fail: false }, Worker { fail: false }], Cpu).unwrap();
    let out: Vec<Tensor<f32>> = g.execute().unwrap();
    assert_eq!(out[0].to_vec(), vec![2.0]);
}

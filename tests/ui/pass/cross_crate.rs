// Actor types defined in a library crate (`tests/crates/cross_crate`), one generic and
// imported under another name, used by a graph in this binary crate.
use actorgraph::prelude::*;
use actorgraph_cross_crate::Scaled as S;
use actorgraph_cross_crate::Worker;

graph! {
    Step(workers: [Worker], scalers: [S<f32>], x: Tensor<f32>) {
        let g = workers.grad(x);
        let s = scalers.scale(g);
        (allreduce(g), allreduce(s))
    }
}

fn main() {
    let workers: Vec<Worker> = (0..2).map(|rank| Worker { rank }).collect();
    let mut step = Step::launch(workers, vec![S { k: 2.0 }, S { k: 3.0 }], Cpu).unwrap();
    let out: Vec<(Tensor<f32>, Tensor<f32>)> = step.execute(Tensor::zeros([1])).unwrap();
    assert_eq!(out[0].0.to_vec(), vec![1.0]);
    assert_eq!(out[0].1.to_vec(), vec![3.0]);
}

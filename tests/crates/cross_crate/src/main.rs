//! A graph in a binary crate over actor types of a library crate (one of them generic and
//! imported under another name). Prints its results; exits with an error if they are wrong.

use actorgraph::prelude::*;
use actorgraph_cross_crate::Scaled as S;
use actorgraph_cross_crate::Worker;

graph! {
    Step(workers: [Worker], scalers: [S<f64>], x: Tensor<f32>, y: Tensor<f64>) {
        let g = workers.grad(x);
        let s = scalers.scale(y);
        (allreduce(g), allreduce(s))
    }
}

fn main() -> Result<(), Error> {
    let workers: Vec<Worker> = (0..3).map(|rank| Worker { rank }).collect();
    let scalers = vec![S { k: 2.0 }, S { k: 0.5 }, S { k: 1.5 }];
    let mut step = Step::launch(workers, scalers, Cpu)?;
    let out: Vec<(Tensor<f32>, Tensor<f64>)> =
        step.execute(Tensor::zeros([2]), Tensor::full([1], 2.0))?;
    let (workers, _) = step.teardown()?;
    println!(
        "grad {:?} scaled {:?} ranks {:?}",
        out[0].0.to_vec(),
        out[2].1.to_vec(),
        workers.iter().map(Worker::rank).collect::<Vec<_>>()
    );
    Ok(())
}

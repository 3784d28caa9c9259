//! A graph without an output expression: one error, and the code using the graph
//! (teardown included) reports nothing more.
use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn comp1(&mut self) -> Tensor<f32> {
        Tensor::zeros([1])
    }
}

graph! {
    G(workers: [Worker]) {
        let c = workers.comp1();
        allreduce(c);
    }
}

fn main() -> Result<(), Error> {
    let g = G::launch(vec![Worker, Worker], Cpu)?;
    let workers = g.teardown()?;
    assert_eq!(workers.len(), 2);
    Ok(())
}

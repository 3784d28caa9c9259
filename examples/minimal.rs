//! The smallest graph: one group, one method. `scripts/expand-size.sh minimal Echo`
//! measures what `graph!` generates for it, the fixed cost of every graph.

use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn echo(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        x.clone()
    }
}

graph! {
    Echo(workers: [Worker], x: Tensor<f32>) {
        workers.echo(x)
    }
}

fn main() -> Result<(), actorgraph::Error> {
    let mut g = Echo::launch(vec![Worker, Worker], Cpu)?;
    let out = g.execute(Tensor::full([2], 1.0))?;
    assert_eq!(out[1].to_vec(), vec![1.0; 2]);
    g.teardown()?;
    Ok(())
}

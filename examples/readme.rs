//! The example of the README, as written there: `scripts/expand-size.sh readme Bucketed`
//! measures the size of its graph's expansion.
// Kept as the README writes it: `rank` is never read (it shows an actor's state), and
// `Cpu::default()` constructs a unit struct.
#![allow(dead_code, clippy::default_constructed_unit_structs)]

use actorgraph::prelude::*;

struct Worker {
    rank: usize,
}

#[actor]
impl Worker {
    fn comp1(&mut self, _x: &Tensor<f32>) -> Tensor<f32> {
        Tensor::full([4], 1.0)
    }
    fn comp2(&mut self, _x: &Tensor<f32>) -> Tensor<f32> {
        Tensor::full([2], 2.0)
    }
}

graph! {
    /// Both outputs of every worker, summed across workers by one collective.
    pub Bucketed(workers: [Worker], x: Tensor<f32>) {
        let c1 = workers.comp1(x);
        let c2 = workers.comp2(x);
        allreduce([c1, c2])
    }
}

fn main() -> Result<(), actorgraph::Error> {
    let workers = (0..4).map(|rank| Worker { rank }).collect();
    let mut g = Bucketed::launch(workers, Cpu::default())?;
    let out: Vec<(Tensor<f32>, Tensor<f32>)> = g.execute(Tensor::zeros([1]))?;
    assert_eq!(out[2].0.to_vec(), vec![4.0; 4]);
    assert_eq!(out[2].1.to_vec(), vec![8.0; 2]);
    let _workers: Vec<Worker> = g.teardown()?;
    Ok(())
}

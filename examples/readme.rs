//! The README's example, as written there (a test keeps the two the same):
//! `scripts/expand-size.sh readme Bucketed` measures its graph's expansion.

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
    let workers: Vec<Worker> = (0..4).map(|rank| Worker { rank }).collect();
    let mut g = Bucketed::launch(workers, Cpu)?;
    let out: Vec<(Tensor<f32>, Tensor<f32>)> = g.execute(Tensor::zeros([1]))?;
    assert_eq!(out[2].0.to_vec(), vec![4.0; 4]);
    assert_eq!(out[2].1.to_vec(), vec![8.0; 2]);
    let workers: Vec<Worker> = g.teardown()?;
    assert_eq!(workers[3].rank, 3);
    Ok(())
}

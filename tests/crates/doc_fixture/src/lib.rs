//! Graphs as a user's crate writes them, documented by `tests/rustdoc.rs`, which reads the
//! pages rustdoc makes of their generated items.

use actorgraph::prelude::*;

/// A worker of the graphs below.
pub struct Worker {
    /// Its rank.
    pub rank: usize,
}

#[actor]
impl Worker {
    fn comp1(&mut self, _x: &Tensor<f32>) -> Tensor<f32> {
        Tensor::full([4], 1.0)
    }
    fn comp2(&mut self, _x: &Tensor<f32>) -> Tensor<f32> {
        Tensor::full([2], 2.0)
    }
    fn loss(&mut self) -> f32 {
        self.rank as f32
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

graph! {
    /// Four workers: a gradient averaged across them, and each one's own loss.
    pub Step(workers: [Worker; 4], x: Tensor<f32>) {
        let g = workers.comp1(x);
        let l = workers.loss();
        (allreduce(g, Avg), l)
    }
}

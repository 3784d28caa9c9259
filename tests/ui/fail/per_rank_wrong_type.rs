//! Per-rank inputs of the wrong type: an element the method does not take (at the user's
//! argument), and an element that cannot move to its actor's thread (at its type).
use actorgraph::prelude::*;
use std::rc::Rc;

struct Worker;

#[actor]
impl Worker {
    fn train(&mut self, batch: &Tensor<f32>) -> f32 {
        batch.as_slice()[0]
    }
    fn count(&mut self, n: &u32) -> u32 {
        *n
    }
}

graph! {
    Wrong(workers: [Worker], batch: PerRank<u32>) {
        workers.train(batch)
    }

    NotSend(workers: [Worker], n: PerRank<Rc<u32>>) {
        workers.count(n)
    }
}

fn main() {}

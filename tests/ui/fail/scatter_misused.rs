//! `scatter` written where it cannot be: over a per-actor value, to one actor, and over a
//! value that is not a `Vec` (at the user's argument).
use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn loss(&mut self) -> f32 {
        1.0
    }
    fn shards(&mut self) -> Vec<f32> {
        vec![1.0, 2.0]
    }
    fn see(&mut self, l: &f32) -> f32 {
        *l
    }
}

graph! {
    Misused(workers: [Worker]) {
        let losses = workers.loss();
        let shards = workers[0].shards();
        let a = workers.see(scatter(losses));
        let b = workers[1].see(scatter(shards));
        (a, b)
    }

    NotAVec(workers: [Worker]) {
        let one = workers[0].loss();
        workers.see(scatter(one))
    }
}

fn main() {}

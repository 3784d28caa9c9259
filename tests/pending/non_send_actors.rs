//! Actors that are not `Send` (they hold an `Rc`), built on their own threads by
//! `Actors::each`, run a graph with an allreduce, keeping their state across executions.
//!
//! PENDING: needs the runtime's `Actors` (exec branch); move to `tests/` when it lands.

use std::cell::Cell;
use std::rc::Rc;
use std::thread::{self, ThreadId};

use actorgraph::prelude::*;
use actorgraph::Actors;

struct Worker {
    rank: usize,
    size: usize,
    calls: Rc<Cell<u32>>,
    built_on: ThreadId,
}

#[actor]
impl Worker {
    fn grad(&mut self) -> Tensor<f32> {
        assert_eq!(thread::current().id(), self.built_on, "built on another thread");
        self.calls.set(self.calls.get() + 1);
        Tensor::full([2], self.rank as f32 + self.calls.get() as f32)
    }
    fn size(&self) -> u64 {
        self.size as u64
    }
}

graph! {
    Step(workers: [Worker]) {
        let g = workers.grad();
        let n = workers.size();
        (allreduce(g), n)
    }
}

#[test]
fn actors_built_on_their_threads_need_not_be_send() {
    let actors = Actors::each(3, |rank, size| Worker {
        rank,
        size,
        calls: Rc::new(Cell::new(0)),
        built_on: thread::current().id(),
    });
    let mut g = Step::launch(actors, Cpu).unwrap();
    for step in 1..=3u32 {
        let out: Vec<(Tensor<f32>, u64)> = g.execute().unwrap();
        // Ranks 0 + 1 + 2, plus each actor's own count of calls.
        let want = 3.0 + 3.0 * step as f32;
        for (rank, (sum, size)) in out.iter().enumerate() {
            assert_eq!(sum.to_vec(), vec![want; 2], "rank {rank}, step {step}");
            assert_eq!(*size, 3);
        }
    }
    // `teardown` would hand the actors to this thread: not for a non-`Send` actor (see
    // `tests/ui/pending/non_send_teardown.rs`); dropping the graph stops its threads.
    drop(g);
}

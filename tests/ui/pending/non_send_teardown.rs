//! `teardown` hands the actors back to the caller's thread, so it needs them `Send`: one
//! error, at the call, naming `Send`; the rest of the graph works without it.
//! PENDING: needs the runtime's `Actors` (exec branch); move to `tests/ui/fail/`, bless.
use actorgraph::prelude::*;
use actorgraph::Actors;
use std::rc::Rc;

struct Worker {
    seen: Rc<u32>,
}

#[actor]
impl Worker {
    fn grad(&mut self) -> Tensor<u32> {
        Tensor::full([1], *self.seen)
    }
}

graph! {
    G(workers: [Worker]) {
        let g = workers.grad();
        allreduce(g)
    }
}

fn main() {
    let actors = Actors::each(2, |rank, _| Worker { seen: Rc::new(rank as u32) });
    let mut g = G::launch(actors, Cpu).unwrap();
    let out: Vec<Tensor<u32>> = g.execute().unwrap();
    assert_eq!(out[0].to_vec(), vec![1]);
    let _workers = g.teardown().unwrap();
}

//! An actor that is not `Send` (it holds an `Rc`) launched from ready values: they would
//! have to move to the actor threads. One error, at the argument, naming `Send`; building
//! the actors on their own threads (`Actors::each`) is the way (`tests/non_send_actors.rs`).
//! PENDING: needs the runtime's `Actors` (exec branch); move to `tests/ui/fail/`, bless.
use actorgraph::prelude::*;
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
    let workers = vec![Worker { seen: Rc::new(1) }, Worker { seen: Rc::new(2) }];
    let mut g = G::launch(workers, Cpu).unwrap();
    let out: Vec<Tensor<u32>> = g.execute().unwrap();
    assert_eq!(out[0].to_vec(), vec![3]);
}

//! A value that is not `Send` is fine on its own actor, and one error where it would leave
//! it: as the graph's output, or sent to other actors.
use actorgraph::prelude::*;
use std::rc::Rc;

struct Worker;

#[actor]
impl Worker {
    fn handle(&mut self) -> Rc<u32> {
        Rc::new(1)
    }
    fn read(&mut self, h: &Rc<u32>) -> Tensor<u32> {
        Tensor::full([1], **h)
    }
}

graph! {
    Local(workers: [Worker]) {
        let h = workers.handle();
        let t = workers.read(h);
        allreduce(t)
    }
}

graph! {
    Out(workers: [Worker]) {
        let h = workers.handle();
        let t = workers.read(h);
        (allreduce(t), h)
    }
}

graph! {
    Edge(workers: [Worker]) {
        let h = workers[0].handle();
        let t = workers.read(h);
        allreduce(t)
    }
}

fn main() {
    let mut g = Local::launch(vec![Worker, Worker], Cpu).unwrap();
    let out: Vec<Tensor<u32>> = g.execute().unwrap();
    assert_eq!(out[0].to_vec(), vec![2]);
}

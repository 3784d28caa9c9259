//! A group of a type without an `#[actor]` impl block: one error at the type, however
//! many calls the graph makes on it.
use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn comp1(&mut self) -> Tensor<f32> {
        Tensor::zeros([1])
    }
}

struct Plain;

graph! {
    G(workers: [Vec<Worker>], plain: [Plain]) {
        let c = workers.comp1();
        let d = workers.comp2(c);
        let e = plain.comp1();
        (allreduce(d), e)
    }
}

fn main() {}

use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn loss(&mut self) -> f32 {
        0.5
    }
}

graph! {
    G(workers: [Worker]) {
        let l = workers.loss();
        allgather(l, Sum)
    }
}

fn main() {}

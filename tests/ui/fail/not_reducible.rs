use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn name(&mut self) -> String {
        String::from("worker")
    }
}

graph! {
    G(workers: [Worker]) {
        let s = workers.name();
        allreduce(s)
    }
}

fn main() {}

//! A by-value parameter whose type is not `Clone`: the method stays an ordinary method
//! until a graph calls it, which then needs to clone the graph's value into the call.
use actorgraph::prelude::*;

pub struct Config(u32);

struct Worker;

#[actor]
impl Worker {
    fn config(&mut self) -> Config {
        Config(1)
    }
    fn configure(&mut self, c: Config) -> Tensor<u32> {
        Tensor::full([1], c.0)
    }
}

graph! {
    G(workers: [Worker]) {
        let c = workers.config();
        let t = workers.configure(c);
        allreduce(t)
    }
}

fn main() {}

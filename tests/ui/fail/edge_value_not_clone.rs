use actorgraph::prelude::*;

/// A value that cannot be cloned: fine on one actor, but not sent to several.
pub struct Token(u32);

struct Worker;

#[actor]
impl Worker {
    fn make(&mut self) -> Token {
        Token(1)
    }
    fn read(&mut self, t: &Token) -> Tensor<u32> {
        Tensor::full([1], t.0)
    }
}

graph! {
    G(workers: [Worker]) {
        let t = workers[0].make();
        let r = workers.read(t);
        allreduce(r)
    }
}

fn main() {}

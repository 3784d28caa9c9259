use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn f(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        x.clone()
    }
}

graph! {
    // A cycle needs a value used before it is defined: `a` reads `b`, `b` reads `a`.
    Cycle(workers: [Worker]) {
        let a = workers.f(b);
        let b = workers.f(a);
        b
    }

    // The tightest cycle: a value read by its own definition.
    SelfLoop(workers: [Worker]) {
        let c = workers.f(c);
        c
    }
}

fn main() {}

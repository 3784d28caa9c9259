use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn f(&mut self) -> Tensor<f32> {
        Tensor::zeros([1])
    }
}

graph! {
    G(workers: [Worker]) {
        let a = workers.f();
        let t = workers[0].f();
        allreduce([a, t])
    }
}

fn main() {}

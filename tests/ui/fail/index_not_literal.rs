use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn f(&mut self) -> Tensor<f32> {
        Tensor::zeros([1])
    }
}

graph! {
    G(workers: [Worker], i: usize) {
        let a = workers[i].f();
        let b = workers[-1].f();
        let c = workers[0][1].f();
        (a, b, c)
    }
}

fn main() {}

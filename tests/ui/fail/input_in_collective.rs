use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn comp1(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        x.clone()
    }
}

graph! {
    Flat(workers: [Worker], x: Tensor<f32>) {
        allreduce(x)
    }

    Nested(workers: [Worker], x: Tensor<f32>) {
        let c = workers.comp1(x);
        allreduce([c, x])
    }
}

fn main() {}

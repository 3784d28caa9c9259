use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn comp1(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        x.clone()
    }
}

graph! {
    G(workers: [Worker], n: usize) {
        let c = workers.comp1(n);
        allreduce(c)
    }
}

fn main() {}

use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn comp1(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        x.clone()
    }
}

graph! {
    G(workers: [Worker], n: Tensor<f32>) {
        let c = workers.comp1();
        let d = workers.comp1(n, n);
        allreduce([c, d])
    }
}

fn main() {}

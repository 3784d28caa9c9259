use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn comp1(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        x.clone()
    }
    fn step(&mut self, lr: f32, x: &Tensor<f32>) -> Tensor<f32> {
        Tensor::full(x.shape(), lr)
    }
    fn tick(&mut self) -> Tensor<f32> {
        Tensor::zeros([1])
    }
}

graph! {
    G(workers: [Worker], n: Tensor<f32>, lr: f32) {
        let c = workers.comp1();
        let d = workers.comp1(n, n);
        let e = workers.step(lr);
        let f = workers.tick(n);
        allreduce([c, d, e, f])
    }
}

fn main() {}

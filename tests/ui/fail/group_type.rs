use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn comp1(&mut self) -> Tensor<f32> {
        Tensor::zeros([1])
    }
}

graph! {
    G(workers: [(Worker, Worker)]) {
        let c = workers.comp1();
        allreduce(c)
    }
}

fn main() {}

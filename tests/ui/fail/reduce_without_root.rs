use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn grad(&mut self) -> Tensor<f32> {
        Tensor::zeros([4])
    }
}

graph! {
    G(workers: [Worker]) {
        let g = workers.grad();
        reduce(g, Sum)
    }
}

fn main() {}

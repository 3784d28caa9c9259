use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn loss(&mut self) -> f32 {
        0.5
    }
    fn grad(&mut self) -> Tensor<f32> {
        Tensor::zeros([4])
    }
}

graph! {
    // One element cannot be split over the ranks.
    G(workers: [Worker]) {
        let g = workers.grad();
        let l = workers.loss();
        reducescatter([g, l])
    }
}

fn main() {}

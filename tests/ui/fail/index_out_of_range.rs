use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn send(&mut self) -> Tensor<f32> {
        Tensor::zeros([1])
    }
    fn recv(&mut self, t: &Tensor<f32>) -> Tensor<f32> {
        t.clone()
    }
}

graph! {
    // A group of 2 actors, so index 2 and root 2 are visibly out of range.
    Pair(workers: [Worker; 2]) {
        let t = workers[0].send();
        let r = workers[2].recv(t);
        let all = workers.send();
        let b = broadcast(all, 2);
        (r, b)
    }
}

fn main() {}

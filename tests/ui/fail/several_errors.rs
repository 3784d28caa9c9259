use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn comp1(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        x.clone()
    }
}

graph! {
    G(workers: [Worker], x: Tensor<f32>) {
        let c = workers.comp1(missing);
        let d = workers.comp1(x);
        let d = workers.comp1(x);
        allreduce([c, d], Mean)
    }
}

fn main() {
    let workers = vec![Worker, Worker];
    let mut g = G::launch(workers, Cpu).unwrap();
    let out: Vec<(Tensor<f32>, Tensor<f32>)> = g.execute(Tensor::zeros([1])).unwrap();
    let _ = out;
    let back: Vec<Worker> = g.teardown().unwrap();
    let _ = back;
}

//! Two `graph!` invocations in one module, with the same group and actor names.
use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn comp1(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        x.clone()
    }
    fn comp2(&mut self) -> Tensor<f32> {
        Tensor::zeros([2])
    }
}

graph! {
    First(workers: [Worker], x: Tensor<f32>) {
        let c = workers.comp1(x);
        allreduce(c)
    }
}

graph! {
    Second(workers: [Worker], x: Tensor<f32>) {
        let c = workers.comp1(x);
        let d = workers.comp2();
        allreduce([c, d], Avg)
    }
}

fn main() {
    let mut first = First::launch(vec![Worker, Worker], Cpu).unwrap();
    let out: Vec<Tensor<f32>> = first.execute(Tensor::full([1], 1.0)).unwrap();
    assert_eq!(out[0].to_vec(), vec![2.0]);
    let mut second = Second::launch(vec![Worker], Cpu).unwrap();
    let out: Vec<(Tensor<f32>, Tensor<f32>)> = second.execute(Tensor::full([1], 1.0)).unwrap();
    assert_eq!(out[0].1.to_vec(), vec![0.0; 2]);
}

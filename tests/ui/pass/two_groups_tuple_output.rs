//! Two groups of different actor types, and a tuple output that mixes their values.
use actorgraph::prelude::*;

struct Trainer {
    rank: usize,
}

struct Evaluator;

#[actor]
impl Trainer {
    fn grad(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        Tensor::full([2], x.as_slice()[0] + self.rank as f32)
    }
}

#[actor]
impl Evaluator {
    fn score(&mut self) -> Tensor<i64> {
        Tensor::full([1], 7)
    }
}

graph! {
    Mixed(trainers: [Trainer], evaluators: [Evaluator], x: Tensor<f32>) {
        let raw = trainers.grad(x);
        let s = evaluators.score();
        let g = allreduce(raw);
        (s, g)
    }
}

fn main() {
    let trainers: Vec<Trainer> = (0..2).map(|rank| Trainer { rank }).collect();
    let mut m = Mixed::launch(trainers, vec![Evaluator, Evaluator], Cpu).unwrap();
    let out: Vec<(Tensor<i64>, Tensor<f32>)> = m.execute(Tensor::full([1], 1.0)).unwrap();
    assert_eq!(out[1].0.to_vec(), vec![7]);
    assert_eq!(out[1].1.to_vec(), vec![3.0; 2]);
    let (_t, _e): (Vec<Trainer>, Vec<Evaluator>) = m.teardown().unwrap();
}

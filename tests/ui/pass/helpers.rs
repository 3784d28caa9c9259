// An `#[actor]` block holding helpers that cannot be graph nodes: they compile, stay
// ordinary methods, and the graph calls only the nodes. (Also included by
// `tests/it/actor_types.rs`.)
use actorgraph::prelude::*;
use std::fmt::Display;

#[derive(Debug, PartialEq)]
pub struct Worker {
    weights: Vec<f32>,
}

/// Not `Clone`: a by-value parameter of this type keeps a method from being callable by a
/// graph, not from compiling.
pub struct Update(Vec<f32>);

#[actor]
impl Worker {
    fn new(n: usize) -> Self {
        Worker {
            weights: vec![1.0; n],
        }
    }
    fn weights(&self) -> &[f32] {
        &self.weights
    }
    fn first<'a>(&'a self, _other: &'a [f32]) -> &'a f32 {
        &self.weights[0]
    }
    fn scaled<T: Into<f32>>(&self, k: T) -> Vec<f32> {
        let k = k.into();
        self.weights.iter().map(|w| w * k).collect()
    }
    fn describe(&self, label: impl Display) -> String {
        format!("{label}: {}", self.weights.len())
    }
    fn iter(&self) -> impl Iterator<Item = &f32> {
        self.weights.iter()
    }
    fn add_into(&self, out: &mut Vec<f32>) {
        out.extend_from_slice(&self.weights);
    }
    fn apply(&mut self, u: Update) {
        self.weights = u.0;
    }
    fn into_weights(self) -> Vec<f32> {
        self.weights
    }
    async fn later(&self) -> usize {
        self.weights.len()
    }
    fn sum_where(&self) -> f32
    where
        Self: Sized,
    {
        self.weights.iter().sum()
    }
    fn parse(&self, s: &str) -> Result<f32, std::num::ParseFloatError> {
        s.parse()
    }
    fn boxed(&self) -> Box<dyn Fn(f32) -> f32 + '_> {
        Box::new(move |x| x * self.weights[0])
    }

    // A node compiled out: its generated impls are compiled out with it.
    #[cfg(any())]
    fn compiled_out(&mut self) -> Tensor<f32> {
        Tensor::from_slice(&self.weights)
    }

    // The graph nodes.
    #[cfg(not(any()))]
    fn grad(&mut self) -> Tensor<f32> {
        Tensor::from_slice(&self.weights)
    }
    fn step(&mut self, g: &Tensor<f32>, lr: f32) -> Result<f32, String> {
        if g.len() != self.weights.len() {
            return Err(format!("{} gradients for {} weights", g.len(), self.weights.len()));
        }
        for (w, g) in self.weights.iter_mut().zip(g.as_slice()) {
            *w -= lr * g;
        }
        Ok(self.weights.iter().sum())
    }
}

graph! {
    Train(workers: [Worker], lr: f32) {
        let g = workers.grad();
        let mean = allreduce(g, Avg);
        workers.step(mean, lr)
    }
}

pub fn main() {
    let mut w = Worker::new(2);
    assert_eq!(w.weights(), &[1.0, 1.0]);
    assert_eq!(*w.first(&[]), 1.0);
    assert_eq!(w.scaled(2u8), vec![2.0, 2.0]);
    assert_eq!(w.describe("w"), "w: 2");
    assert_eq!(w.iter().count(), 2);
    let mut out = Vec::new();
    w.add_into(&mut out);
    assert_eq!(out, vec![1.0, 1.0]);
    assert_eq!(w.sum_where(), 2.0);
    assert_eq!(w.parse("0.5"), Ok(0.5));
    assert_eq!(w.boxed()(3.0), 3.0);
    drop(w.later());
    w.apply(Update(vec![2.0, 2.0]));

    let mut g = Train::launch(vec![w, Worker::new(2)], Cpu).unwrap();
    let sums: Vec<f32> = g.execute(0.5).unwrap();
    // Mean gradient (1.5, 1.5): 2 - 0.75 and 1 - 0.75 per weight.
    assert_eq!(sums, vec![2.5, 0.5]);
    let back: Vec<Worker> = g.teardown().unwrap();
    assert_eq!(back[1].clone_weights(), vec![0.25, 0.25]);
    assert_eq!(back.into_iter().next().map(Worker::into_weights), Some(vec![1.25, 1.25]));
}

impl Worker {
    fn clone_weights(&self) -> Vec<f32> {
        self.weights.clone()
    }
}

// Generic actors: `Worker<T>` over a user trait `Float`, used as `[Worker<f32>]` and
// `[Worker<f64>]` in two graphs, and `Model<B>` whose bound is the user's own `Backend`
// (shadowing the prelude's). (Also included by `tests/it/actor_types.rs`.)
use actorgraph::prelude::*;
use actorgraph::Element;
use std::marker::PhantomData;

/// The user's float trait.
pub trait Float: Element {
    fn from_f64(x: f64) -> Self;
}

impl Float for f32 {
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}

impl Float for f64 {
    fn from_f64(x: f64) -> Self {
        x
    }
}

pub struct Worker<T> {
    rank: usize,
    scale: T,
}

#[actor]
impl<T: Float + Send + 'static> Worker<T> {
    fn grad(&mut self, x: &Tensor<T>) -> Tensor<T> {
        Tensor::full(x.shape(), T::from_f64(self.rank as f64))
    }
    fn loss(&mut self, scale: T) -> T {
        self.scale = scale;
        T::from_f64(1.0)
    }
    /// A helper, not a node.
    fn scale(&self) -> &T {
        &self.scale
    }
}

graph! {
    Step32(workers: [Worker<f32>], x: Tensor<f32>, s: f32) {
        let g = workers.grad(x);
        let l = workers.loss(s);
        allreduce([g, l])
    }

    Step64(workers: [Worker<f64>], x: Tensor<f64>, s: f64) {
        let g = workers.grad(x);
        let l = workers.loss(s);
        allreduce([g, l], Avg)
    }
}

/// The user's own trait named like the prelude's `Backend`.
pub trait Backend {
    type Elem: Element;
    const NAME: &'static str;
    fn init(rank: usize) -> Self::Elem;
}

pub struct Ints;

impl Backend for Ints {
    type Elem = i64;
    const NAME: &'static str = "ints";
    fn init(rank: usize) -> i64 {
        rank as i64 * 10
    }
}

pub struct Model<B> {
    rank: usize,
    backend: PhantomData<B>,
}

#[actor]
impl<B: Backend> Model<B> {
    fn forward(&mut self) -> Tensor<B::Elem> {
        Tensor::full([2], B::init(self.rank))
    }
    fn name(&self) -> String {
        B::NAME.to_string()
    }
}

graph! {
    Forward(models: [Model<Ints>; 2]) {
        let y = models.forward();
        let n = models.name();
        (allreduce(y), n)
    }
}

fn workers<T: Float>(n: usize) -> Vec<Worker<T>> {
    (0..n)
        .map(|rank| Worker {
            rank,
            scale: T::from_f64(0.0),
        })
        .collect()
}

pub fn main() {
    let mut g = Step32::launch(workers::<f32>(3), Cpu).unwrap();
    let out: Vec<(Tensor<f32>, f32)> = g.execute(Tensor::zeros([2]), 0.5).unwrap();
    assert_eq!(out[0].0.to_vec(), vec![3.0; 2]);
    assert_eq!(out[0].1, 3.0);
    let back: Vec<Worker<f32>> = g.teardown().unwrap();
    assert_eq!(*back[1].scale(), 0.5);

    let mut g = Step64::launch(workers::<f64>(2), Cpu).unwrap();
    let out: Vec<(Tensor<f64>, f64)> = g.execute(Tensor::zeros([1]), 2.0).unwrap();
    assert_eq!(out[1].0.to_vec(), vec![0.5]);
    assert_eq!(out[1].1, 1.0);

    let models = [0, 1].map(|rank| Model::<Ints> {
        rank,
        backend: PhantomData,
    });
    let mut f = Forward::launch(models, Cpu).unwrap();
    let out: Vec<(Tensor<i64>, String)> = f.execute().unwrap();
    assert_eq!(out[1].0.to_vec(), vec![10, 10]);
    assert_eq!(out[1].1, "ints");

    // A fixed-size group given another number of actors (`launch` takes an array of the
    // right length; `launch_actors` checks at run time).
    let three: Vec<Model<Ints>> = (0..3)
        .map(|rank| Model {
            rank,
            backend: PhantomData,
        })
        .collect();
    assert!(matches!(
        Forward::launch_actors(three.into(), Cpu, LaunchOptions::default()),
        Err(Error::GroupSize {
            group: "models",
            expected: 2,
            got: 3
        })
    ));

    // The picture names the generic types as written.
    assert!(Step32::to_dot().contains("workers: [Worker<f32>]"), "{}", Step32::to_dot());
    assert!(Step64::to_dot().contains("workers: [Worker<f64>]"));
    assert!(Forward::to_dot().contains("models: [Model<Ints>; 2]"));
}

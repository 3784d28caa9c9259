// The actor type in one module, its `#[actor]` impl (naming it `crate::types::Worker`) in
// another, and the graph in a third. (Also included by `tests/impl_elsewhere.rs`.)
mod types {
    pub struct Worker {
        pub rank: usize,
    }
}

mod actors {
    use actorgraph::prelude::*;

    #[actor]
    impl crate::types::Worker {
        fn grad(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
            Tensor::full(x.shape(), self.rank as f32 + 1.0)
        }
    }
}

mod graphs {
    use actorgraph::prelude::*;

    graph! {
        pub Step(workers: [crate::types::Worker], x: Tensor<f32>) {
            let g = workers.grad(x);
            allreduce(g, Avg)
        }
    }
}

pub fn main() {
    use actorgraph::prelude::*;
    use types::Worker;

    let workers: Vec<Worker> = (0..4).map(|rank| Worker { rank }).collect();
    let mut step = graphs::Step::launch(workers, Cpu).unwrap();
    let out: Vec<Tensor<f32>> = step.execute(Tensor::zeros([3])).unwrap();
    assert_eq!(out[0].to_vec(), vec![2.5; 3]);
    let back: Vec<Worker> = step.teardown().unwrap();
    assert_eq!(back.len(), 4);
}

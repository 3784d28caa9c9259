// An actor type imported under another name: the graph names it `W`.
// (Also included by `tests/it/actor_types.rs`, which runs `main` as a test.)
use actorgraph::prelude::*;

mod model {
    use actorgraph::prelude::*;

    pub struct Worker {
        pub rank: usize,
    }

    #[actor]
    impl Worker {
        fn grad(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
            Tensor::full(x.shape(), self.rank as f32)
        }
    }
}

use model::Worker as W;

graph! {
    G(ws: [W], x: Tensor<f32>) {
        let g = ws.grad(x);
        allreduce(g)
    }
}

pub fn main() {
    let mut g = G::launch((0..3).map(|rank| W { rank }).collect::<Vec<_>>(), Cpu).unwrap();
    let out: Vec<Tensor<f32>> = g.execute(Tensor::zeros([2])).unwrap();
    assert_eq!(out[1].to_vec(), vec![3.0; 2]);
    let back: Vec<W> = g.teardown().unwrap();
    assert_eq!(back[2].rank, 2);
    assert!(G::to_dot().contains("ws: [W]"));
}

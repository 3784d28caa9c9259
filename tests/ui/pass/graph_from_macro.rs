// A graph written by a `macro_rules!` macro: each `$e:expr` it passes on comes wrapped in
// an invisible group, which `graph!` reads as the expression itself.
// (Also included by `tests/it/actor_types.rs`, which runs `main` as a test.)
use actorgraph::prelude::*;

pub struct Worker {
    rank: usize,
}

#[actor]
impl Worker {
    fn value(&mut self, scale: &f32) -> Tensor<f32> {
        Tensor::full([3], *scale * (self.rank + 1) as f32)
    }
}

/// A graph of `$n`'s named calls to `value`, whose output is `$out`.
macro_rules! graph_of {
    ($name:ident, $group:expr, [$($t:ident),*] => $out:expr) => {
        graph! {
            $name(workers: [Worker], scale: f32) {
                $(let $t = $group.value(scale);)*
                $out
            }
        }
    };
}

graph_of!(Summed, workers, [a, b] => (allreduce([a, b]), a));

/// A graph of one call, `$call`, given whole, and its allreduce.
macro_rules! graph_of_call {
    ($name:ident, $call:expr) => {
        graph! {
            $name(workers: [Worker], scale: f32) {
                let x = $call;
                allreduce(x, Max)
            }
        }
    };
}

graph_of_call!(Called, workers.value(scale));

pub fn main() {
    let workers = (0..2).map(|rank| Worker { rank }).collect::<Vec<_>>();
    let mut g = Summed::launch(workers, Cpu).unwrap();
    let out = g.execute(2.0).unwrap();
    for (rank, ((a, b), own)) in out.iter().enumerate() {
        assert_eq!(a.to_vec(), vec![6.0; 3]);
        assert_eq!(b.to_vec(), vec![6.0; 3]);
        assert_eq!(own.to_vec(), vec![2.0 * (rank + 1) as f32; 3]);
    }
    let workers = (0..3).map(|rank| Worker { rank }).collect::<Vec<_>>();
    let mut g = Called::launch(workers, Cpu).unwrap();
    for max in g.execute(0.5).unwrap() {
        assert_eq!(max.to_vec(), vec![1.5; 3]);
    }
}

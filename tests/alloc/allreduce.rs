//! After warm-up, the actor side of a bucketed allreduce graph allocates nothing per
//! execute: layouts, flat buffers and output views are all reused.

use crate::counting_alloc::{count_this_thread, counted, turn};

use actorgraph::prelude::*;

struct Echo;

#[actor]
impl Echo {
    fn echo(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        count_this_thread();
        x.clone()
    }
    fn echo_i(&mut self, x: &Tensor<i64>) -> Tensor<i64> {
        x.clone()
    }
}

graph! {
    Bucket(workers: [Echo], a: Tensor<f32>, b: Tensor<f32>, c: Tensor<i64>) {
        let x = workers.echo(a);
        let y = workers.echo(b);
        let z = workers.echo_i(c);
        allreduce([x, y, z], Avg)
    }
}

#[test]
fn steady_state_execute_allocates_nothing_on_the_actors() {
    let _turn = turn();
    // Made on their threads, so that every step runs there (ready values may also run a
    // step on the caller's thread, whose own allocations this test does not count).
    let made = Actors::each(3, |_, _| Echo);
    let mut g = Bucket::launch_actors(made, Cpu, LaunchOptions::default()).unwrap();
    let a = Tensor::full([1024], 1.0f32);
    let b = Tensor::full([3000], 2.0f32);
    let c = Tensor::full([5], 9i64);
    for _ in 0..10 {
        g.execute(a.clone(), b.clone(), c.clone()).unwrap();
    }
    let before = counted();
    for _ in 0..10_000 {
        let out = g.execute(a.clone(), b.clone(), c.clone()).unwrap();
        assert_eq!(out[2].2.as_slice()[4], 9);
    }
    let after = counted();
    assert_eq!(
        after - before,
        0,
        "allocations on actor threads in 10 000 executes"
    );
    // The counter is live: a held view forces a fresh buffer on the next execute.
    let held = g.execute(a.clone(), b.clone(), c.clone()).unwrap();
    g.execute(a, b, c).unwrap();
    assert!(counted() > after);
    drop(held);
}

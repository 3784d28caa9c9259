//! After warm-up, the actor side of a bucketed allreduce graph allocates nothing per
//! execute: layouts, flat buffers and output views are all reused; wherever a step runs
//! (its actor's thread, or the caller's for ready values: `exec::help`).

use crate::counting_alloc::{counted, turn};

use actorgraph::prelude::*;

struct Echo;

#[actor]
impl Echo {
    fn echo(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
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
    // Ready values: the caller's thread runs the first actor's step.
    let ready = Bucket::launch(vec![Echo, Echo, Echo], Cpu).unwrap();
    // Made on their threads: every step runs there.
    let made = Actors::each(3, |_, _| Echo);
    let made = Bucket::launch_actors(made, Cpu, LaunchOptions::default()).unwrap();
    for mut g in [ready, made] {
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
            "allocations on behalf of the actors in 10 000 executes"
        );
        // The counter is live: a held view forces a fresh buffer on the next execute.
        let held = g.execute(a.clone(), b.clone(), c.clone()).unwrap();
        g.execute(a, b, c).unwrap();
        assert!(counted() > after);
        drop(held);
    }
}

struct Fresh;

#[actor]
impl Fresh {
    /// A fresh allocation per call, and the name of the thread that made it.
    fn fresh(&mut self) -> (Vec<u8>, String) {
        let here = std::thread::current().name().unwrap_or("").to_string();
        (vec![1; 64], here)
    }
}

graph! {
    One(fs: [Fresh]) {
        fs.fresh()
    }
}

#[test]
fn a_step_the_caller_runs_is_counted_and_the_callers_own_work_is_not() {
    let _turn = turn();
    let me = std::thread::current().name().unwrap_or("").to_string();
    let mut g = One::launch(vec![Fresh], Cpu).unwrap();
    g.execute().unwrap();
    let before = counted();
    let (bytes, ran_on) = g.execute().unwrap().remove(0);
    // The step ran here (so this is the path the test means to cover), and its `vec!` was
    // counted; the caller's `Vec` of outputs and the thread name above were not.
    assert_eq!(ran_on, me);
    assert_eq!(bytes.len(), 64);
    let counted_in_step = counted() - before;
    assert!(
        counted_in_step >= 1,
        "the step's allocation was not counted"
    );
    let before = counted();
    std::hint::black_box(String::from("the caller's own"));
    assert_eq!(counted(), before, "the caller's own allocation was counted");
}

//! After warm-up, a graph with edges of every kind (group to group, one actor to a group,
//! one actor to another) and a collective allocates nothing on behalf of its actors per
//! execute: edge slots, schedules and stage buffers are all reused; wherever a step runs
//! (its actor's thread, or the caller's for ready values: `exec::help`).

use crate::counting_alloc::{counted, turn};

use actorgraph::prelude::*;

#[derive(Clone)]
struct Echo;

#[actor]
impl Echo {
    fn echo(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        x.clone()
    }
}

graph! {
    Pipe(first: [Echo], second: [Echo], a: Tensor<f32>) {
        let x = first.echo(a);
        let t = first[0].echo(a);
        let y = second.echo(x);
        let w = second.echo(t);
        let p = second[1].echo(y);
        let q = first[1].echo(p);
        let (s, _) = allreduce([y, w]);
        let back = first.echo(s);
        (back, q)
    }
}

#[test]
fn steady_state_edges_allocate_nothing_on_the_actors() {
    let _turn = turn();
    // Ready values: the caller's thread runs the first actor's step.
    let ready = || vec![Echo, Echo, Echo];
    let ready = Pipe::launch(ready(), ready(), Cpu).unwrap();
    // Made on their threads: every step runs there.
    let made = || Actors::each(3, |_, _| Echo);
    let made = Pipe::launch_actors(made(), made(), Cpu, LaunchOptions::default()).unwrap();
    for mut g in [ready, made] {
        let a = Tensor::full([1000], 1.0f32);
        for _ in 0..10 {
            g.execute(a.clone()).unwrap();
        }
        let before = counted();
        for _ in 0..5_000 {
            let out = g.execute(a.clone()).unwrap();
            assert_eq!(out[2].0.as_slice()[999], 3.0);
            assert!(out[1].1.is_some());
        }
        let after = counted();
        assert_eq!(
            after - before,
            0,
            "allocations on behalf of the actors in 5 000 executes"
        );
        // The counter is live: a held view forces a fresh stage buffer on the next execute.
        let held = g.execute(a.clone()).unwrap();
        g.execute(a).unwrap();
        assert!(counted() > after);
        drop(held);
    }
}

#[derive(Clone)]
struct Sum;

#[actor]
impl Sum {
    fn total(&mut self, all: &[Tensor<f32>]) -> f32 {
        all.iter().map(|t| t.as_slice()[0]).sum()
    }
}

graph! {
    /// A per-rank input, one rank's value read by a group of another size, gathers to one
    /// actor and to a group, and an output mixing the groups.
    Ranked(first: [Echo], second: [Echo], sums: [Sum], a: PerRank<Tensor<f32>>) {
        let x = first.echo(a);
        let y = second.echo(x[1]);
        let one = second[2].echo(y);
        let n = sums[0].total(gather(x));
        let m = sums.total(gather(x));
        (y, x[0], one, n, m)
    }
}

#[test]
fn steady_state_per_rank_inputs_one_ranks_value_and_gathers_allocate_nothing_on_the_actors() {
    let _turn = turn();
    // Ready values: the caller's thread runs the first actor's step.
    let ready = Ranked::launch(vec![Echo; 2], vec![Echo; 3], vec![Sum; 3], Cpu).unwrap();
    // Made on their threads: every step runs there.
    let echoes = |n| Actors::each(n, |_, _| Echo);
    let sums = Actors::each(3, |_, _| Sum);
    let options = LaunchOptions::default();
    let made = Ranked::launch_actors(echoes(2), echoes(3), sums, Cpu, options).unwrap();
    for mut g in [ready, made] {
        let a = Tensor::full([1000], 1.0f32);
        let b = Tensor::full([1000], 2.0f32);
        for _ in 0..10 {
            g.execute(vec![a.clone(), b.clone()]).unwrap();
        }
        let before = counted();
        for _ in 0..5_000 {
            let out = g.execute(vec![a.clone(), b.clone()]).unwrap();
            assert_eq!(out[2].0.as_slice()[0], 2.0);
            assert!(out[0].1.is_some() && out[2].1.is_none());
            assert_eq!((out[0].3, out[2].4), (Some(3.0), 3.0));
        }
        assert_eq!(
            counted() - before,
            0,
            "allocations on behalf of the actors in 5 000 executes"
        );
    }
}

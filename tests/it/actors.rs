//! Actors made on their own threads (`Actors::each`), which need not be `Send`, and the
//! ways making them can fail.

use std::cell::RefCell;
use std::rc::Rc;

use actorgraph::prelude::*;

/// Holds thread-bound state: an `Rc` (not `Send`), so it can only be made on its thread.
struct Local {
    rank: usize,
    size: usize,
    /// The thread that made it; every step checks it still runs there.
    thread: String,
    history: Rc<RefCell<Vec<f32>>>,
}

impl Local {
    fn new(rank: usize, size: usize) -> Self {
        Self {
            rank,
            size,
            thread: current_thread(),
            history: Rc::new(RefCell::new(Vec::new())),
        }
    }
}

fn current_thread() -> String {
    std::thread::current().name().unwrap_or("").to_string()
}

#[actor]
impl Local {
    fn grad(&mut self, x: &f32) -> Result<Tensor<f32>, String> {
        if current_thread() != self.thread {
            return Err(format!(
                "moved from {} to {}",
                self.thread,
                current_thread()
            ));
        }
        self.history.borrow_mut().push(*x);
        let n = self.history.borrow().len() as f32;
        Ok(Tensor::full([3], self.rank as f32 + n * x))
    }

    fn shape(&mut self) -> (usize, usize) {
        (self.rank, self.size)
    }
}

graph! {
    Sum(locals: [Local], x: f32) {
        let g = locals.grad(x);
        let s = locals.shape();
        (allreduce(g), s)
    }
}

graph! {
    Pair(locals: [Local; 2], x: f32) {
        let g = locals.grad(x);
        allreduce(g)
    }
}

#[test]
fn actors_made_on_their_threads_need_not_be_send() {
    let made = Actors::each(3, Local::new);
    let mut g = Sum::launch_actors(made, Cpu, LaunchOptions::default()).unwrap();
    for step in 1..=3 {
        let out = g.execute(2.0).unwrap();
        for (rank, (sum, shape)) in out.into_iter().enumerate() {
            // ranks 0 + 1 + 2, plus 3 times step * 2
            let want = 3.0 + 3.0 * step as f32 * 2.0;
            assert_eq!(sum.to_vec(), vec![want; 3], "step {step}");
            assert_eq!(shape, (rank, 3));
        }
    }
    // Not `Send`: `teardown` cannot hand them back (a compile error, see tests/ui); dropping
    // the graph drops them on their threads.
    drop(g);
}

#[test]
fn the_maker_runs_on_the_actors_thread_with_its_rank() {
    let made = Actors::try_each(2, |rank, size| {
        let thread = current_thread();
        if thread == format!("actorgraph-locals-{rank}") {
            Ok(Local::new(rank, size))
        } else {
            Err(format!("rank {rank} made on thread {thread:?}"))
        }
    });
    let mut g = Pair::launch_actors(made, Cpu, LaunchOptions::default()).unwrap();
    let out = g.execute(1.0).unwrap();
    assert_eq!(out[1].to_vec(), vec![3.0; 3]);
}

#[test]
fn a_failing_maker_fails_launch_with_the_lowest_rank() {
    let made = Actors::try_each(4, |rank, size| {
        if rank % 2 == 1 {
            Err(format!("no device for rank {rank}"))
        } else {
            Ok(Local::new(rank, size))
        }
    });
    match Sum::launch_actors(made, Cpu, LaunchOptions::default()) {
        Err(Error::ActorInit {
            group: "locals",
            rank: 1,
            source,
        }) => assert_eq!(source.to_string(), "no device for rank 1"),
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a failed maker must fail launch"),
    }
}

#[test]
fn a_panicking_maker_fails_launch() {
    let made = Actors::each(2, |rank, size| {
        assert!(rank == 0, "rank {rank} cannot start");
        Local::new(rank, size)
    });
    match Pair::launch_actors(made, Cpu, LaunchOptions::default()) {
        Err(e @ Error::ActorInit { rank: 1, .. }) => {
            assert!(e.to_string().contains("rank 1 cannot start"), "{e}")
        }
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a panicking maker must fail launch"),
    }
}

#[test]
fn a_fixed_size_group_checks_its_size() {
    let made = Actors::each(3, Local::new);
    match Pair::launch_actors(made, Cpu, LaunchOptions::default()) {
        Err(Error::GroupSize {
            group: "locals",
            expected: 2,
            got: 3,
        }) => {}
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a fixed-size group must refuse another size"),
    }
}

struct Counter {
    n: u64,
}

#[actor]
impl Counter {
    fn bump(&mut self) -> u64 {
        self.n += 1;
        self.n
    }
}

graph! {
    Bump(counters: [Counter]) {
        let n = counters.bump();
        allreduce(n)
    }
}

graph! {
    BumpPair(counters: [Counter; 2]) {
        let n = counters.bump();
        allreduce(n)
    }
}

#[test]
fn teardown_hands_a_fixed_size_group_back_as_the_array_launch_took() {
    let mut g = BumpPair::launch([Counter { n: 0 }, Counter { n: 10 }], Cpu).unwrap();
    assert_eq!(g.execute().unwrap(), vec![12, 12]);
    let counters: [Counter; 2] = g.teardown().unwrap();
    assert_eq!(counters.map(|c| c.n), [1, 11]);
}

#[test]
fn a_process_that_hosts_part_of_a_fixed_size_group_cannot_fill_its_array() {
    // What `teardown` meets in a graph over several processes; `teardown_each` is the way.
    let part = actorgraph::__private::fixed_group::<u8, 3>("counters", vec![1, 2]);
    match part {
        Err(Error::Unsupported(why)) => assert!(why.contains("teardown_each"), "{why}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn send_actors_made_on_their_threads_come_back_at_teardown() {
    let made = Actors::each(2, |rank, _| Counter {
        n: 10 * rank as u64,
    });
    let mut g = Bump::launch_actors(made, Cpu, LaunchOptions::default()).unwrap();
    assert_eq!(g.execute().unwrap(), vec![12, 12]);
    let back: Vec<Counter> = g.teardown().unwrap();
    assert_eq!(back.iter().map(|c| c.n).collect::<Vec<_>>(), vec![1, 11]);
    // Ready values still work as before, from a `Vec` or collected into `Actors`.
    let ready: Actors<Counter> = back.into_iter().collect();
    let mut g = Bump::launch_actors(ready, Cpu, LaunchOptions::default()).unwrap();
    assert_eq!(g.execute().unwrap(), vec![14, 14]);
}

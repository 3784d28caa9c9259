//! `each_<group>` and `try_each_<group>`: a closure on every actor between executions, on
//! the actor's own thread, its values by rank, its failures as typed errors.

use std::rc::Rc;

use actorgraph::prelude::*;

/// A running sum scaled by a factor that `each` changes between executions.
struct Acc {
    total: f64,
    scale: f64,
}

impl Acc {
    fn new() -> Self {
        Acc {
            total: 0.0,
            scale: 1.0,
        }
    }
}

#[actor]
impl Acc {
    fn add(&mut self, x: &f64) -> f64 {
        self.total += x * self.scale;
        self.total
    }
}

graph! {
    Sums(workers: [Acc], x: f64) {
        workers.add(x)
    }
}

graph! {
    Pair(workers: [Acc; 2], x: f64) {
        workers.add(x)
    }
}

/// The name of the thread the caller runs on.
fn thread_name() -> String {
    std::thread::current().name().unwrap_or("").to_string()
}

#[test]
fn each_returns_every_ranks_value_in_rank_order_from_its_own_thread() {
    let mut g = Sums::launch((0..4).map(|_| Acc::new()).collect::<Vec<_>>(), Cpu).unwrap();
    g.execute(1.0).unwrap();
    let seen = g
        .each_workers(|ctx, w| (ctx.rank(), ctx.size(), ctx.group(), w.total, thread_name()))
        .unwrap();
    let expected: Vec<_> = (0..4)
        .map(|r| (r, 4, "workers", 1.0, format!("actorgraph-workers-{r}")))
        .collect();
    assert_eq!(seen, expected);
    // `Ctx::current` is the actor's there too, as in a method.
    let current = g
        .each_workers(|_, _| Ctx::current().map(|c| c.rank()))
        .unwrap();
    assert_eq!(current, [Some(0), Some(1), Some(2), Some(3)]);
}

#[test]
fn what_each_changes_the_next_execution_sees() {
    let mut g = Sums::launch(vec![Acc::new(), Acc::new()], Cpu).unwrap();
    assert_eq!(g.execute(1.0).unwrap(), [1.0, 1.0]);
    g.each_workers(|ctx, w| w.scale = 10.0 * (ctx.rank() + 1) as f64)
        .unwrap();
    assert_eq!(g.execute(1.0).unwrap(), [11.0, 21.0]);
    let workers = g.teardown().unwrap();
    assert_eq!(workers[1].scale, 20.0);
}

#[test]
fn actors_made_on_their_threads_are_visited_there() {
    struct Local {
        // Not `Send`: the actor never leaves its thread, `each` included.
        seen: Rc<std::cell::Cell<u32>>,
    }
    #[actor]
    impl Local {
        fn count(&mut self) -> u32 {
            self.seen.set(self.seen.get() + 1);
            self.seen.get()
        }
    }
    graph! {
        Counts(locals: [Local]) {
            locals.count()
        }
    }
    let locals = Actors::each(3, |_, _| Local {
        seen: Rc::new(std::cell::Cell::new(0)),
    });
    let mut g = Counts::launch_actors(locals, Cpu, LaunchOptions::default()).unwrap();
    g.execute().unwrap();
    let names = g
        .each_locals(|ctx, l| {
            l.seen.set(l.seen.get() + 10 * ctx.rank() as u32);
            thread_name()
        })
        .unwrap();
    assert_eq!(
        names,
        [
            "actorgraph-locals-0",
            "actorgraph-locals-1",
            "actorgraph-locals-2"
        ]
    );
    assert_eq!(g.execute().unwrap(), [2, 12, 22]);
}

#[test]
fn a_closures_err_names_its_rank_and_leaves_the_graph_usable() {
    let mut g = Sums::launch((0..3).map(|_| Acc::new()).collect::<Vec<_>>(), Cpu).unwrap();
    let result = g.try_each_workers(|ctx, w| {
        if ctx.rank() >= 1 {
            Err(format!("no checkpoint for rank {}", ctx.rank()))
        } else {
            w.scale = 2.0;
            Ok(ctx.rank())
        }
    });
    match result {
        Err(Error::Method {
            group: "workers",
            rank: 1,
            method: "each",
            source,
        }) => assert_eq!(source.to_string(), "no checkpoint for rank 1"),
        other => panic!("expected rank 1's error, got {other:?}"),
    }
    // Rank 0 ran its part; the others' actors are unchanged and none is poisoned.
    assert_eq!(g.execute(1.0).unwrap(), [2.0, 1.0, 1.0]);
    let ok = g.try_each_workers(|ctx, _| Ok::<_, std::io::Error>(ctx.rank()));
    assert_eq!(ok.unwrap(), [0, 1, 2]);
}

#[test]
fn a_closures_panic_poisons_its_actor_as_a_methods_panic_does() {
    let mut g = Sums::launch((0..3).map(|_| Acc::new()).collect::<Vec<_>>(), Cpu).unwrap();
    let result = g.each_workers(|ctx, _| {
        if ctx.rank() == 2 {
            panic!("checkpoint torn");
        }
    });
    match result {
        Err(Error::Panic {
            group: "workers",
            rank: 2,
            method: Some("each"),
            message,
        }) => assert_eq!(message, "checkpoint torn"),
        other => panic!("expected rank 2's panic, got {other:?}"),
    }
    // Rank 2 is poisoned from now on, for executions and for `each`; the others are not.
    assert!(matches!(
        g.execute(1.0),
        Err(Error::Poisoned {
            group: "workers",
            rank: 2,
            ..
        })
    ));
    assert!(matches!(
        g.each_workers(|_, w| w.total),
        Err(Error::Poisoned { rank: 2, .. })
    ));
    let torn = g.teardown_each();
    assert!(torn[0].is_ok() && torn[1].is_ok());
    assert!(matches!(torn[2], Err(Error::Poisoned { rank: 2, .. })));
}

#[test]
fn a_fixed_size_group_is_visited_too() {
    let mut g = Pair::launch([Acc::new(), Acc::new()], Cpu).unwrap();
    let ranks = g.each_workers(|ctx, w| {
        w.scale = 3.0;
        ctx.rank()
    });
    assert_eq!(ranks.unwrap(), [0, 1]);
    assert_eq!(g.execute(2.0).unwrap(), [6.0, 6.0]);
}

#[test]
fn each_group_of_a_graph_has_its_own_call_with_its_own_actor_type() {
    struct Critic {
        weight: f64,
    }
    #[actor]
    impl Critic {
        fn score(&mut self, x: &f64) -> f64 {
            self.weight * x
        }
    }
    graph! {
        Two(workers: [Acc], critics: [Critic], x: f64) {
            let t = workers.add(x);
            let s = critics.score(x);
            (t, s)
        }
    }
    let critics: Vec<_> = (0..2).map(|_| Critic { weight: 1.0 }).collect();
    let mut g = Two::launch(vec![Acc::new(), Acc::new()], critics, Cpu).unwrap();
    let weights = g
        .each_critics(|ctx, c: &mut Critic| {
            c.weight = 0.5 + ctx.rank() as f64;
            c.weight
        })
        .unwrap();
    assert_eq!(weights, [0.5, 1.5]);
    let totals = g.each_workers(|_, w: &mut Acc| w.total).unwrap();
    assert_eq!(totals, [0.0, 0.0]);
    assert_eq!(g.execute(2.0).unwrap(), [(2.0, 1.0), (2.0, 3.0)]);
}

#[test]
fn each_waits_for_the_executions_in_flight_and_keeps_their_results() {
    let workers: Vec<_> = (0..2).map(|_| Acc::new()).collect();
    let mut g = Sums::launch_with(workers, Cpu, LaunchOptions::default().max_in_flight(2)).unwrap();
    let first = g.submit(1.0).unwrap();
    let second = g.submit(2.0).unwrap();
    // Runs after both: it sees their sum, and they did not see its scale.
    let totals = g
        .each_workers(|_, w| {
            w.scale = 100.0;
            w.total
        })
        .unwrap();
    assert_eq!(totals, [3.0, 3.0]);
    assert_eq!(g.in_flight(), 2, "both results wait for their tickets");
    assert_eq!(g.wait(second).unwrap(), [3.0, 3.0]);
    assert_eq!(g.wait(first).unwrap(), [1.0, 1.0]);
    assert_eq!(g.execute(1.0).unwrap(), [103.0, 103.0]);
}

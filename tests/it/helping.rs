//! Where steps run: the thread that calls `execute` runs the first actor's step itself
//! when the actors may change threads (ready values on `Cpu`) and nothing else is in
//! flight; every other step runs on its actor's own thread, or on the caller's when no
//! thread has started it and the threads outnumber the cores (and for `execute_async`,
//! only with `LaunchOptions::poll_runs_steps`).

use actorgraph::prelude::*;

/// Reports the thread each step runs on, and how many steps it ran.
struct Where {
    steps: usize,
}

fn current_thread() -> String {
    std::thread::current().name().unwrap_or("").to_string()
}

#[actor]
impl Where {
    fn thread(&mut self) -> (String, usize) {
        self.steps += 1;
        (current_thread(), self.steps)
    }
}

graph! {
    Threads(ws: [Where]) {
        ws.thread()
    }
}

/// Reports the thread each step runs on, and the step count of the actor it heard from.
struct Next {
    steps: usize,
}

#[actor]
impl Next {
    fn after(&mut self, prev: &(String, usize)) -> (String, usize, usize) {
        self.steps += 1;
        (current_thread(), self.steps, prev.1)
    }
}

graph! {
    /// Each `ws` actor hands its report to the `next` actor of its rank.
    Chained(ws: [Where], next: [Next]) {
        let a = ws.thread();
        next.after(a)
    }
}

fn own(rank: usize) -> String {
    format!("actorgraph-ws-{rank}")
}

#[test]
fn execute_runs_the_first_ready_actor_on_the_calling_thread() {
    let me = current_thread();
    let mut g = Threads::launch(vec![Where { steps: 0 }, Where { steps: 0 }], Cpu).unwrap();
    for step in 1..=3 {
        let out = g.execute().unwrap();
        assert_eq!(out[0], (me.clone(), step));
        // Rank 1 runs on its own thread, or on the caller's if that thread had not started
        // it when the caller looked, with the threads outnumbering the cores (2 here).
        assert_eq!(out[1].1, step);
        assert!(out[1].0 == own(1) || out[1].0 == me, "{out:?}");
    }
    // With a timeout the caller must stay free to give up: every step on its own thread.
    assert_eq!(
        g.execute_timeout(std::time::Duration::from_secs(60))
            .unwrap(),
        vec![(own(0), 4), (own(1), 4)]
    );
    // The state is the same actor's, whichever thread ran it, and teardown hands it back.
    assert_eq!(g.execute().unwrap()[0], (me, 5));
    let actors = g.teardown().unwrap();
    assert_eq!(actors.iter().map(|a| a.steps).collect::<Vec<_>>(), [5, 5]);
}

#[test]
fn submitted_and_async_executions_run_on_the_actors_threads() {
    let options = LaunchOptions::default().max_in_flight(2);
    let mut g =
        Threads::launch_with(vec![Where { steps: 0 }, Where { steps: 0 }], Cpu, options).unwrap();
    let first = g.submit().unwrap();
    // Another execution is in flight: the caller does not run this one.
    let second = g.submit().unwrap();
    assert_eq!(g.wait(first).unwrap(), vec![(own(0), 1), (own(1), 1)]);
    assert_eq!(g.wait(second).unwrap(), vec![(own(0), 2), (own(1), 2)]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    assert_eq!(
        rt.block_on(g.execute_async()).unwrap(),
        vec![(own(0), 3), (own(1), 3)]
    );
    assert_eq!(g.execute().unwrap()[0], (current_thread(), 4));
}

#[test]
fn actors_made_on_their_threads_stay_there() {
    let made = Actors::each(2, |_, _| Where { steps: 0 });
    let mut g = Threads::launch_actors(made, Cpu, LaunchOptions::default()).unwrap();
    assert_eq!(g.execute().unwrap(), vec![(own(0), 1), (own(1), 1)]);
}

/// With `poll_runs_steps`, an async execution's poll may run steps that no actor thread has
/// started, on the executor's thread: each step still runs once, in order, on the same
/// actor, whichever thread runs it. More actors than cores, so that the poll may run some.
#[test]
fn a_poll_that_runs_steps_runs_each_once_in_order() {
    let n = std::thread::available_parallelism().map_or(2, |c| c.get()) + 1;
    let options = LaunchOptions::default()
        .max_in_flight(2)
        .poll_runs_steps(true);
    let mut g =
        Threads::launch_with((0..n).map(|_| Where { steps: 0 }).collect(), Cpu, options).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let me = current_thread();
    let mut on_caller = 0;
    let mut check = |out: Vec<(String, usize)>, step: usize, may_help: bool| {
        for (rank, (thread, steps)) in out.into_iter().enumerate() {
            assert_eq!(steps, step, "rank {rank} ran a step twice or skipped one");
            let helped = may_help && thread == me;
            assert!(
                thread == own(rank) || helped,
                "rank {rank}'s step ran on {thread}"
            );
            on_caller += usize::from(helped);
        }
    };
    for step in 1..=50 {
        check(rt.block_on(g.execute_async()).unwrap(), step, true);
    }
    // Two executions in flight: the poll of the first runs none of their steps.
    let (first, second) = (g.submit().unwrap(), g.submit().unwrap());
    check(rt.block_on(g.wait_async(first)).unwrap(), 51, false);
    check(rt.block_on(g.wait_async(second)).unwrap(), 52, true);
    println!("{on_caller} steps of {n} actors ran on the executor's thread");
    let actors = g.teardown().unwrap();
    assert!(actors.iter().all(|a| a.steps == 52));
}

/// In a graph of two groups joined by edges, the caller may run, as it collects each
/// group, the steps that no thread has started, in either group (more actors than cores):
/// each still runs once, in order, and gets its value over the edge.
#[test]
fn the_caller_runs_steps_of_every_group_once_in_order() {
    let n = std::thread::available_parallelism().map_or(2, |c| c.get());
    let mut g = Chained::launch(
        (0..n).map(|_| Where { steps: 0 }).collect(),
        (0..n).map(|_| Next { steps: 0 }).collect(),
        Cpu,
    )
    .unwrap();
    let me = current_thread();
    let mut on_caller = 0;
    for step in 1..=100 {
        for (rank, (thread, steps, heard)) in g.execute().unwrap().into_iter().enumerate() {
            assert_eq!((steps, heard), (step, step), "rank {rank}");
            let own = format!("actorgraph-next-{rank}");
            assert!(
                thread == own || thread == me,
                "rank {rank}'s step ran on {thread}"
            );
            on_caller += usize::from(thread == me);
        }
    }
    println!("{on_caller} steps of the second group ran on the caller's thread");
    let (ws, next) = g.teardown().unwrap();
    assert!(ws.iter().all(|a| a.steps == 100) && next.iter().all(|a| a.steps == 100));
}

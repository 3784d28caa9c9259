//! The failure model and async executions across processes: each test starts `mpirun`
//! over this test binary itself, under the launcher's watchdog (`tests/support/mpirun.rs`),
//! and every process runs one scenario of `worker` and checks what it sees; the test
//! passes when every process does.
//!
//! - `timeout`: a rank of another process is late; every process's `execute_timeout`
//!   returns `Timeout` naming it (a global rank) and the ranks that waited for it; the
//!   group is broken after it (`Broken`) and teardown hands every actor back.
//! - `after`: a method error, and a panic, after the group's last stage (and in a group
//!   with no stage at all), on a rank of one process: the same error on every process.
//! - `async`: `execute_async` from a current-thread tokio runtime, and `submit`/`wait`
//!   with `max_in_flight(4)`, with a failure among the executions in flight.
//!
//! Needs OpenMPI's `mpirun` (`.ci/run` installs it). Runs as root too.
#![cfg(feature = "mpi")]

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use actorgraph::mpi::Mpi;
use actorgraph::prelude::*;
use actorgraph::BoxError;

#[path = "support/mpirun.rs"]
mod mpirun;

use mpirun::{passes, SHM, TCP};

#[test]
fn a_timeout_names_the_late_rank_of_another_process_on_every_process() {
    passes("timeout", &[1, 1], SHM);
    passes("timeout", &[1, 2, 1], SHM);
    passes("timeout", &[1, 2, 1], TCP);
}

#[test]
fn a_failure_after_the_last_stage_reaches_every_process() {
    passes("after", &[1, 1], SHM);
    passes("after", &[1, 2, 1], SHM);
    passes("after", &[1, 2, 1], TCP);
}

#[test]
fn async_and_pipelined_executions_across_processes() {
    passes("async", &[1, 1], SHM);
    passes("async", &[1, 2, 1], SHM);
    passes("async", &[1, 1], TCP);
    passes("async", &[1, 2, 1], TCP);
}

// ---------------------------------------------------------------------------------------
// The worker: what every process of a run does.

#[test]
fn worker() {
    let Some((scenario, layout)) = mpirun::scenario() else {
        return; // run by `mpirun` only
    };
    let mpi = Mpi::init().unwrap();
    assert_eq!(mpi.processes(), layout.len());
    let process = mpi.process();
    let first: usize = layout[..process].iter().sum();
    let size: usize = layout.iter().sum();
    let here = first..first + layout[process];
    match scenario.as_str() {
        "timeout" => timeout(&mpi, here, &layout),
        "after" => after(&mpi, here, size),
        "async" => run_async(&mpi, here, size),
        other => panic!("no scenario {other}"),
    }
    println!("process {process}: scenario done");
}

/// Opened by this process's driver once its `execute_timeout` has returned: the late rank
/// waits for it, so it is late for as long as the test needs, with no sleep.
static GATE: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

fn open_gate() {
    *GATE.0.lock().unwrap() = true;
    GATE.1.notify_all();
}

fn wait_for_gate() {
    let mut open = GATE.0.lock().unwrap();
    while !*open {
        open = GATE.1.wait(open).unwrap();
    }
}

/// A worker that fails, or is late, on request.
struct W {
    rank: usize,
}

#[derive(Clone, Copy)]
enum Trouble {
    None,
    /// The rank that waits for the gate.
    Late(usize),
    /// The rank whose method returns `Err`.
    Err(usize),
    /// The rank whose method panics.
    Panic(usize),
}

#[actor]
impl W {
    fn make(&mut self, trouble: &Trouble) -> Result<Tensor<f32>, BoxError> {
        if let Trouble::Late(r) = *trouble {
            if r == self.rank {
                wait_for_gate();
            }
        }
        Ok(Tensor::full([4], self.rank as f32))
    }

    /// A method after the stage: checks the sum, and fails on request.
    fn check(&mut self, sum: &Tensor<f32>, trouble: &Trouble) -> Result<f32, BoxError> {
        let rank = self.rank;
        match *trouble {
            Trouble::Err(r) if r == rank => Err(format!("rank {rank} refused").into()),
            Trouble::Panic(r) if r == rank => panic!("rank {rank} gave up"),
            _ => Ok(sum.to_vec()[0]),
        }
    }

    fn alone(&mut self, trouble: &Trouble) -> Result<usize, BoxError> {
        match *trouble {
            Trouble::Err(r) if r == self.rank => Err(format!("rank {r} refused").into()),
            _ => Ok(self.rank),
        }
    }
}

graph! {
    Sum(workers: [W], trouble: Trouble) {
        allreduce(workers.make(trouble), Sum)
    }
}

graph! {
    Checked(workers: [W], trouble: Trouble) {
        let sum = allreduce(workers.make(trouble), Sum);
        workers.check(sum, trouble)
    }
}

graph! {
    NoStage(workers: [W], trouble: Trouble) {
        workers.alone(trouble)
    }
}

fn workers(here: &std::ops::Range<usize>) -> Vec<W> {
    here.clone().map(|rank| W { rank }).collect()
}

fn total(size: usize) -> f32 {
    (0..size).map(|q| q as f32).sum()
}

fn timeout(mpi: &Mpi, here: std::ops::Range<usize>, layout: &[usize]) {
    let size: usize = layout.iter().sum();
    let mut g = Sum::launch(workers(&here), mpi).unwrap();
    // Long enough for any machine: this one must not time out.
    for t in g
        .execute_timeout(Trouble::None, Duration::from_secs(60))
        .unwrap()
    {
        assert_eq!(t.to_vec(), vec![total(size); 4]);
    }
    // The last rank of process 1 is late: on [1, 1] rank 1, on [1, 2, 1] rank 2.
    let late = layout[0] + layout[1] - 1;
    match g.execute_timeout(Trouble::Late(late), Duration::from_millis(500)) {
        Err(Error::Timeout {
            group: "workers",
            ranks,
            waiting,
            ..
        }) => {
            assert_eq!(ranks, vec![late]);
            let others: Vec<usize> = (0..size).filter(|&q| q != late).collect();
            assert_eq!(waiting, others);
        }
        other => panic!("expected a timeout naming rank {late}, got {other:?}"),
    }
    open_gate();
    // The group is broken on every process: a stage was given up on.
    match g.execute(Trouble::None) {
        Err(Error::Broken {
            group: "workers", ..
        }) => {}
        other => panic!("expected the group broken, got {other:?}"),
    }
    for (rank, actor) in here.zip(g.teardown_each()) {
        assert_eq!(actor.unwrap().rank, rank);
    }
}

fn after(mpi: &Mpi, here: std::ops::Range<usize>, size: usize) {
    let last = size - 1;
    let mut g = Checked::launch(workers(&here), mpi).unwrap();
    let fine = |g: &mut Checked| {
        assert_eq!(
            g.execute(Trouble::None).unwrap(),
            vec![total(size); here.len()]
        );
    };
    fine(&mut g);
    // An error after the last stage, on the last process: every process sees it.
    match g.execute(Trouble::Err(last)) {
        Err(
            e @ Error::Method {
                group: "workers",
                method: "check",
                rank,
                ..
            },
        ) if rank == last => {
            assert!(
                e.to_string().ends_with(&format!("rank {last} refused")),
                "{e}"
            );
        }
        other => panic!("expected the error of rank {last}'s check, got {other:?}"),
    }
    fine(&mut g);
    // A panic there on rank 1: every process sees it, then the actor is poisoned.
    match g.execute(Trouble::Panic(1)) {
        Err(Error::Panic {
            group: "workers",
            rank: 1,
            method: Some("check"),
            message,
        }) => assert!(message.contains("rank 1 gave up"), "{message}"),
        other => panic!("expected rank 1's panic, got {other:?}"),
    }
    match g.execute(Trouble::None) {
        Err(Error::Poisoned {
            group: "workers",
            rank: 1,
            ..
        }) => {}
        other => panic!("expected rank 1 poisoned, got {other:?}"),
    }
    drop(g.teardown_each());

    // A group with no stage at all: its error reaches every process too.
    let mut g = NoStage::launch(workers(&here), mpi).unwrap();
    assert_eq!(
        g.execute(Trouble::None).unwrap(),
        here.clone().collect::<Vec<_>>()
    );
    match g.execute(Trouble::Err(0)) {
        Err(Error::Method {
            group: "workers",
            method: "alone",
            rank: 0,
            ..
        }) => {}
        other => panic!("expected the error of rank 0's alone, got {other:?}"),
    }
    assert_eq!(g.execute(Trouble::None).unwrap(), here.collect::<Vec<_>>());
    g.teardown().unwrap();
}

fn run_async(mpi: &Mpi, here: std::ops::Range<usize>, size: usize) {
    let last = size - 1;
    let sums = vec![total(size); here.len()];
    // `execute_async` from a current-thread runtime: the actors run on their own threads.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut g = Checked::launch(workers(&here), mpi).unwrap();
    for _ in 0..3 {
        assert_eq!(rt.block_on(g.execute_async(Trouble::None)).unwrap(), sums);
    }
    match rt.block_on(g.execute_async(Trouble::Err(last))) {
        Err(Error::Method { rank, .. }) if rank == last => {}
        other => panic!("expected the error of rank {last}, got {other:?}"),
    }
    assert_eq!(rt.block_on(g.execute_async(Trouble::None)).unwrap(), sums);
    g.teardown().unwrap();

    // Four executions in flight, the second of which fails after its stage on the last
    // rank: the others are unaffected, on every process.
    let options = LaunchOptions::default().max_in_flight(4);
    let mut g = Checked::launch_actors(Actors::from(workers(&here)), mpi, options).unwrap();
    for _ in 0..2 {
        let troubles = [
            Trouble::None,
            Trouble::Err(last),
            Trouble::None,
            Trouble::None,
        ];
        let tickets: Vec<Ticket> = troubles.iter().map(|&t| g.submit(t).unwrap()).collect();
        assert_eq!(g.in_flight(), 4);
        for (i, t) in tickets.into_iter().enumerate() {
            match (i, g.wait(t)) {
                (1, Err(Error::Method { rank, .. })) if rank == last => {}
                (1, other) => panic!("expected the error of rank {last}, got {other:?}"),
                (_, got) => assert_eq!(got.unwrap(), sums),
            }
        }
    }
    // Pipelined and async together: an async execution after submissions waits its turn.
    let early = g.submit(Trouble::None).unwrap();
    assert_eq!(rt.block_on(g.execute_async(Trouble::None)).unwrap(), sums);
    assert_eq!(rt.block_on(g.wait_async(early)).unwrap(), sums);
    g.teardown().unwrap();
}

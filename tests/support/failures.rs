//! The failure scenarios across processes that every backend over MPI must pass, shared by
//! `tests/mpi_failures.rs` (the `Mpi` backend) and `tests/nccl_mpi.rs` (NCCL over MPI): a
//! worker that fails or is late on request, its graphs, and what every process checks.
//! Each scenario is generic over the backend: it launches with whatever `backend` the
//! test's worker made. The values are host tensors, which every backend takes.
//!
//! - [`timeout`]: a rank of another process is late; every process's `execute_timeout`
//!   returns `Timeout` naming it (a global rank) and the ranks that waited for it; the
//!   group is broken after it (`Broken`) and teardown hands every actor back.
//! - [`after`]: a method error, and a panic, after the group's last stage (and in a group
//!   with no stage at all), on a rank of one process: the same error on every process.
#![allow(dead_code)] // each test binary uses its own part

use std::ops::Range;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use actorgraph::prelude::*;
use actorgraph::{Backend, BoxError};

use crate::expect;

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
pub struct W {
    pub rank: usize,
}

#[derive(Clone, Copy)]
pub enum Trouble {
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
            Trouble::Panic(r) if r == self.rank => panic!("rank {r} gave up alone"),
            _ => Ok(self.rank),
        }
    }
}

graph! {
    pub Sum(workers: [W], trouble: Trouble) {
        allreduce(workers.make(trouble), Sum)
    }
}

graph! {
    pub Checked(workers: [W], trouble: Trouble) {
        let sum = allreduce(workers.make(trouble), Sum);
        workers.check(sum, trouble)
    }
}

graph! {
    pub NoStage(workers: [W], trouble: Trouble) {
        workers.alone(trouble)
    }
}

/// This process's workers, by global rank.
pub fn workers(here: &Range<usize>) -> Vec<W> {
    here.clone().map(|rank| W { rank }).collect()
}

/// The sum of every rank's value: each rank `q` brings `q`.
pub fn total(size: usize) -> f32 {
    (0..size).map(|q| q as f32).sum()
}

/// The `timeout` scenario (see the module docs) over `layout`, whose second process holds
/// the late rank (its last).
pub fn timeout<B: Backend + Copy>(backend: B, here: Range<usize>, layout: &[usize]) {
    let size: usize = layout.iter().sum();
    let mut g = Sum::launch(workers(&here), backend).unwrap();
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

/// The `after` scenario (see the module docs): the group has `size` ranks, `here` in this
/// process.
pub fn after<B: Backend + Copy>(backend: B, here: Range<usize>, size: usize) {
    let last = size - 1;
    let mut g = Checked::launch(workers(&here), backend).unwrap();
    let fine = |g: &mut Checked| {
        assert_eq!(
            g.execute(Trouble::None).unwrap(),
            vec![total(size); here.len()]
        );
    };
    fine(&mut g);
    // An error after the last stage, on the last process: every process sees it.
    expect::refused(g.execute(Trouble::Err(last)), "check", last);
    fine(&mut g);
    // A panic there on rank 1: every process sees it, then the actor is poisoned.
    expect::panicked(g.execute(Trouble::Panic(1)), "check", 1, "rank 1 gave up");
    expect::poisoned(g.execute(Trouble::None), 1);
    drop(g.teardown_each());

    // A group with no stage at all: its error reaches every process too, and the next
    // execution works.
    let mut g = NoStage::launch(workers(&here), backend).unwrap();
    assert_eq!(
        g.execute(Trouble::None).unwrap(),
        here.clone().collect::<Vec<_>>()
    );
    expect::refused(g.execute(Trouble::Err(0)), "alone", 0);
    assert_eq!(
        g.execute(Trouble::None).unwrap(),
        here.clone().collect::<Vec<_>>()
    );
    g.teardown().unwrap();
    // A panic there, on the last rank: every process sees it.
    let mut g = NoStage::launch(workers(&here), backend).unwrap();
    expect::panicked(
        g.execute(Trouble::Panic(last)),
        "alone",
        last,
        "gave up alone",
    );
    drop(g.teardown_each());
}

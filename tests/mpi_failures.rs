//! The failure model and async executions across processes: each test starts `mpirun`
//! over this test binary itself, under the launcher's watchdog (`tests/support/mpirun.rs`),
//! and every process runs one scenario of `worker` and checks what it sees; the test
//! passes when every process does.
//!
//! - `timeout` and `after`: the scenarios every backend over MPI shares
//!   (`tests/support/failures.rs`), here on the `Mpi` backend.
//! - `async`: `execute_async` from a current-thread tokio runtime, and `submit`/`wait`
//!   with `max_in_flight(4)`, with a failure among the executions in flight.
//! - `late_process`: a timeout while the last process has not started the execution.
//! - `launch_error`: a program whose `main` returns the error of a launch that cannot
//!   work (its graph addresses an actor beyond the group), under `mpirun` and without it.
//!
//! Needs OpenMPI's `mpirun` (`.ci/run` installs it). Runs as root too.
#![cfg(feature = "mpi")]

use actorgraph::mpi::Mpi;
use actorgraph::prelude::*;

#[path = "support/expect.rs"]
mod expect;
#[path = "support/mpirun.rs"]
mod mpirun;

#[path = "support/failures.rs"]
mod failures;
use failures::{after, timeout, total, workers, Checked, Trouble, W};

use mpirun::{alone, mpirun, passes, Run, SHM, TCP};

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
fn a_timeout_names_a_process_that_had_not_started_the_execution() {
    passes("late_process", &[1, 1], SHM);
    passes("late_process", &[1, 1], TCP);
    passes("late_process", &[1, 2, 1], SHM);
}

#[test]
fn async_and_pipelined_executions_across_processes() {
    passes("async", &[1, 1], SHM);
    passes("async", &[1, 2, 1], SHM);
    passes("async", &[1, 1], TCP);
    passes("async", &[1, 2, 1], TCP);
}

#[test]
fn a_failed_launch_prints_its_error_and_ends_mpi_cleanly() {
    // The group has 2 ranks, and the graph needs a fourth: one process hosting both, under
    // `mpirun` and as MPI's singleton, and two processes that each reach the verdict.
    let check = |how: &str, run: Run| {
        let output = &run.output;
        assert!(
            output.contains(LAUNCH_ERROR),
            "{how}: the launch's error is missing:\n{output}"
        );
        // What MPI says when a communicator outlives `MPI_Finalize`.
        assert!(
            !output.contains("MPI_FINALIZE"),
            "{how}: MPI ended before a communicator was freed:\n{output}"
        );
        assert_eq!(run.code, Some(1), "{how}: not a clean failure:\n{output}");
    };
    check("mpirun -np 1", mpirun("launch_error", &[2], SHM));
    check("mpirun -np 2", mpirun("launch_error", &[1, 1], SHM));
    check("without mpirun", alone("launch_error", 2));
}

/// What a `main` that returns the launch's error with `?` prints (its `Debug`).
const LAUNCH_ERROR: &str = r#"Error: IndexOutOfRange { group: "workers", index: 3, size: 2 }"#;

graph! {
    Fourth(workers: [W], trouble: Trouble) {
        workers[3].alone(trouble)
    }
}

/// The `main` of a program whose launch fails after the processes agreed on the layout:
/// the graph addresses `workers[3]`, which `actors` actors in every process lack.
fn launch_beyond(actors: usize) -> Result<(), Error> {
    let mpi = Mpi::init()?;
    let mut g = Fourth::launch(workers(&(0..actors)), &mpi)?;
    g.execute(Trouble::None)?;
    g.teardown()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The worker: what every process of a run does.

#[test]
fn worker() {
    let Some((scenario, layout)) = mpirun::scenario() else {
        return; // run by `mpirun` only
    };
    if scenario == "launch_error" {
        // As a `main` returning `Result` does: the error outlives every local of `main`
        // (MPI ends with the last of them), then it is printed and the process exits
        // with status 1.
        // Every layout of this scenario gives each process as many actors.
        if let Err(e) = launch_beyond(layout[0]) {
            // One `write` for the whole line: `eprintln!` writes each piece of the format
            // on its own, and two processes' pieces interleave in `mpirun`'s output.
            let line = format!("Error: {e:?}\n");
            std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes()).unwrap();
            std::process::exit(1);
        }
        panic!("a launch that needs more actors than the group has succeeded");
    }
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
        "late_process" => late_process(&mpi, here, &layout),
        other => panic!("no scenario {other}"),
    }
    println!("process {process}: scenario done");
}

/// The last process calls `execute_timeout` only once every other process's has returned
/// (a barrier of the test's own on `MPI_COMM_WORLD` orders them), all with one timeout.
/// The others time out waiting for it in the stage, and name its ranks, on every one of
/// them. It finds their part of that stage posted and returns the outputs, which the
/// reference's "Failures across processes" says; its next execution fails, as theirs do.
fn late_process(mpi: &Mpi, here: std::ops::Range<usize>, layout: &[usize]) {
    use actorgraph::mpi::rsmpi::topology::SimpleCommunicator;
    use actorgraph::mpi::rsmpi::traits::*;
    let size: usize = layout.iter().sum();
    let last = layout.len() - 1;
    let late: Vec<usize> = (size - layout[last]..size).collect();
    let on_time: Vec<usize> = (0..size - layout[last]).collect();
    let mut g = failures::Sum::launch(workers(&here), mpi).unwrap();
    let timeout = std::time::Duration::from_millis(500);
    let world = SimpleCommunicator::world();
    if mpi.process() == last {
        world.barrier();
        let sums = g.execute_timeout(Trouble::None, timeout).unwrap();
        for t in sums {
            assert_eq!(t.to_vec(), vec![total(size); 4]);
        }
        // The others never come to this stage.
        match g.execute_timeout(Trouble::None, timeout) {
            Err(Error::Timeout { .. }) => {}
            other => panic!("expected a timeout, got {other:?}"),
        }
    } else {
        match g.execute_timeout(Trouble::None, timeout) {
            Err(Error::Timeout {
                group: "workers",
                ranks,
                waiting,
                ..
            }) => {
                assert_eq!(ranks, late, "the late ranks");
                assert_eq!(waiting, on_time, "the ranks that waited");
            }
            other => panic!("expected a timeout naming ranks {late:?}, got {other:?}"),
        }
        world.barrier();
        match g.execute(Trouble::None) {
            Err(Error::Broken {
                group: "workers", ..
            }) => {}
            other => panic!("expected the group broken, got {other:?}"),
        }
    }
    for (rank, actor) in here.zip(g.teardown_each()) {
        assert_eq!(actor.unwrap().rank, rank);
    }
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

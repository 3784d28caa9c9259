//! Threads against cores: each actor's share of the process's cores reaches its methods
//! (`Ctx::compute_threads`), counting every group's actors; `LaunchOptions` overrides it
//! and pins actor threads. (That a launch from a single-threaded process sets the compute
//! libraries' variables is `tests/threads_env.rs`: this harness has threads of its own.)

use actorgraph::prelude::*;
use actorgraph::threads;

#[derive(Default)]
struct Worker {
    /// The cores its thread could run on when it was made there, if it was.
    made_on_cores: Option<usize>,
}
struct Coord;

#[actor]
impl Worker {
    /// The threads the actor may use, and the cores its thread may run on.
    fn threads(&mut self) -> (usize, usize) {
        let ctx = Ctx::current().expect("on an actor thread");
        (ctx.compute_threads(), threads::cores())
    }
    fn made_on_cores(&mut self) -> Option<usize> {
        self.made_on_cores
    }
}

#[actor]
impl Coord {
    fn threads(&mut self) -> usize {
        Ctx::current()
            .expect("on an actor thread")
            .compute_threads()
    }
}

graph! {
    One(workers: [Worker]) {
        workers.threads()
    }
}

graph! {
    Made(workers: [Worker]) {
        workers.made_on_cores()
    }
}

graph! {
    Two(workers: [Worker], coord: [Coord; 1]) {
        let w = workers.threads();
        let c = coord.threads();
        (w, c)
    }
}

#[test]
fn the_cores_are_divided_among_every_groups_actors() -> Result<(), Error> {
    let mut g = Two::launch(vec![Worker::default()], [Coord], Cpu)?;
    let share = threads::per_actor(2);
    let seen: Vec<(usize, usize)> = g.execute()?.iter().map(|(w, c)| (w.0, *c)).collect();
    assert_eq!(seen, vec![(share, share)]);
    Ok(())
}

#[test]
fn one_actor_may_use_every_core() -> Result<(), Error> {
    let mut g = One::launch(vec![Worker::default()], Cpu)?;
    assert_eq!(g.execute()?[0].0, threads::cores());
    Ok(())
}

#[test]
fn the_launch_option_overrides_the_share() -> Result<(), Error> {
    let options = LaunchOptions::default().compute_threads(5);
    let mut g = One::launch_with(vec![Worker::default(), Worker::default()], Cpu, options)?;
    assert_eq!(g.execute()?, vec![(5, threads::cores()); 2]);
    Ok(())
}

#[test]
fn a_launch_from_a_threaded_process_leaves_the_environment_alone() -> Result<(), Error> {
    let before: Vec<_> = threads::THREAD_VARS.map(std::env::var_os).into();
    let _g = One::launch(vec![Worker::default(), Worker::default()], Cpu)?;
    let after: Vec<_> = threads::THREAD_VARS.map(std::env::var_os).into();
    assert_eq!(before, after);
    Ok(())
}

#[cfg(target_os = "linux")]
#[test]
fn pinned_actor_threads_run_on_as_many_cores_as_they_may_use() -> Result<(), Error> {
    let options = LaunchOptions::default()
        .compute_threads(1)
        .pin_threads(true);
    // Made on their own threads, after the pin: a step may also run on the caller's.
    let workers = Actors::each(3, |_, _| Worker {
        made_on_cores: Some(threads::cores()),
    });
    let mut g = Made::launch_actors(workers, Cpu, options)?;
    assert_eq!(g.execute()?, vec![Some(1); 3]);
    Ok(())
}

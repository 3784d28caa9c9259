//! The rank context (`Ctx::current`): every actor of every group sees its own rank, its
//! group's size and name, and every group's size, in methods and in constructors run on
//! its thread, on every execution; other threads see none.

use actorgraph::prelude::*;

struct Worker {
    /// The context seen by the constructor, when it ran on the actor's thread.
    made_on: Option<Ctx>,
}

struct Coord;

#[actor]
impl Worker {
    fn whoami(&mut self, step: &u32) -> (usize, usize, String, u32) {
        let ctx = Ctx::current().expect("on an actor thread");
        (ctx.rank(), ctx.size(), ctx.group().to_string(), *step)
    }
    fn made_on(&mut self) -> Option<Ctx> {
        self.made_on
    }
    fn sizes(&mut self) -> [Option<usize>; 3] {
        let ctx = Ctx::current().expect("on an actor thread");
        ["workers", "coord", "nobody"].map(|group| ctx.group_size(group))
    }
}

#[actor]
impl Coord {
    fn whoami(&mut self) -> (usize, usize, String) {
        let ctx = Ctx::current().expect("on an actor thread");
        (ctx.rank(), ctx.size(), ctx.group().to_string())
    }
    fn sizes(&mut self) -> [Option<usize>; 3] {
        let ctx = Ctx::current().expect("on an actor thread");
        ["workers", "coord", "nobody"].map(|group| ctx.group_size(group))
    }
}

graph! {
    Two(workers: [Worker], coord: [Coord; 1], step: u32) {
        let w = workers.whoami(step);
        let c = coord.whoami();
        (w, c)
    }
}

graph! {
    Sizes(workers: [Worker], coord: [Coord; 1]) {
        let w = workers.sizes();
        let c = coord.sizes();
        (w, c[0])
    }
}

graph! {
    Made(workers: [Worker]) {
        workers.made_on()
    }
}

#[test]
fn every_rank_of_every_group_sees_its_own_context_on_every_execution() {
    let workers = (0..3).map(|_| Worker { made_on: None }).collect();
    // Groups of different sizes zipped into one output: checked at launch.
    assert!(matches!(
        Two::launch(workers, [Coord], Cpu),
        Err(Error::GroupSizeMismatch { .. })
    ));
    let workers = (0..1).map(|_| Worker { made_on: None }).collect();
    let mut g = Two::launch(workers, [Coord], Cpu).unwrap();
    for step in 0..3 {
        let out = g.execute(step).unwrap();
        assert_eq!(
            out,
            vec![(
                (0, 1, "workers".to_string(), step),
                (0, 1, "coord".to_string())
            )]
        );
    }
    g.teardown().unwrap();
}

#[test]
fn every_actor_sees_the_size_of_every_group() {
    let workers = (0..3).map(|_| Worker { made_on: None }).collect();
    let mut g = Sizes::launch(workers, [Coord], Cpu).unwrap();
    let sizes = [Some(3), Some(1), None];
    let out = g.execute().unwrap();
    assert_eq!(out.len(), 3);
    for (rank, (w, c)) in out.into_iter().enumerate() {
        assert_eq!(w, sizes);
        assert_eq!(c, (rank == 0).then_some(sizes));
    }
    g.teardown().unwrap();
}

#[test]
fn the_context_is_there_in_constructors_and_absent_elsewhere() {
    assert_eq!(Ctx::current(), None);
    let actors = Actors::each(4, |_rank, _size| Worker {
        made_on: Ctx::current(),
    });
    let mut g = Made::launch_actors(actors, Cpu, LaunchOptions::default()).unwrap();
    for _ in 0..2 {
        let out = g.execute().unwrap();
        for (rank, ctx) in out.iter().enumerate() {
            let ctx = ctx.expect("made on its thread");
            assert_eq!((ctx.rank(), ctx.size(), ctx.group()), (rank, 4, "workers"));
        }
    }
    g.teardown().unwrap();
    // The driver's thread is no actor's.
    assert_eq!(Ctx::current(), None);
}

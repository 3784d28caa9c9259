//! Edges across processes: values that go from an actor of one process to an actor of
//! another over MPI point-to-point. Each test starts `mpirun` over this test binary itself
//! (see `tests/support/mpirun.rs`), under a watchdog; every process checks what its own
//! actors received against what each producing rank must have sent, and fails otherwise.
//!
//! The graph has two groups: `workers`, hosted as `ACTORGRAPH_MPI_LAYOUT` says (`1,2,1`:
//! one actor on process 0, two on process 1, one on process 2), and `heads`, hosted by
//! the same layout rotated by one process (`2,1,1`), so that a per-actor value of
//! `workers` read by `heads` (rank i to rank i) crosses processes for some ranks and stays
//! in its process for others.
//!
//! Needs OpenMPI's `mpirun` (`.ci/run` installs it) and features `mpi` and `serde`.
#![cfg(all(feature = "mpi", feature = "serde"))]

use actorgraph::mpi::Mpi;
use actorgraph::prelude::*;
use actorgraph::{BoxError, Element, Error};
use serde::{Deserialize, Serialize};

#[path = "support/mpirun.rs"]
mod mpirun;

use mpirun::{passes, SHM, TCP};

#[test]
fn values_cross_2_processes_of_1_actor_over_shared_memory() {
    passes("edges", &[1, 1], SHM);
}

#[test]
fn values_cross_2_processes_of_1_actor_over_tcp() {
    passes("edges", &[1, 1], TCP);
}

#[test]
fn values_cross_3_processes_of_1_2_1_actors_over_shared_memory() {
    passes("edges", &[1, 2, 1], SHM);
}

#[test]
fn values_cross_3_processes_of_1_2_1_actors_over_tcp() {
    passes("edges", &[1, 2, 1], TCP);
}

#[test]
fn a_type_that_cannot_travel_is_refused_at_launch_on_every_process() {
    passes("cannot", &[1, 1], SHM);
    passes("cannot", &[1, 2, 1], TCP);
}

#[test]
fn a_value_that_fails_to_cross_is_the_same_travel_error_on_every_process() {
    passes("travel", &[1, 1], SHM);
    passes("travel", &[1, 2, 1], TCP);
}

#[test]
fn a_producers_failure_is_its_own_error_on_every_process_and_the_graph_stays_usable() {
    passes("fails", &[1, 1], TCP);
    passes("fails", &[1, 2, 1], SHM);
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
    match scenario.as_str() {
        "edges" => edges(&mpi, &layout),
        "cannot" => cannot(&mpi, &layout),
        "fails" => fails(&mpi, &layout),
        "travel" => travel(&mpi, &layout),
        other => panic!("no scenario {other}"),
    }
    println!("process {process}: scenario done");
}

/// The global ranks process `process` hosts, of a group hosted as `layout` says.
fn ranks(layout: &[usize], process: usize) -> std::ops::Range<usize> {
    let first: usize = layout[..process].iter().sum();
    first..first + layout[process]
}

/// The layout of `heads`: `workers`' rotated by one process.
fn rotated(layout: &[usize]) -> Vec<usize> {
    let mut r = layout.to_vec();
    r.rotate_right(1);
    r
}

/// A user type that travels through serde (postcard).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Point {
    name: String,
    xs: Vec<f32>,
}

/// What rank `q` produces in step `s`: each value depends on both, so a consumer knows
/// what each producer must have sent.
fn tensor(q: usize, s: u64) -> Tensor<f32> {
    let rows = q + 1;
    Tensor::from_vec(
        (0..rows * 3)
            .map(|i| (q * 100 + i) as f32 + s as f32 * 0.5)
            .collect(),
        [rows, 3],
    )
    .unwrap()
}
fn list(q: usize, s: u64) -> Vec<i64> {
    (0..q as i64 + 2)
        .map(|i| i * 1_000_003 - q as i64 + s as i64)
        .collect()
}
fn scalar(q: usize, s: u64) -> f64 {
    q as f64 * 1.25 + s as f64
}
fn pair(q: usize, s: u64) -> (Tensor<u8>, Vec<f32>, u32) {
    (
        Tensor::full([2, q + 1], (q as u8).wrapping_add(s as u8)),
        vec![q as f32 / 3.0; 3],
        (q as u32) << 16 | s as u32,
    )
}
fn point(q: usize, s: u64) -> Point {
    Point {
        name: format!("rank {q} step {s}"),
        xs: vec![s as f32; q],
    }
}
/// Large: over the inline limit, so its elements travel straight from its buffer.
fn big(s: u64) -> Tensor<f32> {
    Tensor::from_vec(
        (0..300_000).map(|i| (i % 977) as f32 + s as f32).collect(),
        [600, 500],
    )
    .unwrap()
}
fn shards(n: usize, s: u64) -> Vec<Tensor<i32>> {
    (0..n)
        .map(|k| Tensor::full([k + 1], k as i32 * 10 + s as i32))
        .collect()
}

fn same<T: PartialEq + std::fmt::Debug>(what: &str, got: &T, want: &T) -> Result<(), BoxError> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, want {want:?}").into())
    }
}

/// Tensors compare by shape, then by their first differing element (a large one's
/// elements would fill the log).
fn same_tensor<E: Element>(what: &str, got: &Tensor<E>, want: &Tensor<E>) -> Result<(), BoxError> {
    same(
        &format!("{what} (shape)"),
        &got.shape().to_vec(),
        &want.shape().to_vec(),
    )?;
    let (g, w) = (got.as_slice(), want.as_slice());
    match (0..g.len()).find(|&i| g[i] != w[i]) {
        None => Ok(()),
        Some(i) => Err(format!("{what}: element {i} is {:?}, want {:?}", g[i], w[i]).into()),
    }
}

struct W {
    rank: usize,
    size: usize,
}

#[actor]
impl W {
    fn tensor(&mut self, s: &u64) -> Tensor<f32> {
        tensor(self.rank, *s)
    }
    fn list(&mut self, s: &u64) -> Vec<i64> {
        list(self.rank, *s)
    }
    fn scalar(&mut self, s: &u64) -> f64 {
        scalar(self.rank, *s)
    }
    fn pair(&mut self, s: &u64) -> (Tensor<u8>, Vec<f32>, u32) {
        pair(self.rank, *s)
    }
    fn point(&mut self, s: &u64) -> Point {
        point(self.rank, *s)
    }
    fn big(&mut self, s: &u64) -> Tensor<f32> {
        big(*s)
    }
    /// Rank 1's tensor, read by rank 0 (point to point, within the group).
    fn read_one(&mut self, t: &Tensor<f32>, s: &u64) -> Result<usize, BoxError> {
        same_tensor("t[1]", t, &tensor(1, *s))?;
        Ok(self.rank)
    }
    /// Rank 1's scalar, read by every worker (one message each).
    fn with(&mut self, x: &f64, s: &u64) -> Result<f64, BoxError> {
        same("s[1]", x, &scalar(1, *s))?;
        Ok(*x + self.rank as f64)
    }
    /// Its value of a scatter.
    fn shard(&mut self, t: &Tensor<i32>, s: &u64) -> Result<i32, BoxError> {
        same_tensor("shard", t, &shards(self.size, *s)[self.rank])?;
        Ok(t.as_slice()[0])
    }
}

struct H {
    rank: usize,
    workers: usize,
}

#[actor]
impl H {
    /// Worker i's values, read by head i (rank to rank), and worker 0's large tensor.
    #[allow(clippy::too_many_arguments)]
    fn zip(
        &mut self,
        t: &Tensor<f32>,
        v: &Vec<i64>,
        x: &f64,
        p: &(Tensor<u8>, Vec<f32>, u32),
        pt: &Point,
        b: &Tensor<f32>,
        s: &u64,
    ) -> Result<usize, BoxError> {
        let (q, s) = (self.rank, *s);
        same_tensor("t", t, &tensor(q, s))?;
        same("v", v, &list(q, s))?;
        same("x", x, &scalar(q, s))?;
        let want = pair(q, s);
        same_tensor("p.0", &p.0, &want.0)?;
        same("p.1", &p.1, &want.1)?;
        same("p.2", &p.2, &want.2)?;
        same("pt", pt, &point(q, s))?;
        same_tensor("big", b, &big(s))?;
        Ok(q)
    }
    /// Every worker's list, in rank order (a gather to one actor).
    fn gathered(&mut self, all: &[Vec<i64>], s: &u64) -> Result<usize, BoxError> {
        let want: Vec<Vec<i64>> = (0..self.workers).map(|q| list(q, *s)).collect();
        same("gather(v)", &all.to_vec(), &want)?;
        Ok(all.len())
    }
    /// Every worker's scalar, in rank order, on every head (a gather to a group).
    fn every(&mut self, all: &[f64], s: &u64) -> Result<f64, BoxError> {
        let want: Vec<f64> = (0..self.workers).map(|q| scalar(q, *s)).collect();
        same("gather(x)", &all.to_vec(), &want)?;
        Ok(all.iter().sum())
    }
    fn shards(&mut self, s: &u64) -> Vec<Tensor<i32>> {
        shards(self.workers, *s)
    }
}

graph! {
    Edges(workers: [W], heads: [H], s: u64) {
        let t = workers.tensor(s);
        let v = workers.list(s);
        let x = workers.scalar(s);
        let p = workers.pair(s);
        let pt = workers.point(s);
        let b = workers[0].big(s);
        let z = heads.zip(t, v, x, p, pt, b, s);
        workers[0].read_one(t[1], s);
        workers.with(x[1], s);
        let g = heads[0].gathered(gather(v), s);
        let e = heads.every(gather(x), s);
        let sh = heads[1].shards(s);
        workers.shard(scatter(sh), s);
        (z, e, g)
    }
}

fn edges(mpi: &Mpi, layout: &[usize]) {
    let me = mpi.process();
    let size: usize = layout.iter().sum();
    let heads_layout = rotated(layout);
    let workers: Vec<W> = ranks(layout, me).map(|rank| W { rank, size }).collect();
    let heads: Vec<H> = ranks(&heads_layout, me)
        .map(|rank| H {
            rank,
            workers: size,
        })
        .collect();
    let mut g = Edges::launch(workers, heads, mpi).unwrap();
    assert_eq!(g.ranks("workers"), Some(ranks(layout, me)));
    assert_eq!(g.ranks("heads"), Some(ranks(&heads_layout, me)));
    // Several steps: each message is of its own round, and the edges are reused. Every
    // consumer checks what it got (a mismatch fails its method, and so the execute).
    let here = ranks(&heads_layout, me);
    for s in 0..5u64 {
        let out = g.execute(s).unwrap();
        assert_eq!(out.len(), here.len());
        for (q, (z, e, gathered)) in here.clone().zip(out) {
            assert_eq!(z, q);
            assert_eq!(e, (0..size).map(|q| scalar(q, s)).sum::<f64>());
            assert_eq!(gathered, (q == 0).then_some(size));
        }
    }
    g.teardown().unwrap();
}

/// A value that cannot travel: neither `Travel` nor serde's traits.
#[derive(Clone, Debug)]
struct Opaque(u32);

struct O {
    rank: usize,
}

#[actor]
impl O {
    fn make(&mut self) -> Opaque {
        Opaque(self.rank as u32)
    }
    fn read(&mut self, o: &Opaque) -> u32 {
        o.0
    }
}

graph! {
    Crossing(workers: [O]) {
        let o = workers[0].make();
        workers.read(o)
    }
}

graph! {
    Staying(workers: [O], heads: [O]) {
        let o = workers.make();
        heads.read(o)
    }
}

fn cannot(mpi: &Mpi, layout: &[usize]) {
    let me = mpi.process();
    let make = || ranks(layout, me).map(|rank| O { rank }).collect::<Vec<_>>();
    match Crossing::launch(make(), mpi) {
        Err(
            e @ Error::CannotTravel {
                value: "o",
                from_group: "workers",
                to_group: "workers",
                ty,
            },
        ) => {
            assert!(ty.ends_with("Opaque"), "{ty}");
            assert!(e.to_string().contains("cannot travel"), "{e}");
        }
        Err(other) => panic!("expected CannotTravel, got {other}"),
        Ok(_) => panic!("expected CannotTravel, the graph launched"),
    }
    // The same type on edges whose ends share a process (two groups of one layout, rank i
    // to rank i): it launches and runs, moved as ever.
    let mut g = Staying::launch(make(), make(), mpi).unwrap();
    let out = g.execute().unwrap();
    assert_eq!(out, ranks(layout, me).map(|q| q as u32).collect::<Vec<_>>());
    g.teardown().unwrap();
}

/// Which rank fails, if any.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Trouble {
    None,
    Err(usize),
}

struct F {
    rank: usize,
}

#[actor]
impl F {
    fn produce(&mut self, trouble: &Trouble) -> Result<Tensor<f32>, BoxError> {
        match trouble {
            Trouble::Err(q) if *q == self.rank => Err(format!("rank {q} refused").into()),
            _ => Ok(Tensor::full([3], self.rank as f32)),
        }
    }
    fn consume(&mut self, a: &Tensor<f32>, b: &Tensor<f32>) -> f32 {
        a.as_slice()[0] + b.as_slice()[0]
    }
}

graph! {
    Fails(workers: [F], trouble: Trouble) {
        let a = workers.produce(trouble);
        let first = workers[0].produce(trouble);
        workers.consume(first, a[1])
    }
}

fn fails(mpi: &Mpi, layout: &[usize]) {
    let me = mpi.process();
    let mut g = Fails::launch(ranks(layout, me).map(|rank| F { rank }).collect(), mpi).unwrap();
    let fine = |g: &mut Fails| {
        assert_eq!(g.execute(Trouble::None).unwrap(), vec![1.0; layout[me]]);
    };
    fine(&mut g);
    // Rank 0's method fails (process 0); its value goes to every worker. Rank 1's value
    // (`a[1]`, another process's or this one's) still arrives: every process reports rank
    // 0's error, as its own.
    for q in [0, 1] {
        match g.execute(Trouble::Err(q)) {
            Err(
                e @ Error::Method {
                    group: "workers",
                    method: "produce",
                    rank,
                    ..
                },
            ) if rank == q => {
                assert!(e.to_string().ends_with(&format!("rank {q} refused")), "{e}");
            }
            other => panic!("expected rank {q}'s method error, got {other:?}"),
        }
        fine(&mut g);
    }
    g.teardown().unwrap();
}

// ---------------------------------------------------------------------------------------
// A value whose serialization fails or panics, on either side.

/// A user type whose serde implementations fail as `how` says: writing it returns an
/// error (2) or panics (1); reading it panics (3) or returns an error (4); 0 is fine.
#[derive(Clone, Debug)]
struct Touchy {
    how: u8,
    x: u32,
}

impl Serialize for Touchy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.how {
            1 => panic!("Touchy cannot be written"),
            2 => Err(serde::ser::Error::custom("Touchy refused")),
            _ => (self.how, self.x).serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Touchy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (how, x) = <(u8, u32)>::deserialize(d)?;
        match how {
            3 => panic!("Touchy cannot be read"),
            4 => Err(serde::de::Error::custom("Touchy unreadable")),
            _ => Ok(Touchy { how, x }),
        }
    }
}

struct T0 {
    rank: usize,
}

#[actor]
impl T0 {
    fn make(&mut self, how: &u8) -> Touchy {
        Touchy {
            how: *how,
            x: self.rank as u32 + 7,
        }
    }
    fn read(&mut self, t: &Touchy) -> u32 {
        t.x
    }
    /// One value per rank, to scatter: the first (rank 0's, which stays) always fine.
    fn deal(&mut self, how: &u8, n: &usize) -> Vec<Touchy> {
        (0..*n)
            .map(|k| Touchy {
                how: if k == 0 { 0 } else { *how },
                x: k as u32,
            })
            .collect()
    }
    fn both(&mut self, t: &Touchy, mine: &Touchy) -> u32 {
        t.x + mine.x
    }
}

graph! {
    Touchies(workers: [T0], how: u8, n: usize) {
        let t = workers[0].make(how);
        let dealt = workers[0].deal(how, n);
        workers.both(t, scatter(dealt))
    }
}

fn travel(mpi: &Mpi, layout: &[usize]) {
    let me = mpi.process();
    let mut g = Touchies::launch(ranks(layout, me).map(|rank| T0 { rank }).collect(), mpi).unwrap();
    let n: usize = layout.iter().sum();
    let fine = |g: &mut Touchies| {
        let want: Vec<u32> = ranks(layout, me).map(|r| 7 + r as u32).collect();
        assert_eq!(g.execute(0, n).unwrap(), want);
    };
    fine(&mut g);
    // Both values cross processes, the second scattered (rank 0 keeps its own share,
    // the others' fail the same way). Writing fails on rank 0, the producer; reading on
    // every consumer in another process than rank 0's, of which rank 1 is the first:
    // every process reports that rank's error, and the graph stays usable.
    for (how, rank, why) in [
        (2, 0, "writing it: "),
        (1, 0, "writing it: it panicked: Touchy cannot be written"),
        (3, 1, "it panicked: Touchy cannot be read"),
        (4, 1, "it does not decode"),
    ] {
        match g.execute(how, n) {
            Err(Error::Travel {
                group: "workers",
                rank: r,
                value: "t" | "scatter(dealt)",
                reason,
            }) if r == rank && reason.contains(why) => {}
            other => panic!("process {me}, how {how}: expected rank {rank}'s Travel error ({why}), got {other:?}"),
        }
        fine(&mut g);
    }
    g.teardown().unwrap();
}

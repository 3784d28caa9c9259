//! Groups of different sizes talking to each other: one rank's value (`losses[k]`) read by
//! any group, every rank's value gathered on one actor (`gather(losses)`), and outputs that
//! mix a group's per-actor values with a value of one actor of another group. Across
//! several executions, and with a failing producer.

use actorgraph::prelude::*;

struct Worker;

#[derive(Default)]
struct Coord {
    means: Vec<f32>,
}

struct Head;

#[actor]
impl Worker {
    /// Rank `fail` fails (none when `fail` is negative).
    fn loss(&mut self, step: &f32, fail: &i64) -> Result<f32, String> {
        let rank = Ctx::current().unwrap().rank();
        if *fail == rank as i64 {
            return Err(format!("bad batch on rank {rank}"));
        }
        Ok(*step + rank as f32)
    }
    fn apply(&mut self, lr: &f32, loss: &f32) -> f32 {
        loss * lr
    }
    fn total(&mut self, all: &[f32]) -> f32 {
        all.iter().sum()
    }
}

#[actor]
impl Coord {
    fn record(&mut self, losses: &[f32]) -> f32 {
        let mean = losses.iter().sum::<f32>() / losses.len() as f32;
        self.means.push(mean);
        mean
    }
    fn lr(&mut self, mean: &f32) -> f32 {
        1.0 / (1.0 + mean)
    }
    fn ranks(&mut self, losses: Vec<f32>) -> usize {
        losses.len()
    }
}

#[actor]
impl Head {
    fn see(&mut self, first: &f32) -> (f32, usize) {
        (*first, Ctx::current().unwrap().rank())
    }
}

graph! {
    /// A parameter-server step: N workers, one coordinator, M heads.
    Server(workers: [Worker], coord: [Coord; 1], heads: [Head], step: f32, fail: i64) {
        let losses = workers.loss(step, fail);
        let mean = coord[0].record(gather(losses));   // N -> 1, in rank order
        let lr = coord[0].lr(mean);                    // 1 -> N
        let update = workers.apply(lr, losses);
        let seen = heads.see(losses[1]);               // N -> M through rank 1's value
        let total = workers[0].total(gather(losses));  // within the group: rank 0 keeps its own
        (update, mean, total)
    }

    /// One rank's value as the output, and a gather by value (a clone of the `Vec`).
    Picks(workers: [Worker], coord: [Coord], step: f32, fail: i64) {
        let losses = workers.loss(step, fail);
        let n = coord[0].ranks(gather(losses));
        (losses[2], n)
    }
}

graph! {
    Heads(workers: [Worker], heads: [Head], step: f32, fail: i64) {
        let losses = workers.loss(step, fail);
        heads.see(losses[1])
    }
}

#[test]
fn gather_fan_out_and_one_ranks_value_across_groups_of_different_sizes() {
    let mut g = Server::launch(
        (0..4).map(|_| Worker).collect(),
        [Coord::default()],
        (0..3).map(|_| Head).collect(),
        Cpu,
    )
    .unwrap();
    for step in 0..3 {
        let s = step as f32;
        let out: Vec<(f32, Option<f32>, Option<f32>)> = g.execute(s, -1).unwrap();
        // losses = s + rank; mean = s + 1.5
        let mean = s + 1.5;
        let lr = 1.0 / (1.0 + mean);
        assert_eq!(out.len(), 4);
        for (rank, (update, m, total)) in out.iter().enumerate() {
            assert_eq!(*update, (s + rank as f32) * lr);
            assert_eq!(*m, (rank == 0).then_some(mean));
            assert_eq!(*total, (rank == 0).then_some(4.0 * s + 6.0));
        }
    }
    let (_, coord, _) = g.teardown().unwrap();
    assert_eq!(coord[0].means, vec![1.5, 2.5, 3.5]);
}

#[test]
fn one_ranks_value_reaches_every_actor_of_a_larger_group() {
    let mut g = Heads::launch(vec![Worker, Worker], (0..5).map(|_| Head).collect(), Cpu).unwrap();
    for step in 0..3 {
        let out = g.execute(step as f32, -1).unwrap();
        let want: Vec<(f32, usize)> = (0..5).map(|r| (step as f32 + 1.0, r)).collect();
        assert_eq!(out, want);
    }
    // A failing producer: the heads report the producer's error; the next execute works.
    match g.execute(0.0, 1) {
        Err(Error::Method {
            group: "workers",
            rank: 1,
            ..
        }) => {}
        other => panic!("expected the worker's error, got {other:?}"),
    }
    assert_eq!(g.execute(1.0, -1).unwrap()[4], (2.0, 4));
    g.teardown().unwrap();
}

#[test]
fn a_failing_producer_of_a_gather_is_reported_and_the_next_execution_works() {
    let mut g = Server::launch(
        (0..3).map(|_| Worker).collect(),
        [Coord::default()],
        vec![Head],
        Cpu,
    )
    .unwrap();
    for round in 0..3 {
        for fail in [2, 0] {
            match g.execute(0.0, fail) {
                Err(Error::Method {
                    group: "workers",
                    rank,
                    method: "loss",
                    ..
                }) => assert_eq!(rank as i64, fail),
                other => panic!("round {round}: expected the worker's error, got {other:?}"),
            }
        }
        let out = g.execute(1.0, -1).unwrap();
        assert_eq!(out[0].1, Some(2.0));
    }
    let (_, coord, _) = g.teardown().unwrap();
    // Only the executions without a failure reached the coordinator's method.
    assert_eq!(coord[0].means, vec![2.0, 2.0, 2.0]);
}

#[test]
fn an_output_mixes_a_groups_values_with_one_actor_of_a_smaller_or_larger_group() {
    // The output has one entry per rank of the larger group here: `losses[2]` is at rank 2
    // and the coordinator's value at rank 0.
    let coords = (0..7).map(|_| Coord::default()).collect();
    let mut g = Picks::launch((0..3).map(|_| Worker).collect(), coords, Cpu).unwrap();
    for step in 0..2 {
        let out = g.execute(step as f32, -1).unwrap();
        assert_eq!(
            out,
            vec![
                (None, Some(3)),
                (None, None),
                (Some(step as f32 + 2.0), None),
                (None, None),
                (None, None),
                (None, None),
                (None, None)
            ]
        );
    }
    g.teardown().unwrap();
    // `losses[2]` needs a rank 2 among the workers.
    assert!(matches!(
        Picks::launch(vec![Worker, Worker], vec![Coord::default()], Cpu),
        Err(Error::IndexOutOfRange {
            group: "workers",
            index: 2,
            size: 2
        })
    ));
    // An empty group is reported as empty, not as an index past its end.
    assert!(matches!(
        Picks::launch(Vec::new(), vec![Coord::default()], Cpu),
        Err(Error::EmptyGroup { group: "workers" })
    ));
}

graph! {
    Late(workers: [Worker], coord: [Coord], step: f32, fail: i64) {
        let losses = workers.loss(step, fail);
        let n = coord[3].ranks(gather(losses));
        (losses, n)
    }
}

#[test]
fn a_value_of_one_actor_outside_the_zipped_ranks_is_a_launch_error() {
    let coords = || (0..4).map(|_| Coord::default()).collect::<Vec<_>>();
    match Late::launch(vec![Worker, Worker], coords(), Cpu) {
        Err(e @ Error::OutputRank { .. }) => assert_eq!(
            e.to_string(),
            "output value `n` is `Some` at rank 3, but the output has one entry per actor of group `workers` (2 actors)"
        ),
        other => panic!("expected OutputRank, got {:?}", other.map(|_| ())),
    }
    let mut g = Late::launch((0..4).map(|_| Worker).collect(), coords(), Cpu).unwrap();
    let out = g.execute(0.0, -1).unwrap();
    assert_eq!(out[3], (3.0, Some(4)));
    assert_eq!(out[0], (0.0, None));
    assert!(Late::to_dot().contains("gather: every rank → 3"));
    g.teardown().unwrap();
}

struct Loader;

#[actor]
impl Loader {
    /// One shard per worker; `bad` gives one value too few.
    fn shards(&mut self, n: &usize, bad: &bool) -> Vec<Vec<u32>> {
        let n = if *bad { n - 1 } else { *n };
        (0..n as u32).map(|k| vec![k; 2]).collect()
    }
}

struct Shard;

#[actor]
impl Shard {
    fn sum(&mut self, shard: &[u32]) -> (u32, usize) {
        (shard.iter().sum(), shard.as_ptr() as usize)
    }
    fn own_shards(&mut self, n: &usize) -> Vec<u32> {
        (0..*n as u32).map(|k| 10 * k).collect()
    }
    fn get(&mut self, v: &u32) -> u32 {
        *v
    }
}

graph! {
    Split(loader: [Loader; 1], workers: [Shard], n: usize, bad: bool) {
        let shards = loader[0].shards(n, bad);
        let sums = workers.sum(scatter(shards));     // 1 -> N, the k-th to rank k
        let mine = workers[1].own_shards(n);
        let got = workers.get(scatter(mine));       // within a group: rank 1 keeps its own
        (sums, got)
    }
}

#[test]
fn a_scatter_gives_rank_k_the_kth_value_and_refuses_another_length() {
    let mut g = Split::launch([Loader], (0..3).map(|_| Shard).collect(), Cpu).unwrap();
    for _ in 0..3 {
        let out = g.execute(3, false).unwrap();
        let sums: Vec<(u32, u32)> = out.iter().map(|((s, _), got)| (*s, *got)).collect();
        assert_eq!(sums, vec![(0, 0), (2, 10), (4, 20)]);
    }
    // Too few shards: the loader's typed error, and the next execution works.
    for _ in 0..2 {
        match g.execute(3, true) {
            Err(e @ Error::ScatterLength { .. }) => assert_eq!(
                e.to_string(),
                "`scatter(shards)` on rank 0 of group `loader` got 2 values for 3 actors (one value per rank)"
            ),
            other => panic!("expected ScatterLength, got {other:?}"),
        }
        assert_eq!(g.execute(3, false).unwrap()[2].0 .0, 4);
    }
    g.teardown().unwrap();
}

graph! {
    /// Every worker's loss on every actor of a group of another size.
    ToAll(workers: [Worker], coord: [Coord; 1], heads: [Coord], step: f32, fail: i64) {
        let losses = workers.loss(step, fail);
        let mean = coord.record(gather(losses));
        let n = heads.ranks(gather(losses));
        (mean, n)
    }
}

#[test]
fn a_gather_to_a_group_gives_each_of_its_actors_every_value() {
    let mut g = ToAll::launch(
        (0..4).map(|_| Worker).collect(),
        [Coord::default()],
        vec![Coord::default()],
        Cpu,
    )
    .unwrap();
    for step in 0..3 {
        let out = g.execute(step as f32, -1).unwrap();
        assert_eq!(out, vec![(step as f32 + 1.5, 4)]);
    }
    match g.execute(0.0, 3) {
        Err(Error::Method {
            group: "workers",
            rank: 3,
            ..
        }) => {}
        other => panic!("expected the worker's error, got {other:?}"),
    }
    assert_eq!(g.execute(0.0, -1).unwrap(), vec![(1.5, 4)]);
    assert!(ToAll::to_dot().contains("gather: every rank → all"));
    let (_, coord, _) = g.teardown().unwrap();
    assert_eq!(coord[0].means, vec![1.5, 2.5, 3.5, 1.5]);
    // A scatter is drawn too.
    assert!(Split::to_dot().contains("scatter: rank 0 → each"));
}

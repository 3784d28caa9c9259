//! Per-rank inputs (`batch: PerRank<T>`): rank k gets the k-th value, moved; a `Vec` of
//! another length is refused before any actor runs, and the next execution works.

use actorgraph::prelude::*;

struct Worker;
struct Head;

#[actor]
impl Worker {
    /// The batch, the address of its data (to show that it was not copied), and the rank.
    fn take(&mut self, batch: &Tensor<f32>, scale: &f32) -> (Vec<f32>, usize, usize) {
        let data = batch.as_slice();
        let v = data.iter().map(|x| x * scale).collect();
        (v, data.as_ptr() as usize, Ctx::current().unwrap().rank())
    }
    fn id(&mut self, n: &u64) -> u64 {
        *n
    }
    fn owned(&mut self, s: String) -> usize {
        s.len()
    }
}

#[actor]
impl Head {
    fn count(&mut self, n: &u64) -> u64 {
        *n + 100
    }
}

graph! {
    Shards(workers: [Worker], batch: PerRank<Tensor<f32>>, scale: f32) {
        workers.take(batch, scale)
    }

    /// Per-rank inputs of two groups, one read by a single actor, with a collective.
    Mixed(workers: [Worker], heads: [Head; 2], n: PerRank<u64>, m: PerRank<u64>, s: PerRank<String>) {
        let a = workers.id(n);
        let total = allreduce(a);
        let one = workers[1].id(n);
        let h = heads.count(m);
        let len = workers.owned(s);
        (total, one, h, len)
    }
}

#[test]
fn rank_k_gets_value_k_without_a_copy() {
    let mut g = Shards::launch(vec![Worker, Worker, Worker], Cpu).unwrap();
    for step in 0..3 {
        let batches: Vec<Tensor<f32>> = (0..3)
            .map(|r| Tensor::full([2], (10 * step + r) as f32))
            .collect();
        let addrs: Vec<usize> = batches
            .iter()
            .map(|b| b.as_slice().as_ptr() as usize)
            .collect();
        let out = g.execute(batches, 2.0).unwrap();
        for (rank, (v, addr, seen_rank)) in out.into_iter().enumerate() {
            assert_eq!(v, vec![2.0 * (10 * step + rank) as f32; 2]);
            assert_eq!(addr, addrs[rank], "rank {rank}'s tensor was copied");
            assert_eq!(seen_rank, rank);
        }
    }
    g.teardown().unwrap();
}

#[test]
fn a_wrong_length_is_refused_and_the_next_execution_works() {
    let mut g = Shards::launch(vec![Worker, Worker], Cpu).unwrap();
    for wrong in [0, 1, 3] {
        let batches = vec![Tensor::full([1], 1.0); wrong];
        match g.execute(batches, 1.0) {
            Err(Error::PerRankLength {
                input: "batch",
                group: "workers",
                expected: 2,
                got,
            }) => assert_eq!(got, wrong),
            other => panic!("expected PerRankLength, got {other:?}"),
        }
        assert_eq!(g.in_flight(), 0);
        let out = g.execute(vec![Tensor::full([1], 1.0), Tensor::full([1], 2.0)], 1.0);
        let firsts: Vec<f32> = out.unwrap().into_iter().map(|o| o.0[0]).collect();
        assert_eq!(firsts, vec![1.0, 2.0]);
    }
    // The same with a ticket: nothing is submitted.
    assert!(matches!(
        g.submit(vec![], 1.0),
        Err(Error::PerRankLength { .. })
    ));
    assert_eq!(g.in_flight(), 0);
    g.teardown().unwrap();
}

#[test]
fn per_rank_inputs_of_several_groups_and_single_actors() {
    let mut g = Mixed::launch(vec![Worker, Worker], [Head, Head], Cpu).unwrap();
    for step in 0..3u64 {
        let s = vec!["a".repeat(step as usize), "bb".into()];
        let out = g.execute(vec![step, 10], vec![1, 2], s).unwrap();
        assert_eq!(
            out,
            vec![
                (step + 10, None, 101, step as usize),
                (step + 10, Some(10), 102, 2)
            ]
        );
    }
    // Each group checks its own inputs; the heads' `m` is too short.
    assert!(matches!(
        g.execute(vec![1, 2], vec![1], vec!["".into(), "".into()]),
        Err(Error::PerRankLength {
            input: "m",
            group: "heads",
            ..
        })
    ));
    let out = g.execute(vec![1, 2], vec![3, 4], vec!["".into(), "".into()]);
    assert_eq!(out.unwrap()[1], (3, Some(2), 104, 0));
    g.teardown().unwrap();
}

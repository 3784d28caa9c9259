//! End-to-end behaviour of `#[actor]`, `graph!` and the CPU runtime: fused allreduce
//! stages, their output types and values, and their buffers across executions.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use actorgraph::prelude::*;

struct Worker {
    rank: usize,
    calls: usize,
}

fn workers(n: usize) -> Vec<Worker> {
    (0..n).map(|rank| Worker { rank, calls: 0 }).collect()
}

#[actor]
impl Worker {
    fn ten(&mut self) -> Tensor<f32> {
        Tensor::full([10], (self.rank + 1) as f32)
    }
    fn one(&mut self) -> Tensor<f32> {
        Tensor::full([1], 1.0)
    }
    fn two(&mut self) -> Tensor<f32> {
        Tensor::full([1], 2.0)
    }
    fn sized(&mut self, n: &usize) -> Tensor<f32> {
        Tensor::from_vec((0..*n).map(|i| (i + self.rank) as f32).collect(), [*n]).unwrap()
    }
    fn scaled(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        let v = x.as_slice()[0] * (self.rank + 1) as f32;
        Tensor::full([3], v)
    }
    fn by_value(&mut self, x: Tensor<f32>) -> Tensor<f32> {
        x
    }
    fn times_two(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        Tensor::from_vec(x.as_slice().iter().map(|v| v * 2.0).collect(), x.shape()).unwrap()
    }
    fn combine(&mut self, a: &Tensor<f32>, b: &Tensor<f32>) -> Tensor<f32> {
        Tensor::full([1], a.as_slice()[0] * 10.0 + b.as_slice()[0])
    }
    fn count(&mut self) -> Tensor<i32> {
        self.calls += 1;
        Tensor::full([1], self.calls as i32)
    }
    fn scalar(&mut self) -> f32 {
        (self.rank + 1) as f32
    }
    fn matrix(&mut self) -> Tensor<f32> {
        Tensor::from_vec((0..6).map(|i| i as f32).collect(), [2, 3]).unwrap()
    }
}

graph! {
    Flat(workers: [Worker]) {
        let a = workers.ten();
        allreduce(a)
    }

    Nested(workers: [Worker]) {
        let c1 = workers.one();
        let c2 = workers.two();
        allreduce([c1, c2])
    }

    Lengths(workers: [Worker], n1: usize, n2: usize, n3: usize) {
        let a = workers.sized(n1);
        let b = workers.sized(n2);
        let c = workers.sized(n3);
        allreduce([a, b, c])
    }

    FromInput(workers: [Worker], x: Tensor<f32>) {
        let s = workers.scaled(x);
        allreduce(s)
    }

    RawAndReduced(workers: [Worker]) {
        let a = workers.ten();
        let r = allreduce(a);
        (a, r)
    }

    Chained(workers: [Worker]) {
        let a = workers.ten();
        let r = allreduce(a);
        let d = workers.times_two(r);
        allreduce(d)
    }

    Destructured(workers: [Worker]) {
        let c1 = workers.one();
        let c2 = workers.two();
        let (s1, s2) = allreduce([c1, c2]);
        workers.combine(s1, s2)
    }

    Counter(workers: [Worker]) {
        workers.count()
    }

    Shapes(workers: [Worker]) {
        let m = workers.matrix();
        allreduce(m)
    }

    Big(workers: [Worker], n: usize) {
        let a = workers.sized(n);
        let b = workers.count();
        allreduce([a, b])
    }

    BigAndScalar(workers: [Worker], n: usize) {
        let a = workers.sized(n);
        let s = workers.scalar();
        allreduce([a, s])
    }

    ByValue(workers: [Worker], x: Tensor<f32>) {
        let y = workers.by_value(x);
        allreduce(y, Max)
    }
}

#[test]
fn flat_allreduce_sums_across_two_actors() {
    let mut g = Flat::launch(workers(2), Cpu).unwrap();
    let out: Vec<Tensor<f32>> = g.execute().unwrap();
    assert_eq!(out.len(), 2);
    for t in &out {
        assert_eq!(t.shape(), &[10]);
        assert_eq!(t.to_vec(), vec![3.0; 10]);
    }
    g.teardown().unwrap();
}

#[test]
fn nested_allreduce_is_indexed_by_rank_then_position() {
    let mut g = Nested::launch(workers(2), Cpu).unwrap();
    let out: Vec<(Tensor<f32>, Tensor<f32>)> = g.execute().unwrap();
    for (a, b) in &out {
        assert_eq!(a.to_vec(), vec![2.0]);
        assert_eq!(b.to_vec(), vec![4.0]);
        // One fused stage: both outputs are views into the same flat buffer.
        assert!(a.shares_storage(b));
    }
}

#[test]
fn different_lengths_in_one_bucket_keep_their_shapes() {
    let mut g = Lengths::launch(workers(3), Cpu).unwrap();
    let out = g.execute(10, 3, 0).unwrap();
    for (a, b, c) in &out {
        assert_eq!(a.shape(), &[10]);
        assert_eq!(b.shape(), &[3]);
        assert_eq!(c.shape(), &[0]);
        // sum over ranks r of (i + r) = 3i + 3
        assert_eq!(
            a.to_vec(),
            (0..10).map(|i| (3 * i + 3) as f32).collect::<Vec<_>>()
        );
        assert_eq!(b.to_vec(), vec![3.0, 6.0, 9.0]);
        assert!(c.is_empty());
    }
}

#[test]
fn multi_dimensional_shapes_survive_the_bucket() {
    let mut g = Shapes::launch(workers(2), Cpu).unwrap();
    let out = g.execute().unwrap();
    assert_eq!(out[1].shape(), &[2, 3]);
    assert_eq!(out[1].to_vec(), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
}

#[test]
fn the_input_decides_the_values_every_execution() {
    let mut g = FromInput::launch(workers(2), Cpu).unwrap();
    for x in [1.0f32, 2.0, 3.0] {
        let out = g.execute(Tensor::full([1], x)).unwrap();
        // rank 0 gives x, rank 1 gives 2x
        for t in &out {
            assert_eq!(t.to_vec(), vec![3.0 * x; 3]);
        }
    }
}

#[test]
fn a_held_view_keeps_its_values_after_the_next_execution() {
    let mut g = FromInput::launch(workers(2), Cpu).unwrap();
    let first = g.execute(Tensor::full([1], 1.0)).unwrap();
    let second = g.execute(Tensor::full([1], 5.0)).unwrap();
    assert_eq!(first[0].to_vec(), vec![3.0; 3]);
    assert_eq!(second[0].to_vec(), vec![15.0; 3]);
    assert!(!first[0].shares_storage(&second[0]));
    drop(first);
    let third = g.execute(Tensor::full([1], 2.0)).unwrap();
    assert_eq!(second[1].to_vec(), vec![15.0; 3]);
    assert_eq!(third[1].to_vec(), vec![6.0; 3]);
}

#[test]
fn a_value_used_as_output_keeps_its_unreduced_value() {
    let mut g = RawAndReduced::launch(workers(2), Cpu).unwrap();
    let out: Vec<(Tensor<f32>, Tensor<f32>)> = g.execute().unwrap();
    assert_eq!(out[0].0.to_vec(), vec![1.0; 10]);
    assert_eq!(out[1].0.to_vec(), vec![2.0; 10]);
    assert_eq!(out[0].1.to_vec(), vec![3.0; 10]);
    assert_eq!(out[1].1.to_vec(), vec![3.0; 10]);
}

#[test]
fn a_second_collective_over_a_method_of_the_first_result() {
    let mut g = Chained::launch(workers(2), Cpu).unwrap();
    let out = g.execute().unwrap();
    // allreduce gives 3, times two gives 6 on each rank, allreduce gives 12.
    for t in &out {
        assert_eq!(t.to_vec(), vec![12.0; 10]);
    }
}

#[test]
fn destructured_collective_feeds_a_later_call() {
    let mut g = Destructured::launch(workers(3), Cpu).unwrap();
    let out = g.execute().unwrap();
    for t in &out {
        // s1 = 3, s2 = 6
        assert_eq!(t.to_vec(), vec![36.0]);
    }
}

#[test]
fn a_group_of_one_is_the_identity() {
    let mut g = Nested::launch(workers(1), Cpu).unwrap();
    let out = g.execute().unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0.to_vec(), vec![1.0]);
    assert_eq!(out[0].1.to_vec(), vec![2.0]);
}

#[test]
fn eight_actors_on_a_small_machine() {
    let mut g = Flat::launch(workers(8), Cpu).unwrap();
    for _ in 0..50 {
        let out = g.execute().unwrap();
        assert_eq!(out.len(), 8);
        for t in &out {
            assert_eq!(t.to_vec(), vec![36.0; 10]);
        }
    }
}

#[test]
fn by_value_arguments_and_an_explicit_op() {
    let mut g = ByValue::launch(workers(2), Cpu).unwrap();
    let out = g.execute(Tensor::from_slice(&[1.0, -2.0])).unwrap();
    assert_eq!(out[0].to_vec(), vec![1.0, -2.0]);
}

#[test]
fn teardown_returns_the_actors_with_their_state() {
    let mut g = Counter::launch(workers(2), Cpu).unwrap();
    for i in 1..=3 {
        let out: Vec<Tensor<i32>> = g.execute().unwrap();
        assert_eq!(out[1].to_vec(), vec![i]);
    }
    let back: Vec<Worker> = g.teardown().unwrap();
    assert_eq!(back.len(), 2);
    for (rank, w) in back.iter().enumerate() {
        assert_eq!(w.rank, rank);
        assert_eq!(w.calls, 3);
    }
}

#[test]
fn launching_an_empty_group_is_an_error() {
    match Flat::launch(Vec::new(), Cpu) {
        Err(Error::EmptyGroup { group }) => assert_eq!(group, "workers"),
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("an empty group must not launch"),
    }
}

/// Adds one to its counter when the thread that holds it ends (a thread-local's
/// destructor runs as its thread exits, before a join of that thread returns).
struct CountsThreadEnd(Arc<AtomicUsize>);

impl Drop for CountsThreadEnd {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

thread_local! {
    static ON_THREAD_END: RefCell<Option<CountsThreadEnd>> = const { RefCell::new(None) };
}

/// An actor whose thread, once it has run [`Watched::watch`], counts its own end.
struct Watched {
    ended: Arc<AtomicUsize>,
}

#[actor]
impl Watched {
    fn watch(&mut self) -> f32 {
        let counter = CountsThreadEnd(Arc::clone(&self.ended));
        ON_THREAD_END.with(|slot| *slot.borrow_mut() = Some(counter));
        1.0
    }
}

graph! {
    Watch(ws: [Watched]) {
        let x = ws.watch();
        allreduce(x)
    }
}

/// Made on their threads (`Actors::each`), so that every method runs there: ready values
/// may also run a step on the thread that calls `execute`.
#[test]
fn dropping_a_graph_stops_its_threads() {
    let ended = Arc::new(AtomicUsize::new(0));
    let made = {
        let ended = Arc::clone(&ended);
        Actors::each(4, move |_, _| Watched {
            ended: Arc::clone(&ended),
        })
    };
    let mut g = Watch::launch_actors(made, Cpu, LaunchOptions::default()).unwrap();
    assert_eq!(g.execute().unwrap(), vec![4.0; 4]);
    assert_eq!(
        ended.load(SeqCst),
        0,
        "the actor threads run until the graph goes"
    );
    drop(g);
    assert_eq!(ended.load(SeqCst), 4, "every actor thread has ended");
}

/// A large bucket's results are written once, into one buffer that every rank's outputs
/// view; views held across executions keep their values, and the values are right.
#[test]
fn a_large_allreduce_shares_one_result_buffer_between_ranks() {
    let n = 300_000; // 1.2 MB of f32: above the size where the CPU backend shares results
    let mut g = Big::launch(workers(3), Cpu).unwrap();
    let want = |i: usize| (3 * i + 3) as f32; // sum over ranks r of (i + r)
    let first = g.execute(n).unwrap();
    for (a, b) in &first {
        assert!(a.shares_storage(&first[0].0), "one buffer for every rank");
        assert_eq!(a.len(), n);
        assert!(a.as_slice().iter().enumerate().all(|(i, &v)| v == want(i)));
        assert_eq!(b.to_vec(), vec![3]);
    }
    // Held views are never overwritten: the next execution takes another buffer.
    let second = g.execute(n).unwrap();
    assert!(!second[1].0.shares_storage(&first[1].0));
    assert_eq!(first[2].1.to_vec(), vec![3]);
    assert_eq!(second[2].1.to_vec(), vec![6]);
    assert!(second[2]
        .0
        .as_slice()
        .iter()
        .enumerate()
        .all(|(i, &v)| v == want(i)));
    // Once every view is gone, the buffer is used again: no allocation per execute.
    drop((first, second));
    let third = g.execute(n).unwrap();
    let ptr = third[0].0.as_slice().as_ptr();
    drop(third);
    let fourth = g.execute(n).unwrap();
    assert_eq!(fourth[1].0.as_slice().as_ptr(), ptr);
}

/// The stage keeps its layout between executions and rewrites only what changed: a layout
/// that changes (lengths, a value emptied, small and shared results in turn) still
/// reduces every value right.
#[test]
fn a_layout_that_changes_between_executions_reduces_every_value() {
    let mut g = Lengths::launch(workers(3), Cpu).unwrap();
    let want = |n: usize| (0..n).map(|i| (3 * i + 3) as f32).collect::<Vec<_>>();
    for (n1, n2, n3) in [
        (3, 5, 7),
        (3, 5, 7),
        (3, 9, 7),
        (70_000, 1, 2),
        (1, 2, 3),
        (100_000, 0, 100_000),
        (3, 5, 7),
    ] {
        for (a, b, c) in g.execute(n1, n2, n3).unwrap() {
            assert_eq!(
                (a.shape(), b.shape(), c.shape()),
                (&[n1][..], &[n2][..], &[n3][..])
            );
            assert_eq!(
                (a.to_vec(), b.to_vec(), c.to_vec()),
                (want(n1), want(n2), want(n3))
            );
        }
    }
}

/// A shared result buffer is handed back for reuse even when a value of the bucket is
/// copied out rather than viewed (a scalar): no reference to it is left behind.
#[test]
fn a_shared_result_buffer_is_reused_when_a_value_is_copied_out() {
    let n = 100_000; // 400 KB of f32: results shared
    let mut g = BigAndScalar::launch(workers(3), Cpu).unwrap();
    let first = g.execute(n).unwrap();
    for (a, s) in &first {
        assert!(a.shares_storage(&first[0].0));
        assert!(a
            .as_slice()
            .iter()
            .enumerate()
            .all(|(i, &v)| v == (3 * i + 3) as f32));
        assert_eq!(*s, 6.0);
    }
    let ptr = first[0].0.as_slice().as_ptr();
    drop(first);
    let second = g.execute(n).unwrap();
    assert_eq!(
        second[2].0.as_slice().as_ptr(),
        ptr,
        "the buffer is used again"
    );
    assert_eq!(second[1].1, 6.0);
}

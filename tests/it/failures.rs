//! Errors on one rank reach `execute` as typed errors naming the rank and the method, and
//! never leave the other ranks waiting.

use std::fmt;

use actorgraph::prelude::*;

use crate::support::sleeper::{sleepers, Sleeper};

#[derive(Debug)]
struct Boom(usize);

impl fmt::Display for Boom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "boom at call {}", self.0)
    }
}

impl std::error::Error for Boom {}

struct Flaky {
    rank: usize,
    calls: usize,
    fail_rank: usize,
    fail_call: usize,
}

#[actor]
impl Flaky {
    fn grad(&mut self) -> Result<Tensor<f32>, Boom> {
        self.calls += 1;
        if self.rank == self.fail_rank && self.calls == self.fail_call {
            return Err(Boom(self.calls));
        }
        Ok(Tensor::full([4], self.calls as f32))
    }

    fn checked(&mut self, n: &usize) -> Result<Tensor<f32>, String> {
        if *n == 0 {
            Err(format!("rank {} refuses zero", self.rank))
        } else {
            Ok(Tensor::full([*n], 1.0))
        }
    }

    fn explode(&mut self, x: &i32) -> Tensor<i64> {
        if self.rank == 0 && *x < 0 {
            panic!("negative input {x}");
        }
        Tensor::full([2], 1)
    }
}

graph! {
    Step(workers: [Flaky]) {
        let g = workers.grad();
        allreduce(g)
    }

    Checked(workers: [Flaky], n: usize) {
        let a = workers.checked(n);
        let b = workers.checked(n);
        let (ra, rb) = allreduce([a, b]);
        let again = allreduce(ra);
        (again, rb)
    }

    Explode(workers: [Flaky], x: i32) {
        let e = workers.explode(x);
        allreduce(e)
    }
}

fn flaky(n: usize, fail_rank: usize, fail_call: usize) -> Vec<Flaky> {
    (0..n)
        .map(|rank| Flaky {
            rank,
            calls: 0,
            fail_rank,
            fail_call,
        })
        .collect()
}

#[test]
fn an_err_on_one_rank_names_it_and_the_graph_stays_usable() {
    let mut g = Step::launch(flaky(4, 1, 5), Cpu).unwrap();
    for call in 1..=10 {
        let result = g.execute();
        if call == 5 {
            let err = result.unwrap_err();
            match &err {
                Error::Method {
                    group,
                    rank,
                    method,
                    source,
                } => {
                    assert_eq!((*group, *rank, *method), ("workers", 1, "grad"));
                    assert_eq!(source.to_string(), "boom at call 5");
                }
                other => panic!("unexpected error {other:?}"),
            }
            assert_eq!(
                err.to_string(),
                "method `grad` failed on rank 1 of group `workers`: boom at call 5"
            );
        } else {
            let out = result.unwrap();
            for t in &out {
                assert_eq!(t.to_vec(), vec![4.0 * call as f32; 4]);
            }
        }
    }
    let back = g.teardown().unwrap();
    assert!(back.iter().all(|w| w.calls == 10));
}

#[test]
fn every_rank_failing_before_two_stages_does_not_hang() {
    let mut g = Checked::launch(flaky(3, 99, 0), Cpu).unwrap();
    let err = g.execute(0).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Method {
                rank: 0,
                method: "checked",
                ..
            }
        ),
        "{err}"
    );
    let (again, rb) = g.execute(2).unwrap().remove(2);
    assert_eq!(again.to_vec(), vec![9.0; 2]);
    assert_eq!(rb.to_vec(), vec![3.0; 2]);
}

#[test]
fn a_panic_is_reported_and_poisons_the_actor() {
    let mut g = Explode::launch(flaky(2, 99, 0), Cpu).unwrap();
    assert_eq!(g.execute(1).unwrap()[1].to_vec(), vec![2, 2]);
    let err = g.execute(-3).unwrap_err();
    match &err {
        Error::Panic {
            group,
            rank,
            method,
            message,
        } => {
            assert_eq!((*group, *rank, *method), ("workers", 0, Some("explode")));
            assert_eq!(message, "negative input -3");
        }
        other => panic!("unexpected error {other:?}"),
    }
    // Rank 0's state may be torn: it stays poisoned, and says so, without hanging rank 1.
    for _ in 0..3 {
        match g.execute(1).unwrap_err() {
            Error::Poisoned { rank, message, .. } => {
                assert_eq!(rank, 0);
                assert!(message.contains("negative input -3"));
            }
            other => panic!("unexpected error {other:?}"),
        }
    }
    // Teardown hands back the intact actor and names the poisoned one.
    let mut back = g.teardown_each();
    assert!(matches!(back[0], Err(Error::Poisoned { rank: 0, .. })));
    assert_eq!(back.remove(1).unwrap().rank, 1);
}

struct Shaped {
    rank: usize,
}

#[actor]
impl Shaped {
    /// Rank r returns `lens[r]` elements.
    fn part(&mut self, lens: &[usize; 2]) -> Tensor<f32> {
        Tensor::full([lens[self.rank]], 1.0)
    }
}

graph! {
    Parts(workers: [Shaped], lens: [usize; 2]) {
        let a = workers.part(lens);
        let b = workers.part(lens);
        allreduce([a, b])
    }
}

#[test]
fn a_shape_mismatch_names_every_count_and_the_next_execute_works() {
    let mut g = Parts::launch(vec![Shaped { rank: 0 }, Shaped { rank: 1 }], Cpu).unwrap();
    let err = g.execute([10, 20]).unwrap_err();
    match &err {
        Error::ShapeMismatch {
            stage,
            value,
            slot,
            item,
            counts,
            shapes,
            ..
        } => {
            assert_eq!(*stage, "allreduce([a, b])");
            assert_eq!((*value, *slot, *item), ("a", 0, None));
            assert_eq!(
                counts,
                &vec![(actorgraph::DType::F32, 10), (actorgraph::DType::F32, 20)]
            );
            assert_eq!(shapes, &vec![vec![10], vec![20]]);
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "shape mismatch in stage `allreduce([a, b])`, value `a` (slot 0): rank 0 has f32 [10], rank 1 has f32 [20]"
    );
    let out = g.execute([7, 7]).unwrap();
    assert_eq!(out[1].0.to_vec(), vec![2.0; 7]);
    assert_eq!(out[1].1.to_vec(), vec![2.0; 7]);
}

/// Rank 1 returns the transpose of what rank 0 returns when asked: the same six elements.
struct Transposer {
    rank: usize,
}

#[actor]
impl Transposer {
    fn grad(&mut self, transpose: &bool) -> Tensor<f32> {
        let shape = if *transpose && self.rank == 1 {
            [3, 2]
        } else {
            [2, 3]
        };
        Tensor::full(shape, 1.0)
    }
}

graph! {
    Transposed(workers: [Transposer], transpose: bool) {
        let g = workers.grad(transpose);
        allreduce(g)
    }

    GatherTransposed(workers: [Transposer], transpose: bool) {
        let g = workers.grad(transpose);
        allgather(g)
    }
}

#[test]
fn a_transposed_value_is_a_shape_mismatch_that_names_it() {
    let shaped = || vec![Transposer { rank: 0 }, Transposer { rank: 1 }];
    let mut g = Transposed::launch(shaped(), Cpu).unwrap();
    let err = g.execute(true).unwrap_err();
    match &err {
        Error::ShapeMismatch {
            stage,
            value,
            slot,
            shapes,
            ..
        } => {
            assert_eq!((*stage, *value, *slot), ("allreduce(g)", "g", 0));
            assert_eq!(shapes, &vec![vec![2, 3], vec![3, 2]]);
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "shape mismatch in stage `allreduce(g)`, value `g` (slot 0): rank 0 has f32 [2, 3], rank 1 has f32 [3, 2]"
    );
    let out = g.execute(false).unwrap();
    assert_eq!(
        (out[1].shape(), out[1].to_vec()),
        (&[2, 3][..], vec![2.0; 6])
    );

    // `allgather` concatenates along the first dimension: the others must agree.
    let mut g = GatherTransposed::launch(shaped(), Cpu).unwrap();
    assert!(matches!(
        g.execute(true),
        Err(Error::ShapeMismatch { value: "g", .. })
    ));
    assert_eq!(g.execute(false).unwrap()[0].shape(), &[4, 3]);
}

/// A list of gradients per rank; with `fault`, rank 1's item 1 is transposed or its list
/// is one item longer.
struct Lister {
    rank: usize,
}

#[derive(Clone, Copy, PartialEq)]
enum ListFault {
    None,
    Transposed,
    Longer,
}

#[actor]
impl Lister {
    fn grads(&mut self, fault: &ListFault) -> Vec<Tensor<f32>> {
        let mut grads = vec![Tensor::full([2, 3], 1.0); 3];
        if self.rank == 1 {
            match fault {
                ListFault::None => {}
                ListFault::Transposed => grads[1] = Tensor::full([3, 2], 1.0),
                ListFault::Longer => grads.push(Tensor::full([2, 3], 1.0)),
            }
        }
        grads
    }

    fn loss(&mut self) -> f32 {
        1.0
    }
}

graph! {
    Lists(workers: [Lister], fault: ListFault) {
        let l = workers.loss();
        let g = workers.grads(fault);
        allreduce([l, g])
    }

    GatherLists(workers: [Lister], fault: ListFault) {
        let g = workers.grads(fault);
        allgather(g)
    }
}

#[test]
fn a_mismatch_in_a_list_names_the_item() {
    let listers = || vec![Lister { rank: 0 }, Lister { rank: 1 }];
    let mut g = Lists::launch(listers(), Cpu).unwrap();
    let err = g.execute(ListFault::Transposed).unwrap_err();
    match &err {
        Error::ShapeMismatch {
            stage,
            value,
            slot,
            item,
            shapes,
            ..
        } => {
            assert_eq!((*stage, *value, *slot), ("allreduce([l, g])", "g", 1));
            assert_eq!(*item, Some(1));
            assert_eq!(shapes, &vec![vec![2, 3], vec![3, 2]]);
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "shape mismatch in stage `allreduce([l, g])`, item 1 of value `g` (slot 1): rank 0 has f32 [2, 3], rank 1 has f32 [3, 2]"
    );

    let err = g.execute(ListFault::Longer).unwrap_err();
    match &err {
        Error::LengthMismatch {
            stage,
            value,
            slot,
            item,
            lens,
            ..
        } => {
            assert_eq!(
                (*stage, *value, *slot, *item),
                ("allreduce([l, g])", "g", 1, None)
            );
            assert_eq!(lens, &vec![3, 4]);
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "list length mismatch in stage `allreduce([l, g])`, value `g` (slot 1): rank 0 has 3 items, rank 1 has 4 items"
    );

    let out = g.execute(ListFault::None).unwrap();
    assert_eq!(out[1].1[2].to_vec(), vec![2.0; 6]);

    // `allgather` lays its lists out apart: the same errors.
    let mut g = GatherLists::launch(listers(), Cpu).unwrap();
    assert!(matches!(
        g.execute(ListFault::Transposed),
        Err(Error::ShapeMismatch {
            value: "g",
            item: Some(1),
            ..
        })
    ));
    match g.execute(ListFault::Longer) {
        Err(Error::LengthMismatch {
            value: "g", lens, ..
        }) => assert_eq!(lens, [3, 4]),
        other => panic!("unexpected: {:?}", other.map(|_| ())),
    }
    assert_eq!(g.execute(ListFault::None).unwrap()[0][1].shape(), &[4, 3]);
}

/// An input whose clone panics after a few clones: `execute` panics in the driver while
/// some actors already run.
struct Fragile {
    clones_left: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Clone for Fragile {
    fn clone(&self) -> Self {
        use std::sync::atomic::Ordering::SeqCst;
        if self.clones_left.fetch_sub(1, SeqCst) == 0 {
            panic!("clone budget exhausted");
        }
        Fragile {
            clones_left: self.clones_left.clone(),
        }
    }
}

struct Taker;

#[actor]
impl Taker {
    fn take(&mut self, _f: &Fragile) -> Tensor<u8> {
        Tensor::full([3], 1)
    }
}

graph! {
    Takes(workers: [Taker], f: Fragile) {
        let t = workers.take(f);
        allreduce(t)
    }
}

#[test]
fn a_panic_in_the_driver_mid_execute_does_not_leave_threads_behind() {
    let budget = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(1));
    let result = std::panic::catch_unwind(|| {
        let mut g = Takes::launch(vec![Taker, Taker, Taker, Taker], Cpu).unwrap();
        // Ranks 0 and 1 get their input; cloning for rank 2 panics. Ranks 0 and 1 then
        // wait in the collective for peers that never come, until the drop aborts it.
        let _ = g.execute(Fragile {
            clones_left: budget.clone(),
        });
    });
    assert!(result.is_err());
}

graph! {
    Naps(workers: [Sleeper], plan: (usize, u64)) {
        let t = workers.nap(plan);
        allreduce(t)
    }
}

// The bounds below are generous liveness checks (no hang), not performance assertions.
const MARGIN: std::time::Duration = std::time::Duration::from_secs(3);

#[test]
fn a_method_past_the_timeout_gives_timeout_then_broken_then_a_bounded_teardown() {
    use std::time::{Duration, Instant};
    let mut g = Naps::launch(sleepers(3), Cpu).unwrap();
    assert_eq!(
        g.execute_timeout((9, 0), Duration::from_secs(60)).unwrap()[0].to_vec(),
        vec![3.0; 2]
    );

    let timeout = Duration::from_millis(100);
    let start = Instant::now();
    let err = g.execute_timeout((1, 1_500), timeout).unwrap_err();
    assert!(start.elapsed() < timeout + MARGIN);
    match &err {
        Error::Timeout {
            group,
            ranks,
            waiting,
            timeout: t,
        } => {
            assert_eq!(
                (*group, ranks.as_slice(), *t),
                ("workers", &[1][..], timeout)
            );
            assert_eq!(waiting, &[0, 2]);
        }
        other => panic!("unexpected error {other:?}"),
    }
    // Broken from now on, without running anything.
    assert!(matches!(
        g.execute((9, 0)),
        Err(Error::Broken {
            group: "workers",
            ..
        })
    ));
    assert!(matches!(
        g.execute_timeout((9, 0), timeout),
        Err(Error::Broken { .. })
    ));
    // The sleeper wakes up, finds its collective aborted and stops: everyone comes back.
    let start = Instant::now();
    let back = g.teardown().unwrap();
    assert!(start.elapsed() < Duration::from_millis(1_500) + MARGIN);
    assert_eq!(
        back.iter().map(|s| s.rank).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
}

#[test]
fn a_stuck_actor_is_left_behind_and_the_others_come_back() {
    use std::time::{Duration, Instant};
    let mut g = Naps::launch(sleepers(2), Cpu).unwrap();
    let err = g
        .execute_timeout((0, 0), Duration::from_millis(50))
        .unwrap_err();
    assert!(
        matches!(err, Error::Timeout { ref ranks, .. } if ranks == &[0]),
        "{err}"
    );
    let start = Instant::now();
    let back = g.teardown_each();
    assert!(start.elapsed() < actorgraph::TEARDOWN_GRACE + MARGIN);
    assert!(matches!(back[0], Err(Error::ActorLost { rank: 0, .. })));
    assert!(matches!(back[1], Ok(Sleeper { rank: 1 })));
}

#[test]
fn a_graph_dropped_with_an_execution_in_flight_does_not_hang() {
    use std::time::{Duration, Instant};
    let mut g = Naps::launch(sleepers(4), Cpu).unwrap();
    let _ = g.execute_timeout((2, 0), Duration::from_millis(20));
    let start = Instant::now();
    drop(g);
    assert!(start.elapsed() < actorgraph::TEARDOWN_GRACE + MARGIN);
}

struct Dealer {
    budget: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

#[actor]
impl Dealer {
    fn deal(&mut self) -> Fragile {
        Fragile {
            clones_left: self.budget.clone(),
        }
    }
    fn look(&mut self, _f: &Fragile) -> u8 {
        1
    }
}

graph! {
    Deals(workers: [Dealer]) {
        let f = workers[0].deal();
        workers.look(f)
    }
}

#[test]
fn a_clone_that_panics_while_a_value_fans_out_fails_the_execute_without_a_hang() {
    let budget = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(100));
    let dealers = (0..4).map(|_| Dealer {
        budget: budget.clone(),
    });
    let mut g = Deals::launch(dealers.collect(), Cpu).unwrap();
    assert_eq!(g.execute().unwrap(), vec![1; 4]);
    // Rank 0's value goes to 4 readers: a clone for each but the last. The second clone
    // panics: one reader has its copy, the others must hear of the failure, not wait.
    budget.store(1, std::sync::atomic::Ordering::SeqCst);
    match g.execute() {
        Err(Error::Panic {
            rank: 0, message, ..
        }) => assert_eq!(message, "clone budget exhausted"),
        other => panic!("expected rank 0's panic, got {other:?}"),
    }
    // The panic poisoned rank 0's actor; the others are fine, and nothing waits.
    assert!(matches!(g.execute(), Err(Error::Poisoned { rank: 0, .. })));
}

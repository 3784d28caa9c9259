//! Errors on one rank reach `execute` as typed errors naming the rank and the method, and
//! never leave the other ranks waiting.

use std::fmt;

use actorgraph::prelude::*;

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
    g.teardown().unwrap();
}

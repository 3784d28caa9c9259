//! `Communicator::attach`: every rank attaches on its own thread before its first step,
//! and a launch fails, with the rank's error, if any rank cannot.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

use actorgraph::prelude::*;

use crate::support::counting::Counting;

struct Worker;

#[actor]
impl Worker {
    fn id(&mut self) -> f32 {
        1.0
    }
}

graph! {
    Sum(workers: [Worker]) {
        let x = workers.id();
        allreduce([x], Sum)
    }
}

fn backend(fail_attach: Option<usize>) -> Counting {
    Counting {
        fail_attach,
        ..Counting::default()
    }
}

#[test]
fn every_rank_attaches_on_its_own_thread_before_launch_returns() {
    let b = backend(None);
    let counts = Arc::clone(&b.counts);
    let mut g = Sum::launch((0..3).map(|_| Worker).collect::<Vec<_>>(), b).unwrap();
    let mut seen = counts.attached.lock().unwrap().clone();
    seen.sort_by_key(|&(rank, _)| rank);
    assert_eq!(seen.iter().map(|&(r, _)| r).collect::<Vec<_>>(), [0, 1, 2]);
    let me = std::thread::current().id();
    assert!(
        seen.iter().all(|&(_, t)| t != me),
        "attached on the caller's thread"
    );
    assert!(seen[0].1 != seen[1].1 && seen[1].1 != seen[2].1);
    assert_eq!(g.execute().unwrap(), vec![(3.0,); 3]);
    assert_eq!(counts.stages.load(SeqCst), 3);
}

#[test]
fn a_rank_that_cannot_attach_fails_the_launch_with_its_error() {
    let b = backend(Some(1));
    let counts = Arc::clone(&b.counts);
    let err = Sum::launch((0..3).map(|_| Worker).collect::<Vec<_>>(), b)
        .err()
        .unwrap();
    assert!(
        matches!(&err, Error::Backend(m) if m == "rank 1 has no device"),
        "{err}"
    );
    assert_eq!(counts.stages.load(SeqCst), 0, "no stage ran");
}

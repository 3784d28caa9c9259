//! `Communicator::attach`: every rank attaches on its own thread before its first step,
//! and a launch fails, with the rank's error, if any rank cannot.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use actorgraph::comm::{AbortHandle, Collective, CpuComm, Header, RegionMut, StageError};
use actorgraph::prelude::*;
use actorgraph::{Backend, Communicator};

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

/// CPU endpoints that record the thread they were attached on, and fail to attach on
/// `fail_rank`.
struct Attaching {
    fail_rank: Option<usize>,
    attached: Arc<Mutex<Vec<(usize, ThreadId)>>>,
    steps: Arc<AtomicUsize>,
}

struct AttachingComm {
    inner: CpuComm,
    fail: bool,
    attached: Arc<Mutex<Vec<(usize, ThreadId)>>>,
    steps: Arc<AtomicUsize>,
}

impl Communicator for AttachingComm {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn stage(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        regions: &mut [RegionMut<'_>],
        outputs: &mut [RegionMut<'_>],
    ) -> Result<(), StageError> {
        self.steps.fetch_add(1, SeqCst);
        self.inner.stage(header, collective, regions, outputs)
    }
    fn abort_handle(&self) -> AbortHandle {
        self.inner.abort_handle()
    }
    fn attach(&mut self) -> Result<(), Error> {
        if self.fail {
            return Err(Error::Backend(format!(
                "rank {} has no device",
                self.rank()
            )));
        }
        let me = (self.rank(), std::thread::current().id());
        self.attached.lock().unwrap().push(me);
        Ok(())
    }
}

impl Backend for Attaching {
    type Comm = AttachingComm;
    fn communicators(&self, size: usize) -> Result<Vec<AttachingComm>, Error> {
        Ok(Cpu
            .communicators(size)?
            .into_iter()
            .enumerate()
            .map(|(rank, inner)| AttachingComm {
                inner,
                fail: self.fail_rank == Some(rank),
                attached: Arc::clone(&self.attached),
                steps: Arc::clone(&self.steps),
            })
            .collect())
    }
}

fn backend(fail_rank: Option<usize>) -> Attaching {
    Attaching {
        fail_rank,
        attached: Arc::default(),
        steps: Arc::default(),
    }
}

#[test]
fn every_rank_attaches_on_its_own_thread_before_launch_returns() {
    let b = backend(None);
    let (attached, steps) = (Arc::clone(&b.attached), Arc::clone(&b.steps));
    let mut g = Sum::launch((0..3).map(|_| Worker).collect::<Vec<_>>(), b).unwrap();
    let mut seen = attached.lock().unwrap().clone();
    seen.sort_by_key(|&(rank, _)| rank);
    assert_eq!(seen.iter().map(|&(r, _)| r).collect::<Vec<_>>(), [0, 1, 2]);
    let me = std::thread::current().id();
    assert!(
        seen.iter().all(|&(_, t)| t != me),
        "attached on the caller's thread"
    );
    assert!(seen[0].1 != seen[1].1 && seen[1].1 != seen[2].1);
    assert_eq!(g.execute().unwrap(), vec![(3.0,); 3]);
    assert_eq!(steps.load(SeqCst), 3);
}

#[test]
fn a_rank_that_cannot_attach_fails_the_launch_with_its_error() {
    let b = backend(Some(1));
    let steps = Arc::clone(&b.steps);
    let err = Sum::launch((0..3).map(|_| Worker).collect::<Vec<_>>(), b)
        .err()
        .unwrap();
    assert!(
        matches!(&err, Error::Backend(m) if m == "rank 1 has no device"),
        "{err}"
    );
    assert_eq!(steps.load(SeqCst), 0, "no stage ran");
}

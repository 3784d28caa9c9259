//! Model checks of the synchronization, run by `.ci/run` with `RUSTFLAGS="--cfg loom"`:
//! every interleaving of the driver <-> actor handoff, the barrier, its posts (rewritten
//! only once every peer has read them), and its abort (the same outcome for every party).
//! The CPU collective built on them has its own models (`comm/loom_tests.rs`).

use std::sync::Arc;

use loom::cell::UnsafeCell;
use loom::sync::atomic::Ordering::Relaxed;
use loom::thread;

use super::{Barrier, Cells, Epoch, Jobs};

#[test]
fn loom_handoff_carries_data_both_ways() {
    loom::model(|| {
        let go = Arc::new(Epoch::new());
        let done = Arc::new(Epoch::new());
        let cell = Arc::new(UnsafeCell::new(0u32));
        let actor = {
            let (go, done, cell) = (go.clone(), done.clone(), cell.clone());
            thread::spawn(move || {
                go.wait_past(0, None).unwrap();
                // SAFETY: a live cell, which the driver wrote before `go` and does not
                // touch again before `done`: this thread alone accesses it meanwhile
                // (what the model checks).
                let v = cell.with(|p| unsafe { *p });
                // SAFETY: as above.
                cell.with_mut(|p| unsafe { *p = v + 1 });
                done.advance();
            })
        };
        // SAFETY: a live cell, which the actor touches only after `go`.
        cell.with_mut(|p| unsafe { *p = 41 });
        go.advance();
        done.wait_past(0, None).unwrap();
        // SAFETY: a live cell, which the actor no longer touches after `done`.
        assert_eq!(cell.with(|p| unsafe { *p }), 42);
        actor.join().unwrap();
    });
}

/// The driver <-> actor handoff as `exec::handoff::Slot` runs it: execution `e`'s input and output
/// in the cells of `e`, one cell each way (one execution in flight), two executions; the
/// step finds its index in the `done` count. Loom checks every access to the cells
/// against the epochs' ordering.
#[test]
fn loom_cells_carry_each_execution_in_its_turn() {
    loom::model(|| {
        struct Handoff {
            go: Epoch,
            done: Epoch,
            inputs: Cells<u32>,
            outputs: Cells<u32>,
        }
        let h = Arc::new(Handoff {
            go: Epoch::new(),
            done: Epoch::new(),
            inputs: Cells::new(1),
            outputs: Cells::new(1),
        });
        let actor = {
            let h = h.clone();
            thread::spawn(move || {
                for started in 0..2 {
                    h.go.wait_past(started, None).unwrap();
                    let step = h.done.current();
                    // SAFETY: the driver put this input before the `go` advance just seen,
                    // and puts into the cell again only after collecting this step.
                    let input = unsafe { h.inputs.take(step) }.unwrap();
                    // SAFETY: the driver took the cell's last output before it submitted
                    // this step, and takes this one only after the `done` advance.
                    unsafe { h.outputs.put(step, input * 10) };
                    h.done.advance();
                }
            })
        };
        let mut collected = Vec::new();
        for execution in 0..2u64 {
            if execution == 1 {
                // The cell is free once execution 0 is collected.
                h.done.wait_past(0, None).unwrap();
                // SAFETY: put before the `done` advance just seen.
                collected.extend(unsafe { h.outputs.take(0) });
            }
            // SAFETY: the step that took this cell's last input published it first.
            unsafe { h.inputs.put(execution, execution as u32 + 1) };
            h.go.advance();
        }
        while h.done.current() < 2 {
            h.done.wait_past(1, None).unwrap();
        }
        // SAFETY: put before the `done` advance just seen.
        collected.extend(unsafe { h.outputs.take(1) });
        assert_eq!(collected, vec![10, 20]);
        actor.join().unwrap();
    });
}

#[test]
fn loom_barrier_orders_writes_before_reads() {
    loom::model(|| {
        let barrier = Arc::new(Barrier::<()>::new(2));
        let data: Arc<[loom::sync::atomic::AtomicUsize; 2]> = Arc::new([
            loom::sync::atomic::AtomicUsize::new(0),
            loom::sync::atomic::AtomicUsize::new(0),
        ]);
        let threads: Vec<_> = (0..2)
            .map(|me| {
                let (barrier, data) = (barrier.clone(), data.clone());
                thread::spawn(move || {
                    data[me].store(me + 1, Relaxed);
                    barrier.wait(me).unwrap();
                    assert_eq!(data[1 - me].load(Relaxed), 2 - me);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    });
}

#[test]
fn loom_barrier_abort_releases_a_waiter() {
    loom::model(|| {
        let barrier = Arc::new(Barrier::<()>::new(2));
        let b = barrier.clone();
        let waiter = thread::spawn(move || b.wait(0));
        barrier.abort();
        assert!(waiter.join().unwrap().is_err());
    });
}

#[test]
fn loom_barrier_abort_gives_every_party_the_same_outcome() {
    loom::model(|| {
        let barrier = Arc::new(Barrier::<()>::new(2));
        let parties: Vec<_> = (0..2)
            .map(|me| {
                let b = barrier.clone();
                thread::spawn(move || b.wait(me).is_ok())
            })
            .collect();
        barrier.abort();
        let passed: Vec<bool> = parties.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(
            passed[0], passed[1],
            "one party passed while the other gave up"
        );
    });
}

#[test]
fn loom_wait_all_ignores_an_abort_and_orders_writes() {
    loom::model(|| {
        let barrier = Arc::new(Barrier::<()>::new(2));
        let data: Arc<[loom::sync::atomic::AtomicUsize; 2]> = Arc::new([
            loom::sync::atomic::AtomicUsize::new(0),
            loom::sync::atomic::AtomicUsize::new(0),
        ]);
        let parties: Vec<_> = (0..2)
            .map(|me| {
                let (barrier, data) = (barrier.clone(), data.clone());
                thread::spawn(move || {
                    data[me].store(me + 1, Relaxed);
                    barrier.wait_all(me);
                    assert_eq!(data[1 - me].load(Relaxed), 2 - me);
                })
            })
            .collect();
        barrier.abort();
        for t in parties {
            t.join().unwrap();
        }
    });
}

/// A post the model reads and writes through loom's cell, which fails the model on any
/// access that overlaps a write.
#[derive(Default)]
struct Post(UnsafeCell<usize>);

// SAFETY: the model checks that the barrier's rounds order every access (see below).
unsafe impl Sync for Post {}

#[test]
fn loom_barrier_posts_are_rewritten_only_after_every_peer_read_them() {
    // Bounded: three rounds of two parties have too many interleavings to visit them all.
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        // Three rounds: the third writes the posts of the first again.
        const ROUNDS: usize = 3;
        let barrier = Arc::new(Barrier::<Post>::new(2));
        let parties: Vec<_> = (0..2)
            .map(|me| {
                let barrier = barrier.clone();
                thread::spawn(move || {
                    for round in 0..ROUNDS {
                        let r = barrier.generation(me);
                        // SAFETY: checked by the model.
                        barrier
                            .post(me, r)
                            .0
                            .with_mut(|p| unsafe { *p = 10 * me + round });
                        barrier.wait(me).unwrap();
                        let peer = 1 - me;
                        // SAFETY: checked by the model.
                        let seen = barrier.post(peer, r).0.with(|p| unsafe { *p });
                        assert_eq!(seen, 10 * peer + round);
                    }
                })
            })
            .collect();
        for t in parties {
            t.join().unwrap();
        }
    });
}

/// A job of two ranks: each writes its input, the worker sums them.
#[derive(Default)]
struct Job {
    inputs: [u32; 2],
    sum: u32,
}

/// Two ranks post a job and read it while a worker runs it: the worker runs it only once
/// both have posted, and both read its result, whatever the interleaving.
#[test]
fn loom_a_job_runs_once_every_rank_posted_and_every_rank_reads_it() {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        let jobs = Arc::new(Jobs::<Job>::new(2));
        let worker = {
            let jobs = jobs.clone();
            thread::spawn(move || {
                if let Some((seq, mut job)) = jobs.next() {
                    job.sum = job.inputs.iter().sum();
                    jobs.ran(seq, job);
                }
            })
        };
        let other = {
            let jobs = jobs.clone();
            thread::spawn(move || {
                jobs.post(0, |j| j.inputs[1] = 20);
                jobs.read(0, || false, |j| j.sum)
            })
        };
        jobs.post(0, |j| j.inputs[0] = 10);
        assert_eq!(jobs.read(0, || false, |j| j.sum), Some(30));
        assert_eq!(other.join().unwrap(), Some(30));
        worker.join().unwrap();
    });
}

/// A rank posts two jobs before it reads the first: the worker runs them in order, each
/// is read once run, and a job read by every rank is reused for the next.
#[test]
fn loom_jobs_posted_ahead_run_in_order_and_are_reused() {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        let jobs = Arc::new(Jobs::<Job>::new(1));
        let worker = {
            let jobs = jobs.clone();
            thread::spawn(move || {
                while let Some((seq, mut job)) = jobs.next() {
                    job.sum += job.inputs[0] + seq as u32 * 100;
                    jobs.ran(seq, job);
                }
            })
        };
        jobs.post(0, |j| j.inputs[0] = 1);
        jobs.post(1, |j| j.inputs[0] = 2);
        assert_eq!(jobs.read(0, || false, |j| j.sum), Some(1));
        assert_eq!(jobs.read(1, || false, |j| j.sum), Some(102));
        // Job 1's box, the last one read, is job 2's: its old sum is still there.
        jobs.post(2, |j| j.inputs[0] = 3);
        assert_eq!(jobs.read(2, || false, |j| j.sum), Some(102 + 3 + 200));
        jobs.stop();
        worker.join().unwrap();
    });
}

/// A rank that waits for a job whose other rank never posts gives up when told, and the
/// worker stops: nothing hangs.
#[test]
fn loom_a_read_gives_up_on_stop_and_the_worker_ends() {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        let jobs = Arc::new(Jobs::<Job>::new(2));
        let stop = Arc::new(loom::sync::atomic::AtomicBool::new(false));
        let worker = {
            let jobs = jobs.clone();
            thread::spawn(move || while jobs.next().is_some() {})
        };
        let aborter = {
            let (jobs, stop) = (jobs.clone(), stop.clone());
            thread::spawn(move || {
                stop.store(true, Relaxed);
                jobs.ring();
            })
        };
        jobs.post(0, |j| j.inputs[0] = 1);
        assert_eq!(jobs.read(0, || stop.load(Relaxed), |j| j.sum), None);
        aborter.join().unwrap();
        jobs.stop();
        worker.join().unwrap();
    });
}

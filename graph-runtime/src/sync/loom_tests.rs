//! Model checks of the synchronization, run by `.ci/run` with `RUSTFLAGS="--cfg loom"`:
//! every interleaving of the driver <-> actor handoff, the barrier, its abort (the same
//! outcome for every party), and the call check and header agreement of a CPU collective.

use std::sync::Arc;

use loom::cell::UnsafeCell;
use loom::sync::atomic::Ordering::Relaxed;
use loom::thread;

use super::{Barrier, Epoch};
use crate::comm::{
    Backend, Call, Collective, Communicator, Disagreement, Header, SlotData, SlotDesc, StageError,
    Status,
};
use crate::{Cpu, DType, Element, ReduceOp};

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

#[test]
fn loom_barrier_orders_writes_before_reads() {
    loom::model(|| {
        let barrier = Arc::new(Barrier::new(2));
        let data: Arc<[loom::sync::atomic::AtomicUsize; 2]> = Arc::new([
            loom::sync::atomic::AtomicUsize::new(0),
            loom::sync::atomic::AtomicUsize::new(0),
        ]);
        let threads: Vec<_> = (0..2)
            .map(|me| {
                let (barrier, data) = (barrier.clone(), data.clone());
                thread::spawn(move || {
                    data[me].store(me + 1, Relaxed);
                    barrier.wait().unwrap();
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
        let barrier = Arc::new(Barrier::new(2));
        let b = barrier.clone();
        let waiter = thread::spawn(move || b.wait());
        barrier.abort();
        assert!(waiter.join().unwrap().is_err());
    });
}

#[test]
fn loom_barrier_abort_gives_every_party_the_same_outcome() {
    loom::model(|| {
        let barrier = Arc::new(Barrier::new(2));
        let parties: Vec<_> = (0..2)
            .map(|_| {
                let b = barrier.clone();
                thread::spawn(move || b.wait().is_ok())
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
        let barrier = Arc::new(Barrier::new(2));
        let data: Arc<[loom::sync::atomic::AtomicUsize; 2]> = Arc::new([
            loom::sync::atomic::AtomicUsize::new(0),
            loom::sync::atomic::AtomicUsize::new(0),
        ]);
        let parties: Vec<_> = (0..2)
            .map(|me| {
                let (barrier, data) = (barrier.clone(), data.clone());
                thread::spawn(move || {
                    data[me].store(me + 1, Relaxed);
                    barrier.wait_all();
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

/// Two ranks run one stage; `lens[r]` is rank r's element count.
fn stage_pair(lens: [usize; 2], fail: [bool; 2]) -> Vec<(Result<(), StageError>, Vec<f32>)> {
    let comms = Cpu.communicators(2).unwrap();
    let threads: Vec<_> = comms
        .into_iter()
        .enumerate()
        .map(|(rank, mut comm)| {
            thread::spawn(move || {
                let mut data = vec![(rank + 1) as f32; lens[rank]];
                let slots = [SlotDesc::flat(DType::F32, data.len())];
                let input = data.clone();
                let input_data = [SlotData::new(&input[..])];
                let header = Header {
                    status: if fail[rank] {
                        Status::Failed
                    } else {
                        Status::Ok
                    },
                    slots: &slots,
                    dims: &[],
                    data: &input_data,
                };
                let mut regions = [f32::region_mut(&mut data)];
                let sum = Collective::AllReduce(ReduceOp::Sum);
                let r = comm.stage(&header, sum, &mut regions, &mut []);
                (r, data)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn loom_agreed_headers_run_the_payload() {
    // Three barrier epochs and the payload between them: unbounded, the state space does
    // not finish in CI time; four preemptions cover every ordering of the phases.
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(4);
    model.check(|| {
        for (r, data) in stage_pair([2, 2], [false, false]) {
            assert!(r.is_ok());
            assert_eq!(data, vec![3.0, 3.0]);
        }
    });
}

#[test]
fn loom_different_lengths_skip_the_payload_on_both_ranks() {
    loom::model(|| {
        for (rank, (r, data)) in stage_pair([1, 2], [false, false]).into_iter().enumerate() {
            assert!(matches!(
                r,
                Err(StageError::Disagreed(Disagreement::Slot { slot: 0, .. }))
            ));
            assert!(data.iter().all(|&x| x == (rank + 1) as f32));
        }
    });
}

#[test]
fn loom_a_failed_rank_makes_both_skip() {
    loom::model(|| {
        for (r, _) in stage_pair([2, 2], [false, true]) {
            assert!(matches!(
                r,
                Err(StageError::Disagreed(Disagreement::Failed { rank: 1 }))
            ));
        }
    });
}

#[test]
fn loom_different_collectives_stop_both_ranks_before_any_read() {
    // Rank 0 reduces while rank 1 broadcasts: under every interleaving both see that the
    // calls differ and return before touching a peer's memory.
    loom::model(|| {
        let comms = Cpu.communicators(2).unwrap();
        let collectives = [
            Collective::AllReduce(ReduceOp::Sum),
            Collective::Broadcast { root: 1 },
        ];
        let threads: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, mut comm)| {
                thread::spawn(move || {
                    let mut data = vec![(rank + 1) as f32; 2];
                    let input = data.clone();
                    let slots = [SlotDesc::flat(DType::F32, 2)];
                    let header = Header {
                        status: Status::Ok,
                        slots: &slots,
                        dims: &[],
                        data: &[SlotData::new(&input[..])],
                    };
                    let mut regions = [f32::region_mut(&mut data)];
                    let r = comm.stage(&header, collectives[rank], &mut regions, &mut []);
                    (r, data)
                })
            })
            .collect();
        for (rank, t) in threads.into_iter().enumerate() {
            let (r, data) = t.join().unwrap();
            match r {
                Err(StageError::Disagreed(Disagreement::Calls { calls })) => {
                    assert_eq!(calls, collectives.map(|c| Some(Call::Stage(c))))
                }
                other => panic!("expected the calls to disagree, got {other:?}"),
            }
            assert_eq!(data, vec![(rank + 1) as f32; 2]);
        }
    });
}

//! Model checks of the CPU communicator, run by `.ci/run` with `RUSTFLAGS="--cfg loom"`:
//! under every interleaving, the call check and the header agreement of two ranks reach
//! the same verdict, and a rank reads a peer's memory only after both agreed; the eager
//! path's copies are never read while rewritten; and the two-epoch stages (an `allgather`
//! and a `reducescatter` over two ranks) finish with the right results, reading the
//! peers' inputs only while they are alive and unchanged.

use loom::thread;

use crate::comm::{
    Backend, Call, Collective, Communicator, Disagreement, Header, SlotData, SlotDesc, StageError,
    Status,
};
use crate::{Cpu, DType, Element, ReduceOp};

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

/// Two ranks run `rounds` allreduces of one f32 each (eager under loom: see
/// `EAGER_BYTES`), rank r's value in round i being `r + 1 + 10 * i`; each rank's results.
fn eager_rounds(rounds: usize) -> Vec<Vec<Result<f32, StageError>>> {
    let comms = Cpu.communicators(2).unwrap();
    let threads: Vec<_> = comms
        .into_iter()
        .enumerate()
        .map(|(rank, mut comm)| {
            thread::spawn(move || {
                (0..rounds)
                    .map(|i| {
                        let mut data = vec![(rank + 1 + 10 * i) as f32];
                        let slots = [SlotDesc::flat(DType::F32, 1)];
                        let input = data.clone();
                        let header = Header {
                            status: Status::Ok,
                            slots: &slots,
                            dims: &[],
                            data: &[SlotData::new(&input[..])],
                        };
                        let mut regions = [f32::region_mut(&mut data)];
                        let sum = Collective::AllReduce(ReduceOp::Sum);
                        comm.stage(&header, sum, &mut regions, &mut [])
                            .map(|()| data[0])
                    })
                    .collect()
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// The eager path's one barrier per stage: a rank that returns at once and writes its
/// copy for the next stage never races with a peer still reading the copy of this one
/// (loom checks every access to the copies), and both ranks get both sums.
#[test]
fn loom_eager_allreduces_back_to_back() {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        for results in eager_rounds(2) {
            let sums: Vec<f32> = results.into_iter().map(Result::unwrap).collect();
            assert_eq!(sums, vec![3.0, 23.0]);
        }
    });
}

/// A rank with a one-element value (eager) and one with none (eager too): both refuse.
#[test]
fn loom_eager_different_lengths_skip_the_payload_on_both_ranks() {
    loom::model(|| {
        for (rank, (r, data)) in stage_pair([1, 0], [false, false]).into_iter().enumerate() {
            assert!(matches!(
                r,
                Err(StageError::Disagreed(Disagreement::Slot { slot: 0, .. }))
            ));
            assert!(data.iter().all(|&x| x == (rank + 1) as f32));
        }
    });
}

/// Two elements each: the two-barrier path (above `EAGER_BYTES` under loom).
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

/// One element against two: rank 0 would run eagerly, rank 1 not; both take the
/// two-barrier path and refuse alike.
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

/// Two ranks run one stage with outputs: rank r's input is `[r + 1; 2]`.
fn output_pair(collective: Collective) -> Vec<(Result<(), StageError>, Vec<u32>)> {
    let comms = Cpu.communicators(2).unwrap();
    let threads: Vec<_> = comms
        .into_iter()
        .enumerate()
        .map(|(rank, mut comm)| {
            thread::spawn(move || {
                let mut input = vec![rank as u32 + 1; 2];
                let out_len = collective.output_len(2, 2).unwrap();
                let mut output = vec![0u32; out_len];
                let slots = [SlotDesc::flat(DType::U32, 2)];
                let values = input.clone();
                let data = [SlotData::new(&values[..])];
                let header = Header {
                    status: Status::Ok,
                    slots: &slots,
                    dims: &[],
                    data: &data,
                };
                let mut regions = [u32::region_mut(&mut input)];
                let mut outputs = [u32::region_mut(&mut output)];
                let r = comm.stage(&header, collective, &mut regions, &mut outputs);
                (r, output)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Unbounded, each model takes about 15 s on CI's two cores; with at most three
/// preemptions it still interleaves the two ranks' phases (post, barrier, copy,
/// barrier) every way, in a few seconds.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(f);
}

#[test]
fn loom_allgather_gathers_in_rank_order() {
    model(|| {
        for (r, out) in output_pair(Collective::AllGather) {
            assert!(r.is_ok());
            assert_eq!(out, vec![1, 1, 2, 2]);
        }
    });
}

#[test]
fn loom_reducescatter_gives_each_rank_its_chunk() {
    model(|| {
        for (r, out) in output_pair(Collective::ReduceScatter(ReduceOp::Sum)) {
            assert!(r.is_ok());
            assert_eq!(out, vec![3]);
        }
    });
}

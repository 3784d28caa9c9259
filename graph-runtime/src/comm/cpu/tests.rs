//! The communicator's stages end to end, on threads: results against the reference
//! kernels, every collective, refusals, and the eager path on either side of its limits.

use super::plan::{EAGER_BYTES, EAGER_BYTES_CROWDED};
use super::post::{decode, encode};
use super::*;
use crate::comm::reduce::{reduce_reference, BLOCK};
use crate::comm::{SlotData, SlotDesc};
use crate::{DType, Element, ReduceOp};

/// Runs one in-place stage over `inputs[rank]` on `inputs.len()` threads.
fn run<E: Element>(inputs: Vec<Vec<E>>, collective: Collective) -> Vec<Vec<E>> {
    let comms = Cpu.communicators(inputs.len()).unwrap();
    let threads: Vec<_> = comms
        .into_iter()
        .zip(inputs)
        .map(|(mut comm, mut data)| {
            std::thread::spawn(move || {
                let slots = [SlotDesc::flat(E::DTYPE, data.len())];
                // The communicator reads the inputs in place and writes the results
                // into the region: here a copy of the same values.
                let input = data.clone();
                let header = Header {
                    status: Status::Ok,
                    slots: &slots,
                    dims: &[],
                    data: &[SlotData::new(&input[..])],
                };
                let mut regions = [E::region_mut(&mut data)];
                let regions = if slots[0].len == 0 {
                    &mut regions[..0]
                } else {
                    &mut regions[..]
                };
                comm.stage(&header, collective, regions, &mut []).unwrap();
                data
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn matches_the_reference_bit_for_bit() {
    // Under Miri, one rank (a path of its own) and a few.
    let ranks: &[usize] = if cfg!(miri) { &[1, 3] } else { &[1, 2, 3, 5] };
    for &n in ranks {
        for len in [0, 1, 7, BLOCK + 3, 3 * BLOCK] {
            let inputs: Vec<Vec<f32>> = (0..n)
                .map(|r| {
                    (0..len)
                        .map(|i| ((i * 7 + r * 13) % 17) as f32 * 0.37)
                        .collect()
                })
                .collect();
            for op in ReduceOp::ALL {
                let srcs: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
                let want = reduce_reference(&srcs, op);
                for got in run(inputs.clone(), Collective::AllReduce(op)) {
                    let got: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
                    let want: Vec<u32> = want.iter().map(|x| x.to_bits()).collect();
                    assert_eq!(got, want, "n={n} len={len} op={op:?}");
                }
                let reduced = run(inputs.clone(), Collective::Reduce { op, root: n - 1 });
                assert_eq!(reduced[n - 1], want, "reduce n={n} len={len} op={op:?}");
            }
        }
    }
}

#[test]
fn broadcast_copies_the_root_everywhere() {
    let inputs: Vec<Vec<u8>> = (0..4).map(|r| vec![r as u8; 5]).collect();
    for got in run(inputs, Collective::Broadcast { root: 2 }) {
        assert_eq!(got, vec![2u8; 5]);
    }
}

#[test]
fn a_root_out_of_range_is_refused_on_every_rank() {
    let comms = Cpu.communicators(2).unwrap();
    let threads: Vec<_> = comms
        .into_iter()
        .map(|mut comm| {
            std::thread::spawn(move || {
                let header = Header {
                    status: Status::Ok,
                    slots: &[],
                    dims: &[],
                    data: &[],
                };
                comm.stage(&header, Collective::Broadcast { root: 2 }, &mut [], &mut [])
            })
        })
        .collect();
    for t in threads {
        match t.join().unwrap() {
            Err(StageError::Disagreed(Disagreement::Root { root: 2, size: 2 })) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn buffers_that_do_not_match_the_slots_are_refused() {
    let comms = Cpu.communicators(1).unwrap();
    for mut comm in comms {
        let mut data = vec![1.0f64; 3];
        let slots = [SlotDesc::flat(DType::F64, 4)];
        let input = [1.0f64; 4];
        let header = Header {
            status: Status::Ok,
            slots: &slots,
            dims: &[],
            data: &[SlotData::new(&input[..])],
        };
        let mut regions = [f64::region_mut(&mut data)];
        let r = comm.stage(&header, Collective::AllGather, &mut regions, &mut []);
        assert!(matches!(
            r,
            Err(StageError::Disagreed(Disagreement::Buffers { .. }))
        ));
    }
}

#[test]
fn mismatched_lengths_are_refused_on_every_rank() {
    let comms = Cpu.communicators(2).unwrap();
    let threads: Vec<_> = comms
        .into_iter()
        .enumerate()
        .map(|(rank, mut comm)| {
            std::thread::spawn(move || {
                let mut data = vec![1i64; 10 * (rank + 1)];
                let slots = [SlotDesc::flat(DType::I64, data.len())];
                let input = data.clone();
                let header = Header {
                    status: Status::Ok,
                    slots: &slots,
                    dims: &[],
                    data: &[SlotData::new(&input[..])],
                };
                let mut regions = [i64::region_mut(&mut data)];
                let r = comm.stage(
                    &header,
                    Collective::AllReduce(ReduceOp::Sum),
                    &mut regions,
                    &mut [],
                );
                (r, data)
            })
        })
        .collect();
    for t in threads {
        let (r, data) = t.join().unwrap();
        match r {
            Err(StageError::Disagreed(Disagreement::Slot {
                slot: 0, counts, ..
            })) => {
                assert_eq!(counts, vec![(DType::I64, 10), (DType::I64, 20)])
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(data.iter().all(|&x| x == 1), "payload must not run");
    }
}

/// Runs `rounds` in-place f64 allreduces on `lens.len()` threads, rank r's
/// `lens[r]` elements in round i being `r + i + k / 8` (k the element's index), rank
/// r failing `fail[r]` rounds' stages; each rank's results.
fn allreduce_rounds(
    lens: &[usize],
    fail: &[Option<usize>],
    rounds: usize,
) -> Vec<Vec<Result<Vec<f64>, StageError>>> {
    let comms = Cpu.communicators(lens.len()).unwrap();
    let threads: Vec<_> = comms
        .into_iter()
        .enumerate()
        .map(|(rank, mut comm)| {
            let (len, fail) = (lens[rank], fail[rank]);
            std::thread::spawn(move || {
                (0..rounds)
                    .map(|i| {
                        let mut data: Vec<f64> = (0..len)
                            .map(|k| (rank + i) as f64 + k as f64 / 8.0)
                            .collect();
                        let slots = [SlotDesc::flat(DType::F64, len)];
                        let input = data.clone();
                        let values = [SlotData::new(&input[..])];
                        let header = match fail == Some(i) {
                            true => Header::FAILED,
                            false => Header {
                                status: Status::Ok,
                                slots: &slots,
                                dims: &[],
                                data: &values,
                            },
                        };
                        let mut regions = [f64::region_mut(&mut data)];
                        let sum = Collective::AllReduce(ReduceOp::Sum);
                        comm.stage(&header, sum, &mut regions, &mut [])
                            .map(|()| data)
                    })
                    .collect()
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// The largest eager allreduce of `n` ranks, in f64 elements.
fn eager_len(n: usize) -> usize {
    Cpu.communicators(n).unwrap()[0].caps().eager_bytes() / 8
}

/// Small allreduces (one barrier each, see `Eager`) back to back give every rank
/// every round's sum, on either side of the size limit, with as many ranks as the
/// cores or fewer and with more.
#[test]
fn eager_allreduces_back_to_back() {
    let rounds = if cfg!(miri) { 3 } else { 200 };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut sizes = vec![2, 3, cores + 1];
    sizes.sort_unstable();
    sizes.dedup();
    for n in sizes {
        let eager = eager_len(n);
        for len in [1, eager, eager + 1] {
            let results = allreduce_rounds(&vec![len; n], &vec![None; n], rounds);
            for rank in results {
                for (i, got) in rank.into_iter().enumerate() {
                    let want: Vec<f64> = (0..len)
                        .map(|k| (0..n).map(|r| (r + i) as f64 + k as f64 / 8.0).sum())
                        .collect();
                    assert_eq!(got.unwrap(), want, "len={len} n={n} round={i}");
                }
            }
        }
    }
}

/// Ranks that outnumber the cores run larger allreduces eagerly, and only then.
#[test]
fn crowded_ranks_run_larger_allreduces_eagerly() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(eager_len(cores) * 8, EAGER_BYTES);
    assert_eq!(eager_len(cores + 1) * 8, EAGER_BYTES_CROWDED);
}

/// One rank's value is small enough for one barrier and the other's is not: both
/// ranks refuse with the same error, and the communicator still works.
#[test]
fn an_eager_and_a_two_barrier_rank_refuse_alike() {
    let big = eager_len(2) + 1;
    let results = allreduce_rounds(&[1, big], &[None, None], 1);
    for rank in &results {
        match &rank[0] {
            Err(StageError::Disagreed(Disagreement::Slot {
                slot: 0, counts, ..
            })) => {
                assert_eq!(counts, &vec![(DType::F64, 1), (DType::F64, big)])
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// A rank that failed joins a small allreduce with an empty copy: every rank skips
/// it as failed, and the next round runs.
#[test]
fn a_failed_rank_skips_an_eager_allreduce_on_every_rank() {
    for n in [2, 3] {
        let mut fail = vec![None; n];
        fail[1] = Some(0);
        for rank in allreduce_rounds(&vec![2; n], &fail, 2) {
            assert!(
                matches!(
                    rank[0],
                    Err(StageError::Disagreed(Disagreement::Failed { rank: 1 }))
                ),
                "{:?}",
                rank[0]
            );
            let sum: f64 = (0..n).map(|r| (r + 1) as f64).sum();
            assert_eq!(
                rank[1].as_ref().unwrap(),
                &vec![sum, sum + 0.125 * n as f64]
            );
        }
    }
}

/// A rank that failed before it knew its stage joins it with a collective of its
/// own: the others skip the stage because it failed, not because the calls differ.
#[test]
fn a_failed_rank_joins_with_any_collective() {
    let comms = Cpu.communicators(2).unwrap();
    let threads: Vec<_> = comms
        .into_iter()
        .enumerate()
        .map(|(rank, mut comm)| {
            std::thread::spawn(move || {
                let (mut data, input) = (vec![1u8; 3], [1u8; 3]);
                let slots = [SlotDesc::flat(DType::U8, 3)];
                let values = [SlotData::new(&input[..])];
                let (status, slots, values, collective) = match rank {
                    0 => (Status::Ok, &slots[..], &values[..], Collective::AllGather),
                    _ => (
                        Status::Failed,
                        &[][..],
                        &[][..],
                        Collective::Broadcast { root: 0 },
                    ),
                };
                let header = Header {
                    status,
                    slots,
                    dims: &[],
                    data: values,
                };
                let mut out = vec![0u8; 6];
                let (mut regions, mut outputs) =
                    ([u8::region_mut(&mut data)], [u8::region_mut(&mut out)]);
                let (regions, outputs) = match rank {
                    0 => (&mut regions[..], &mut outputs[..]),
                    _ => (&mut regions[..0], &mut outputs[..0]),
                };
                let first = comm.stage(&header, collective, regions, outputs);
                // The communicator is not broken: the next stage runs.
                let ok = Header {
                    status: Status::Ok,
                    slots: &[],
                    dims: &[],
                    data: &[],
                };
                (
                    first,
                    comm.stage(&ok, Collective::AllGather, &mut [], &mut []),
                )
            })
        })
        .collect();
    for t in threads {
        let (first, second) = t.join().unwrap();
        assert!(
            matches!(
                first,
                Err(StageError::Disagreed(Disagreement::Failed { rank: 1 }))
            ),
            "{first:?}"
        );
        assert!(second.is_ok(), "{second:?}");
    }
}

#[test]
fn every_call_decodes_to_itself() {
    let mut calls = vec![
        Call::ExchangeResults,
        Call::Launched,
        Call::Stage(Collective::AllGather),
    ];
    for op in ReduceOp::ALL {
        calls.push(Call::Stage(Collective::AllReduce(op)));
        calls.push(Call::Stage(Collective::ReduceScatter(op)));
        calls.push(Call::Stage(Collective::Reduce {
            op,
            root: usize::MAX,
        }));
    }
    calls.push(Call::Stage(Collective::Broadcast { root: 7 }));
    for call in calls {
        let (code, root) = encode(call);
        assert_eq!(decode(code, root), Some(call));
    }
    assert_eq!(decode(0, 0), None, "a post never written");
}

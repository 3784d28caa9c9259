//! Property tests of the fused stage over the CPU communicator, one per collective: random
//! actor counts (1-8), bucket sizes (1-12 values), lengths (0-5000, multiples of N for
//! `reducescatter`), dtypes (mixed in one bucket) and ops; every value's result on every
//! rank equals what a naive reference, written here one element at a time, gives for that
//! value alone. A deterministic test then runs every collective x dtype x op once.
//!
//! Floats are compared bit for bit: the communicator reduces each element once, in rank
//! order, in the element's accumulator, exactly like the reference, so there is no
//! tolerance to document.

use proptest::prelude::*;

use super::{FusedStage, SlotIdx};
use crate::comm::reduce::BLOCK;
use crate::comm::{reduce_reference, Backend, Collective, CpuComm};
use crate::{Cpu, DType, Element, ReduceOp, Tensor};

macro_rules! any_tensor {
    ($($d:ident: $t:ty [$($info:tt)*]),*) => {
        /// A tensor of any dtype, so one bucket can mix them.
        #[derive(Clone, Debug)]
        enum AnyTensor {
            $($d(Tensor<$t>),)*
        }

        fn any_tensor(dtype: DType, seed: u64, rank: usize, slot: usize, len: usize) -> AnyTensor {
            match dtype {
                $(DType::$d => AnyTensor::$d(make(seed, rank, slot, len)),)*
            }
        }

        /// The reference for slot `k`, given every rank's value for it.
        fn reference_any(per_rank: &[AnyTensor], rank: usize, collective: Collective) -> Got {
            match &per_rank[0] {
                $(AnyTensor::$d(_) => {
                    let slices: Vec<&[$t]> = per_rank
                        .iter()
                        .map(|v| match v {
                            AnyTensor::$d(t) => t.as_slice(),
                            _ => unreachable!("one slot has one dtype on every rank"),
                        })
                        .collect();
                    reference(&slices, rank, collective)
                })*
            }
        }
    };
}
crate::element::for_each_dtype!(any_tensor);

/// Runs `$body` with `$t` bound to the tensor inside `$x`, whatever its dtype.
macro_rules! each {
    // The arms, from `for_each_dtype!` (first: its input would not parse as the other's).
    ((@arms ($x:expr) $t:ident ($body:expr)) $($d:ident: $ty:ty [$($info:tt)*]),*) => {
        match $x {
            $(AnyTensor::$d($t) => $body,)*
        }
    };
    ($x:expr, $t:ident => $body:expr) => {
        crate::element::for_each_dtype!(each, (@arms ($x) $t ($body)))
    };
}

/// Deterministic values in a small range, so that products over 8 ranks stay finite.
trait Gen: Element {
    fn gen(x: u64) -> Self;
    /// The bits, for exact comparison (floats compare by bits, so -0.0 != 0.0 and NaN == NaN).
    fn bits(self) -> u64;
}

macro_rules! gen {
    ($($d:ident: $t:ty [$name:literal, $kind:ident, $doc:literal]),*) => {$(
        impl Gen for $t {
            gen!(@ $kind $t);
        }
    )*};
    (@ float $t:ty) => {
        fn gen(x: u64) -> Self {
            (x % 41) as $t / 10.0 - 2.0
        }
        fn bits(self) -> u64 {
            self.to_bits() as u64
        }
    };
    (@ half $t:ty) => {
        fn gen(x: u64) -> Self {
            <$t>::from_f32((x % 41) as f32 / 10.0 - 2.0)
        }
        fn bits(self) -> u64 {
            self.to_bits() as u64
        }
    };
    (@ int $t:ty) => {
        fn gen(x: u64) -> Self {
            x as $t
        }
        fn bits(self) -> u64 {
            self as u64
        }
    };
}
crate::element::for_each_dtype!(gen);

fn mix(seed: u64, rank: usize, slot: usize, i: usize) -> u64 {
    let mut x = seed ^ ((rank as u64) << 48) ^ ((slot as u64) << 32) ^ i as u64;
    x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 29)
}

fn make<E: Gen>(seed: u64, rank: usize, slot: usize, len: usize) -> Tensor<E> {
    Tensor::from_vec(
        (0..len).map(|i| E::gen(mix(seed, rank, slot, i))).collect(),
        [len],
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn bits<E: Gen>(xs: &[E]) -> Vec<u64> {
    xs.iter().map(|&x| x.bits()).collect()
}

/// One rank's result for one value: `None` where the collective gives this rank nothing.
type Got = Option<Vec<u64>>;

/// One rank's part: build its bucket, run the stage, return each value's result as bits.
fn run_rank(comm: &mut CpuComm, values: &[AnyTensor], collective: Collective) -> Vec<Got> {
    let mut st = FusedStage::new("prop");
    st.begin();
    let slots: Vec<SlotIdx> = values
        .iter()
        .map(|v| match collective {
            Collective::AllGather => each!(v, t => st.add_gather(t)),
            Collective::ReduceScatter(_) => each!(v, t => st.add_scatter(t)),
            _ => each!(v, t => st.add(t)),
        })
        .collect();
    st.prepare();
    // Half the values are lent in place and half packed, so that both ways a value
    // reaches the communicator meet in one bucket (`values` outlives `run`).
    for (k, (v, &s)) in values.iter().zip(&slots).enumerate() {
        if k % 2 == 0 {
            each!(v, t => st.lend(t, s));
        } else {
            each!(v, t => st.pack(t, s));
        }
    }
    st.run(comm, collective, "prop")
        .unwrap_or_else(|e| panic!("{e}"));
    values
        .iter()
        .zip(&slots)
        .map(|(v, &s)| match collective {
            Collective::AllGather => each!(v, t => Some(bits(st.output_gathered(t, s).as_slice()))),
            Collective::ReduceScatter(_) => {
                each!(v, t => Some(bits(st.output_scattered(t, s).as_slice())))
            }
            Collective::Reduce { root, .. } => {
                each!(v, t => st.output_rooted(t, s, root).map(|r| bits(r.as_slice())))
            }
            _ => each!(v, t => Some(bits(st.output(t, s).as_slice()))),
        })
        .collect()
}

/// What `rank` must get for one value, from every rank's input: the naive definition of
/// each collective, on top of the element-by-element `reduce_reference`.
fn reference<E: Gen>(inputs: &[&[E]], rank: usize, collective: Collective) -> Got {
    let n = inputs.len();
    match collective {
        Collective::AllReduce(op) => Some(bits(&reduce_reference(inputs, op))),
        Collective::Reduce { op, root } => {
            (rank == root).then(|| bits(&reduce_reference(inputs, op)))
        }
        Collective::ReduceScatter(op) => {
            let all = reduce_reference(inputs, op);
            let chunk = all.len() / n;
            Some(bits(&all[rank * chunk..(rank + 1) * chunk]))
        }
        Collective::AllGather => {
            let mut all = Vec::new();
            for input in inputs {
                all.extend_from_slice(input);
            }
            Some(bits(&all))
        }
        Collective::Broadcast { root } => Some(bits(inputs[root])),
    }
}

/// Runs one stage of `collective` over `slots` (dtype, length) on `n` ranks and compares
/// every rank's every result with the reference; the error names the first difference.
fn check(
    n: usize,
    slots: &[(DType, usize)],
    collective: Collective,
    seed: u64,
) -> Result<(), String> {
    let inputs: Vec<Vec<AnyTensor>> = (0..n)
        .map(|rank| {
            slots
                .iter()
                .enumerate()
                .map(|(k, &(d, len))| any_tensor(d, seed, rank, k, len))
                .collect()
        })
        .collect();
    let comms = Cpu.communicators(n).map_err(|e| e.to_string())?;
    let results: Vec<Vec<Got>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(&inputs)
            .map(|(mut comm, values)| s.spawn(move || run_rank(&mut comm, values, collective)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("rank panicked")))
            .collect()
    });
    for (k, &(dtype, len)) in slots.iter().enumerate() {
        let per_rank: Vec<AnyTensor> = inputs.iter().map(|v| v[k].clone()).collect();
        for (rank, got) in results.iter().enumerate() {
            let want = reference_any(&per_rank, rank, collective);
            if got[k] != want {
                return Err(format!(
                    "{collective:?} over {n} ranks: slot {k} ({dtype}, {len} elements) differs on rank {rank}"
                ));
            }
        }
    }
    Ok(())
}

fn ops() -> impl Strategy<Value = ReduceOp> {
    prop_oneof![
        Just(ReduceOp::Sum),
        Just(ReduceOp::Prod),
        Just(ReduceOp::Min),
        Just(ReduceOp::Max),
        Just(ReduceOp::Avg),
    ]
}

/// The longest value of a case: under Miri, a few blocks (which are 8 elements there).
const MAX_LEN: usize = if cfg!(miri) { 40 } else { 5000 };

/// 1-12 values of random dtypes, each 0-`MAX_LEN` elements long.
fn buckets() -> impl Strategy<Value = Vec<(DType, usize)>> {
    prop::collection::vec(
        (0usize..DType::COUNT, 0usize..=MAX_LEN).prop_map(|(d, len)| (DType::ALL[d], len)),
        1..=12,
    )
}

/// 40 cases each, or as many as `PROPTEST_CASES` says (CI runs few under Miri).
fn config() -> ProptestConfig {
    // The default reads `PROPTEST_CASES`.
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 40;
    }
    if cfg!(miri) {
        // Miri isolates the program from the file system, where failures are kept.
        config.failure_persistence = None;
    }
    config
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fused_allreduce_matches_the_reference(n in 1usize..=8, slots in buckets(), op in ops(), seed in any::<u64>()) {
        prop_assert_eq!(check(n, &slots, Collective::AllReduce(op), seed), Ok(()));
    }

    #[test]
    fn fused_reduce_matches_the_reference(n in 1usize..=8, slots in buckets(), op in ops(), root in any::<usize>(), seed in any::<u64>()) {
        let root = root % n;
        prop_assert_eq!(check(n, &slots, Collective::Reduce { op, root }, seed), Ok(()));
    }

    #[test]
    fn fused_reducescatter_matches_the_reference(n in 1usize..=8, slots in buckets(), op in ops(), seed in any::<u64>()) {
        let slots: Vec<(DType, usize)> = slots.into_iter().map(|(d, len)| (d, len - len % n)).collect();
        prop_assert_eq!(check(n, &slots, Collective::ReduceScatter(op), seed), Ok(()));
    }

    #[test]
    fn fused_allgather_matches_the_reference(n in 1usize..=8, slots in buckets(), seed in any::<u64>()) {
        prop_assert_eq!(check(n, &slots, Collective::AllGather, seed), Ok(()));
    }

    #[test]
    fn fused_broadcast_matches_the_reference(n in 1usize..=8, slots in buckets(), root in any::<usize>(), seed in any::<u64>()) {
        let root = root % n;
        prop_assert_eq!(check(n, &slots, Collective::Broadcast { root }, seed), Ok(()));
    }
}

/// Every collective x dtype x op at least once, whatever the random cases above drew:
/// three ranks, one bucket holding a value of every length class of that dtype (empty,
/// shorter than the ranks, a block and a bit) next to an `f32` and an `i64`. (Under Miri,
/// where each stage costs seconds: one bucket per collective holds those values of every
/// dtype at once, and each op goes with one kind of reduction.)
#[test]
fn every_collective_dtype_and_op() {
    let n = 3;
    let mut collectives = vec![
        Collective::AllGather,
        Collective::Broadcast { root: 0 },
        Collective::Broadcast { root: 2 },
    ];
    for (i, op) in ReduceOp::ALL.into_iter().enumerate() {
        let kinds = [
            Collective::AllReduce(op),
            Collective::ReduceScatter(op),
            Collective::Reduce { op, root: 1 },
        ];
        // Under Miri, each op with one kind, each kind with a few ops.
        match cfg!(miri) {
            true => collectives.push(kinds[i % 3]),
            false => collectives.extend(kinds),
        }
    }
    let buckets: Vec<&[DType]> = match cfg!(miri) {
        true => vec![&DType::ALL],
        false => DType::ALL.iter().map(std::slice::from_ref).collect(),
    };
    for collective in collectives {
        for &dtypes in &buckets {
            // Empty, shorter than the ranks, a block and a bit (a multiple of 3 for
            // reducescatter).
            let lens: &[usize] = match collective {
                Collective::ReduceScatter(_) => &[0, 3, (BLOCK / 3 + 1) * 3, 6],
                _ => &[0, 2, BLOCK + 3, 7],
            };
            let mut slots: Vec<(DType, usize)> = dtypes
                .iter()
                .flat_map(|&dtype| lens.iter().map(move |&len| (dtype, len)))
                .collect();
            slots.insert(1, (DType::F32, 9));
            slots.push((DType::I64, 3));
            if let Err(e) = check(n, &slots, collective, 42) {
                panic!("{e}");
            }
        }
    }
}

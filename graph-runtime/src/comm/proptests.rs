//! Property test of the fused stage over the CPU communicator: random actor counts,
//! bucket sizes, lengths, dtypes and ops; every value's result equals reducing that value
//! alone with the naive reference, and every rank holds bitwise-identical results.
//!
//! Floats are compared bit for bit: the communicator reduces each element once, in rank
//! order, exactly like the reference, so there is no tolerance to document.

use proptest::prelude::*;

use crate::bucket::{FusedStage, SlotIdx};
use crate::comm::{reduce_reference, Backend, Collective};
use crate::{Cpu, DType, Element, ReduceOp, Tensor};

/// A tensor of any dtype, so one bucket can mix them.
#[derive(Clone, Debug)]
enum AnyTensor {
    F32(Tensor<f32>),
    F64(Tensor<f64>),
    I8(Tensor<i8>),
    U8(Tensor<u8>),
    I32(Tensor<i32>),
    U32(Tensor<u32>),
    I64(Tensor<i64>),
    U64(Tensor<u64>),
}

macro_rules! each {
    ($x:expr, $t:ident => $body:expr) => {
        match $x {
            AnyTensor::F32($t) => $body,
            AnyTensor::F64($t) => $body,
            AnyTensor::I8($t) => $body,
            AnyTensor::U8($t) => $body,
            AnyTensor::I32($t) => $body,
            AnyTensor::U32($t) => $body,
            AnyTensor::I64($t) => $body,
            AnyTensor::U64($t) => $body,
        }
    };
}

/// Deterministic values in a small range, so that products over 8 ranks stay finite.
trait Gen: Element {
    fn gen(x: u64) -> Self;
    /// The bits, for exact comparison (floats compare by bits, so -0.0 != 0.0 and NaN == NaN).
    fn bits(self) -> u64;
}

macro_rules! gen_float {
    ($t:ty) => {
        impl Gen for $t {
            fn gen(x: u64) -> Self {
                (x % 41) as $t / 10.0 - 2.0
            }
            fn bits(self) -> u64 {
                self.to_bits() as u64
            }
        }
    };
}
macro_rules! gen_int {
    ($t:ty) => {
        impl Gen for $t {
            fn gen(x: u64) -> Self {
                x as $t
            }
            fn bits(self) -> u64 {
                self as u64
            }
        }
    };
}
gen_float!(f32);
gen_float!(f64);
gen_int!(i8);
gen_int!(u8);
gen_int!(i32);
gen_int!(u32);
gen_int!(i64);
gen_int!(u64);

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

fn any_tensor(dtype: DType, seed: u64, rank: usize, slot: usize, len: usize) -> AnyTensor {
    match dtype {
        DType::F32 => AnyTensor::F32(make(seed, rank, slot, len)),
        DType::F64 => AnyTensor::F64(make(seed, rank, slot, len)),
        DType::I8 => AnyTensor::I8(make(seed, rank, slot, len)),
        DType::U8 => AnyTensor::U8(make(seed, rank, slot, len)),
        DType::I32 => AnyTensor::I32(make(seed, rank, slot, len)),
        DType::U32 => AnyTensor::U32(make(seed, rank, slot, len)),
        DType::I64 => AnyTensor::I64(make(seed, rank, slot, len)),
        DType::U64 => AnyTensor::U64(make(seed, rank, slot, len)),
    }
}

fn bits<E: Gen>(t: &Tensor<E>) -> Vec<u64> {
    t.as_slice().iter().map(|&x| x.bits()).collect()
}

/// One rank's part: build its bucket, run the stage, return each value's result as bits.
fn run_rank(comm: &mut crate::comm::CpuComm, values: &[AnyTensor], op: ReduceOp) -> Vec<Vec<u64>> {
    let mut st = FusedStage::new("prop");
    st.begin();
    let slots: Vec<SlotIdx> = values.iter().map(|v| each!(v, t => st.add(t))).collect();
    st.prepare();
    for (v, &s) in values.iter().zip(&slots) {
        each!(v, t => st.pack(t, s));
    }
    st.run(comm, Collective::AllReduce(op), "prop")
        .unwrap_or_else(|e| panic!("{e}"));
    values
        .iter()
        .zip(&slots)
        .map(|(v, &s)| each!(v, t => bits(&st.output(t, s))))
        .collect()
}

fn reference(per_rank: &[AnyTensor], op: ReduceOp) -> Vec<u64> {
    macro_rules! reduce {
        ($variant:ident) => {{
            let slices: Vec<&[_]> = per_rank
                .iter()
                .map(|v| match v {
                    AnyTensor::$variant(t) => t.as_slice(),
                    _ => unreachable!("one slot has one dtype on every rank"),
                })
                .collect();
            reduce_reference(&slices, op)
                .into_iter()
                .map(Gen::bits)
                .collect()
        }};
    }
    match &per_rank[0] {
        AnyTensor::F32(_) => reduce!(F32),
        AnyTensor::F64(_) => reduce!(F64),
        AnyTensor::I8(_) => reduce!(I8),
        AnyTensor::U8(_) => reduce!(U8),
        AnyTensor::I32(_) => reduce!(I32),
        AnyTensor::U32(_) => reduce!(U32),
        AnyTensor::I64(_) => reduce!(I64),
        AnyTensor::U64(_) => reduce!(U64),
    }
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn fused_allreduce_matches_the_per_value_reference(
        n in 1usize..=8,
        slots in prop::collection::vec((0usize..DType::COUNT, 0usize..=5000), 1..=12),
        op in ops(),
        seed in any::<u64>(),
    ) {
        let inputs: Vec<Vec<AnyTensor>> = (0..n)
            .map(|rank| {
                slots
                    .iter()
                    .enumerate()
                    .map(|(k, &(d, len))| any_tensor(DType::ALL[d], seed, rank, k, len))
                    .collect()
            })
            .collect();
        let comms = Cpu.communicators(n).unwrap_or_else(|e| panic!("{e}"));
        let results: Vec<Vec<Vec<u64>>> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .zip(&inputs)
                .map(|(mut comm, values)| s.spawn(move || run_rank(&mut comm, values, op)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| panic!("rank panicked"))).collect()
        });
        for k in 0..slots.len() {
            let per_rank: Vec<AnyTensor> = inputs.iter().map(|v| v[k].clone()).collect();
            let want = reference(&per_rank, op);
            for (rank, got) in results.iter().enumerate() {
                prop_assert_eq!(&got[k], &want, "slot {} rank {} op {:?}", k, rank, op);
            }
        }
    }
}

//! GPU tests' values and their expected results, shared by `tests/nccl_gpu.rs` (GPUs of
//! one process) and `tests/nccl_mpi.rs` (GPUs of several processes): small integers, exact
//! in every dtype, so every expected result is exact whatever order NCCL reduces in;
//! computed on the host by `actorgraph::comm::reduce_reference`.
#![allow(dead_code)] // each test binary uses its own part

use actorgraph::comm::reduce_reference;
use actorgraph::half::{bf16, f16};
use actorgraph::nccl::{current_device, Device};
use actorgraph::prelude::*;
use actorgraph::{BoxError, Element};

/// An element type built from a small integer (exact in every type; negative values wrap
/// in the unsigned ones).
pub trait Val: Element {
    fn of(v: i64) -> Self;
}

macro_rules! val_as {
    ($($t:ty),*) => {
        $(impl Val for $t {
            fn of(v: i64) -> Self {
                v as $t
            }
        })*
    };
}
val_as!(f32, f64, i8, u8, i32, u32, i64, u64);

impl Val for f16 {
    fn of(v: i64) -> Self {
        f16::from_f32(v as f32)
    }
}

impl Val for bf16 {
    fn of(v: i64) -> Self {
        bf16::from_f32(v as f32)
    }
}

/// `len` values of rank `rank`, in `[-4, 4 + rank]`: products of two stay exact in `bf16`.
pub fn values<E: Val>(seed: i64, rank: usize, len: usize) -> Vec<E> {
    (0..len as i64)
        .map(|i| E::of((i * 5 + seed).rem_euclid(9) - 4 + rank as i64))
        .collect()
}

pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A copy of [`values`] on `device`.
pub fn on_gpu<E: Val>(
    device: &Device,
    seed: i64,
    rank: usize,
    shape: &[usize],
) -> Result<Tensor<E>, Error> {
    Tensor::from_vec(values(seed, rank, numel(shape)), shape)?.to_device(device)
}

/// A host copy of a tensor's elements.
pub fn host<E: Element>(t: &Tensor<E>) -> Vec<E> {
    t.to_host().expect("copy to the host").to_vec()
}

/// One GPU tensor of every dtype.
pub type Bucket = (
    Tensor<f32>,
    Tensor<f64>,
    Tensor<f16>,
    Tensor<bf16>,
    Tensor<i8>,
    Tensor<u8>,
    Tensor<i32>,
    Tensor<u32>,
    Tensor<i64>,
    Tensor<u64>,
);

/// The shape of each slot of a [`Bucket`]: first dimensions even, so `reducescatter`
/// divides over one or two ranks.
pub const SHAPES: [&[usize]; 10] = [
    &[4, 3],
    &[2],
    &[6],
    &[4],
    &[2, 2],
    &[8],
    &[6],
    &[2],
    &[4],
    &[2],
];

pub struct Node {
    pub rank: usize,
}

pub fn nodes(n: usize) -> Vec<Node> {
    (0..n).map(|rank| Node { rank }).collect()
}

#[actor]
impl Node {
    /// Slot `k` holds `values(k, rank, ..)` of shape `SHAPES[k]`, on this actor's GPU.
    pub fn bucket(&mut self) -> Result<Bucket, BoxError> {
        let d = current_device()?;
        let r = self.rank;
        Ok((
            on_gpu(&d, 0, r, SHAPES[0])?,
            on_gpu(&d, 1, r, SHAPES[1])?,
            on_gpu(&d, 2, r, SHAPES[2])?,
            on_gpu(&d, 3, r, SHAPES[3])?,
            on_gpu(&d, 4, r, SHAPES[4])?,
            on_gpu(&d, 5, r, SHAPES[5])?,
            on_gpu(&d, 6, r, SHAPES[6])?,
            on_gpu(&d, 7, r, SHAPES[7])?,
            on_gpu(&d, 8, r, SHAPES[8])?,
            on_gpu(&d, 9, r, SHAPES[9])?,
        ))
    }
}

graph! {
    pub AllReduceOps(ns: [Node]) {
        let (a, b, c, d, e, f, g, h, i, j) = ns.bucket();
        let sum = allreduce([a, b, c, d, e, f, g, h, i, j], Sum);
        let prod = allreduce([a, b, c, d, e, f, g, h, i, j], Prod);
        let lo = allreduce([a, b, c, d, e, f, g, h, i, j], Min);
        let hi = allreduce([a, b, c, d, e, f, g, h, i, j], Max);
        let avg = allreduce([a, b, c, d, e, f, g, h, i, j], Avg);
        (sum, prod, lo, hi, avg)
    }

    pub ReduceScatterOps(ns: [Node]) {
        let (a, b, c, d, e, f, g, h, i, j) = ns.bucket();
        let sum = reducescatter([a, b, c, d, e, f, g, h, i, j], Sum);
        let prod = reducescatter([a, b, c, d, e, f, g, h, i, j], Prod);
        let lo = reducescatter([a, b, c, d, e, f, g, h, i, j], Min);
        let hi = reducescatter([a, b, c, d, e, f, g, h, i, j], Max);
        let avg = reducescatter([a, b, c, d, e, f, g, h, i, j], Avg);
        (sum, prod, lo, hi, avg)
    }

    pub ReduceOps(ns: [Node]) {
        let (a, b, c, d, e, f, g, h, i, j) = ns.bucket();
        let sum = reduce([a, b, c, d, e, f, g, h, i, j], Sum, 0);
        let prod = reduce([a, b, c, d, e, f, g, h, i, j], Prod, 0);
        let lo = reduce([a, b, c, d, e, f, g, h, i, j], Min, 0);
        let hi = reduce([a, b, c, d, e, f, g, h, i, j], Max, 0);
        let avg = reduce([a, b, c, d, e, f, g, h, i, j], Avg, 0);
        (sum, prod, lo, hi, avg)
    }

    pub GatherBroadcast(ns: [Node]) {
        let (a, b, c, d, e, f, g, h, i, j) = ns.bucket();
        let gathered = allgather([a, b, c, d, e, f, g, h, i, j]);
        let sent = broadcast([a, b, c, d, e, f, g, h, i, j], 0);
        (gathered, sent)
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Coll {
    AllReduce(ReduceOp),
    ReduceScatter(ReduceOp),
    /// Root 0.
    Reduce(ReduceOp),
    AllGather,
    /// Root 0.
    Broadcast,
}

/// What rank `rank` of `ranks` gets for slot `slot` (`None`: a reduce off the root), and
/// its shape.
pub fn expected<E: Val>(
    coll: Coll,
    slot: usize,
    rank: usize,
    ranks: usize,
) -> Option<(Vec<E>, Vec<usize>)> {
    let shape = SHAPES[slot];
    let len = numel(shape);
    let inputs: Vec<Vec<E>> = (0..ranks).map(|r| values(slot as i64, r, len)).collect();
    let srcs: Vec<&[E]> = inputs.iter().map(Vec::as_slice).collect();
    let mut out_shape = shape.to_vec();
    let data = match coll {
        Coll::AllReduce(op) => reduce_reference(&srcs, op),
        Coll::Reduce(op) if rank == 0 => reduce_reference(&srcs, op),
        Coll::Reduce(_) => return None,
        Coll::ReduceScatter(op) => {
            let all = reduce_reference(&srcs, op);
            let chunk = len / ranks;
            out_shape[0] /= ranks;
            all[rank * chunk..(rank + 1) * chunk].to_vec()
        }
        Coll::AllGather => {
            out_shape[0] *= ranks;
            inputs.concat()
        }
        Coll::Broadcast => inputs[0].clone(),
    };
    Some((data, out_shape))
}

/// Where a result is: its rank, among how many, and its GPU's ordinal in its process.
#[derive(Clone, Copy, Debug)]
pub struct At {
    pub rank: usize,
    pub ranks: usize,
    pub gpu: usize,
}

impl At {
    /// Rank `rank` of `ranks` in one process, on GPU `rank`.
    pub fn here(rank: usize, ranks: usize) -> Self {
        At {
            rank,
            ranks,
            gpu: rank,
        }
    }
}

pub fn check<E: Val>(got: &Tensor<E>, coll: Coll, slot: usize, at: At) {
    let At { rank, ranks, gpu } = at;
    let what = format!(
        "{coll:?} of {} (slot {slot}) on rank {rank} of {ranks}",
        E::DTYPE
    );
    let (want, shape) = expected::<E>(coll, slot, rank, ranks).expect("a result on this rank");
    assert_eq!(got.device_ordinal(), Some(gpu), "{what}: on the rank's GPU");
    assert_eq!(got.shape(), &shape[..], "{what}: shape");
    assert_eq!(host(got), want, "{what}: values");
}

pub fn check_opt<E: Val>(got: &Option<Tensor<E>>, coll: Coll, slot: usize, at: At) {
    match got {
        Some(t) => check(t, coll, slot, at),
        None => assert!(
            expected::<E>(coll, slot, at.rank, at.ranks).is_none(),
            "{coll:?} of {} (slot {slot}): no result on rank {}",
            E::DTYPE,
            at.rank
        ),
    }
}

/// Checks the ten results of one stage (`$check` is `check` or `check_opt`) of the rank
/// at `$at`.
macro_rules! check_bucket {
    ($check:ident, $out:expr, $coll:expr, $at:expr) => {{
        let (o, c, at) = (&$out, $coll, $at);
        $check::<f32>(&o.0, c, 0, at);
        $check::<f64>(&o.1, c, 1, at);
        $check::<f16>(&o.2, c, 2, at);
        $check::<bf16>(&o.3, c, 3, at);
        $check::<i8>(&o.4, c, 4, at);
        $check::<u8>(&o.5, c, 5, at);
        $check::<i32>(&o.6, c, 6, at);
        $check::<u32>(&o.7, c, 7, at);
        $check::<i64>(&o.8, c, 8, at);
        $check::<u64>(&o.9, c, 9, at);
    }};
}

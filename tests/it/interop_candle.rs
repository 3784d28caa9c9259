//! candle tensors (feature `candle`) through every collective: every dtype that maps to an
//! actorgraph element, 1-d and 3-d, contiguous or not, mixed in one bucket with actorgraph
//! tensors and scalars and in one list, checked against the per-value reference; a dtype
//! without an element type refused with its error, the graph still usable.

use actorgraph::candle_core::{DType, Device, Tensor as CTensor, WithDType};
use actorgraph::comm::reduce_reference;
use actorgraph::prelude::*;
use actorgraph::Element;

const RANKS: usize = 3;
const DTYPES: [DType; 8] = [
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
    DType::U8,
    DType::U32,
    DType::I32,
    DType::I64,
];

struct C {
    rank: usize,
}

/// A tensor of `dims` and `dtype` with small non-negative integers, distinct per rank.
fn tensor(rank: usize, salt: usize, dims: &[usize], dtype: DType) -> CTensor {
    let n: usize = dims.iter().product();
    let data: Vec<f64> = (0..n)
        .map(|i| ((i * 7 + rank * 5 + salt) % 11) as f64)
        .collect();
    CTensor::from_vec(data, dims, &Device::Cpu)
        .and_then(|t| t.to_dtype(dtype))
        .unwrap()
}

#[actor]
impl C {
    /// One `[3, 2]` tensor per mapped dtype.
    fn every_dtype(&mut self) -> Vec<CTensor> {
        let dtypes = DTYPES.iter().enumerate();
        dtypes
            .map(|(k, &d)| tensor(self.rank, k, &[3, 2], d))
            .collect()
    }
    /// 3-d.
    fn cube(&mut self) -> CTensor {
        tensor(self.rank, 20, &[3, 2, 2], DType::F32)
    }
    /// Not contiguous: a transposed `[2, 6]`, shape `[6, 2]`.
    fn transposed(&mut self) -> CTensor {
        tensor(self.rank, 30, &[2, 6], DType::I64).t().unwrap()
    }
    fn plain(&mut self) -> Tensor<f32> {
        Tensor::full([3], self.rank as f32)
    }
    fn scalar(&mut self) -> u32 {
        self.rank as u32
    }
    fn unsupported(&mut self, bad: &bool) -> CTensor {
        let d = if *bad { DType::I16 } else { DType::F32 };
        CTensor::zeros(3, d, &Device::Cpu).unwrap()
    }
}

fn actors() -> Vec<C> {
    (0..RANKS).map(|rank| C { rank }).collect()
}

fn inputs<T>(f: impl Fn(&mut C) -> T) -> Vec<T> {
    actors().iter_mut().map(f).collect()
}

graph! {
    Sum(cs: [C]) {
        let e = cs.every_dtype();
        let c = cs.cube();
        let t = cs.transposed();
        let p = cs.plain();
        let s = cs.scalar();
        allreduce([e, c, t, p, s], Sum)
    }
    Max(cs: [C]) {
        let e = cs.every_dtype();
        let t = cs.transposed();
        allreduce([e, t], Max)
    }
    Bcast(cs: [C]) {
        let e = cs.every_dtype();
        let c = cs.cube();
        broadcast([e, c], 2)
    }
    Reduce(cs: [C]) {
        let e = cs.every_dtype();
        let t = cs.transposed();
        reduce([e, t], Sum, 1)
    }
    GatherAll(cs: [C]) {
        let e = cs.every_dtype();
        let c = cs.cube();
        let t = cs.transposed();
        let s = cs.scalar();
        allgather([e, c, t, s])
    }
    ScatterAll(cs: [C]) {
        let e = cs.every_dtype();
        let c = cs.cube();
        let t = cs.transposed();
        let p = cs.plain();
        reducescatter([e, c, t, p], Sum)
    }
    Refused(cs: [C], bad: bool) {
        let u = cs.unsupported(bad);
        allreduce(u)
    }
}

/// The elements of `t`, row-major, as `E`.
fn elements<E: WithDType>(t: &CTensor) -> Vec<E> {
    t.flatten_all().unwrap().to_vec1::<E>().unwrap()
}

/// What a part's result must hold: `expect(per-rank elements)` in `E`, and its dtype.
fn check_as<E: Element + WithDType>(
    got: &CTensor,
    ins: &[&CTensor],
    dims: &[usize],
    expect: &dyn Fn(&[&[E]]) -> Vec<E>,
) {
    assert_eq!(got.dtype(), ins[0].dtype());
    assert_eq!(got.dims(), dims, "{:?}", got.dtype());
    let each: Vec<Vec<E>> = ins.iter().map(|t| elements::<E>(t)).collect();
    let srcs: Vec<&[E]> = each.iter().map(|v| &v[..]).collect();
    assert_eq!(elements::<E>(got), expect(&srcs), "{:?}", got.dtype());
}

/// [`check_as`] at the tensor's own element type; `f` is generic over it, so a macro.
macro_rules! check {
    ($got:expr, $ins:expr, $dims:expr, |$srcs:ident| $expect:expr) => {{
        let (got, ins, dims): (&CTensor, &[&CTensor], &[usize]) = ($got, $ins, $dims);
        match got.dtype() {
            DType::F16 => check_as::<actorgraph::half::f16>(got, ins, dims, &|$srcs| $expect),
            DType::BF16 => check_as::<actorgraph::half::bf16>(got, ins, dims, &|$srcs| $expect),
            DType::F32 => check_as::<f32>(got, ins, dims, &|$srcs| $expect),
            DType::F64 => check_as::<f64>(got, ins, dims, &|$srcs| $expect),
            DType::U8 => check_as::<u8>(got, ins, dims, &|$srcs| $expect),
            DType::U32 => check_as::<u32>(got, ins, dims, &|$srcs| $expect),
            DType::I32 => check_as::<i32>(got, ins, dims, &|$srcs| $expect),
            DType::I64 => check_as::<i64>(got, ins, dims, &|$srcs| $expect),
            other => panic!("unexpected dtype {other:?}"),
        }
    }};
}

fn reduced(got: &CTensor, ins: &[&CTensor], op: ReduceOp) {
    check!(got, ins, ins[0].dims(), |srcs| reduce_reference(srcs, op));
}

fn nth(list: &[Vec<CTensor>], k: usize) -> Vec<&CTensor> {
    list.iter().map(|l| &l[k]).collect()
}

#[test]
fn allreduce_of_every_dtype_mixed_with_tensors_and_scalars() {
    let (es, cs, ts) = (
        inputs(C::every_dtype),
        inputs(C::cube),
        inputs(C::transposed),
    );
    assert!(!ts[0].is_contiguous());
    let out = Sum::launch(actors(), Cpu).unwrap().execute().unwrap();
    for (e, c, t, p, s) in &out {
        assert_eq!(e.len(), DTYPES.len());
        for (k, got) in e.iter().enumerate() {
            assert_eq!(got.dtype(), DTYPES[k]);
            reduced(got, &nth(&es, k), ReduceOp::Sum);
        }
        reduced(c, &cs.iter().collect::<Vec<_>>(), ReduceOp::Sum);
        reduced(t, &ts.iter().collect::<Vec<_>>(), ReduceOp::Sum);
        assert_eq!(p.to_vec(), vec![3.0; 3]);
        assert_eq!(*s, 3);
    }
    for (e, t) in &Max::launch(actors(), Cpu).unwrap().execute().unwrap() {
        for (k, got) in e.iter().enumerate() {
            reduced(got, &nth(&es, k), ReduceOp::Max);
        }
        reduced(t, &ts.iter().collect::<Vec<_>>(), ReduceOp::Max);
    }
}

#[test]
fn broadcast_and_reduce_of_every_dtype() {
    let (es, cs, ts) = (
        inputs(C::every_dtype),
        inputs(C::cube),
        inputs(C::transposed),
    );
    for (e, c) in &Bcast::launch(actors(), Cpu).unwrap().execute().unwrap() {
        for (k, got) in e.iter().enumerate() {
            check!(got, &[&es[2][k]], es[2][k].dims(), |srcs| srcs[0].to_vec());
        }
        check!(c, &[&cs[2]], cs[2].dims(), |srcs| srcs[0].to_vec());
    }
    let out = Reduce::launch(actors(), Cpu).unwrap().execute().unwrap();
    assert!(out[0].0.is_none() && out[2].1.is_none());
    for (k, got) in out[1].0.as_ref().unwrap().iter().enumerate() {
        reduced(got, &nth(&es, k), ReduceOp::Sum);
    }
    reduced(
        out[1].1.as_ref().unwrap(),
        &ts.iter().collect::<Vec<_>>(),
        ReduceOp::Sum,
    );
}

/// `ins` gathered: `[N * d0, rest..]`, every rank's elements in rank order.
fn gathered(got: &CTensor, ins: &[&CTensor]) {
    let mut dims = ins[0].dims().to_vec();
    dims[0] *= RANKS;
    check!(got, ins, &dims, |srcs| srcs.concat());
}

#[test]
fn allgather_of_every_dtype() {
    let (es, cs, ts) = (
        inputs(C::every_dtype),
        inputs(C::cube),
        inputs(C::transposed),
    );
    let out = GatherAll::launch(actors(), Cpu).unwrap().execute().unwrap();
    for (e, c, t, s) in &out {
        for (k, got) in e.iter().enumerate() {
            gathered(got, &nth(&es, k));
        }
        gathered(c, &cs.iter().collect::<Vec<_>>());
        gathered(t, &ts.iter().collect::<Vec<_>>());
        assert_eq!(*s, vec![0, 1, 2]);
    }
}

/// Rank `rank`'s rows of the sum of `ins`.
fn scattered(got: &CTensor, ins: &[&CTensor], rank: usize) {
    let mut dims = ins[0].dims().to_vec();
    dims[0] /= RANKS;
    check!(got, ins, &dims, |srcs| {
        let all = reduce_reference(srcs, ReduceOp::Sum);
        let share = all.len() / RANKS;
        all[rank * share..(rank + 1) * share].to_vec()
    });
}

#[test]
fn reducescatter_of_every_dtype() {
    let (es, cs, ts) = (
        inputs(C::every_dtype),
        inputs(C::cube),
        inputs(C::transposed),
    );
    let out = ScatterAll::launch(actors(), Cpu)
        .unwrap()
        .execute()
        .unwrap();
    for (rank, (e, c, t, p)) in out.iter().enumerate() {
        for (k, got) in e.iter().enumerate() {
            scattered(got, &nth(&es, k), rank);
        }
        scattered(c, &cs.iter().collect::<Vec<_>>(), rank);
        scattered(t, &ts.iter().collect::<Vec<_>>(), rank);
        assert_eq!(p.to_vec(), vec![3.0]);
    }
}

#[test]
fn a_dtype_without_an_element_type_is_refused_and_the_graph_stays_usable() {
    let mut g = Refused::launch(actors(), Cpu).unwrap();
    match g.execute(true) {
        Err(Error::Unsupported(m)) => assert!(m.contains("I16"), "{m}"),
        other => panic!("unexpected: {:?}", other.map(|_| ())),
    }
    let out = g.execute(false).unwrap();
    assert_eq!(out[0].dtype(), DType::F32);
    assert_eq!(elements::<f32>(&out[0]), vec![0.0; 3]);
}

//! ndarray arrays (feature `ndarray`) through every collective, 1-d and 3-d, in standard
//! and in non-standard layout, mixed in one bucket with tensors and scalars, each result
//! checked against the per-value reference in logical order.

use actorgraph::comm::reduce_reference;
use actorgraph::ndarray::{
    concatenate, Array, Array1, Array2, Array3, ArrayView, Axis, Dimension, RemoveAxis,
};
use actorgraph::prelude::*;
use actorgraph::Element;

const RANKS: usize = 3;

struct A {
    rank: usize,
}

/// A value per rank and place, distinct and small enough to sum exactly.
fn v(rank: usize, i: usize) -> i64 {
    ((i * 7 + rank * 5) % 13) as i64 - 6
}

#[actor]
impl A {
    /// 1-d, standard.
    fn line(&mut self) -> Array1<f32> {
        Array1::from_shape_fn(6, |i| v(self.rank, i) as f32)
    }
    /// 3-d, standard.
    fn cube(&mut self) -> Array3<f64> {
        Array3::from_shape_fn((3, 2, 2), |(i, j, k)| {
            v(self.rank, i * 4 + j * 2 + k) as f64
        })
    }
    /// 3-d, not standard: axes permuted, shape `[6, 2, 3]`.
    fn permuted(&mut self) -> Array3<f64> {
        Array3::from_shape_fn((2, 3, 6), |(i, j, k)| {
            v(self.rank, 100 + i * 18 + j * 6 + k) as f64
        })
        .permuted_axes([2, 0, 1])
    }
    /// 2-d, transposed: shape `[3, 2]`, column-major.
    fn transposed(&mut self) -> Array2<i32> {
        Array2::from_shape_fn((2, 3), |(i, j)| v(self.rank, 200 + i * 3 + j) as i32).reversed_axes()
    }
    /// 1-d, strided: every other element of 12.
    fn strided(&mut self) -> Array1<i64> {
        let all = Array1::from_shape_fn(12, |i| v(self.rank, 300 + i));
        all.slice_move(actorgraph::ndarray::s![..;2])
    }
    fn tensor(&mut self) -> Tensor<f32> {
        Tensor::from_vec(
            (0..6).map(|i| v(self.rank, 400 + i) as f32).collect(),
            [3, 2],
        )
        .unwrap()
    }
    fn scalar(&mut self) -> u64 {
        self.rank as u64 + 1
    }
    fn arrays(&mut self) -> Vec<Array3<f64>> {
        vec![self.cube(), self.permuted()]
    }
}

fn actors() -> Vec<A> {
    (0..RANKS).map(|rank| A { rank }).collect()
}

fn inputs<T>(f: impl Fn(&mut A) -> T) -> Vec<T> {
    actors().iter_mut().map(f).collect()
}

graph! {
    Sum(xs: [A]) {
        let l = xs.line();
        let c = xs.cube();
        let p = xs.permuted();
        let t = xs.transposed();
        let s = xs.strided();
        let x = xs.tensor();
        let k = xs.scalar();
        let v = xs.arrays();
        allreduce([l, c, p, t, s, x, k, v], Sum)
    }
    Max(xs: [A]) {
        let l = xs.line();
        let p = xs.permuted();
        let t = xs.transposed();
        allreduce([l, p, t], Max)
    }
    Bcast(xs: [A]) {
        let c = xs.cube();
        let p = xs.permuted();
        let x = xs.tensor();
        broadcast([c, p, x], 1)
    }
    Reduce(xs: [A]) {
        let l = xs.line();
        let p = xs.permuted();
        let k = xs.scalar();
        reduce([l, p, k], Sum, 0)
    }
    GatherAll(xs: [A]) {
        let l = xs.line();
        let c = xs.cube();
        let p = xs.permuted();
        let t = xs.transposed();
        let x = xs.tensor();
        let k = xs.scalar();
        allgather([l, c, p, t, x, k])
    }
    ScatterAll(xs: [A]) {
        let l = xs.line();
        let c = xs.cube();
        let p = xs.permuted();
        let t = xs.transposed();
        let x = xs.tensor();
        reducescatter([l, c, p, t, x], Sum)
    }
}

/// `got` has the inputs' shape and, in logical order, `op` over them.
fn check<E: Element, D: Dimension>(got: &Array<E, D>, ins: &[Array<E, D>], op: ReduceOp) {
    let logical: Vec<Vec<E>> = ins.iter().map(|a| a.iter().copied().collect()).collect();
    let srcs: Vec<&[E]> = logical.iter().map(|v| &v[..]).collect();
    assert_eq!(got.shape(), ins[0].shape());
    assert!(got.is_standard_layout());
    assert_eq!(
        got.iter().copied().collect::<Vec<_>>(),
        reduce_reference(&srcs, op)
    );
}

#[test]
fn allreduce_of_arrays_mixed_with_tensors_and_scalars() {
    let (ls, cs, ps) = (inputs(A::line), inputs(A::cube), inputs(A::permuted));
    let (ts, ss, xs) = (inputs(A::transposed), inputs(A::strided), inputs(A::tensor));
    assert!(!ps[0].is_standard_layout() && !ts[0].is_standard_layout());
    assert!(!ss[0].is_standard_layout());
    let out = Sum::launch(actors(), Cpu).unwrap().execute().unwrap();
    for (l, c, p, t, s, x, k, v) in &out {
        check(l, &ls, ReduceOp::Sum);
        check(c, &cs, ReduceOp::Sum);
        check(p, &ps, ReduceOp::Sum);
        check(t, &ts, ReduceOp::Sum);
        check(s, &ss, ReduceOp::Sum);
        let srcs: Vec<&[f32]> = xs.iter().map(|t| t.as_slice()).collect();
        assert_eq!(x.as_slice(), reduce_reference(&srcs, ReduceOp::Sum));
        assert_eq!(*k, 6);
        check(&v[0], &cs, ReduceOp::Sum);
        check(&v[1], &ps, ReduceOp::Sum);
    }
    let out = Max::launch(actors(), Cpu).unwrap().execute().unwrap();
    for (l, p, t) in &out {
        check(l, &ls, ReduceOp::Max);
        check(p, &ps, ReduceOp::Max);
        check(t, &ts, ReduceOp::Max);
    }
}

#[test]
fn broadcast_and_reduce_of_arrays() {
    let (ls, cs, ps, xs) = (
        inputs(A::line),
        inputs(A::cube),
        inputs(A::permuted),
        inputs(A::tensor),
    );
    for (c, p, x) in &Bcast::launch(actors(), Cpu).unwrap().execute().unwrap() {
        assert_eq!((c, p, x), (&cs[1], &ps[1], &xs[1]));
    }
    let out = Reduce::launch(actors(), Cpu).unwrap().execute().unwrap();
    let (l, p, k) = &out[0];
    check(l.as_ref().unwrap(), &ls, ReduceOp::Sum);
    check(p.as_ref().unwrap(), &ps, ReduceOp::Sum);
    assert_eq!(*k, Some(6));
    assert!(out[1].0.is_none() && out[2].1.is_none());
}

/// The ranks' arrays concatenated along the first axis.
fn concat<E: Element, D: RemoveAxis>(ins: &[Array<E, D>]) -> Array<E, D> {
    let views: Vec<ArrayView<'_, E, D>> = ins.iter().map(|a| a.view()).collect();
    concatenate(Axis(0), &views).unwrap()
}

#[test]
fn allgather_concatenates_arrays_along_their_first_axis() {
    let (ls, cs, ps, ts) = (
        inputs(A::line),
        inputs(A::cube),
        inputs(A::permuted),
        inputs(A::transposed),
    );
    let xs = inputs(A::tensor);
    let out = GatherAll::launch(actors(), Cpu).unwrap().execute().unwrap();
    for (l, c, p, t, x, k) in &out {
        assert_eq!(l, &concat(&ls));
        assert_eq!(c, &concat(&cs));
        assert_eq!(p, &concat(&ps));
        assert_eq!(t, &concat(&ts));
        assert_eq!(p.shape(), &[18, 2, 3]);
        assert_eq!(x.shape(), &[9, 2]);
        assert_eq!(
            x.to_vec(),
            xs.iter().flat_map(|t| t.to_vec()).collect::<Vec<_>>()
        );
        assert_eq!(*k, vec![1, 2, 3]);
    }
}

/// Rank `rank`'s rows of the sum of `ins`.
fn check_scattered<E: Element, D: Dimension>(got: &Array<E, D>, ins: &[Array<E, D>], rank: usize) {
    let logical: Vec<Vec<E>> = ins.iter().map(|a| a.iter().copied().collect()).collect();
    let srcs: Vec<&[E]> = logical.iter().map(|v| &v[..]).collect();
    let all = reduce_reference(&srcs, ReduceOp::Sum);
    let share = all.len() / RANKS;
    let mut shape = ins[0].shape().to_vec();
    shape[0] /= RANKS;
    assert_eq!(got.shape(), &shape[..]);
    assert_eq!(
        got.iter().copied().collect::<Vec<_>>(),
        &all[rank * share..(rank + 1) * share]
    );
}

#[test]
fn reducescatter_splits_arrays_along_their_first_axis() {
    let (ls, cs, ps, ts) = (
        inputs(A::line),
        inputs(A::cube),
        inputs(A::permuted),
        inputs(A::transposed),
    );
    let out = ScatterAll::launch(actors(), Cpu)
        .unwrap()
        .execute()
        .unwrap();
    for (rank, (l, c, p, t, x)) in out.iter().enumerate() {
        check_scattered(l, &ls, rank);
        check_scattered(c, &cs, rank);
        check_scattered(p, &ps, rank);
        check_scattered(t, &ts, rank);
        assert_eq!(x.shape(), &[1, 2]);
    }
}

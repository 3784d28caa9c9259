//! Values made of parts: a `Vec` of tensors, a derived struct of tensors and scalars, and
//! lists of structs, through every collective, mixed in one bucket with plain tensors and
//! scalars, checked part by part against the per-value reference; lists of different
//! lengths on different ranks; one fused stage for a whole list.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

use actorgraph::comm::reduce_reference;
use actorgraph::prelude::*;
use actorgraph::Element;

use crate::support::counting::Counting;

const RANKS: usize = 3;

/// One layer's gradients: two dtypes.
#[derive(Bucketable, Gather, Scatter, Debug)]
struct Layer {
    w: Tensor<f32>,
    b: Tensor<f64>,
}

/// A model's gradients: a list of layers and two scalars.
#[derive(Bucketable, Debug)]
struct Grads {
    layers: Vec<Layer>,
    step: u64,
    loss: f32,
}

/// A tuple struct, generic over its element type.
#[derive(Bucketable, Gather, Scatter)]
struct Pair<E: Element>(Tensor<E>, Tensor<E>);

struct W {
    rank: usize,
}

/// `shape` with element `i` equal to `f(rank, k, i)`, distinct per rank, part and place.
fn tensor<E: Element>(rank: usize, k: usize, shape: &[usize], f: fn(i64) -> E) -> Tensor<E> {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|i| f(((i * 7 + rank * 5 + k * 3) % 11) as i64 - 5))
        .collect();
    Tensor::from_vec(data, shape).unwrap()
}

fn layer(rank: usize, k: usize) -> Layer {
    Layer {
        w: tensor(rank, k, &[3 * (k + 1), 2], |v| v as f32 * 0.5),
        b: tensor(rank, k + 10, &[3], |v| v as f64 * 0.25),
    }
}

#[actor]
impl W {
    fn grads(&mut self) -> Grads {
        Grads {
            layers: (0..3).map(|k| layer(self.rank, k)).collect(),
            step: 10 + self.rank as u64,
            loss: self.rank as f32 + 0.5,
        }
    }
    /// A list of three tensors of three shapes, the first 3-d.
    fn list(&mut self) -> Vec<Tensor<f32>> {
        vec![
            tensor(self.rank, 20, &[3, 2, 2], |v| v as f32),
            tensor(self.rank, 21, &[6], |v| v as f32),
            tensor(self.rank, 22, &[0, 4], |v| v as f32),
        ]
    }
    fn layers(&mut self) -> Vec<Layer> {
        (0..2).map(|k| layer(self.rank, k)).collect()
    }
    fn pair(&mut self) -> Pair<i32> {
        Pair(
            tensor(self.rank, 30, &[3, 1], |v| v as i32),
            tensor(self.rank, 31, &[6], |v| v as i32),
        )
    }
    fn plain(&mut self) -> Tensor<i64> {
        tensor(self.rank, 40, &[3, 3], |v| v)
    }
    fn scalar(&mut self) -> f32 {
        self.rank as f32 * 2.0
    }
    fn flat(&mut self) -> Vec<u8> {
        vec![self.rank as u8; 3]
    }
    /// `1 + rank` tensors: lists of different lengths.
    fn ragged(&mut self) -> Vec<Tensor<f32>> {
        vec![Tensor::full([2], 1.0); 1 + self.rank]
    }
}

fn workers() -> Vec<W> {
    (0..RANKS).map(|rank| W { rank }).collect()
}

graph! {
    SumAll(ws: [W]) {
        let g = ws.grads();
        let l = ws.list();
        let p = ws.pair();
        let t = ws.plain();
        let s = ws.scalar();
        let f = ws.flat();
        allreduce([g, l, p, t, s, f], Sum)
    }
    MaxAll(ws: [W]) {
        let g = ws.grads();
        let l = ws.list();
        allreduce([g, l], Max)
    }
    AvgAll(ws: [W]) {
        let g = ws.grads();
        let l = ws.list();
        allreduce([g, l], Avg)
    }
    Bcast(ws: [W]) {
        let g = ws.grads();
        let l = ws.list();
        broadcast([g, l], 2)
    }
    Reduce(ws: [W]) {
        let g = ws.grads();
        let l = ws.list();
        reduce([g, l], Sum, 1)
    }
    GatherAll(ws: [W]) {
        let l = ws.list();
        let y = ws.layers();
        let p = ws.pair();
        let s = ws.scalar();
        let f = ws.flat();
        allgather([l, y, p, s, f])
    }
    ScatterAll(ws: [W]) {
        let y = ws.layers();
        let p = ws.pair();
        let t = ws.plain();
        let f = ws.flat();
        reducescatter([y, p, t, f], Sum)
    }
    Ragged(ws: [W]) {
        let r = ws.ragged();
        allreduce(r)
    }
}

/// Every rank's inputs, made by the same methods the actors run.
fn inputs<T>(f: impl Fn(&mut W) -> T) -> Vec<T> {
    workers().iter_mut().map(f).collect()
}

/// `got` holds, bit for bit, `op` over the ranks' `parts` (the per-value reference).
fn check_reduced<E: Element>(got: &Tensor<E>, parts: &[&Tensor<E>], op: ReduceOp, what: &str) {
    let srcs: Vec<&[E]> = parts.iter().map(|t| t.as_slice()).collect();
    assert_eq!(got.shape(), parts[0].shape(), "{what}: shape");
    assert_eq!(
        got.as_slice(),
        reduce_reference(&srcs, op),
        "{what}: {op:?}"
    );
}

fn check_grads(got: &Grads, ins: &[Grads], op: ReduceOp) {
    assert_eq!(got.layers.len(), 3);
    for (k, l) in got.layers.iter().enumerate() {
        let ws: Vec<_> = ins.iter().map(|g| &g.layers[k].w).collect();
        let bs: Vec<_> = ins.iter().map(|g| &g.layers[k].b).collect();
        check_reduced(&l.w, &ws, op, "layer w");
        check_reduced(&l.b, &bs, op, "layer b");
    }
    let steps: Vec<u64> = ins.iter().map(|g| g.step).collect();
    let losses: Vec<f32> = ins.iter().map(|g| g.loss).collect();
    assert_eq!(got.step, fold(&steps, op));
    assert_eq!(got.loss, fold(&losses, op));
}

/// `op` over one scalar per rank, by the reference.
fn fold<E: Element>(per_rank: &[E], op: ReduceOp) -> E {
    let each: Vec<[E; 1]> = per_rank.iter().map(|&v| [v]).collect();
    let srcs: Vec<&[E]> = each.iter().map(|v| &v[..]).collect();
    reduce_reference(&srcs, op)[0]
}

fn check_list(got: &[Tensor<f32>], ins: &[Vec<Tensor<f32>>], op: ReduceOp) {
    assert_eq!(got.len(), 3);
    for (k, t) in got.iter().enumerate() {
        let parts: Vec<_> = ins.iter().map(|l| &l[k]).collect();
        check_reduced(t, &parts, op, "list item");
    }
}

#[test]
fn allreduce_of_lists_and_structs_mixed_with_tensors_and_scalars() {
    let mut g = SumAll::launch(workers(), Cpu).unwrap();
    let (grads, lists, pairs) = (inputs(W::grads), inputs(W::list), inputs(W::pair));
    let (plains, scalars) = (inputs(W::plain), inputs(W::scalar));
    for _ in 0..2 {
        let out = g.execute().unwrap();
        for (gr, l, p, t, s, f) in &out {
            check_grads(gr, &grads, ReduceOp::Sum);
            check_list(l, &lists, ReduceOp::Sum);
            check_reduced(
                &p.0,
                &pairs.iter().map(|p| &p.0).collect::<Vec<_>>(),
                ReduceOp::Sum,
                "pair.0",
            );
            check_reduced(
                &p.1,
                &pairs.iter().map(|p| &p.1).collect::<Vec<_>>(),
                ReduceOp::Sum,
                "pair.1",
            );
            check_reduced(
                t,
                &plains.iter().collect::<Vec<_>>(),
                ReduceOp::Sum,
                "plain",
            );
            assert_eq!(*s, fold(&scalars, ReduceOp::Sum));
            assert_eq!(*f, vec![3u8; 3]);
            // Results are views of the stage's one f32 buffer: the struct's, the list's.
            assert!(gr.layers[0].w.shares_storage(&l[0]));
            assert!(gr.layers[2].w.shares_storage(&gr.layers[1].w));
        }
    }
}

#[test]
fn every_reduce_op_and_the_rooted_collectives() {
    let (grads, lists) = (inputs(W::grads), inputs(W::list));
    for (gr, l) in &MaxAll::launch(workers(), Cpu).unwrap().execute().unwrap() {
        check_grads(gr, &grads, ReduceOp::Max);
        check_list(l, &lists, ReduceOp::Max);
    }
    for (gr, l) in &AvgAll::launch(workers(), Cpu).unwrap().execute().unwrap() {
        check_grads(gr, &grads, ReduceOp::Avg);
        check_list(l, &lists, ReduceOp::Avg);
    }
    for (gr, l) in &Bcast::launch(workers(), Cpu).unwrap().execute().unwrap() {
        assert_eq!(gr.step, grads[2].step);
        assert_eq!(gr.layers[1].w, grads[2].layers[1].w);
        assert_eq!(gr.layers[2].b, grads[2].layers[2].b);
        assert_eq!(l, &lists[2]);
    }
    let out = Reduce::launch(workers(), Cpu).unwrap().execute().unwrap();
    assert!(out[0].0.is_none() && out[2].1.is_none());
    check_grads(out[1].0.as_ref().unwrap(), &grads, ReduceOp::Sum);
    check_list(out[1].1.as_ref().unwrap(), &lists, ReduceOp::Sum);
}

/// Every rank's tensors, concatenated along the first dimension.
fn concat<E: Element>(parts: &[&Tensor<E>]) -> (Vec<usize>, Vec<E>) {
    let mut shape = parts[0].shape().to_vec();
    shape[0] *= parts.len();
    (shape, parts.iter().flat_map(|t| t.to_vec()).collect())
}

fn check_gathered<E: Element>(got: &Tensor<E>, parts: &[&Tensor<E>]) {
    let (shape, data) = concat(parts);
    assert_eq!((got.shape(), got.to_vec()), (&shape[..], data));
}

#[test]
fn allgather_gathers_each_part_on_its_own() {
    let (lists, layers, pairs) = (inputs(W::list), inputs(W::layers), inputs(W::pair));
    let out = GatherAll::launch(workers(), Cpu)
        .unwrap()
        .execute()
        .unwrap();
    for (l, y, p, s, f) in &out {
        for k in 0..3 {
            check_gathered(&l[k], &lists.iter().map(|l| &l[k]).collect::<Vec<_>>());
        }
        assert_eq!(y.len(), 2);
        for k in 0..2 {
            check_gathered(&y[k].w, &layers.iter().map(|l| &l[k].w).collect::<Vec<_>>());
            check_gathered(&y[k].b, &layers.iter().map(|l| &l[k].b).collect::<Vec<_>>());
        }
        check_gathered(&p.0, &pairs.iter().map(|p| &p.0).collect::<Vec<_>>());
        check_gathered(&p.1, &pairs.iter().map(|p| &p.1).collect::<Vec<_>>());
        assert_eq!(*s, vec![0.0, 2.0, 4.0]);
        // A list of scalars is still one flat value.
        assert_eq!(*f, vec![0, 0, 0, 1, 1, 1, 2, 2, 2]);
    }
}

/// Rank `rank`'s rows of `op` over the ranks' `parts`.
fn check_scattered<E: Element>(got: &Tensor<E>, parts: &[&Tensor<E>], rank: usize) {
    let srcs: Vec<&[E]> = parts.iter().map(|t| t.as_slice()).collect();
    let all = reduce_reference(&srcs, ReduceOp::Sum);
    let share = all.len() / RANKS;
    let mut shape = parts[0].shape().to_vec();
    shape[0] /= RANKS;
    assert_eq!(got.shape(), &shape[..]);
    assert_eq!(got.as_slice(), &all[rank * share..(rank + 1) * share]);
}

#[test]
fn reducescatter_splits_each_part_along_its_rows() {
    let (layers, pairs, plains) = (inputs(W::layers), inputs(W::pair), inputs(W::plain));
    let out = ScatterAll::launch(workers(), Cpu)
        .unwrap()
        .execute()
        .unwrap();
    for (rank, (y, p, t, f)) in out.iter().enumerate() {
        for k in 0..2 {
            check_scattered(
                &y[k].w,
                &layers.iter().map(|l| &l[k].w).collect::<Vec<_>>(),
                rank,
            );
            check_scattered(
                &y[k].b,
                &layers.iter().map(|l| &l[k].b).collect::<Vec<_>>(),
                rank,
            );
        }
        check_scattered(&p.0, &pairs.iter().map(|p| &p.0).collect::<Vec<_>>(), rank);
        check_scattered(&p.1, &pairs.iter().map(|p| &p.1).collect::<Vec<_>>(), rank);
        check_scattered(t, &plains.iter().collect::<Vec<_>>(), rank);
        assert_eq!(*f, vec![3u8]);
    }
}

#[test]
fn lists_of_different_lengths_are_a_length_mismatch_naming_the_value() {
    let mut g = Ragged::launch(workers(), Cpu).unwrap();
    for _ in 0..2 {
        match g.execute() {
            Err(Error::LengthMismatch {
                value: "r",
                slot: 0,
                item: None,
                lens,
                ..
            }) => assert_eq!(lens, [1, 2, 3]),
            other => panic!("unexpected: {:?}", other.map(|_| ())),
        }
    }
}

#[test]
fn a_list_of_a_hundred_tensors_is_one_fused_stage() {
    struct Many(usize);
    #[actor]
    impl Many {
        fn grads(&mut self) -> Vec<Tensor<f32>> {
            (0..100)
                .map(|k| Tensor::full([k % 7 + 1], (self.0 + k) as f32))
                .collect()
        }
    }
    graph! {
        G(ms: [Many]) {
            let g = ms.grads();
            allreduce(g)
        }
    }
    let backend = Counting::default();
    let counts = Arc::clone(&backend.counts);
    let mut g = G::launch((0..RANKS).map(Many).collect::<Vec<_>>(), backend).unwrap();
    let out = g.execute().unwrap();
    assert_eq!(counts.stages.load(SeqCst), RANKS, "one stage per rank");
    // The list's length takes a slot without elements: no region of its own.
    assert_eq!(counts.regions.load(SeqCst), RANKS, "one f32 region");
    for list in &out {
        assert_eq!(list.len(), 100);
        for (k, t) in list.iter().enumerate() {
            assert_eq!(t.to_vec(), vec![(3 * k + 3) as f32; k % 7 + 1]);
            assert!(t.shares_storage(&list[0]));
        }
    }
}

#[test]
fn a_method_may_return_more_than_twelve_values() {
    struct Wide(f32);
    #[actor]
    impl Wide {
        #[allow(clippy::type_complexity)] // the point: a 16-tuple, beyond std's 12
        fn many(
            &mut self,
        ) -> (
            f32,
            f32,
            f32,
            f32,
            f32,
            f32,
            f32,
            f32,
            f32,
            f32,
            f32,
            f32,
            f32,
            f32,
            f32,
            f32,
        ) {
            let v = self.0;
            (v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v)
        }
    }
    graph! {
        G(ws: [Wide]) {
            let (a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p) = ws.many();
            let (x, y) = allreduce([a, p]);
            (x, y, b, c, d, e, f, g, h, i, j, k, l, m, n, o)
        }
    }
    let mut g = G::launch(vec![Wide(1.0), Wide(2.0)], Cpu).unwrap();
    let out = g.execute().unwrap();
    // A graph's output may be as wide: 16 values per actor.
    assert_eq!(
        (out[1].0, out[1].1, out[1].2, out[1].15),
        (3.0, 3.0, 2.0, 2.0)
    );
}

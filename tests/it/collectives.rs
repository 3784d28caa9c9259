//! Every collective through `graph!`, flat and nested, with known values: output types and
//! shapes (empty values, scalars, `Vec<E>`, 16-bit floats), the run-time errors of
//! `reducescatter` and of a root out of range, and a counting communicator showing that a
//! bucket mixing dtypes runs as one fused stage.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

use actorgraph::half::{bf16, f16};
use actorgraph::prelude::*;

use crate::support::counting::Counting;

struct Node {
    rank: usize,
}

fn nodes(n: usize) -> Vec<Node> {
    (0..n).map(|rank| Node { rank }).collect()
}

#[actor]
impl Node {
    /// `[2, 3]`: `10 * rank + i`.
    fn mat(&mut self) -> Tensor<f32> {
        let r = self.rank as f32;
        Tensor::from_vec((0..6).map(|i| 10.0 * r + i as f32).collect(), [2, 3]).unwrap()
    }
    /// A loss: `rank + 1`.
    fn loss(&mut self) -> f32 {
        (self.rank + 1) as f32
    }
    /// `[rank; 2]`.
    fn bytes(&mut self) -> Vec<u8> {
        vec![self.rank as u8; 2]
    }
    /// `[n, 2]`: `rank + i`.
    fn rows(&mut self, n: &usize) -> Tensor<i64> {
        let r = self.rank as i64;
        Tensor::from_vec((0..2 * *n as i64).map(|i| r + i).collect(), [*n, 2]).unwrap()
    }
    fn empty(&mut self) -> Tensor<i32> {
        Tensor::zeros([0, 3])
    }
    /// A 0-d tensor: `rank`.
    fn point(&mut self) -> Tensor<f64> {
        Tensor::scalar(self.rank as f64)
    }
    fn halves(&mut self) -> Tensor<f16> {
        Tensor::from_slice(&[f16::from_f32(0.5), f16::from_f32(self.rank as f32)])
    }
    /// `[256, 1]` on rank 0, `[1, 1]` elsewhere.
    fn brains(&mut self) -> Tensor<bf16> {
        let first = if self.rank == 0 { 256.0 } else { 1.0 };
        Tensor::from_slice(&[bf16::from_f32(first), bf16::ONE])
    }
    /// Checks what a destructured collective hands to a later method.
    #[allow(clippy::ptr_arg)] // graph methods take each value's own type by reference
    fn total(&mut self, m: &Tensor<f32>, l: &Vec<f32>) -> f32 {
        m.as_slice().iter().sum::<f32>() + l.iter().sum::<f32>()
    }
    fn root_only(&mut self, m: &Option<Tensor<f32>>) -> bool {
        m.is_some()
    }
}

graph! {
    GatherFlat(ns: [Node]) {
        let m = ns.mat();
        allgather(m)
    }

    GatherNested(ns: [Node]) {
        let m = ns.mat();
        let l = ns.loss();
        let b = ns.bytes();
        let e = ns.empty();
        let p = ns.point();
        let h = ns.halves();
        allgather([m, l, b, e, p, h])
    }

    GatherThenUse(ns: [Node]) {
        let m = ns.mat();
        let l = ns.loss();
        let (ms, ls) = allgather([m, l]);
        ns.total(ms, ls)
    }

    ScatterFlat(ns: [Node], n: usize) {
        let r = ns.rows(n);
        reducescatter(r)
    }

    ScatterNested(ns: [Node], n: usize) {
        let r = ns.rows(n);
        let m = ns.mat();
        let b = ns.bytes();
        let e = ns.empty();
        let (rs, ms, bs, es) = reducescatter([r, m, b, e], Max);
        (rs, ms, bs, es)
    }

    ScatterPoint(ns: [Node]) {
        let p = ns.point();
        reducescatter(p)
    }

    BroadcastFlat(ns: [Node]) {
        let m = ns.mat();
        broadcast(m, 1)
    }

    BroadcastNested(ns: [Node]) {
        let m = ns.mat();
        let l = ns.loss();
        let b = ns.bytes();
        let p = ns.point();
        let h = ns.brains();
        broadcast([m, l, b, p, h], 2)
    }

    BroadcastFar(ns: [Node]) {
        let m = ns.mat();
        broadcast(m, 5)
    }

    ReduceFlat(ns: [Node]) {
        let m = ns.mat();
        reduce(m, Sum, 0)
    }

    ReduceNested(ns: [Node]) {
        let m = ns.mat();
        let l = ns.loss();
        let (rm, rl) = reduce([m, l], Max, 1);
        let seen = ns.root_only(rm);
        (seen, rl)
    }

    Halves(ns: [Node]) {
        let h = ns.halves();
        let b = ns.brains();
        let l = ns.loss();
        allreduce([h, b, l], Avg)
    }
}

#[test]
fn allgather_of_a_2x3_tensor_over_3_ranks_is_6x3_in_rank_order() {
    let mut g = GatherFlat::launch(nodes(3), Cpu).unwrap();
    let out: Vec<Tensor<f32>> = g.execute().unwrap();
    let want: Vec<f32> = (0..3)
        .flat_map(|r| (0..6).map(move |i| 10.0 * r as f32 + i as f32))
        .collect();
    for t in &out {
        assert_eq!(t.shape(), &[6, 3]);
        assert_eq!(t.to_vec(), want);
    }
}

#[test]
fn nested_allgather_keeps_each_values_type_and_shape() {
    let mut g = GatherNested::launch(nodes(3), Cpu).unwrap();
    #[allow(clippy::type_complexity)]
    let out: Vec<(
        Tensor<f32>,
        Vec<f32>,
        Vec<u8>,
        Tensor<i32>,
        Tensor<f64>,
        Tensor<f16>,
    )> = g.execute().unwrap();
    assert_eq!(out.len(), 3);
    for (m, l, b, e, p, h) in &out {
        assert_eq!(m.shape(), &[6, 3]);
        assert_eq!(l, &vec![1.0, 2.0, 3.0]);
        assert_eq!(b, &vec![0, 0, 1, 1, 2, 2]);
        assert_eq!(e.shape(), &[0, 3]);
        // A 0-d tensor gathers into a vector of one value per rank.
        assert_eq!(p.shape(), &[3]);
        assert_eq!(p.to_vec(), vec![0.0, 1.0, 2.0]);
        let h: Vec<f32> = h.as_slice().iter().map(|x| x.to_f32()).collect();
        assert_eq!(h, vec![0.5, 0.0, 0.5, 1.0, 0.5, 2.0]);
    }
}

#[test]
fn a_destructured_allgather_feeds_a_later_method() {
    let mut g = GatherThenUse::launch(nodes(2), Cpu).unwrap();
    let out: Vec<f32> = g.execute().unwrap();
    // sum of (0..6) + sum of (10..16) + losses 1 + 2
    assert_eq!(out, vec![15.0 + 75.0 + 3.0; 2]);
}

#[test]
fn a_held_allgather_output_survives_the_next_execution() {
    let mut g = GatherFlat::launch(nodes(2), Cpu).unwrap();
    let first = g.execute().unwrap();
    let second = g.execute().unwrap();
    assert!(!first[0].shares_storage(&second[0]));
    assert_eq!(first[0].to_vec(), second[0].to_vec());
}

#[test]
fn reducescatter_gives_each_rank_its_chunk_of_the_first_dimension() {
    let mut g = ScatterFlat::launch(nodes(3), Cpu).unwrap();
    let out: Vec<Tensor<i64>> = g.execute(6).unwrap();
    // Element i sums to 3i + (0 + 1 + 2); rank r gets rows 2r, 2r + 1 (elements 4r..4r + 4).
    for (r, t) in out.iter().enumerate() {
        assert_eq!(t.shape(), &[2, 2]);
        let want: Vec<i64> = (4 * r..4 * r + 4).map(|i| 3 * i as i64 + 3).collect();
        assert_eq!(t.to_vec(), want);
    }
}

#[test]
fn nested_reducescatter_with_an_op() {
    let mut g = ScatterNested::launch(nodes(2), Cpu).unwrap();
    #[allow(clippy::type_complexity)]
    let out: Vec<(Tensor<i64>, Tensor<f32>, Vec<u8>, Tensor<i32>)> = g.execute(4).unwrap();
    for (r, (rs, ms, bs, es)) in out.iter().enumerate() {
        // Max over ranks is rank 1's value everywhere.
        assert_eq!(rs.shape(), &[2, 2]);
        let want: Vec<i64> = (4 * r..4 * r + 4).map(|i| 1 + i as i64).collect();
        assert_eq!(rs.to_vec(), want);
        assert_eq!(ms.shape(), &[1, 3]);
        let want: Vec<f32> = (3 * r..3 * r + 3).map(|i| 10.0 + i as f32).collect();
        assert_eq!(ms.to_vec(), want);
        assert_eq!(bs, &vec![1]);
        assert_eq!(es.shape(), &[0, 3]);
    }
}

#[test]
fn reducescatter_not_divisible_is_a_typed_error_and_the_graph_stays_usable() {
    let mut g = ScatterFlat::launch(nodes(3), Cpu).unwrap();
    match g.execute(4) {
        Err(Error::NotDivisible {
            stage,
            slot,
            len,
            ranks,
        }) => {
            assert_eq!((stage, slot, len, ranks), ("reducescatter(r)", 0, 4, 3));
        }
        other => panic!("expected NotDivisible, got {other:?}"),
    }
    // Every execute checks again; a failed one leaves nothing behind.
    assert!(matches!(
        g.execute(2),
        Err(Error::NotDivisible { len: 2, .. })
    ));
    let out = g.execute(3).unwrap();
    assert_eq!(out[2].shape(), &[1, 2]);
}

#[test]
fn the_first_dimension_must_divide_even_when_the_length_does() {
    // [3, 2] holds 6 elements, which split over 2 ranks, but its 3 rows do not.
    let mut g = ScatterFlat::launch(nodes(2), Cpu).unwrap();
    let err = g.execute(3).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotDivisible {
                len: 3,
                ranks: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("reducescatter(r)"), "{err}");
    assert_eq!(g.execute(2).unwrap()[1].shape(), &[1, 2]);
}

#[test]
fn a_0d_tensor_scatters_over_one_rank_only() {
    let mut g = ScatterPoint::launch(nodes(1), Cpu).unwrap();
    let out = g.execute().unwrap();
    assert_eq!((out[0].shape(), out[0].to_vec()), (&[][..], vec![0.0]));
    let mut g = ScatterPoint::launch(nodes(2), Cpu).unwrap();
    assert!(matches!(
        g.execute(),
        Err(Error::NotDivisible {
            len: 1,
            ranks: 2,
            ..
        })
    ));
}

#[test]
fn broadcast_gives_every_rank_the_roots_value() {
    let mut g = BroadcastFlat::launch(nodes(3), Cpu).unwrap();
    let out: Vec<Tensor<f32>> = g.execute().unwrap();
    for t in &out {
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(t.to_vec(), vec![10.0, 11.0, 12.0, 13.0, 14.0, 15.0]);
    }
}

#[test]
fn nested_broadcast_of_every_kind_of_value() {
    let mut g = BroadcastNested::launch(nodes(4), Cpu).unwrap();
    #[allow(clippy::type_complexity)]
    let out: Vec<(Tensor<f32>, f32, Vec<u8>, Tensor<f64>, Tensor<bf16>)> = g.execute().unwrap();
    for (m, l, b, p, h) in &out {
        assert_eq!(m.as_slice()[0], 20.0);
        assert_eq!(*l, 3.0);
        assert_eq!(b, &vec![2, 2]);
        assert_eq!((p.shape(), p.to_vec()), (&[][..], vec![2.0]));
        assert_eq!(h.to_vec(), vec![bf16::ONE, bf16::ONE]);
    }
}

#[test]
fn a_broadcast_root_outside_the_group_fails_at_launch() {
    match BroadcastFar::launch(nodes(2), Cpu) {
        Err(Error::RootOutOfRange {
            group,
            stage,
            root,
            size,
        }) => assert_eq!((group, stage, root, size), ("ns", "broadcast(m, 5)", 5, 2)),
        Err(other) => panic!("expected RootOutOfRange, got {other}"),
        Ok(_) => panic!("a root outside the group must not launch"),
    }
    // Within range it runs.
    let mut g = BroadcastFar::launch(nodes(6), Cpu).unwrap();
    assert_eq!(g.execute().unwrap()[0].as_slice()[0], 50.0);
}

#[test]
fn a_rooted_stage_over_an_empty_group_is_an_empty_group_error() {
    // Not `RootOutOfRange { size: 0 }`: no root could be right, the group is the mistake.
    for result in [
        BroadcastFlat::launch(Vec::new(), Cpu).map(drop),
        ReduceFlat::launch(Vec::new(), Cpu).map(drop),
    ] {
        match result {
            Err(Error::EmptyGroup { group }) => assert_eq!(group, "ns"),
            Err(other) => panic!("expected EmptyGroup, got {other}"),
            Ok(()) => panic!("an empty group must not launch"),
        }
    }
}

#[test]
fn reduce_gives_the_root_the_result_and_the_others_none() {
    let mut g = ReduceFlat::launch(nodes(3), Cpu).unwrap();
    let out: Vec<Option<Tensor<f32>>> = g.execute().unwrap();
    let root = out[0].as_ref().unwrap();
    assert_eq!(root.shape(), &[2, 3]);
    assert_eq!(root.to_vec(), vec![30.0, 33.0, 36.0, 39.0, 42.0, 45.0]);
    assert!(out[1].is_none() && out[2].is_none());
}

#[test]
fn nested_reduce_feeds_a_later_method() {
    let mut g = ReduceNested::launch(nodes(3), Cpu).unwrap();
    let out: Vec<(bool, Option<f32>)> = g.execute().unwrap();
    assert_eq!(out, vec![(false, None), (true, Some(3.0)), (false, None)]);
}

#[test]
fn half_floats_average_through_f32() {
    let mut g = Halves::launch(nodes(3), Cpu).unwrap();
    let out: Vec<(Tensor<f16>, Tensor<bf16>, f32)> = g.execute().unwrap();
    for (h, b, l) in &out {
        // (0 + 1 + 2) / 3 = 1; 0.5 stays 0.5.
        assert_eq!(h.to_vec(), vec![f16::from_f32(0.5), f16::ONE]);
        // (256 + 1 + 1) / 3 = 86 in f32. In bf16 steps 256 + 1 rounds back to 256, and
        // 256 / 3 would give 85.5.
        assert_eq!(b.to_vec(), vec![bf16::from_f32(86.0), bf16::ONE]);
        assert_eq!(*l, 2.0);
    }
}

struct Mixer {
    rank: usize,
}

/// One method per dtype: `[rank + 1; 3]` (and `f32`/`i64` partners of length 2 and 4).
macro_rules! mixer_methods {
    ($($method:ident: $t:ty = $make:expr;)*) => {
        #[actor]
        impl Mixer {
            $(fn $method(&mut self) -> Tensor<$t> {
                let make: fn(usize) -> $t = $make;
                Tensor::full([3], make(self.rank + 1))
            })*
            fn partner_f32(&mut self) -> Tensor<f32> {
                Tensor::full([2], 1.0)
            }
            fn partner_i64(&mut self) -> Tensor<i64> {
                Tensor::full([4], 1)
            }
        }
    };
}

mixer_methods! {
    m_f16: f16 = |v| f16::from_f32(v as f32);
    m_bf16: bf16 = |v| bf16::from_f32(v as f32);
    m_f32: f32 = |v| v as f32;
    m_f64: f64 = |v| v as f64;
    m_i8: i8 = |v| v as i8;
    m_u8: u8 = |v| v as u8;
    m_i32: i32 = |v| v as i32;
    m_u32: u32 = |v| v as u32;
    m_i64: i64 = |v| v as i64;
    m_u64: u64 = |v| v as u64;
}

/// Per dtype: a graph whose one `allreduce` mixes that dtype with `f32` and `i64`, and a
/// test that each execute makes exactly one `stage` call per rank, with one region per
/// distinct dtype, and sums correctly.
macro_rules! one_stage_per_dtype {
    ($($test:ident: $graph:ident, $method:ident, $t:ty, $regions:expr;)*) => {
        graph! {
            $($graph(ms: [Mixer]) {
                let a = ms.partner_f32();
                let b = ms.$method();
                let c = ms.partner_i64();
                allreduce([a, b, c])
            })*
        }

        $(#[test]
        fn $test() {
            let backend = Counting::default();
            let counts = Arc::clone(&backend.counts);
            let ranks = 3;
            let mut g = $graph::launch((0..ranks).map(|rank| Mixer { rank }).collect::<Vec<_>>(), backend)
                .unwrap();
            for round in 1..=4 {
                let out: Vec<(Tensor<f32>, Tensor<$t>, Tensor<i64>)> = g.execute().unwrap();
                assert_eq!(counts.stages.load(SeqCst), round * ranks, "one stage per rank per execute");
                assert_eq!(counts.regions.load(SeqCst), round * ranks * $regions, "one region per dtype");
                for (a, b, c) in &out {
                    assert_eq!(a.to_vec(), vec![3.0; 2]);
                    // 1 + 2 + 3
                    let make: fn(usize) -> $t = |v| Mixer { rank: v - 1 }.$method().as_slice()[0];
                    assert_eq!(b.to_vec(), vec![make(6); 3]);
                    assert_eq!(c.to_vec(), vec![3; 4]);
                }
            }
        })*
    };
}

one_stage_per_dtype! {
    one_stage_f16: MixF16, m_f16, f16, 3;
    one_stage_bf16: MixBf16, m_bf16, bf16, 3;
    one_stage_f32: MixF32, m_f32, f32, 2;
    one_stage_f64: MixF64, m_f64, f64, 3;
    one_stage_i8: MixI8, m_i8, i8, 3;
    one_stage_u8: MixU8, m_u8, u8, 3;
    one_stage_i32: MixI32, m_i32, i32, 3;
    one_stage_u32: MixU32, m_u32, u32, 3;
    one_stage_i64: MixI64, m_i64, i64, 2;
    one_stage_u64: MixU64, m_u64, u64, 3;
}

graph! {
    /// Every collective once over a bucket of four dtypes.
    EveryCollective(ms: [Mixer]) {
        let a = ms.m_f16();
        let b = ms.m_i8();
        let c = ms.m_u64();
        let d = ms.partner_f32();
        let (a1, b1, c1, d1) = allreduce([a, b, c, d], Max);
        let (a2, b2, c2, d2) = allgather([a1, b1, c1, d1]);
        let (a3, b3, c3, d3) = reducescatter([a2, b2, c2, d2], Sum);
        let (a4, b4, c4, d4) = broadcast([a3, b3, c3, d3], 1);
        reduce([a4, b4, c4, d4], Sum, 0)
    }
}

#[test]
fn every_collective_over_a_mixed_bucket_is_one_stage_each() {
    let backend = Counting::default();
    let counts = Arc::clone(&backend.counts);
    let mut g = EveryCollective::launch(
        (0..3).map(|rank| Mixer { rank }).collect::<Vec<_>>(),
        backend,
    )
    .unwrap();
    #[allow(clippy::type_complexity)]
    let out: Vec<(
        Option<Tensor<f16>>,
        Option<Tensor<i8>>,
        Option<Tensor<u64>>,
        Option<Tensor<f32>>,
    )> = g.execute().unwrap();
    assert_eq!(counts.stages.load(SeqCst), 5 * 3);
    assert_eq!(counts.regions.load(SeqCst), 5 * 3 * 4);
    // Max over ranks is 3 (and 1 for d); gathered, each is 3 ranks x that; scattered with
    // Sum, each rank gets a third of 3 x (3 ranks x 3) = 9s; broadcast keeps them; reduced
    // with Sum on rank 0: 27.
    let (a, b, c, d) = &out[0];
    let (a, b, c, d) = (
        a.as_ref().unwrap(),
        b.as_ref().unwrap(),
        c.as_ref().unwrap(),
        d.as_ref().unwrap(),
    );
    assert_eq!(a.to_vec(), vec![f16::from_f32(27.0); 3]);
    assert_eq!(b.to_vec(), vec![27; 3]);
    assert_eq!(c.to_vec(), vec![27; 3]);
    assert_eq!(d.to_vec(), vec![9.0; 2]);
    assert!(out[1].0.is_none() && out[2].3.is_none());
}

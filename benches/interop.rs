//! What the integrations' copies cost: one allreduce of a list of K tensors on 2 actors,
//! as `Vec<actorgraph::Tensor<f32>>` (lent to the stage in place, results views of its
//! buffer), as `Vec<candle_core::Tensor>` of the same bytes (copied in and out of the
//! stage's buffer) and as `Vec<ndarray::Array1<f32>>` (lent in place, results copied out;
//! the actor also clones its arrays each step, since an `Array` owns its elements).
//! Measured in one binary, side by side (feature `candle` and `ndarray`).

use std::time::Duration;

use actorgraph::candle_core::{Device, Tensor as CTensor};
use actorgraph::ndarray::Array1;
use actorgraph::prelude::*;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// Holds one list of each kind of the same values; returns them by reference count
/// (tensors) or by clone (arrays).
struct Holder {
    tensors: Vec<Tensor<f32>>,
    candles: Vec<CTensor>,
    arrays: Vec<Array1<f32>>,
}

#[actor]
impl Holder {
    fn tensors(&mut self) -> Vec<Tensor<f32>> {
        self.tensors.clone()
    }
    fn candles(&mut self) -> Vec<CTensor> {
        self.candles.clone()
    }
    fn arrays(&mut self) -> Vec<Array1<f32>> {
        self.arrays.clone()
    }
}

graph! {
    Tensors(hs: [Holder]) {
        let t = hs.tensors();
        allreduce(t)
    }
    Candles(hs: [Holder]) {
        let c = hs.candles();
        allreduce(c)
    }
    Arrays(hs: [Holder]) {
        let a = hs.arrays();
        allreduce(a)
    }
}

fn holders(k: usize, len: usize) -> Vec<Holder> {
    (0..2)
        .map(|r| {
            let data: Vec<Vec<f32>> = (0..k).map(|i| vec![(r + i) as f32; len]).collect();
            Holder {
                tensors: data.iter().map(|d| Tensor::from_slice(d)).collect(),
                candles: data
                    .iter()
                    .map(|d| CTensor::from_slice(d, len, &Device::Cpu).unwrap())
                    .collect(),
                arrays: data.iter().map(|d| Array1::from_vec(d.clone())).collect(),
            }
        })
        .collect()
}

fn copies(c: &mut Criterion) {
    let mut group = c.benchmark_group("interop allreduce");
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(3));
    // 16 tensors of 1 Ki f32 (64 KiB) and of 64 Ki f32 (4 MiB).
    for len in [1024, 65536] {
        let k = 16;
        group.throughput(Throughput::Bytes((k * len * 4) as u64));
        let id = |what: &str| BenchmarkId::new(what, format!("{k}x{len} f32"));
        let mut g = Tensors::launch(holders(k, len), Cpu).unwrap();
        group.bench_function(id("actorgraph Tensor"), |b| b.iter(|| g.execute().unwrap()));
        let mut g = Candles::launch(holders(k, len), Cpu).unwrap();
        group.bench_function(id("candle Tensor"), |b| b.iter(|| g.execute().unwrap()));
        let mut g = Arrays::launch(holders(k, len), Cpu).unwrap();
        group.bench_function(id("ndarray Array1"), |b| b.iter(|| g.execute().unwrap()));
    }
    group.finish();
}

criterion_group!(benches, copies);
criterion_main!(benches);

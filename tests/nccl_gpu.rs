//! The NCCL backend on real GPUs: device tensors through every collective, host values
//! staged through the GPU, buffer reuse, the failure model, and the backend's own errors.
//!
//! Every test that needs a GPU asks [`gpus`] first and returns early, with a message, on a
//! machine without one (or without the CUDA driver), so the file passes anywhere it builds.
//! Set `ACTORGRAPH_REQUIRE_GPU=1` (as `scripts/gpu-check.sh` does) to make a missing GPU
//! a failure instead.
//!
//! Most tests run over `min(GPUs, 2)` ranks: one rank on a one-GPU machine (NCCL refuses
//! one GPU twice in a communicator), where every reduction of a single value is that
//! value, and two ranks where there are two GPUs. Values are small integers, so every
//! expected result is exact, whatever order NCCL reduces in; they are computed on the host
//! by `actorgraph::comm::reduce_reference`.
#![cfg(feature = "nccl")]

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use actorgraph::comm::{
    reduce_reference, AbortHandle, Collective, DevRegion, DeviceComm, Header, RegionMut, SlotDesc,
    StageError,
};
use actorgraph::half::{bf16, f16};
use actorgraph::nccl::cudarc::driver::DevicePtr;
use actorgraph::nccl::{self, current_device, Device, Nccl};
use actorgraph::prelude::*;
use actorgraph::{Backend, BoxError, Communicator, DType, Element};

#[path = "support/nap.rs"]
mod nap;
use nap::nap;

#[macro_use]
#[path = "support/gpu_bucket.rs"]
mod gpu_bucket;
use gpu_bucket::*;

/// The number of GPUs, or `None` (after saying why) when this machine has none.
///
/// With `ACTORGRAPH_REQUIRE_GPU` set (not empty, not `0`), a missing GPU fails the test
/// instead: a GPU check that skips everything must not look like a pass.
fn gpus() -> Option<usize> {
    let reason = match nccl::device_count() {
        Ok(0) => "the CUDA driver sees no GPU".to_string(),
        Ok(n) => return Some(n),
        // The full message lists every file name tried; the library says enough here.
        Err(Error::LibraryMissing { library, .. }) => format!("{library} could not be loaded"),
        Err(e) => e.to_string(),
    };
    let required = std::env::var("ACTORGRAPH_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0");
    assert!(!required, "ACTORGRAPH_REQUIRE_GPU is set, but: {reason}");
    eprintln!("skipped: no GPU ({reason})");
    None
}

/// A GPU test's turn: the machine's GPUs, to itself while the test runs.
///
/// GPU tests take turns: NCCL kernels of different communicators on one GPU can wait on
/// each other (with several ranks, even deadlock), and one test at a time also makes a
/// hang name its test.
struct Turn {
    /// The number of GPUs.
    gpus: usize,
    _serial: MutexGuard<'static, ()>,
}

impl Turn {
    /// The ranks the multi-rank tests use: one per GPU, at most two.
    fn ranks(&self) -> usize {
        self.gpus.min(2)
    }
}

/// Every GPU test's start: its turn, or `None` (after saying why) on a machine with fewer
/// than `min` GPUs.
fn gpu_turn(min: usize) -> Option<Turn> {
    let gpus = gpus()?;
    if gpus < min {
        eprintln!("skipped: needs {min} GPUs, this machine has {gpus}");
        return None;
    }
    static SERIAL: Mutex<()> = Mutex::new(());
    let serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    Some(Turn {
        gpus,
        _serial: serial,
    })
}

/// The device address of a GPU tensor's first element.
fn device_ptr<E: Element>(t: &Tensor<E>, device: &Device) -> u64 {
    let view = t.device_view().expect("a GPU tensor");
    let (ptr, _sync) = view.device_ptr(device.stream());
    ptr
}

// ---------------------------------------------------------------------------------------
// (a) GPU tensors of several dtypes and lengths through one allreduce.

struct Maker {
    calls: i64,
}

#[actor]
impl Maker {
    /// Two f32 values (one made with `Tensor::from_device`), two f16, a bf16, an i64 and a
    /// u8, all on this actor's GPU; different every call.
    #[allow(clippy::type_complexity)]
    fn mixed(
        &mut self,
    ) -> Result<
        (
            Tensor<f32>,
            Tensor<f32>,
            Tensor<f16>,
            Tensor<f16>,
            Tensor<bf16>,
            Tensor<i64>,
            Tensor<u8>,
        ),
        BoxError,
    > {
        self.calls += 1;
        let dev = current_device()?;
        let s = self.calls;
        // Not `clone_htod`: a copy from pageable memory on the actor's stream may wait
        // behind the group's collectives (see `Tensor::to_device`).
        let staged = on_gpu::<f32>(&dev, s, 0, &[1000])?;
        let big = dev
            .stream()
            .clone_dtod(&staged.device_view().ok_or("a GPU tensor")?)?;
        Ok((
            Tensor::from_device(big, [1000])?,
            on_gpu(&dev, s + 1, 0, &[3, 5])?,
            on_gpu(&dev, s + 2, 0, &[7])?,
            on_gpu(&dev, s + 3, 0, &[1])?,
            on_gpu(&dev, s + 4, 0, &[5])?,
            on_gpu(&dev, s + 5, 0, &[2, 2])?,
            on_gpu(&dev, s + 6, 0, &[2, 3])?,
        ))
    }

    /// An empty f32 and an empty i32 (a dtype with nothing else in the bucket) beside a
    /// non-empty f32, all on the GPU.
    #[allow(clippy::type_complexity)]
    fn with_empties(&mut self) -> Result<(Tensor<f32>, Tensor<f32>, Tensor<i32>), BoxError> {
        let dev = current_device()?;
        Ok((
            Tensor::<f32>::zeros([0]).to_device(&dev)?,
            on_gpu(&dev, 1, 0, &[4])?,
            Tensor::<i32>::zeros([0, 3]).to_device(&dev)?,
        ))
    }
}

graph! {
    MixedSum(ws: [Maker]) {
        let (a, b, c, d, e, f, g) = ws.mixed();
        allreduce([a, b, c, d, e, f, g], Sum)
    }

    Empties(ws: [Maker]) {
        let (e, x, z) = ws.with_empties();
        let (re, rx, rz) = allreduce([e, x, z]);
        let (ge, gx, gz) = allgather([e, x, z]);
        (re, rx, rz, ge, gx, gz)
    }
}

#[test]
fn one_rank_allreduce_of_gpu_tensors_gives_gpu_views_equal_to_the_input() {
    let Some(_turn) = gpu_turn(1) else { return };
    let mut g = MixedSum::launch(vec![Maker { calls: 0 }], Nccl::new([0]).unwrap()).unwrap();
    // Several executions: each must see its own values, not a stale buffer.
    for s in 1..=3 {
        let mut out = g.execute().unwrap();
        assert_eq!(out.len(), 1);
        let (a, b, c, d, e, f, u) = out.remove(0);
        assert_eq!(a.device_ordinal(), Some(0));
        assert_eq!(b.device_ordinal(), Some(0));
        assert_eq!(c.device_ordinal(), Some(0));
        assert_eq!(d.device_ordinal(), Some(0));
        assert_eq!(e.device_ordinal(), Some(0));
        assert_eq!(f.device_ordinal(), Some(0));
        assert_eq!(u.device_ordinal(), Some(0));
        assert!(!a.is_host() && a.host_slice().is_none());

        // One flat device buffer per dtype: values of one dtype view the same storage.
        assert!(
            a.shares_storage(&b),
            "the two f32 results share the stage's buffer"
        );
        assert!(
            c.shares_storage(&d),
            "the two f16 results share the stage's buffer"
        );

        assert_eq!(a.shape(), &[1000]);
        assert_eq!(b.shape(), &[3, 5]);
        assert_eq!(c.shape(), &[7]);
        assert_eq!(d.shape(), &[1]);
        assert_eq!(e.shape(), &[5]);
        assert_eq!(f.shape(), &[2, 2]);
        assert_eq!(u.shape(), &[2, 3]);

        // One rank: the sum of one value is that value.
        assert_eq!(host(&a), values::<f32>(s, 0, 1000), "execution {s}");
        assert_eq!(host(&b), values::<f32>(s + 1, 0, 15));
        assert_eq!(host(&c), values::<f16>(s + 2, 0, 7));
        assert_eq!(host(&d), values::<f16>(s + 3, 0, 1));
        assert_eq!(host(&e), values::<bf16>(s + 4, 0, 5));
        assert_eq!(host(&f), values::<i64>(s + 5, 0, 4));
        assert_eq!(host(&u), values::<u8>(s + 6, 0, 6));
        // A host copy is a host tensor.
        assert!(a.to_host().unwrap().is_host());
    }
    let back = g.teardown().unwrap();
    assert_eq!(back[0].calls, 3);
}

#[test]
fn empty_gpu_tensors_go_through_allreduce_and_allgather() {
    let Some(_turn) = gpu_turn(1) else { return };
    let mut g = Empties::launch(vec![Maker { calls: 0 }], Nccl::new([0]).unwrap()).unwrap();
    for _ in 0..2 {
        let (re, rx, rz, ge, gx, gz) = g.execute().unwrap().remove(0);
        for (t, shape) in [(&re, &[0][..]), (&ge, &[0][..])] {
            assert_eq!(t.shape(), shape);
            assert!(t.is_empty());
            assert_eq!(host(t), Vec::<f32>::new());
        }
        // An empty value of a dtype that has other values is a view of that buffer.
        assert!(re.shares_storage(&rx));
        assert_eq!(rx.device_ordinal(), Some(0));
        assert_eq!(host(&rx), values::<f32>(1, 0, 4));
        assert_eq!(host(&gx), values::<f32>(1, 0, 4));
        for t in [&rz, &gz] {
            assert_eq!(t.shape(), &[0, 3]);
            assert!(t.is_empty());
            assert_eq!(host(t), Vec::<i32>::new());
        }
    }
}

// ---------------------------------------------------------------------------------------
// (b) Every collective, every op, every dtype, with exact expected values.

#[test]
fn every_collective_every_op_every_dtype_on_the_gpu() {
    let Some(turn) = gpu_turn(1) else { return };
    let n = turn.ranks();
    let backend = || Nccl::new(0..n).unwrap();

    let mut g = AllReduceOps::launch(nodes(n), backend()).unwrap();
    let out = g.execute().unwrap();
    assert_eq!(out.len(), n);
    for (rank, (sum, prod, lo, hi, avg)) in out.iter().enumerate() {
        for (res, op) in [sum, prod, lo, hi, avg].into_iter().zip(ReduceOp::ALL) {
            check_bucket!(check, *res, Coll::AllReduce(op), At::here(rank, n));
        }
    }
    g.teardown().unwrap();

    let mut g = ReduceScatterOps::launch(nodes(n), backend()).unwrap();
    let out = g.execute().unwrap();
    for (rank, (sum, prod, lo, hi, avg)) in out.iter().enumerate() {
        for (res, op) in [sum, prod, lo, hi, avg].into_iter().zip(ReduceOp::ALL) {
            check_bucket!(check, *res, Coll::ReduceScatter(op), At::here(rank, n));
        }
    }
    g.teardown().unwrap();

    let mut g = ReduceOps::launch(nodes(n), backend()).unwrap();
    let out = g.execute().unwrap();
    assert!(out[0].0 .0.is_some(), "the root gets the reduction");
    for (rank, (sum, prod, lo, hi, avg)) in out.iter().enumerate() {
        for (res, op) in [sum, prod, lo, hi, avg].into_iter().zip(ReduceOp::ALL) {
            check_bucket!(check_opt, *res, Coll::Reduce(op), At::here(rank, n));
        }
    }
    g.teardown().unwrap();

    let mut g = GatherBroadcast::launch(nodes(n), backend()).unwrap();
    let out = g.execute().unwrap();
    for (rank, (gathered, sent)) in out.iter().enumerate() {
        check_bucket!(check, *gathered, Coll::AllGather, At::here(rank, n));
        check_bucket!(check, *sent, Coll::Broadcast, At::here(rank, n));
    }
    g.teardown().unwrap();
}

// ---------------------------------------------------------------------------------------
// (c) Host values through the GPU, (d) a bucket mixing GPU and host values.

struct HostVals {
    rank: usize,
}

fn host_vals(n: usize) -> Vec<HostVals> {
    (0..n).map(|rank| HostVals { rank }).collect()
}

const TABLE: [usize; 2] = [2, 3];

#[actor]
impl HostVals {
    /// `rank + 0.5`: averages exactly over one or two ranks.
    fn loss(&mut self) -> f32 {
        self.rank as f32 + 0.5
    }
    fn counts(&mut self) -> Vec<i32> {
        values(7, self.rank, 4)
    }
    fn table(&mut self) -> Tensor<f64> {
        Tensor::from_vec(values(8, self.rank, numel(&TABLE)), TABLE).unwrap()
    }
    /// A GPU f32 `[4, 2]`, a host loss, a host `Vec<u8>`, a GPU bf16 `[2]` and a host f32
    /// tensor `[6]` (the same dtype as the first value: one region, mixed places).
    #[allow(clippy::type_complexity)]
    fn mixed(
        &mut self,
    ) -> Result<(Tensor<f32>, f32, Vec<u8>, Tensor<bf16>, Tensor<f32>), BoxError> {
        let d = current_device()?;
        let r = self.rank;
        Ok((
            on_gpu(&d, 20, r, &[4, 2])?,
            r as f32 + 0.5,
            values(21, r, 2),
            on_gpu(&d, 22, r, &[2])?,
            Tensor::from_vec(values(23, r, 6), [6])?,
        ))
    }
}

graph! {
    HostOnly(ns: [HostVals]) {
        let l = ns.loss();
        let v = ns.counts();
        let t = ns.table();
        let ar = allreduce([l, v, t], Avg);
        let ag = allgather([l, v, t]);
        let rs = reducescatter([v, t], Max);
        let bc = broadcast([l, v, t], 0);
        let rd = reduce([l, v, t], Min, 0);
        (ar, ag, rs, bc, rd)
    }

    MixedPlaces(ns: [HostVals]) {
        let (g, l, v, b, h) = ns.mixed();
        let ar = allreduce([g, l, v, b, h], Sum);
        let ag = allgather([g, l, v, b, h]);
        (ar, ag)
    }
}

/// Every rank's `values(seed, r, len)`, and their reduction.
fn all_ranks<E: Val>(seed: i64, len: usize, n: usize) -> Vec<Vec<E>> {
    (0..n).map(|r| values(seed, r, len)).collect()
}

/// Rank `rank`'s share of `all` over `n` ranks.
fn chunk<E: Val>(all: &[E], rank: usize, n: usize) -> Vec<E> {
    let len = all.len() / n;
    all[rank * len..(rank + 1) * len].to_vec()
}

fn reduced<E: Val>(inputs: &[Vec<E>], op: ReduceOp) -> Vec<E> {
    let srcs: Vec<&[E]> = inputs.iter().map(Vec::as_slice).collect();
    reduce_reference(&srcs, op)
}

#[test]
fn host_values_on_the_nccl_backend_give_host_results() {
    let Some(turn) = gpu_turn(1) else { return };
    let n = turn.ranks();
    let mut g = HostOnly::launch(host_vals(n), Nccl::new(0..n).unwrap()).unwrap();
    let losses: Vec<f32> = (0..n).map(|r| r as f32 + 0.5).collect();
    let counts = all_ranks::<i32>(7, 4, n);
    let tables = all_ranks::<f64>(8, 6, n);
    // Twice: the second execution reuses the staging buffers.
    for _ in 0..2 {
        let out = g.execute().unwrap();
        assert_eq!(out.len(), n);
        for (rank, (ar, ag, rs, bc, rd)) in out.into_iter().enumerate() {
            let (l, v, t) = ar;
            assert_eq!(l, losses.iter().sum::<f32>() / n as f32);
            assert_eq!(v, reduced(&counts, ReduceOp::Avg));
            assert!(t.is_host(), "a host tensor's result is on the host");
            assert_eq!(t.shape(), &TABLE);
            assert_eq!(t.to_vec(), reduced(&tables, ReduceOp::Avg));

            let (l, v, t) = ag;
            assert_eq!(l, losses);
            assert_eq!(v, counts.concat());
            assert!(t.is_host());
            assert_eq!(t.shape(), &[2 * n, 3]);
            assert_eq!(t.to_vec(), tables.concat());

            let (v, t) = rs;
            assert_eq!(v, chunk(&reduced(&counts, ReduceOp::Max), rank, n));
            assert!(t.is_host());
            assert_eq!(t.shape(), &[2 / n, 3]);
            assert_eq!(t.to_vec(), chunk(&reduced(&tables, ReduceOp::Max), rank, n));

            let (l, v, t) = bc;
            assert_eq!(l, losses[0]);
            assert_eq!(v, counts[0]);
            assert!(t.is_host());
            assert_eq!(t.to_vec(), tables[0]);

            let (l, v, t) = rd;
            if rank == 0 {
                assert_eq!(l, Some(0.5));
                assert_eq!(v, Some(reduced(&counts, ReduceOp::Min)));
                let t = t.expect("the root gets the reduction");
                assert!(t.is_host());
                assert_eq!(t.to_vec(), reduced(&tables, ReduceOp::Min));
            } else {
                assert_eq!((l, v, t.is_none()), (None, None, true));
            }
        }
    }
    g.teardown().unwrap();
}

#[test]
fn a_bucket_mixing_gpu_and_host_values_keeps_each_in_its_place() {
    let Some(turn) = gpu_turn(1) else { return };
    let n = turn.ranks();
    let mut g = MixedPlaces::launch(host_vals(n), Nccl::new(0..n).unwrap()).unwrap();
    let gs = all_ranks::<f32>(20, 8, n);
    let vs = all_ranks::<u8>(21, 2, n);
    let bs = all_ranks::<bf16>(22, 2, n);
    let hs = all_ranks::<f32>(23, 6, n);
    let loss_sum: f32 = (0..n).map(|r| r as f32 + 0.5).sum();
    for _ in 0..2 {
        let out = g.execute().unwrap();
        for (rank, (ar, ag)) in out.into_iter().enumerate() {
            let (gr, l, v, b, h) = ar;
            assert_eq!(gr.device_ordinal(), Some(rank));
            assert_eq!(b.device_ordinal(), Some(rank));
            assert!(h.is_host(), "a host tensor's result stays on the host");
            assert!(!gr.shares_storage(&h), "the host result is a host copy");
            assert_eq!(gr.shape(), &[4, 2]);
            assert_eq!(host(&gr), reduced(&gs, ReduceOp::Sum));
            assert_eq!(l, loss_sum);
            assert_eq!(v, reduced(&vs, ReduceOp::Sum));
            assert_eq!(host(&b), reduced(&bs, ReduceOp::Sum));
            assert_eq!(h.to_vec(), reduced(&hs, ReduceOp::Sum));

            let (gr, l, v, b, h) = ag;
            assert_eq!(gr.device_ordinal(), Some(rank));
            assert_eq!(b.device_ordinal(), Some(rank));
            assert!(h.is_host());
            assert_eq!(gr.shape(), &[4 * n, 2]);
            assert_eq!(host(&gr), gs.concat());
            assert_eq!(l, (0..n).map(|r| r as f32 + 0.5).collect::<Vec<_>>());
            assert_eq!(v, vs.concat());
            assert_eq!(host(&b), bs.concat());
            assert_eq!(h.shape(), &[6 * n]);
            assert_eq!(h.to_vec(), hs.concat());
        }
    }
    g.teardown().unwrap();
}

// ---------------------------------------------------------------------------------------
// (e) The flat device buffer is reused, unless a result still views it.

struct Counter {
    calls: u32,
}

#[actor]
impl Counter {
    /// `[calls; 1024]` on the GPU.
    fn grad(&mut self) -> Result<Tensor<f32>, BoxError> {
        self.calls += 1;
        Ok(Tensor::full([1024], self.calls as f32).to_device(&current_device()?)?)
    }
}

graph! {
    Reuse(ns: [Counter]) {
        let g = ns.grad();
        allreduce(g)
    }
}

#[test]
fn the_device_buffer_is_reused_only_when_no_result_views_it() {
    let Some(_turn) = gpu_turn(1) else { return };
    let device = Device::new(0).unwrap();
    let mut g = Reuse::launch(vec![Counter { calls: 0 }], Nccl::new([0]).unwrap()).unwrap();

    let first = g.execute().unwrap().remove(0);
    assert_eq!(host(&first), vec![1.0; 1024]);
    let p1 = device_ptr(&first, &device);
    drop(first);

    // Nothing views the buffer any more: the next execution writes into it again.
    let second = g.execute().unwrap().remove(0);
    assert_eq!(
        device_ptr(&second, &device),
        p1,
        "an unviewed buffer is reused"
    );
    assert_eq!(host(&second), vec![2.0; 1024]);

    // `second` is held: the next execution must not write into it.
    let third = g.execute().unwrap().remove(0);
    let p3 = device_ptr(&third, &device);
    assert_ne!(p3, p1, "a buffer a result still views is not reused");
    assert!(!third.shares_storage(&second));
    assert_eq!(host(&third), vec![3.0; 1024]);
    assert_eq!(
        host(&second),
        vec![2.0; 1024],
        "a held result survives the next execution"
    );

    // Once both are dropped, the stage goes on with the buffer it holds (the third's).
    drop((second, third));
    let fourth = g.execute().unwrap().remove(0);
    assert_eq!(device_ptr(&fourth, &device), p3);
    assert_eq!(host(&fourth), vec![4.0; 1024]);
    drop(fourth);
    g.teardown().unwrap();
}

// ---------------------------------------------------------------------------------------
// (f) Failures on the GPU, and placement errors.

struct Flaky {
    rank: usize,
}

#[actor]
impl Flaky {
    fn grad(&mut self, fail: &bool) -> Result<Tensor<f32>, String> {
        let dev = current_device().map_err(|e| e.to_string())?;
        if *fail {
            return Err(format!("rank {} was asked to fail", self.rank));
        }
        Tensor::full([16], 1.0 + self.rank as f32)
            .to_device(&dev)
            .map_err(|e| e.to_string())
    }
    fn loss(&mut self) -> f32 {
        2.0
    }
    /// Which thread this method sees as its GPU.
    fn where_am_i(&mut self) -> Result<usize, Error> {
        current_device().map(|d| d.ordinal())
    }
    /// A GPU tensor made without `current_device` (for a host-backend graph).
    fn on_gpu0(&mut self, gpu: &bool) -> Result<Tensor<f32>, BoxError> {
        let t = Tensor::full([4], 1.0);
        Ok(if *gpu {
            t.to_device(&Device::new(0)?)?
        } else {
            t
        })
    }
}

graph! {
    FailOnce(ns: [Flaky], fail: bool) {
        let g = ns.grad(fail);
        let l = ns.loss();
        allreduce([g, l])
    }

    WhereAmI(ns: [Flaky]) {
        ns.where_am_i()
    }

    OnHost(ns: [Flaky], gpu: bool) {
        let t = ns.on_gpu0(gpu);
        allreduce(t)
    }
}

#[test]
fn a_failing_method_on_the_gpu_is_reported_and_the_next_execute_works() {
    let Some(_turn) = gpu_turn(1) else { return };
    let mut g = FailOnce::launch(vec![Flaky { rank: 0 }], Nccl::new([0]).unwrap()).unwrap();
    let (t, l) = g.execute(false).unwrap().remove(0);
    assert_eq!((host(&t), l), (vec![1.0; 16], 2.0));
    for _ in 0..2 {
        match g.execute(true) {
            Err(Error::Method {
                group,
                rank,
                method,
                source,
            }) => {
                assert_eq!((group, rank, method), ("ns", 0, "grad"));
                assert_eq!(source.to_string(), "rank 0 was asked to fail");
            }
            other => panic!("expected Error::Method, got {other:?}"),
        }
        let (t, l) = g.execute(false).unwrap().remove(0);
        assert_eq!(t.device_ordinal(), Some(0));
        assert_eq!((host(&t), l), (vec![1.0; 16], 2.0));
    }
    g.teardown().unwrap();
}

#[test]
fn each_actor_sees_its_own_gpu() {
    let Some(turn) = gpu_turn(1) else { return };
    let n = turn.gpus;
    let mut g = WhereAmI::launch(
        (0..n).map(|rank| Flaky { rank }).collect::<Vec<_>>(),
        Nccl::all().unwrap(),
    )
    .unwrap();
    assert_eq!(g.execute().unwrap(), (0..n).collect::<Vec<_>>());
    g.teardown().unwrap();
}

#[test]
fn current_device_off_the_nccl_backend_is_a_placement_error() {
    // Needs no GPU: the launching thread, and an actor of the CPU backend, have none.
    assert!(matches!(current_device(), Err(Error::Placement(_))));
    let mut g = WhereAmI::launch(vec![Flaky { rank: 0 }], Cpu).unwrap();
    match g.execute() {
        Err(Error::Method { method, source, .. }) => {
            assert_eq!(method, "where_am_i");
            assert!(source.to_string().contains("Nccl backend"), "{source}");
        }
        other => panic!("expected Error::Method, got {other:?}"),
    }
}

#[test]
fn a_gpu_tensor_on_the_cpu_backend_is_a_placement_error() {
    let Some(_turn) = gpu_turn(1) else { return };
    let mut g = OnHost::launch(vec![Flaky { rank: 0 }], Cpu).unwrap();
    match g.execute(true) {
        Err(Error::Placement(message)) => {
            assert!(message.contains("host communicator"), "{message}")
        }
        other => panic!("expected Error::Placement, got {other:?}"),
    }
    assert_eq!(g.execute(false).unwrap()[0].to_vec(), vec![1.0; 4]);
}

/// An actor whose gradients come from a stream of their own, not the actor's.
struct SideStream;

#[actor]
impl SideStream {
    /// `2^14` values of `step` made on a new stream of this actor's GPU; the stage reads
    /// them on the actor's stream, then drops them (a free on the side stream).
    fn grad(&mut self, step: &i64) -> Result<Tensor<f32>, BoxError> {
        let side = Device::new(current_device()?.ordinal())?;
        Ok(on_gpu(&side, *step, 0, &[1 << 14])?)
    }
}

graph! {
    SideSum(ns: [SideStream], step: i64) {
        let g = ns.grad(step);
        allreduce(g)
    }
}

#[test]
fn a_gpu_value_made_on_another_stream_is_read_before_it_is_freed() {
    let Some(turn) = gpu_turn(1) else { return };
    let n = turn.ranks();
    let actors: Vec<_> = (0..n).map(|_| SideStream).collect();
    let mut g = SideSum::launch(actors, Nccl::new(0..n).unwrap()).unwrap();
    // Only the order of the two streams keeps the free after the copy (`copy_ordered`
    // joins them, and cudarc's event tracking does too, within one context): run it often.
    for step in 0..20 {
        let want = reduced(&vec![values::<f32>(step, 0, 1 << 14); n], ReduceOp::Sum);
        for t in g.execute(step).unwrap() {
            assert_eq!(host(&t), want);
        }
    }
    g.teardown().unwrap();
}

#[test]
fn executions_in_flight_on_the_gpu_each_get_their_own_buffer() {
    let Some(turn) = gpu_turn(1) else { return };
    let n = turn.ranks();
    let actors: Vec<_> = (0..n).map(|_| SideStream).collect();
    let options = LaunchOptions::default().max_in_flight(4);
    let mut g = SideSum::launch_with(actors, Nccl::new(0..n).unwrap(), options).unwrap();
    for round in 0..3 {
        let steps: Vec<i64> = (0..4).map(|k| 10 * round + k).collect();
        let tickets: Vec<_> = steps.iter().map(|&s| g.submit(s).unwrap()).collect();
        // All four results alive at once: four buffers, each with its own execution's sum.
        let results: Vec<_> = tickets.into_iter().map(|t| g.wait(t).unwrap()).collect();
        for (out, &step) in results.iter().zip(&steps) {
            let want = reduced(&vec![values::<f32>(step, 0, 1 << 14); n], ReduceOp::Sum);
            for t in out {
                assert_eq!(host(t), want, "step {step}");
            }
        }
        let device = Device::new(0).unwrap();
        let mut ptrs: Vec<u64> = results.iter().map(|o| device_ptr(&o[0], &device)).collect();
        ptrs.sort_unstable();
        ptrs.dedup();
        assert_eq!(ptrs.len(), 4, "one buffer per execution in flight");
    }
    g.teardown().unwrap();
}

/// An actor that sleeps in its method when asked.
struct Napper {
    rank: usize,
}

#[actor]
impl Napper {
    /// Blocks as [`nap`] says, then gives 1.0 on this actor's GPU.
    fn grad(&mut self, plan: &(usize, u64)) -> Result<Tensor<f32>, BoxError> {
        nap(self.rank, *plan);
        Ok(Tensor::full([8], 1.0f32).to_device(&current_device()?)?)
    }
}

graph! {
    NapSum(ns: [Napper], plan: (usize, u64)) {
        let g = ns.grad(plan);
        allreduce(g)
    }
}

#[test]
fn a_late_rank_times_out_and_ends_the_group_without_a_hang() {
    let Some(_turn) = gpu_turn(2) else { return };
    let nappers = vec![Napper { rank: 0 }, Napper { rank: 1 }];
    let mut g = NapSum::launch(nappers, Nccl::new([0, 1]).unwrap()).unwrap();
    let out = g.execute_timeout((9, 0), Duration::from_secs(60)).unwrap();
    assert_eq!(host(&out[1]), vec![2.0; 8]);
    // Rank 0 waits for rank 1 in the stage's agreement until the timeout aborts the group.
    match g.execute_timeout((1, 1_000), Duration::from_millis(100)) {
        Err(Error::Timeout { ranks, .. }) => assert_eq!(ranks, vec![1]),
        other => panic!("expected Error::Timeout, got {other:?}"),
    }
    assert!(matches!(
        g.execute_timeout((9, 0), Duration::from_secs(60)),
        Err(Error::Broken { group: "ns", .. })
    ));
    // Rank 1 wakes, finds the group aborted, and comes back.
    let back = g.teardown().unwrap();
    assert_eq!(back.iter().map(|n| n.rank).collect::<Vec<_>>(), vec![0, 1]);
}

// ---------------------------------------------------------------------------------------
// (g) Two GPUs: real reductions between ranks, and a shape mismatch.

struct Pair {
    rank: usize,
}

#[actor]
impl Pair {
    /// `(i % 97) * (rank + 1)` on this rank's GPU: integer-valued, so the sum is exact.
    fn grad(&mut self) -> Result<Tensor<f32>, BoxError> {
        let v: Vec<f32> = (0..1 << 16)
            .map(|i| ((i % 97) * (self.rank + 1)) as f32)
            .collect();
        Ok(Tensor::from_vec(v, [1 << 16])?.to_device(&current_device()?)?)
    }
    fn loss(&mut self) -> f32 {
        self.rank as f32 + 1.0
    }
    /// Rank r returns `lens[r]` elements on its GPU.
    fn part(&mut self, lens: &[usize; 2]) -> Result<Tensor<f32>, BoxError> {
        Ok(Tensor::full([lens[self.rank]], 1.0).to_device(&current_device()?)?)
    }
}

/// The sum of the two `Pair`s' gradients, exact (small integers).
fn pair_sums() -> Vec<f32> {
    (0..1 << 16).map(|i| ((i % 97) * 3) as f32).collect()
}

graph! {
    PairSum(ns: [Pair]) {
        let g = ns.grad();
        let l = ns.loss();
        allreduce([g, l])
    }

    PairParts(ns: [Pair], lens: [usize; 2]) {
        let a = ns.part(lens);
        allreduce(a)
    }
}

#[test]
fn two_gpus_allreduce_to_bitwise_identical_exact_sums() {
    let Some(_turn) = gpu_turn(2) else { return };
    let pairs = vec![Pair { rank: 0 }, Pair { rank: 1 }];
    let mut g = PairSum::launch(pairs, Nccl::new([0, 1]).unwrap()).unwrap();
    let want = pair_sums();
    for _ in 0..3 {
        let out = g.execute_timeout(Duration::from_secs(60)).unwrap();
        let bits: Vec<Vec<u32>> = out
            .iter()
            .enumerate()
            .map(|(rank, (t, l))| {
                assert_eq!(t.device_ordinal(), Some(rank));
                assert_eq!(*l, 3.0);
                host(t).iter().map(|x| x.to_bits()).collect()
            })
            .collect();
        assert!(bits[0] == bits[1], "both ranks hold the same bits");
        assert_eq!(host(&out[0].0), want);
    }
    g.teardown().unwrap();
}

#[test]
fn two_gpus_shape_mismatch_is_an_error_not_a_hang() {
    let Some(_turn) = gpu_turn(2) else { return };
    let pairs = vec![Pair { rank: 0 }, Pair { rank: 1 }];
    let mut g = PairParts::launch(pairs, Nccl::new([0, 1]).unwrap()).unwrap();
    let timeout = Duration::from_secs(60);
    match g.execute_timeout([10, 20], timeout) {
        Err(Error::ShapeMismatch { slot, counts, .. }) => {
            assert_eq!(slot, 0);
            assert_eq!(counts, vec![(DType::F32, 10), (DType::F32, 20)]);
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    let out = g.execute_timeout([7, 7], timeout).unwrap();
    for (rank, t) in out.iter().enumerate() {
        assert_eq!(t.device_ordinal(), Some(rank));
        assert_eq!(host(t), vec![2.0; 7]);
    }
    g.teardown().unwrap();
}

// ---------------------------------------------------------------------------------------
// (h) The backend's own errors.

#[test]
fn the_backend_refuses_bad_device_lists() {
    let Some(turn) = gpu_turn(1) else { return };
    let n = turn.gpus;
    let (major, _, _) = nccl::nccl_version().unwrap();
    assert_eq!(major, 2);

    match Nccl::new([0, 0]) {
        Err(Error::Backend(message)) => assert!(message.contains("twice"), "{message}"),
        other => panic!("expected a GPU given twice to be refused, got {other:?}"),
    }
    for ordinal in [n, usize::MAX] {
        match Nccl::new([ordinal]) {
            Err(Error::NoSuchDevice { ordinal: o, count }) => assert_eq!((o, count), (ordinal, n)),
            other => panic!("expected NoSuchDevice for GPU {ordinal}, got {other:?}"),
        }
        assert!(matches!(
            Device::new(ordinal),
            Err(Error::NoSuchDevice { .. })
        ));
    }
    assert!(matches!(Nccl::new([]), Err(Error::Backend(_))));
    assert_eq!(Nccl::all().unwrap().devices(), (0..n).collect::<Vec<_>>());

    // A group larger than the backend's GPU list fails at launch, without hanging.
    let one = Nccl::new([0]).unwrap();
    match Reuse::launch(vec![Counter { calls: 0 }, Counter { calls: 0 }], one) {
        Err(Error::Backend(message)) => assert!(message.contains("one GPU per actor"), "{message}"),
        Err(other) => panic!("expected a Backend error, got {other}"),
        Ok(_) => panic!("two actors on one GPU must not launch"),
    }

    let device = Device::new(0).unwrap();
    assert_eq!(device.ordinal(), 0);
    device.synchronize().unwrap();
}

#[test]
fn without_a_gpu_the_backend_is_an_error_not_a_panic() {
    // The converse of the tests above; needs no GPU.
    match nccl::device_count() {
        Ok(n) if n > 0 => eprintln!("skipped: this machine has {n} GPU(s)"),
        Ok(_) => {
            assert!(Nccl::new([0]).is_err());
            assert!(Device::new(0).is_err());
        }
        Err(e) => {
            assert!(matches!(e, Error::LibraryMissing { .. }), "{e}");
            for result in [Nccl::new([0]), Nccl::all()] {
                match result {
                    Err(Error::LibraryMissing { hint, .. }) => assert!(!hint.is_empty()),
                    other => panic!("expected LibraryMissing, got {other:?}"),
                }
            }
            assert!(matches!(Device::new(0), Err(Error::LibraryMissing { .. })));
        }
    }
}

// ---------------------------------------------------------------------------------------
// (i) The same tests on a simulated GPU, and the failure model with injected faults.

#[path = "nccl_gpu/simulated.rs"]
mod simulated;

// ---------------------------------------------------------------------------------------
// A device communicator is checked against the layout it is told, whoever tells it.

/// The Nccl backend's communicators, changed in one way each test needs.
#[derive(Clone, Copy)]
enum Twisted {
    /// Passes each device stage on to NCCL with a header that claims one element more per
    /// value than the stage's regions hold.
    Forging,
    /// Without the device capability: fused stages then run over host memory, through
    /// `NcclComm`'s host `stage` (copies to the GPU and back).
    HostMode,
}

struct TwistedComm(nccl::NcclComm, Twisted);

impl Backend for Twisted {
    type Comm = TwistedComm;
    fn communicators(&self, size: usize) -> Result<Vec<TwistedComm>, Error> {
        let comms = Nccl::new(0..size)?.communicators(size)?;
        Ok(comms.into_iter().map(|c| TwistedComm(c, *self)).collect())
    }
}

impl Communicator for TwistedComm {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn stage(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        regions: &mut [RegionMut<'_>],
        outputs: &mut [RegionMut<'_>],
    ) -> Result<(), StageError> {
        self.0.stage(header, collective, regions, outputs)
    }
    fn abort_handle(&self) -> AbortHandle {
        self.0.abort_handle()
    }
    fn attach(&mut self) -> Result<(), Error> {
        self.0.attach()
    }
    fn device_comm(&mut self) -> Option<&mut dyn DeviceComm> {
        match self.1 {
            Twisted::Forging => Some(self),
            Twisted::HostMode => None,
        }
    }
}

/// Reached in `Twisted::Forging` mode only (`device_comm`).
impl DeviceComm for TwistedComm {
    fn device(&self) -> Option<&Device> {
        self.0.device()
    }
    fn stage_device(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        ins: &[DevRegion<'_>],
        outs: &[DevRegion<'_>],
    ) -> Result<(), StageError> {
        let longer: Vec<SlotDesc> = header
            .slots
            .iter()
            .map(|s| SlotDesc::flat(s.dtype, s.len + 1))
            .collect();
        let forged = Header {
            slots: &longer,
            dims: &[],
            ..*header
        };
        self.0.stage_device(&forged, collective, ins, outs)
    }
    fn wait(&mut self) -> Result<(), StageError> {
        self.0.wait()
    }
}

#[test]
fn a_device_stage_whose_regions_do_not_match_its_header_is_an_error() {
    let Some(_turn) = gpu_turn(1) else { return };
    let mut g = MixedSum::launch(vec![Maker { calls: 0 }], Twisted::Forging).unwrap();
    // NCCL would run past the regions: the communicator refuses, on every execution.
    for _ in 0..2 {
        match g.execute() {
            Err(Error::Backend(m)) => assert!(m.contains("do not match its header"), "{m}"),
            other => panic!("expected the regions to be refused, got {other:?}"),
        }
    }
}

/// The memory pool `cuMemAllocAsync` (so cudarc) allocates from on GPU `device`.
fn current_pool(device: usize) -> nccl::cudarc::driver::sys::CUmemoryPool {
    use nccl::cudarc::driver::sys;
    let mut pool = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local, and a GPU ordinal the driver reported.
    let r = unsafe { sys::cuDeviceGetMemPool(&mut pool, device as sys::CUdevice) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuDeviceGetMemPool");
    pool
}

/// Whether GPU `peer` may read and write memory of `pool` (a pool of GPU `owner`), where it
/// can reach `owner` peer to peer at all (`None`: it cannot).
fn pool_access(
    pool: nccl::cudarc::driver::sys::CUmemoryPool,
    owner: usize,
    peer: usize,
) -> Option<bool> {
    use nccl::cudarc::driver::sys;
    let (mut can, mut flags) = (0, sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE);
    let mut location = sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: peer as i32,
    };
    // SAFETY: out-pointers to locals, GPU ordinals the driver reported, a pool it made,
    // and a location that lives across the call.
    unsafe {
        let r = sys::cuDeviceCanAccessPeer(&mut can, peer as i32, owner as i32);
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuDeviceCanAccessPeer");
        if can == 0 {
            return None;
        }
        let r = sys::cuMemPoolGetAccess(&mut flags, pool, &mut location);
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuMemPoolGetAccess");
    }
    Some(flags == sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
}

#[test]
fn peers_may_read_and_write_the_pool_the_stage_buffers_come_from() {
    use nccl::cudarc::driver::sys;
    let Some(_turn) = gpu_turn(2) else { return };
    let devices = [0usize, 1];
    // SAFETY: the driver is loaded (`gpu_turn`); plain calls with out-pointers to locals.
    let supported = devices.map(|d| unsafe {
        let mut v = 0;
        let a = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED;
        sys::cuDeviceGetAttribute(&mut v, a, d as i32) == sys::CUresult::CUDA_SUCCESS && v != 0
    });
    if !supported.iter().all(|&s| s) {
        eprintln!("skipped: a GPU without memory pools (cudarc then uses cuMemAlloc)");
        return;
    }
    // A program (or a library it uses) may make a pool of its own current: the stage
    // buffers then come from it, and the peers need access to that one.
    let defaults = devices.map(current_pool);
    let made = devices.map(|d| {
        // SAFETY: the properties are plain data, valid zeroed, then filled in as the
        // driver documents for a pinned device pool; out-pointers to locals.
        unsafe {
            let mut props: sys::CUmemPoolProps = std::mem::zeroed();
            props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
            props.location = sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: d as i32,
            };
            let mut pool = std::ptr::null_mut();
            let r = sys::cuMemPoolCreate(&mut pool, &props);
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuMemPoolCreate");
            let r = sys::cuDeviceSetMemPool(d as i32, pool);
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuDeviceSetMemPool");
            pool
        }
    });
    let pairs = vec![Pair { rank: 0 }, Pair { rank: 1 }];
    let mut g = PairSum::launch(pairs, Nccl::new(devices).unwrap()).unwrap();
    let want = pair_sums();
    for (t, l) in g.execute_timeout(Duration::from_secs(60)).unwrap() {
        assert_eq!((host(&t), l), (want.clone(), 3.0));
    }
    for (owner, peer) in [(0, 1), (1, 0)] {
        assert_eq!(current_pool(owner), made[owner]);
        // Where the GPUs reach each other: read and write, on the pool actually used.
        assert_ne!(
            pool_access(made[owner], owner, peer),
            Some(false),
            "GPU {peer} has no read-write access to GPU {owner}'s current pool"
        );
    }
    g.teardown().unwrap();
    for d in devices {
        // SAFETY: the GPU's own default pool, as it was before the test.
        let r = unsafe { sys::cuDeviceSetMemPool(d as i32, defaults[d]) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuDeviceSetMemPool");
    }
}

#[test]
fn host_regions_staged_through_the_gpu_give_the_device_modes_results() {
    let Some(turn) = gpu_turn(1) else { return };
    let n = turn.ranks();
    let mut on_device = HostOnly::launch(host_vals(n), Nccl::new(0..n).unwrap()).unwrap();
    let mut on_host = HostOnly::launch(host_vals(n), Twisted::HostMode).unwrap();
    // Twice: the second execution reuses the page-locked and device scratch buffers.
    for _ in 0..2 {
        let want = format!("{:?}", on_device.execute().unwrap());
        assert_eq!(format!("{:?}", on_host.execute().unwrap()), want);
    }
    on_device.teardown().unwrap();
    on_host.teardown().unwrap();
}

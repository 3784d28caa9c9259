//! The NCCL backend across processes (`Nccl::over_mpi`), on simulated GPUs: each test
//! builds `tests/fake_gpu/` (as `tests/nccl_gpu.rs` does) and starts `mpirun` over this
//! test binary with the simulated libraries first on `LD_LIBRARY_PATH`, under the MPI
//! tests' watchdog. Each process hosts its actors on its own simulated GPUs, and the
//! simulated NCCL meets the ranks of different processes in shared memory named after the
//! communicator's id, with NCCL's arithmetic.
//!
//! Every process checks its own actors' results (bit for bit: the values are small
//! integers, exact in every dtype) and fails otherwise; the test passes when `mpirun` does.
//!
//! Needs OpenMPI's `mpirun` and a C compiler.
#![cfg(all(feature = "nccl", feature = "mpi", target_os = "linux"))]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use actorgraph::half::{bf16, f16};
use actorgraph::mpi::Mpi;
use actorgraph::nccl::{current_device, Nccl};
use actorgraph::prelude::*;
use actorgraph::{BoxError, DType};

#[path = "support/expect.rs"]
mod expect;
#[path = "support/mpirun.rs"]
mod mpirun;

#[macro_use]
#[path = "support/gpu_bucket.rs"]
mod gpu_bucket;
use gpu_bucket::*;

use mpirun::{passes_env, SHM, TCP};

#[path = "support/failures.rs"]
mod failures;

/// Builds the simulated libraries once, into the test's own directory.
fn fakes() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fake_gpu_mpi");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fake-gpu.sh");
        let out = Command::new("sh").arg(&script).arg(&dir).output().unwrap();
        assert!(
            out.status.success(),
            "{} failed (it needs a C compiler):\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

/// Runs `scenario` over `layout` on simulated GPUs (two per process: a process uses one
/// per actor).
fn passes_on_simulated_gpus(scenario: &str, layout: &[usize], btl: &str) {
    let mut path = fakes().as_os_str().to_owned();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    let path = path.into_string().unwrap();
    let env = [
        ("LD_LIBRARY_PATH", path.as_str()),
        ("FAKE_GPU_COUNT", "2"),
        ("FAKE_GPU_TIMEOUT_S", "30"),
    ];
    passes_env(scenario, layout, btl, &env);
}

#[test]
fn every_collective_over_2_processes_of_1_gpu_over_shared_memory() {
    passes_on_simulated_gpus("nccl-collectives", &[1, 1], SHM);
}

#[test]
fn every_collective_over_2_processes_of_1_gpu_over_tcp() {
    passes_on_simulated_gpus("nccl-collectives", &[1, 1], TCP);
}

#[test]
fn a_mixed_bucket_over_processes_of_2_and_1_gpus() {
    passes_on_simulated_gpus("nccl-mixed", &[2, 1], SHM);
}

#[test]
fn failures_are_the_same_error_on_every_process_and_the_graph_stays_usable() {
    passes_on_simulated_gpus("nccl-failures", &[1, 1], SHM);
}

#[test]
fn a_failure_after_the_last_stage_reaches_every_process() {
    passes_on_simulated_gpus("after", &[1, 1], SHM);
    passes_on_simulated_gpus("after", &[1, 2], TCP);
}

#[test]
fn a_timeout_names_the_late_rank_of_another_process_on_every_process() {
    passes_on_simulated_gpus("timeout", &[1, 1], SHM);
    passes_on_simulated_gpus("timeout", &[1, 2], TCP);
}

#[test]
fn a_gpu_tensor_and_a_scalar_cross_processes_on_edges() {
    // Rank 0 and rank 2 are in different processes.
    passes_on_simulated_gpus("nccl-edges", &[1, 2], SHM);
    passes_on_simulated_gpus("nccl-edges", &[2, 1], TCP);
}

#[test]
fn launches_that_differ_between_processes_fail_on_every_process() {
    passes_on_simulated_gpus("nccl-launch", &[1, 2], SHM);
}

// ---------------------------------------------------------------------------------------
// A mixed bucket: every dtype on the GPU, and host values.

struct Mixer {
    /// The global rank.
    rank: usize,
}

#[actor]
impl Mixer {
    fn bucket(&mut self) -> Result<Bucket, BoxError> {
        Node { rank: self.rank }.bucket()
    }

    /// Host values beside GPU ones: a scalar and a `Vec`.
    fn host_vals(&mut self) -> (f32, Vec<i32>) {
        (1.0 + self.rank as f32, vec![self.rank as i32; 5])
    }
}

graph! {
    Mixed(ns: [Mixer]) {
        let (a, b, c, d, e, f, g, h, i, j) = ns.bucket();
        let (loss, counts) = ns.host_vals();
        allreduce([a, b, c, d, e, f, g, h, i, j, loss, counts], Sum)
    }
}

// ---------------------------------------------------------------------------------------
// Failures: a method error on one rank, a shape mismatch between processes.

struct Flaky {
    rank: usize,
}

#[actor]
impl Flaky {
    /// Fails on global rank `fail`, or on every rank if it is [`EVERY`].
    fn grad(&mut self, fail: &usize) -> Result<Tensor<f32>, String> {
        if *fail == self.rank || *fail == EVERY {
            return Err(format!("rank {} was asked to fail", self.rank));
        }
        let dev = current_device().map_err(|e| e.to_string())?;
        Tensor::full([16], 1.0 + self.rank as f32)
            .to_device(&dev)
            .map_err(|e| e.to_string())
    }

    /// Global rank r returns `lens[r]` elements on its GPU.
    fn part(&mut self, lens: &[usize; 2]) -> Result<Tensor<f32>, BoxError> {
        Ok(Tensor::full([lens[self.rank]], 1.0).to_device(&current_device()?)?)
    }
}

/// `FailOn`'s input that fails every rank.
const EVERY: usize = usize::MAX - 1;

graph! {
    FailOn(ns: [Flaky], fail: usize) {
        let g = ns.grad(fail);
        allreduce(g)
    }

    Parts(ns: [Flaky], lens: [usize; 2]) {
        let a = ns.part(lens);
        allreduce(a)
    }
}

/// Makes the next allocation on simulated GPU `device` fail (tests/fake_gpu/fake.h).
fn fail_next_alloc(device: i32) {
    use actorgraph::nccl::cudarc;
    // SAFETY: the simulated driver is loaded (the backend opened it); its
    // `fake_gpu_fail_alloc` has this signature (tests/fake_gpu/fake.h).
    unsafe {
        let cuda = cudarc::driver::sys::culib();
        let fail = cuda
            .get::<unsafe extern "C" fn(i32, usize)>(b"fake_gpu_fail_alloc\0")
            .expect("the simulated driver");
        fail(device, 1);
    }
}

// ---------------------------------------------------------------------------------------
// Edges between processes: a GPU tensor and a scalar, beside a collective on the GPU.

/// Rank `q`'s tensor of step `s`.
fn edge_values(q: usize, s: u64) -> Vec<f32> {
    (0..6).map(|i| (q * 100 + i) as f32 + s as f32).collect()
}

/// Rank `q`'s scalar of step `s`.
fn edge_scalar(q: usize, s: u64) -> i64 {
    q as i64 * 1000 - s as i64
}

struct Passer {
    rank: usize,
}

#[actor]
impl Passer {
    /// A tensor on this rank's GPU.
    fn tensor(&mut self, s: &u64) -> Result<Tensor<f32>, BoxError> {
        let t = Tensor::from_vec(edge_values(self.rank, *s), [2, 3])?;
        Ok(t.to_device(&current_device()?)?)
    }

    fn scalar(&mut self, s: &u64) -> i64 {
        edge_scalar(self.rank, *s)
    }

    /// Rank `from`'s tensor and scalar, which crossed processes (on the host: a GPU
    /// tensor crosses through host memory).
    fn read(&mut self, t: &Tensor<f32>, x: &i64, from: &usize, s: &u64) -> Result<f32, BoxError> {
        let got = t.to_host()?;
        if got.shape() != [2, 3] || got.to_vec() != edge_values(*from, *s) {
            return Err(format!("rank {}: rank {from}'s tensor is {got:?}", self.rank).into());
        }
        if *x != edge_scalar(*from, *s) {
            return Err(format!("rank {}: rank {from}'s scalar is {x}", self.rank).into());
        }
        Ok(got.to_vec()[0] + *x as f32)
    }
}

graph! {
    Passed(ns: [Passer], s: u64, zero: usize, last: usize) {
        let t = ns.tensor(s);
        let x = ns.scalar(s);
        // The last rank's values to rank 0 and rank 0's to the last: each in another
        // process.
        let a = ns[0].read(t[2], x[2], last, s);
        let b = ns[2].read(t[0], x[0], zero, s);
        let sum = allreduce(t, Sum);
        (sum, a, b)
    }
}

// ---------------------------------------------------------------------------------------
// The worker: what every process of a run does.

#[test]
fn worker() {
    let Some((scenario, layout)) = mpirun::scenario() else {
        return; // run by `mpirun` only
    };
    let mpi = Mpi::init().unwrap();
    assert_eq!(mpi.processes(), layout.len());
    let process = mpi.process();
    let n = layout[process];
    let first: usize = layout[..process].iter().sum();
    let ranks: usize = layout.iter().sum();
    let backend = Nccl::over_mpi(&mpi, 0..n).unwrap();
    let at = |local: usize| At {
        rank: first + local,
        ranks,
        gpu: local,
    };
    let mixers = || {
        (first..first + n)
            .map(|rank| Mixer { rank })
            .collect::<Vec<_>>()
    };
    let nodes = || {
        (first..first + n)
            .map(|rank| Node { rank })
            .collect::<Vec<_>>()
    };
    let flaky = || {
        (first..first + n)
            .map(|rank| Flaky { rank })
            .collect::<Vec<_>>()
    };
    match scenario.as_str() {
        "nccl-collectives" => {
            let mut g = AllReduceOps::launch(nodes(), &backend).unwrap();
            assert_eq!(g.ranks("ns").unwrap(), first..first + n);
            for (l, (sum, prod, lo, hi, avg)) in g.execute().unwrap().iter().enumerate() {
                for (res, op) in [sum, prod, lo, hi, avg].into_iter().zip(ReduceOp::ALL) {
                    check_bucket!(check, *res, Coll::AllReduce(op), at(l));
                }
            }
            g.teardown().unwrap();
            let mut g = ReduceScatterOps::launch(nodes(), &backend).unwrap();
            for (l, (sum, prod, lo, hi, avg)) in g.execute().unwrap().iter().enumerate() {
                for (res, op) in [sum, prod, lo, hi, avg].into_iter().zip(ReduceOp::ALL) {
                    check_bucket!(check, *res, Coll::ReduceScatter(op), at(l));
                }
            }
            g.teardown().unwrap();
            let mut g = ReduceOps::launch(nodes(), &backend).unwrap();
            for (l, (sum, prod, lo, hi, avg)) in g.execute().unwrap().iter().enumerate() {
                for (res, op) in [sum, prod, lo, hi, avg].into_iter().zip(ReduceOp::ALL) {
                    check_bucket!(check_opt, *res, Coll::Reduce(op), at(l));
                }
            }
            g.teardown().unwrap();
            let mut g = GatherBroadcast::launch(nodes(), &backend).unwrap();
            for _ in 0..3 {
                for (l, (gathered, sent)) in g.execute().unwrap().iter().enumerate() {
                    check_bucket!(check, *gathered, Coll::AllGather, at(l));
                    check_bucket!(check, *sent, Coll::Broadcast, at(l));
                }
            }
            g.teardown().unwrap();
        }
        "nccl-mixed" => {
            let mut g = Mixed::launch(mixers(), &backend).unwrap();
            for _ in 0..3 {
                let out = g.execute().unwrap();
                assert_eq!(out.len(), n);
                for (l, o) in out.iter().enumerate() {
                    let sum = Coll::AllReduce(ReduceOp::Sum);
                    check::<f32>(&o.0, sum, 0, at(l));
                    check::<f64>(&o.1, sum, 1, at(l));
                    check::<f16>(&o.2, sum, 2, at(l));
                    check::<bf16>(&o.3, sum, 3, at(l));
                    check::<i8>(&o.4, sum, 4, at(l));
                    check::<u8>(&o.5, sum, 5, at(l));
                    check::<i32>(&o.6, sum, 6, at(l));
                    check::<u32>(&o.7, sum, 7, at(l));
                    check::<i64>(&o.8, sum, 8, at(l));
                    check::<u64>(&o.9, sum, 9, at(l));
                    // Host values come back as host values, summed over every rank.
                    let loss: f32 = (0..ranks).map(|r| 1.0 + r as f32).sum();
                    let count: i32 = (0..ranks as i32).sum();
                    assert_eq!((o.10, &o.11), (loss, &vec![count; 5]));
                }
            }
            g.teardown().unwrap();
        }
        "nccl-failures" => {
            let mut g = FailOn::launch(flaky(), &backend).unwrap();
            for fail in [1, 0, EVERY] {
                // Every process: the failed rank's own error, named alike; with every rank
                // failed, the first's, also on the process whose own rank failed.
                let first = if fail == EVERY { 0 } else { fail };
                match g.execute(fail) {
                    Err(Error::Method {
                        group,
                        rank,
                        method,
                        source,
                    }) => {
                        assert_eq!((group, rank, method), ("ns", first, "grad"));
                        assert_eq!(
                            source.to_string(),
                            format!("rank {first} was asked to fail")
                        );
                    }
                    other => panic!("process {process}: expected Error::Method, got {other:?}"),
                }
                // The graph stays usable.
                let out = g.execute(usize::MAX).unwrap();
                for t in &out {
                    assert_eq!(host(t), vec![3.0; 16]);
                }
            }
            g.teardown().unwrap();
            let mut g = Parts::launch(flaky(), &backend).unwrap();
            match g.execute([10, 20]) {
                Err(Error::ShapeMismatch { slot, counts, .. }) => {
                    assert_eq!(slot, 0);
                    assert_eq!(counts, vec![(DType::F32, 10), (DType::F32, 20)]);
                }
                other => panic!("process {process}: expected ShapeMismatch, got {other:?}"),
            }
            for t in &g.execute([7, 7]).unwrap() {
                assert_eq!(host(t), vec![2.0; 7]);
            }
            g.teardown().unwrap();
        }
        "nccl-launch" => {
            // Process 1 has two actors and two GPUs, process 0 one: fine. Then process 0
            // gives its one GPU two actors: the same error on every process, and nothing
            // waits in NCCL for it.
            let mut g = AllReduceOps::launch(nodes(), &backend).unwrap();
            g.execute().unwrap();
            g.teardown().unwrap();
            let two = vec![Node { rank: 0 }, Node { rank: 1 }];
            let actors = if process == 0 { two } else { nodes() };
            match AllReduceOps::launch(actors, &backend) {
                Err(Error::Backend(message)) => assert!(
                    message.contains("process 0 gives group `ns` 2 actor(s) and has 1 GPU(s)"),
                    "{message}"
                ),
                Err(other) => panic!("process {process}: expected Error::Backend, got {other:?}"),
                Ok(_) => panic!("process {process}: the launch went through"),
            }
            let mut g = AllReduceOps::launch(nodes(), &backend).unwrap();
            g.execute().unwrap();
            g.teardown().unwrap();
            // Process 1's second GPU cannot be opened: every rank of every process learns it
            // before any calls `ncclCommInitRank` (where the others would wait for it for
            // good), and the launch fails on every process.
            if process == 1 {
                fail_next_alloc(1);
            }
            match AllReduceOps::launch(nodes(), &backend) {
                Err(e) => eprintln!("process {process}: the launch failed as it must: {e}"),
                Ok(_) => panic!("process {process}: the launch went through"),
            }
            let mut g = AllReduceOps::launch(nodes(), &backend).unwrap();
            for (l, (sum, ..)) in g.execute().unwrap().iter().enumerate() {
                check_bucket!(check, *sum, Coll::AllReduce(ReduceOp::Sum), at(l));
            }
            g.teardown().unwrap();
        }
        "after" => failures::after(&backend, first..first + n, ranks),
        "timeout" => failures::timeout(&backend, first..first + n, &layout),
        "nccl-edges" => {
            let passers = (first..first + n).map(|rank| Passer { rank }).collect();
            let mut g = Passed::launch(passers, &backend).unwrap();
            let last = ranks - 1;
            for s in 0..3u64 {
                let out = g.execute(s, 0, last).unwrap();
                assert_eq!(out.len(), n);
                for (l, (sum, a, b)) in out.iter().enumerate() {
                    let rank = first + l;
                    let want: Vec<f32> = (0..6)
                        .map(|i| (0..ranks).map(|q| edge_values(q, s)[i]).sum())
                        .collect();
                    assert_eq!(host(sum), want);
                    let read = |from| edge_values(from, s)[0] + edge_scalar(from, s) as f32;
                    assert_eq!(*a, (rank == 0).then(|| read(last)));
                    assert_eq!(*b, (rank == last).then(|| read(0)));
                }
            }
            g.teardown().unwrap();
        }
        other => panic!("unknown scenario {other}"),
    }
    drop(backend);
    println!("scenario done");
}

//! The MPI backend against OpenMPI's own `MPI_Allreduce` (through rsmpi), same processes,
//! same bytes, side by side in one run: run under `mpirun` by `scripts/vs-mpi-procs.sh`.
//!
//! Not a criterion benchmark: criterion picks its iteration counts from the time each
//! process measures, so the processes would run different numbers of collectives and
//! wait for each other forever. Here every process runs the same fixed counts: per size,
//! `SAMPLES` samples of `iters(bytes)` operations each, every sample started after an
//! `MPI_Barrier`, alternating between the two contenders. Process 0 prints, per size, the
//! min / median / max over the samples of the time per operation.
//!
//! Also: 64 tensors of 1 KiB as one fused stage against 64 `MPI_Allreduce` calls, and the
//! cost of `launch` (its agreement and the communicators it makes).
//!
//! `MPI_PROCS_BENCH` picks the run (the script sets it):
//! - unset or `procs`: the table above, one actor per process;
//! - `hier`: a fused allreduce from 1 MiB with `MPI_PROCS_ACTORS` actors per process (2);
//! - `flat`: `MPI_Allreduce` from 1 MiB, one rank per process;
//! - `many`: only the 64 x 1 KiB stage, 15 samples of 4000, for a profiler (`perf record`
//!   on each process);
//! - `others`: the other four collectives, one actor per process, against their MPI calls
//!   (`MPI_Reduce_scatter_block`, `MPI_Allgather`, `MPI_Bcast` and `MPI_Reduce`, the last
//!   two from rank 0), at `OTHER_SIZES` bytes of input per rank.
//!
//! `hier` and `flat` print one `sample MODE BYTES NANOSECONDS` line per sample, which the
//! script puts side by side (2 processes x 2 actors against 4 flat processes).

use std::time::{Duration, Instant};

use actorgraph::mpi::rsmpi::collective::SystemOperation;
use actorgraph::mpi::rsmpi::topology::SimpleCommunicator;
use actorgraph::mpi::rsmpi::traits::*;
use actorgraph::mpi::Mpi;
use actorgraph::prelude::*;

#[path = "support/mpi_samples.rs"]
mod mpi_samples;

use mpi_samples::*;

struct Worker {
    grad: Tensor<f32>,
    many: Vec<Tensor<f32>>,
}

#[actor]
impl Worker {
    fn grad(&mut self) -> Tensor<f32> {
        self.grad.clone()
    }
    fn many(&mut self) -> Vec<Tensor<f32>> {
        self.many.clone()
    }
}

graph! {
    One(workers: [Worker]) {
        allreduce(workers.grad(), Sum)
    }
}

graph! {
    Many(workers: [Worker]) {
        allreduce(workers.many(), Sum)
    }
}

graph! {
    ReduceScatter(workers: [Worker]) {
        reducescatter(workers.grad(), Sum)
    }
    AllGather(workers: [Worker]) {
        allgather(workers.grad())
    }
    Broadcast(workers: [Worker]) {
        broadcast(workers.grad(), 0)
    }
    ReduceTo0(workers: [Worker]) {
        reduce(workers.grad(), Sum, 0)
    }
}

/// A worker whose `many` is 64 tensors of 1 KiB.
fn worker_many() -> Worker {
    Worker {
        grad: Tensor::full([1], 1.0),
        many: (0..64).map(|_| Tensor::full([256], 0.5)).collect(),
    }
}

/// Operations per sample: about 8 MiB of payload, at least 1, at most 2000.
fn iters(bytes: usize) -> usize {
    ((8 << 20) / bytes).clamp(1, 2000)
}

fn row(what: &str, mpi: [Duration; 3], ag: [Duration; 3]) {
    let three = |s: [Duration; 3]| s.map(fmt).join(" / ");
    let ratio = ag[1].as_secs_f64() / mpi[1].as_secs_f64();
    let extra = ag[1].as_secs_f64() * 1e6 - mpi[1].as_secs_f64() * 1e6;
    println!(
        "| {what} | {} | {} | {ratio:.2}x | {extra:+.1} µs |",
        three(mpi),
        three(ag)
    );
}

/// The sizes of the hierarchical comparison, bytes per rank.
const LARGE: [usize; 3] = [1 << 20, 16 << 20, 64 << 20];

/// `hier`: a fused allreduce with `actors` actors in this process.
fn hier(mpi: &Mpi, world: &SimpleCommunicator, actors: usize) -> Result<(), actorgraph::Error> {
    let me = mpi.process();
    for bytes in LARGE {
        let elems = bytes / 4;
        let workers = (0..actors)
            .map(|a| Worker {
                grad: Tensor::full([elems], 1.0 + (me * actors + a) as f32),
                many: Vec::new(),
            })
            .collect();
        let mut g = One::launch(workers, mpi)?;
        let fused = samples(world, iters(bytes), || {
            std::hint::black_box(g.execute().expect("execute"));
        });
        drop(g);
        for t in fused.iter().filter(|_| me == 0) {
            println!("sample hier {bytes} {}", t.as_nanos());
        }
    }
    Ok(())
}

/// `flat`: `MPI_Allreduce` over every process.
fn flat(world: &SimpleCommunicator) {
    for bytes in LARGE {
        let elems = bytes / 4;
        let send = vec![1.0f32 + world.rank() as f32; elems];
        let mut recv = vec![0.0f32; elems];
        let bare = samples(world, iters(bytes), || {
            world.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
        });
        for t in bare.iter().filter(|_| world.rank() == 0) {
            println!("sample flat {bytes} {}", t.as_nanos());
        }
    }
}

/// The sizes of `others`, bytes of input per rank.
const OTHER_SIZES: [usize; 4] = [1 << 10, 32 << 10, 1 << 20, 16 << 20];

/// `others`: reducescatter, allgather, broadcast and reduce against their MPI calls, one
/// actor per process. (A reduce-scatter gives each rank `1 / processes` of the input, so
/// its sizes are rounded down to a multiple of the processes.)
fn others(mpi: &Mpi, world: &SimpleCommunicator) -> Result<(), actorgraph::Error> {
    let (me, procs) = (mpi.process(), mpi.processes());
    let root = world.process_at_rank(0);
    if me == 0 {
        println!("{procs} processes x 1 actor; {SAMPLES} samples per row, each the mean of a fixed number of operations");
        println!();
        println!("| f32 collective, input bytes per rank | MPI min / median / max | actorgraph min / median / max | actorgraph / MPI (medians) | actorgraph - MPI (medians) |");
        println!("| --- | --- | --- | --- | --- |");
    }
    for bytes in sizes(&OTHER_SIZES) {
        let elems = bytes / 4 / procs * procs;
        let n = iters(bytes);
        let worker = || Worker {
            grad: Tensor::full([elems], 1.0 + me as f32),
            many: Vec::new(),
        };
        let send = vec![1.0f32 + me as f32; elems];
        let mut part = vec![0.0f32; elems / procs];
        let mut every = vec![0.0f32; elems * procs];
        let mut own = send.clone();

        // One row: the MPI call's samples, then the graph's, each graph launched for it.
        let row_of = |what: &str, bare: Vec<Duration>, mut execute: Box<dyn FnMut() + '_>| {
            let fused = samples(world, n, &mut execute);
            if me == 0 {
                row(
                    &format!("{what} {}", size(bytes)),
                    stats(bare),
                    stats(fused),
                );
            }
        };
        let bare = samples(world, n, || {
            world.reduce_scatter_block_into(&send[..], &mut part[..], SystemOperation::sum());
        });
        let mut g = ReduceScatter::launch(vec![worker()], mpi)?;
        row_of(
            "reducescatter",
            bare,
            Box::new(move || drop(g.execute().expect("execute"))),
        );

        let bare = samples(world, n, || {
            world.all_gather_into(&send[..], &mut every[..])
        });
        let mut g = AllGather::launch(vec![worker()], mpi)?;
        row_of(
            "allgather",
            bare,
            Box::new(move || drop(g.execute().expect("execute"))),
        );

        let bare = samples(world, n, || root.broadcast_into(&mut own[..]));
        let mut g = Broadcast::launch(vec![worker()], mpi)?;
        row_of(
            "broadcast",
            bare,
            Box::new(move || drop(g.execute().expect("execute"))),
        );

        let bare = samples(world, n, || {
            if me == 0 {
                root.reduce_into_root(&send[..], &mut own[..], SystemOperation::sum());
            } else {
                root.reduce_into(&send[..], SystemOperation::sum());
            }
        });
        let mut g = ReduceTo0::launch(vec![worker()], mpi)?;
        row_of(
            "reduce",
            bare,
            Box::new(move || drop(g.execute().expect("execute"))),
        );
    }
    Ok(())
}

fn main() -> Result<(), actorgraph::Error> {
    // `cargo bench` passes `--bench`; nothing else is read.
    let mpi = Mpi::init()?;
    let world = SimpleCommunicator::world();
    let me = mpi.process();
    match std::env::var("MPI_PROCS_BENCH").as_deref() {
        Ok("hier") => {
            let actors = std::env::var("MPI_PROCS_ACTORS")
                .ok()
                .and_then(|a| a.parse().ok())
                .unwrap_or(2);
            return hier(&mpi, &world, actors);
        }
        Ok("flat") => {
            flat(&world);
            return Ok(());
        }
        Ok("others") => return others(&mpi, &world),
        Ok("many") => {
            // Only the 64 x 1 KiB stage, long enough for a profiler.
            let mut g = Many::launch(vec![worker_many()], &mpi)?;
            let fused = samples(&world, 4000, || {
                std::hint::black_box(g.execute().expect("execute"));
            });
            if me == 0 {
                let [lo, mid, hi] = stats(fused);
                println!("64 x 1 KiB stage: {} / {} / {}", fmt(lo), fmt(mid), fmt(hi));
            }
            return Ok(());
        }
        _ => {}
    }
    let worker = |elems: usize| Worker {
        grad: Tensor::full([elems], 1.0 + me as f32),
        ..worker_many()
    };

    // The cost of `launch`: agreement, a communicator per group, threads.
    let launches: Vec<Duration> = (0..SAMPLES)
        .map(|_| {
            world.barrier();
            let start = Instant::now();
            let g = One::launch(vec![worker(1)], &mpi).expect("launch");
            let took = start.elapsed();
            drop(g);
            took
        })
        .collect();

    if me == 0 {
        println!(
            "{} processes x 1 actor; {SAMPLES} samples per row, each the mean of a fixed number of operations",
            mpi.processes()
        );
        println!();
        println!("| f32 allreduce, bytes per rank | MPI_Allreduce min / median / max | actorgraph min / median / max | actorgraph / MPI (medians) | actorgraph - MPI (medians) |");
        println!("| --- | --- | --- | --- | --- |");
    }
    for bytes in sizes(&[4, 1 << 10, 32 << 10, 256 << 10, 1 << 20, 16 << 20, 64 << 20]) {
        let elems = bytes / 4;
        let n = iters(bytes);
        let send = vec![1.0f32 + me as f32; elems];
        let mut recv = vec![0.0f32; elems];
        let bare = samples(&world, n, || {
            world.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
        });
        let mut g = One::launch(vec![worker(elems)], &mpi)?;
        let fused = samples(&world, n, || {
            let out = g.execute().expect("execute");
            std::hint::black_box(out);
        });
        drop(g);
        if me == 0 {
            row(&size(bytes), stats(bare), stats(fused));
        }
    }

    // 64 tensors of 1 KiB: one fused stage against 64 calls.
    let mut g = Many::launch(vec![worker(1)], &mpi)?;
    let send = vec![vec![0.5f32; 256]; 64];
    let mut recv = vec![vec![0.0f32; 256]; 64];
    let bare = samples(&world, 200, || {
        for (s, r) in send.iter().zip(recv.iter_mut()) {
            world.all_reduce_into(&s[..], &mut r[..], SystemOperation::sum());
        }
    });
    let fused = samples(&world, 200, || {
        std::hint::black_box(g.execute().expect("execute"));
    });
    drop(g);
    if me == 0 {
        row(
            "64 x 1 KiB (64 calls / one stage)",
            stats(bare),
            stats(fused),
        );
        let [lo, mid, hi] = stats(launches);
        println!();
        println!(
            "launch of a 1-group graph: {} / {} / {} (min / median / max)",
            fmt(lo),
            fmt(mid),
            fmt(hi)
        );
    }
    Ok(())
}

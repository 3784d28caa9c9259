//! The sampling of the MPI benchmarks, which run under `mpirun` with fixed iteration counts
//! (not criterion: its counts come from each process's own clock, so two processes would
//! run different numbers of collectives and wait for each other forever). A bench includes
//! this file with `#[path = "support/mpi_samples.rs"] mod mpi_samples;`.
#![allow(dead_code)] // each bench uses its own part

use std::time::{Duration, Instant};

use actorgraph::mpi::rsmpi::topology::SimpleCommunicator;
use actorgraph::mpi::rsmpi::traits::*;

/// Samples per row.
pub const SAMPLES: usize = 15;

/// The time per operation of `SAMPLES` samples of `n` calls of `op` each, every sample
/// started after an `MPI_Barrier`.
pub fn samples(world: &SimpleCommunicator, n: usize, mut op: impl FnMut()) -> Vec<Duration> {
    op(); // warm-up: buffers allocated, connections made
    (0..SAMPLES)
        .map(|_| {
            world.barrier();
            let start = Instant::now();
            for _ in 0..n {
                op();
            }
            start.elapsed() / n as u32
        })
        .collect()
}

/// The sizes of `all` that `MPI_BENCH_BYTES` names (bytes, comma-separated; every one if
/// unset), for a profile of one size: `MPI_BENCH_BYTES=4 mpirun -x MPI_BENCH_BYTES ...`.
pub fn sizes(all: &[usize]) -> Vec<usize> {
    let Ok(only) = std::env::var("MPI_BENCH_BYTES") else {
        return all.to_vec();
    };
    let only: Vec<usize> = only
        .split(',')
        .filter_map(|b| b.trim().parse().ok())
        .collect();
    all.iter().copied().filter(|b| only.contains(b)).collect()
}

/// Min, median and max.
pub fn stats(mut v: Vec<Duration>) -> [Duration; 3] {
    v.sort();
    [v[0], v[v.len() / 2], v[v.len() - 1]]
}

/// A duration in the unit that suits it.
pub fn fmt(d: Duration) -> String {
    let ns = d.as_secs_f64() * 1e9;
    if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// A byte count in the unit that suits it.
pub fn size(b: usize) -> String {
    match b {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

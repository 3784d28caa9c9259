//! How much of a step's communication hides behind its computation, across processes.
//!
//! Each worker's backward pass comes in three segments, each giving a bucket of gradients
//! (`--kib` KiB in all, split 1 : 2 : 1) that is averaged over every worker by its own
//! allreduce while the next segment computes (`--compute-ms` of arithmetic in all).
//! The same graph is launched twice, with overlap (the default) and without
//! (`LaunchOptions::overlap(false)`: each stage to its end where it is written), and the
//! two are timed in alternating rounds. Also timed: the compute alone (no stage) and the
//! communication alone (the stages, no compute). Process 0 prints the medians and the
//! share of what could be hidden that was: `(a + b - c) / min(a, b)`.
//!
//! ```text
//! cargo build --release --features mpi --example overlap
//! scripts/slow-net.sh 1gbit mpirun -np 2 target/release/examples/overlap --kib 16384
//! ```
//!
//! Every result is checked against the average it must be; exits with status 1 on a
//! wrong result or an error.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use actorgraph::mpi::Mpi;
use actorgraph::prelude::*;

const USAGE: &str = "usage: overlap [--kib K] [--compute-ms C] [--rounds R]
  --kib K         KiB of f32 gradients per worker and step (default 16384)
  --compute-ms C  milliseconds of arithmetic per worker and step (default 100)
  --rounds R      alternating rounds, 3 steps of each schedule each (default 5)";

struct Worker {
    rank: usize,
    /// Gradient elements per bucket, and iterations of arithmetic per segment that take
    /// about a third of the compute.
    elems: [usize; 3],
    work: u64,
    compute: bool,
}

/// Arithmetic that takes time and cannot be optimized away.
fn busy(iterations: u64, seed: u64) -> u64 {
    let mut x = seed | 1;
    for _ in 0..iterations {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    std::hint::black_box(x)
}

/// Rank `rank`'s gradient element `i` of bucket `b`: multiples of 1/8, whose averages
/// over two workers are exact.
fn grad(rank: usize, b: usize, i: usize) -> f32 {
    ((i % 61) as f32 + b as f32) / 8.0 * (rank + 1) as f32
}

impl Worker {
    fn segment(&self, b: usize) -> Tensor<f32> {
        if self.compute {
            busy(self.work, (self.rank * 3 + b) as u64);
        }
        let n = self.elems[b];
        Tensor::from_vec((0..n).map(|i| grad(self.rank, b, i)).collect(), [n]).unwrap()
    }
}

#[actor]
impl Worker {
    fn backward_head(&mut self) -> Tensor<f32> {
        self.segment(0)
    }
    fn backward_mid(&mut self) -> Tensor<f32> {
        self.segment(1)
    }
    fn backward_tail(&mut self) -> Tensor<f32> {
        self.segment(2)
    }
}

graph! {
    Step(workers: [Worker]) {
        let g3 = workers.backward_head();
        let r3 = allreduce(g3, Avg);
        let g2 = workers.backward_mid();
        let r2 = allreduce(g2, Avg);
        let g1 = workers.backward_tail();
        let r1 = allreduce(g1, Avg);
        (r3, r2, r1)
    }
}

graph! {
    ComputeOnly(workers: [Worker]) {
        let g3 = workers.backward_head();
        let g2 = workers.backward_mid();
        let g1 = workers.backward_tail();
        (g3, g2, g1)
    }
}

struct Args {
    kib: usize,
    compute_ms: u64,
    rounds: usize,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        kib: 16 << 10,
        compute_ms: 100,
        rounds: 5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let n: usize =
            value.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                format!("{flag} takes a positive integer, not {value:?}\n{USAGE}")
            })?;
        match flag.as_str() {
            "--kib" => args.kib = n,
            "--compute-ms" => args.compute_ms = n as u64,
            "--rounds" => args.rounds = n,
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    Ok(args)
}

/// Iterations of `busy` that take about `ms` milliseconds here.
fn calibrate(ms: u64) -> u64 {
    let probe = 1 << 22;
    let start = Instant::now();
    busy(probe, 7);
    let per = start.elapsed().as_secs_f64() / probe as f64;
    ((ms as f64 / 1e3) / per).max(1.0) as u64
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn run(args: &Args) -> Result<(), String> {
    let mpi = Mpi::init().map_err(|e| e.to_string())?;
    let elems = args.kib * 256;
    let elems = [elems / 4, elems / 2, elems - elems / 4 - elems / 2];
    // Each process calibrates its own arithmetic: the compute takes about as long on each.
    let work = calibrate(args.compute_ms) / 3;
    let workers = |compute: bool| {
        Actors::each(1, move |rank, _| Worker {
            rank,
            elems,
            work,
            compute,
        })
    };
    let e = |e: Error| e.to_string();
    let on = LaunchOptions::default();
    let off = LaunchOptions::default().overlap(false);
    let mut overlapped = Step::launch_actors(workers(true), &mpi, on).map_err(e)?;
    let mut in_order = Step::launch_actors(workers(true), &mpi, off).map_err(e)?;
    let mut comm_only = Step::launch_actors(workers(false), &mpi, off).map_err(e)?;
    let mut compute_only = ComputeOnly::launch_actors(workers(true), &mpi, off).map_err(e)?;
    let size = overlapped
        .group_size("workers")
        .ok_or("no group `workers`")?;
    let check = |out: Vec<(Tensor<f32>, Tensor<f32>, Tensor<f32>)>| -> Result<(), String> {
        let factor = (1..=size).map(|q| q as f32).sum::<f32>() / size as f32;
        for (r3, r2, r1) in out {
            for (b, t) in [r3, r2, r1].iter().enumerate() {
                let wrong = t
                    .as_slice()
                    .iter()
                    .enumerate()
                    .position(|(i, &v)| v != grad(0, b, i) * factor);
                if let Some(i) = wrong {
                    return Err(format!("bucket {b}: element {i} is wrong"));
                }
            }
        }
        Ok(())
    };
    let mut times: [Vec<Duration>; 4] = Default::default();
    for round in 0..=args.rounds {
        for (k, times) in times.iter_mut().enumerate() {
            for _ in 0..3 {
                let start = Instant::now();
                match k {
                    0 => check(overlapped.execute().map_err(e)?)?,
                    1 => check(in_order.execute().map_err(e)?)?,
                    2 => check(comm_only.execute().map_err(e)?)?,
                    _ => drop(compute_only.execute().map_err(e)?),
                }
                // The first round warms up.
                if round > 0 {
                    times.push(start.elapsed());
                }
            }
        }
    }
    let [c, c1, b, a] = times.map(median);
    if mpi.process() == 0 {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let hidden = (ms(a) + ms(b) - ms(c)) / ms(a).min(ms(b));
        println!(
            "{} processes x 1 worker, {} KiB of gradients in 3 buckets, {} ms of compute; median step:",
            mpi.processes(),
            args.kib,
            args.compute_ms
        );
        println!("  (a) compute only           {:8.1} ms", ms(a));
        println!("  (b) communication only     {:8.1} ms", ms(b));
        println!("  (c1) overlap off           {:8.1} ms", ms(c1));
        println!("  (c) overlap on             {:8.1} ms", ms(c));
        println!(
            "  hidden: {:.0} % of min(a, b); c / max(a, b) = {:.2}; results checked",
            hidden * 100.0,
            ms(c) / ms(a).max(ms(b))
        );
    }
    for g in [overlapped, in_order, comm_only] {
        g.teardown().map_err(e)?;
    }
    compute_only.teardown().map_err(e)?;
    Ok(())
}

fn main() -> ExitCode {
    let result = parse().and_then(|args| run(&args));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("overlap: {e}");
            ExitCode::FAILURE
        }
    }
}

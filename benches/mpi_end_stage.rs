//! The cost of the end stage across processes (`SyncPoint::End`): a step whose last
//! operation is its stage, against the same step with a method after the stage, which over
//! several processes ends with one more, empty, stage so that the method's error reaches
//! every process. Run under `mpirun`:
//!
//! ```text
//! cargo bench --features mpi --bench mpi_end_stage --no-run
//! mpirun --oversubscribe -np 2 target/release/deps/mpi_end_stage-* --bench [--workers 2]
//! ```
//!
//! Not criterion: every process must run the same fixed number of executions (see
//! `benches/mpi_procs.rs`). Per graph, `SAMPLES` samples of `ITERS` executions each, every
//! sample started after an `MPI_Barrier`, the two graphs alternating; process 0 prints
//! min / median / max of the time per execution.

use std::time::Instant;

use actorgraph::mpi::rsmpi::topology::SimpleCommunicator;
use actorgraph::mpi::rsmpi::traits::*;
use actorgraph::mpi::Mpi;
use actorgraph::prelude::*;

#[path = "support/mpi_samples.rs"]
mod mpi_samples;

use mpi_samples::{fmt, stats, SAMPLES};

const ITERS: u32 = 2000;

struct Worker {
    grad: Tensor<f32>,
}

#[actor]
impl Worker {
    fn grad(&mut self) -> Tensor<f32> {
        self.grad.clone()
    }
    fn keep(&mut self, sum: &Tensor<f32>) -> usize {
        sum.len()
    }
}

graph! {
    EndsInStage(workers: [Worker]) {
        allreduce(workers.grad(), Sum)
    }
}

graph! {
    MethodAfter(workers: [Worker]) {
        let sum = allreduce(workers.grad(), Sum);
        workers.keep(sum)
    }
}

fn main() -> Result<(), actorgraph::Error> {
    let args: Vec<String> = std::env::args().collect();
    let workers = args
        .iter()
        .position(|a| a == "--workers")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(1usize);
    let mpi = Mpi::init()?;
    let world = SimpleCommunicator::world();
    let make = || -> Vec<Worker> {
        (0..workers)
            .map(|_| Worker {
                grad: Tensor::full([256], 1.0),
            })
            .collect()
    };
    let mut plain = EndsInStage::launch(make(), &mpi)?;
    let mut after = MethodAfter::launch(make(), &mpi)?;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    plain.execute()?;
    after.execute()?;
    for _ in 0..SAMPLES {
        world.barrier();
        let start = Instant::now();
        for _ in 0..ITERS {
            plain.execute()?;
        }
        a.push(start.elapsed() / ITERS);
        world.barrier();
        let start = Instant::now();
        for _ in 0..ITERS {
            after.execute()?;
        }
        b.push(start.elapsed() / ITERS);
    }
    if mpi.process() == 0 {
        let (a, b) = (stats(a), stats(b));
        println!(
            "{} processes x {workers} actors, 1 KiB f32 allreduce; {SAMPLES} samples of {ITERS} executions",
            mpi.processes()
        );
        println!("| step | min / median / max per execution |");
        println!("| --- | --- |");
        println!("| ends in its stage | {} |", a.map(fmt).join(" / "));
        println!(
            "| a method after the stage (+ end stage) | {} |",
            b.map(fmt).join(" / ")
        );
        let extra = b[1].as_secs_f64() * 1e6 - a[1].as_secs_f64() * 1e6;
        println!("end stage (medians): {extra:+.2} µs");
    }
    plain.teardown()?;
    after.teardown()?;
    Ok(())
}

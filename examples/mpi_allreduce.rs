//! One fused allreduce per step across processes, over MPI, checked and timed.
//!
//! Every process runs this same program (SPMD) and hosts `--workers` actors; their ranks
//! in the group are global, process 0's first. Each worker has a gradient of `--elems`
//! f32 and a loss; every step, one fused `allreduce([grad, loss], Avg)` averages both
//! over every worker of every process: inside a process in shared memory, between
//! processes with one MPI operation per dtype. Each process checks its own workers'
//! results, bit for bit the same on every rank, and process 0 prints the time per step.
//!
//! ```text
//! cargo build --release --features mpi --example mpi_allreduce
//! mpirun -np 2 target/release/examples/mpi_allreduce --workers 2 --steps 20
//! ```
//!
//! Exits with status 1, saying why, on a wrong result or an error.

use std::process::ExitCode;
use std::time::Instant;

use actorgraph::mpi::Mpi;
use actorgraph::prelude::*;

const USAGE: &str = "usage: mpi_allreduce [--workers W] [--steps S] [--elems E]
  --workers W  actors in this process (default 1)
  --steps S    timed steps (default 20)
  --elems E    f32 elements of each gradient (default 262144: 1 MiB)";

/// Rank `rank`'s gradient element `i`: small multiples of 1/8, so that every average is
/// exact and can be checked.
fn grad_value(rank: usize, i: usize) -> f32 {
    ((i % 251) as f32 - 125.0) / 8.0 * (rank + 1) as f32
}

struct Worker {
    rank: usize,
    grad: Tensor<f32>,
}

#[actor]
impl Worker {
    fn grads(&mut self) -> (Tensor<f32>, f32) {
        (self.grad.clone(), self.rank as f32)
    }
}

graph! {
    Step(workers: [Worker]) {
        let (grad, loss) = workers.grads();
        allreduce([grad, loss], Avg)
    }
}

struct Args {
    workers: usize,
    steps: usize,
    elems: usize,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        workers: 1,
        steps: 20,
        elems: 1 << 18,
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
            "--workers" => args.workers = n,
            "--steps" => args.steps = n,
            "--elems" => args.elems = n,
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    Ok(args)
}

fn run(args: &Args) -> Result<(), String> {
    let mpi = Mpi::init().map_err(|e| e.to_string())?;
    // Every process says how many workers it hosts; `launch` agrees on the layout and
    // numbers the workers globally, process after process.
    let mut g = Step::launch_actors(
        Actors::each(args.workers, {
            let elems = args.elems;
            move |rank, _size| Worker {
                rank,
                grad: Tensor::from_vec((0..elems).map(|i| grad_value(rank, i)).collect(), [elems])
                    .expect("one value per element"),
            }
        }),
        &mpi,
        LaunchOptions::default(),
    )
    .map_err(|e| e.to_string())?;
    let ranks = g.ranks("workers").ok_or("no group `workers`")?;
    let size = g.group_size("workers").ok_or("no group `workers`")?;
    let check = |out: &[(Tensor<f32>, f32)]| -> Result<(), String> {
        let mean_loss = (0..size).map(|q| q as f32).sum::<f32>() / size as f32;
        let factor = (1..=size).map(|q| q as f32).sum::<f32>() / size as f32;
        for (i, (grad, loss)) in out.iter().enumerate() {
            let rank = ranks.start + i;
            if *loss != mean_loss {
                return Err(format!(
                    "rank {rank}: mean loss {loss}, expected {mean_loss}"
                ));
            }
            let want = |e: usize| grad_value(0, e) * factor;
            if let Some(e) = grad
                .as_slice()
                .iter()
                .enumerate()
                .position(|(e, &v)| v != want(e))
            {
                return Err(format!("rank {rank}: gradient element {e} is wrong"));
            }
        }
        Ok(())
    };
    check(&g.execute().map_err(|e| e.to_string())?)?;
    let start = Instant::now();
    for _ in 0..args.steps {
        g.execute().map_err(|e| e.to_string())?;
    }
    let per_step = start.elapsed() / args.steps as u32;
    check(&g.execute().map_err(|e| e.to_string())?)?;
    if mpi.process() == 0 {
        println!(
            "{} processes, {size} workers, {} f32 each: {per_step:?} per fused allreduce; results checked",
            mpi.processes(),
            args.elems,
        );
    }
    println!("process {}: workers {ranks:?} of {size}: ok", mpi.process());
    g.teardown().map_err(|e| e.to_string())?;
    Ok(())
}

fn main() -> ExitCode {
    let result = parse().and_then(|args| run(&args));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mpi_allreduce: {e}");
            ExitCode::FAILURE
        }
    }
}

//! One fused NCCL allreduce per step over GPU gradients, checked and timed.
//!
//! One worker per GPU. Each keeps a gradient of `--elems` f32 (4M by default, 16 MiB) on
//! its own GPU and reports a host scalar loss; every step, one fused
//! `allreduce([grad, loss], Avg)` averages both: the gradient on the GPU, the loss copied
//! there and back. The program checks the last step's results against the expected
//! averages (copied to the host), then prints the time per step and the bandwidth, as
//! nccl-tests does: `algbw = bytes / time` and `busbw = algbw * 2(n-1)/n`.
//!
//! ```text
//! cargo run --release --features nccl --example nccl_allreduce -- \
//!     [--gpus N] [--steps S] [--elems E]
//! ```
//!
//! With the feature `mpi` too, `--mpi` runs it across processes, one NCCL communicator
//! over every GPU of every process (`Nccl::over_mpi`): each process of `mpirun` hosts
//! `--gpus` workers (default 1) on its GPUs `0..gpus`.
//!
//! ```text
//! cargo build --release --features nccl,mpi --example nccl_allreduce
//! mpirun -np 2 target/release/examples/nccl_allreduce --mpi
//! ```
//!
//! Needs the NVIDIA driver and NCCL (see docs/nccl.md). Without them, or without a GPU, it
//! says what is missing and how to fix it, and exits with status 1.

use std::error::Error as StdError;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use actorgraph::nccl::{self, current_device, Device, Nccl};
use actorgraph::prelude::*;

mod support;
use support::parse_in;

const WARMUP: usize = 5;
const USAGE: &str = "usage: nccl_allreduce [--gpus N] [--steps S] [--elems E]
  --gpus N    workers, one per GPU: GPUs 0..N (default: every GPU)
  --steps S   timed steps, 1..=100000 (default 50)
  --elems E   f32 elements of each gradient, 1..=1073741824 (default 4194304: 16 MiB)
  --mpi       (feature `mpi`) across the processes of `mpirun`: --gpus per process (default 1)";

/// Rank `rank`'s gradient element `i`: a multiple of 1/8 times `rank + 1`, so that the
/// average over n ranks is `base(i) * (n + 1) / 2`.
fn grad_value(rank: usize, i: usize) -> f32 {
    base(i) * (rank + 1) as f32
}

fn base(i: usize) -> f32 {
    ((i % 251) as f32 - 125.0) / 8.0
}

fn loss_value(rank: usize) -> f32 {
    rank as f32 + 1.0
}

/// One data-parallel worker on one GPU.
struct Worker {
    rank: usize,
    elems: usize,
    /// Made on the actor's GPU on the first step, then handed to every step (a tensor
    /// clone copies no data).
    grad: Option<Tensor<f32>>,
}

#[actor]
impl Worker {
    /// This rank's gradient, on its GPU, and its loss, on the host.
    fn grads(&mut self) -> Result<(Tensor<f32>, f32), actorgraph::Error> {
        let grad = match &self.grad {
            Some(grad) => grad.clone(),
            None => {
                let device = current_device()?;
                let host: Vec<f32> = (0..self.elems).map(|i| grad_value(self.rank, i)).collect();
                let grad = Tensor::from_vec(host, [self.elems])?.to_device(&device)?;
                self.grad = Some(grad.clone());
                grad
            }
        };
        Ok((grad, loss_value(self.rank)))
    }
}

graph! {
    /// One step: every worker's gradient and loss, averaged by one fused NCCL allreduce.
    AllreduceStep(workers: [Worker]) {
        let (grad, loss) = workers.grads();
        allreduce([grad, loss], Avg)
    }
}

struct Args {
    gpus: Option<usize>,
    steps: usize,
    elems: usize,
    /// Across the processes of `mpirun`.
    mpi: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        gpus: None,
        steps: 50,
        elems: 4 << 20,
        mpi: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        if flag == "--mpi" {
            if cfg!(not(feature = "mpi")) {
                return Err("--mpi needs the example built with the feature `mpi`".into());
            }
            args.mpi = true;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--gpus" => args.gpus = Some(parse_in(&flag, &value, 1, 1024)?),
            "--steps" => args.steps = parse_in(&flag, &value, 1, 100_000)?,
            "--elems" => args.elems = parse_in(&flag, &value, 1, 1 << 30)?,
            _ => return Err(format!("unknown flag `{flag}`")),
        }
    }
    Ok(args)
}

/// Whether `got` is `want` up to float rounding: NCCL's `Avg` multiplies each rank's
/// value by 1/n before summing, which rounds differently from a sum divided by n.
fn close(got: f32, want: f32) -> bool {
    (got - want).abs() <= 1e-5 * want.abs().max(1.0)
}

/// Compares the results of this process's ranks (global ranks `first..`, on its GPUs
/// `0..`) of `n` with the expected averages; prints and returns whether they all match.
fn check(
    out: &[(Tensor<f32>, f32)],
    first: usize,
    n: usize,
    elems: usize,
) -> Result<bool, actorgraph::Error> {
    let scale = (n + 1) as f32 / 2.0;
    let want_loss = (1..=n).map(|r| r as f32).sum::<f32>() / n as f32;
    let mut ok = true;
    let mut first_bits: Option<Vec<u32>> = None;
    let mut identical = true;
    for (gpu, (grad, loss)) in out.iter().enumerate() {
        let rank = first + gpu;
        if grad.device_ordinal() != Some(gpu) {
            eprintln!(
                "FAIL: rank {rank}'s result is on {:?}, not on GPU {gpu}",
                grad.device_ordinal()
            );
            ok = false;
        }
        let host = grad.to_host()?;
        let got = host.as_slice();
        if got.len() != elems {
            eprintln!(
                "FAIL: rank {rank}'s gradient has {} elements, not {elems}",
                got.len()
            );
            ok = false;
            continue;
        }
        let wrong: Vec<usize> = (0..elems)
            .filter(|&i| !close(got[i], base(i) * scale))
            .take(5)
            .collect();
        if let Some(&i) = wrong.first() {
            eprintln!(
                "FAIL: rank {rank}'s averaged gradient is wrong at {wrong:?}..: element {i} is \
                 {}, expected {}",
                got[i],
                base(i) * scale
            );
            ok = false;
        }
        if !close(*loss, want_loss) {
            eprintln!("FAIL: rank {rank}'s averaged loss is {loss}, expected {want_loss}");
            ok = false;
        }
        let bits: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
        match &first_bits {
            None => first_bits = Some(bits),
            Some(first) => identical &= *first == bits,
        }
    }
    if ok {
        println!(
            "OK: every rank holds the averaged gradient ({elems} f32) and loss ({want_loss}); \
             ranks bitwise identical: {}",
            if identical { "yes" } else { "no" }
        );
    }
    Ok(ok)
}

fn run(args: &Args) -> Result<bool, Box<dyn StdError>> {
    let count = nccl::device_count()?;
    let (major, minor, patch) = nccl::nccl_version()?;
    println!("NCCL {major}.{minor}.{patch}, {count} GPU(s) visible");
    if count == 0 {
        return Err("the CUDA driver sees no GPU: this example needs at least one".into());
    }
    #[cfg(feature = "mpi")]
    let mpi = args.mpi.then(actorgraph::mpi::Mpi::init).transpose()?;
    let n = args.gpus.unwrap_or(if args.mpi { 1 } else { count });
    let backend = Nccl::new(0..n)?;
    for &ordinal in backend.devices() {
        let name = Device::new(ordinal)?
            .context()
            .name()
            .unwrap_or_else(|e| format!("(name unknown: {e})"));
        println!("  GPU {ordinal}: {name}");
    }
    // Each worker learns its rank in the whole group, which spans processes under MPI.
    let elems = args.elems;
    let workers = Actors::each(n, move |rank, _| Worker {
        rank,
        elems,
        grad: None,
    });
    let options = LaunchOptions::default();
    #[cfg(feature = "mpi")]
    let mut g = match &mpi {
        Some(mpi) => AllreduceStep::launch_actors(workers, Nccl::over_mpi(mpi, 0..n)?, options)?,
        None => AllreduceStep::launch_actors(workers, backend, options)?,
    };
    #[cfg(not(feature = "mpi"))]
    let mut g = AllreduceStep::launch_actors(workers, backend, options)?;
    let first = g.ranks("workers").ok_or("no group `workers`")?.start;
    let n = g.group_size("workers").ok_or("no group `workers`")?;
    let bytes = args.elems * 4 + 4;
    println!(
        "allreduce([grad, loss], Avg) over {n} GPU(s): {} f32 + 1 f32 loss = {:.2} MiB per rank, \
         {WARMUP} warm-up + {} timed steps",
        args.elems,
        bytes as f64 / (1 << 20) as f64,
        args.steps
    );

    for _ in 0..WARMUP {
        // Dropping the results lets the next step reuse the stage's device buffer.
        drop(g.execute()?);
    }
    let mut elapsed = Duration::ZERO;
    let mut last = Vec::new();
    for _ in 0..args.steps {
        drop(last);
        let start = Instant::now();
        // Returns once the step is done: the loss is a host value, so the stage waits for
        // the collective to copy it back.
        last = g.execute()?;
        elapsed += start.elapsed();
    }
    let ok = check(&last, first, n, args.elems)?;
    drop(last);
    g.teardown()?;

    let per_step = elapsed.as_secs_f64() / args.steps as f64;
    let algbw = bytes as f64 / per_step / 1e9;
    let busbw = algbw * 2.0 * (n - 1) as f64 / n as f64;
    println!(
        "time per step: {:.1} µs (execute: copy in, agreement, allreduce, loss back to host)",
        per_step * 1e6
    );
    println!("algbw: {algbw:.2} GB/s   busbw: {busbw:.2} GB/s");
    if n == 1 {
        println!(
            "note: with one GPU no data crosses between GPUs, so busbw is 0 by definition; the \
             time is the stage's own cost"
        );
    }
    Ok(ok)
}

fn main() -> ExitCode {
    support::main(USAGE, parse_args, run)
}

//! A small data-parallel training job with one fused allreduce per step, gradients by hand.
//!
//! Fits a linear regression `y = x·W + b` (16 features, 2 outputs) on synthetic data made
//! from a fixed seed. Each of N workers owns a shard of the data and a replica of `W` and
//! `b`. Every step, each worker computes its gradients and local loss, a single bucketed
//! `allreduce([grad_w, grad_b, loss], Avg)` averages all three in one collective, and
//! each worker applies the same averaged update. At the end the replicas must agree bit
//! for bit and the loss must have dropped by orders of magnitude.
//!
//! ```text
//! cargo run --release --example linreg -- [--workers N] [--steps S] [--lr LR]
//! ```

use std::process::ExitCode;
use std::time::{Duration, Instant};

use actorgraph::prelude::*;

mod support;
use support::{parse_in, Rng};

const FEATURES: usize = 16;
const OUTPUTS: usize = 2;
const ROWS_PER_WORKER: usize = 256;
const SEED: u64 = 0x5eed;
const USAGE: &str = "usage: linreg [--workers N] [--steps S] [--lr LR]
  --workers N   data-parallel workers, 1..=256 (default 4)
  --steps S     training steps, 1..=1000000 (default 200)
  --lr LR       learning rate, 0 < LR <= 1 (default 0.1)";

/// One data-parallel replica: its shard (row-major) and its copy of the parameters.
struct Worker {
    x: Vec<f32>,
    y: Vec<f32>,
    w: Vec<f32>,
    b: Vec<f32>,
}

#[actor]
impl Worker {
    /// Gradients of `loss = 1/(2m) Σ ||x_i·W + b - y_i||²` over this shard, and the loss.
    fn grads(&mut self) -> (Tensor<f32>, Tensor<f32>, Tensor<f32>) {
        let m = (self.x.len() / FEATURES) as f32;
        let (mut gw, mut gb, mut loss) = (vec![0.0; FEATURES * OUTPUTS], vec![0.0; OUTPUTS], 0.0);
        for (x, y) in self.x.chunks(FEATURES).zip(self.y.chunks(OUTPUTS)) {
            for k in 0..OUTPUTS {
                let r = predict(x, &self.w, &self.b, k) - y[k];
                loss += r * r;
                gb[k] += r;
                for j in 0..FEATURES {
                    gw[j * OUTPUTS + k] += x[j] * r;
                }
            }
        }
        gw.iter_mut().chain(gb.iter_mut()).for_each(|g| *g /= m);
        let gw = Tensor::from_vec(gw, [FEATURES, OUTPUTS]).expect("shape matches data");
        (
            gw,
            Tensor::from_vec(gb, [OUTPUTS]).expect("shape matches data"),
            Tensor::scalar(loss / (2.0 * m)),
        )
    }

    /// SGD step with the averaged gradients. Passes the averaged loss through so that the
    /// update is part of the graph's output and the driver can watch convergence.
    fn apply(
        &mut self,
        gw: &Tensor<f32>,
        gb: &Tensor<f32>,
        loss: &Tensor<f32>,
        lr: f32,
    ) -> Tensor<f32> {
        let params = self.w.iter_mut().chain(self.b.iter_mut());
        params
            .zip(gw.as_slice().iter().chain(gb.as_slice()))
            .for_each(|(p, g)| *p -= lr * g);
        loss.clone()
    }
}

graph! {
    /// One training step: local gradients, one fused average, local update.
    TrainStep(workers: [Worker], lr: f32) {
        let (gw, gb, loss) = workers.grads();
        let (avg_gw, avg_gb, avg_loss) = allreduce([gw, gb, loss], Avg);
        workers.apply(avg_gw, avg_gb, avg_loss, lr)
    }
}

struct Args {
    workers: usize,
    steps: usize,
    lr: f32,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        workers: 4,
        steps: 200,
        lr: 0.1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            // Each worker is a thread: the cap keeps a typo from spawning a million.
            "--workers" => args.workers = parse_in(&flag, &value, 1, 256)?,
            "--steps" => args.steps = parse_in(&flag, &value, 1, 1_000_000)?,
            // The curvature is 1 along the bias: above 1 it oscillates, at 2 it diverges.
            "--lr" => args.lr = parse_in(&flag, &value, f32::MIN_POSITIVE, 1.0)?,
            _ => return Err(format!("unknown flag `{flag}`")),
        }
    }
    Ok(args)
}

/// The same global dataset for any worker count, split into equal shards: equal shard
/// sizes make the average of the shard gradients the full-batch gradient.
fn make_workers(n: usize) -> Vec<Worker> {
    let mut rng = Rng(SEED);
    let w_true: Vec<f32> = (0..FEATURES * OUTPUTS).map(|_| rng.uniform()).collect();
    let b_true: Vec<f32> = (0..OUTPUTS).map(|_| 2.0 * rng.uniform()).collect();
    let mut shard = || {
        let x: Vec<f32> = (0..ROWS_PER_WORKER * FEATURES)
            .map(|_| rng.uniform())
            .collect();
        let mut y = Vec::with_capacity(ROWS_PER_WORKER * OUTPUTS);
        for row in x.chunks(FEATURES) {
            for k in 0..OUTPUTS {
                y.push(predict(row, &w_true, &b_true, k) + 0.01 * rng.uniform());
            }
        }
        Worker {
            x,
            y,
            w: vec![0.0; FEATURES * OUTPUTS],
            b: vec![0.0; OUTPUTS],
        }
    };
    (0..n).map(|_| shard()).collect()
}

/// Output `k` of `row·W + b`, with `W` row-major `[FEATURES, OUTPUTS]`.
fn predict(row: &[f32], w: &[f32], b: &[f32], k: usize) -> f32 {
    b[k] + row
        .iter()
        .enumerate()
        .map(|(j, x)| x * w[j * OUTPUTS + k])
        .sum::<f32>()
}

fn run(args: &Args) -> Result<bool, actorgraph::Error> {
    println!(
        "training y = x·W + b: {} workers × {ROWS_PER_WORKER} rows, {} steps, lr {}",
        args.workers, args.steps, args.lr
    );
    let mut g = TrainStep::launch(make_workers(args.workers), Cpu)?;
    let (mut first_loss, mut last_loss, mut elapsed) = (f32::NAN, f32::NAN, Duration::ZERO);
    for step in 0..args.steps {
        let start = Instant::now();
        let losses: Vec<Tensor<f32>> = g.execute(args.lr)?;
        elapsed += start.elapsed();
        last_loss = losses[0].as_slice()[0];
        if step == 0 {
            first_loss = last_loss;
        }
        if step % 20 == 0 || step + 1 == args.steps {
            println!("step {step:>5}  loss {last_loss:.6e}");
        }
    }
    let per_step = elapsed.as_secs_f64() * 1e6 / args.steps as f64;
    println!("mean time per step: {per_step:.1} µs (execute only)");

    let workers = g.teardown()?;
    let bits: Vec<Vec<u32>> = workers
        .iter()
        .map(|w| w.w.iter().chain(&w.b).map(|v| v.to_bits()).collect())
        .collect();
    let diverged: Vec<usize> = (1..bits.len()).filter(|&r| bits[r] != bits[0]).collect();
    let mut ok = diverged.is_empty();
    if ok {
        println!(
            "OK: all {} workers hold bitwise-identical parameters",
            bits.len()
        );
    } else {
        eprintln!("FAIL: parameters of ranks {diverged:?} differ from rank 0");
    }
    // The noise floor is about 1e-5 of the starting loss; 1e-2 leaves room for short runs
    // and small learning rates while still catching an update that does not descend.
    if last_loss < first_loss * 1e-2 {
        println!("OK: loss fell from {first_loss:.4e} to {last_loss:.4e}");
    } else {
        eprintln!("FAIL: loss only fell from {first_loss:.4e} to {last_loss:.4e} (more --steps?)");
        ok = false;
    }
    Ok(ok)
}

fn main() -> ExitCode {
    support::main(USAGE, parse_args, run)
}

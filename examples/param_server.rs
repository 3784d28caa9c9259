//! A parameter-server step, drawn as users draw it: rank 0's parameters broadcast to every
//! worker, gradients reduce-scattered so that each worker updates its own shard (with its
//! own momentum), the shards all-gathered back, and a coordinator that reads every worker's
//! loss (`gather`) and logs the mean. Each worker gets its own batch (`PerRank`) and learns
//! its rank from `Ctx::current` to pick its shard.
//!
//! Fits `y = x · w_true` (8 features) on synthetic data; at the end the replicas must agree
//! bit for bit and the mean loss must have dropped by orders of magnitude.
//!
//! ```text
//! cargo run --release --example param_server -- [--workers N] [--steps S]
//! ```

use std::process::ExitCode;

use actorgraph::prelude::*;

const FEATURES: usize = 8;
const ROWS: usize = 64;

/// One data-parallel worker: a replica of the parameters and the momentum of its shard.
struct Worker {
    params: Vec<f32>,
    momentum: Vec<f32>,
}

#[actor]
impl Worker {
    /// The parameters this worker holds now (rank 0's are the ones that count).
    fn params(&mut self) -> Tensor<f32> {
        Tensor::from_slice(&self.params)
    }

    /// The gradient of the mean squared error on this worker's batch, and its loss.
    fn grad(&mut self, w: &Tensor<f32>, batch: &Tensor<f32>) -> (Tensor<f32>, f32) {
        let (w, data) = (w.as_slice(), batch.as_slice());
        let mut g = vec![0.0; FEATURES];
        let mut loss = 0.0;
        for row in data.chunks(FEATURES + 1) {
            let (x, y) = (&row[..FEATURES], row[FEATURES]);
            let err = x.iter().zip(w).map(|(a, b)| a * b).sum::<f32>() - y;
            loss += err * err;
            for (gi, xi) in g.iter_mut().zip(x) {
                *gi += 2.0 * err * xi;
            }
        }
        let n = (data.len() / (FEATURES + 1)) as f32;
        g.iter_mut().for_each(|v| *v /= n);
        (Tensor::from_vec(g, [FEATURES]).expect("shape"), loss / n)
    }

    /// Momentum SGD on this worker's shard of the parameters only.
    fn update(&mut self, w: &Tensor<f32>, grad_shard: &Tensor<f32>, lr: &f32) -> Tensor<f32> {
        let ctx = Ctx::current().expect("runs on an actor thread");
        let len = FEATURES / ctx.size();
        let start = ctx.rank() * len;
        let w = &w.as_slice()[start..start + len];
        let mut shard = Vec::with_capacity(len);
        for (i, g) in grad_shard.as_slice().iter().enumerate() {
            self.momentum[i] = 0.9 * self.momentum[i] + g;
            shard.push(w[i] - lr * self.momentum[i]);
        }
        Tensor::from_vec(shard, [len]).expect("shape")
    }

    fn store(&mut self, w: &Tensor<f32>) -> Vec<f32> {
        self.params = w.to_vec();
        self.params.clone()
    }
}

/// Reads every worker's loss and keeps the history of the mean.
#[derive(Default)]
struct Coordinator {
    history: Vec<f32>,
}

#[actor]
impl Coordinator {
    fn log(&mut self, losses: &[f32]) -> f32 {
        let mean = losses.iter().sum::<f32>() / losses.len() as f32;
        self.history.push(mean);
        mean
    }
}

graph! {
    /// One step of sharded data-parallel training, with a coordinator.
    Server(workers: [Worker], coord: [Coordinator; 1], batch: PerRank<Tensor<f32>>, lr: f32) {
        let mine = workers.params();
        let w = broadcast(mine, 0);                  // rank 0's parameters, everywhere
        let (g, loss) = workers.grad(w, batch);
        let shard = reducescatter(g, Avg);           // this rank's 1/N of the mean gradient
        let updated = workers.update(w, shard, lr);  // the sharded update
        let full = allgather(updated);               // every shard, everywhere
        let replica = workers.store(full);
        let mean = coord[0].log(gather(loss));       // every worker's loss, on one actor
        (replica, mean)
    }
}

/// SplitMix64, for the same data on every platform.
fn next(state: &mut u64) -> f32 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
}

/// One batch per worker: rows of `FEATURES` inputs and their target.
fn batches(workers: usize, seed: &mut u64) -> Vec<Tensor<f32>> {
    let w_true: Vec<f32> = (0..FEATURES).map(|i| i as f32 / 4.0 - 1.0).collect();
    (0..workers)
        .map(|_| {
            let mut data = Vec::with_capacity(ROWS * (FEATURES + 1));
            for _ in 0..ROWS {
                let x: Vec<f32> = (0..FEATURES).map(|_| next(seed)).collect();
                let y = x.iter().zip(&w_true).map(|(a, b)| a * b).sum();
                data.extend(x);
                data.push(y);
            }
            Tensor::from_vec(data, [ROWS, FEATURES + 1]).expect("shape")
        })
        .collect()
}

fn arg(args: &[String], name: &str, default: usize) -> Result<usize, String> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or(format!("{name} takes a number")),
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let workers = arg(&args, "--workers", 4)?;
    let steps = arg(&args, "--steps", 100)?;
    if workers == 0 || FEATURES % workers != 0 {
        return Err(format!("--workers must divide {FEATURES}"));
    }
    let replicas = (0..workers)
        .map(|rank| Worker {
            // Only rank 0's start counts: the broadcast overwrites the others'.
            params: vec![rank as f32; FEATURES],
            momentum: vec![0.0; FEATURES / workers],
        })
        .collect();
    let mut g =
        Server::launch(replicas, [Coordinator::default()], Cpu).map_err(|e| e.to_string())?;
    let mut seed = 0x5eed;
    let mut first = None;
    for step in 0..steps {
        let out = g
            .execute(batches(workers, &mut seed), 0.05)
            .map_err(|e| e.to_string())?;
        let mean = out[0].1.ok_or("the coordinator's mean is at rank 0")?;
        first.get_or_insert(mean);
        if !out.iter().all(|(replica, _)| *replica == out[0].0) {
            return Err(format!("step {step}: the replicas differ"));
        }
        if step % 20 == 0 || step + 1 == steps {
            println!("step {step:4}: mean loss {mean:.6}");
        }
    }
    let (_, coord) = g.teardown().map_err(|e| e.to_string())?;
    let (first, last) = (
        first.unwrap_or(0.0),
        *coord[0].history.last().unwrap_or(&0.0),
    );
    println!("mean loss {first:.4} -> {last:.6} over {steps} steps on {workers} workers");
    if steps >= 50 && last > first / 100.0 {
        return Err("the loss did not drop by 100x".into());
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("param_server: {e}");
            ExitCode::FAILURE
        }
    }
}

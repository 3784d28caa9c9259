//! The main job: a neural network trained data-parallel, its gradients averaged by one
//! fused allreduce per step.
//!
//! The model is an MLP classifier (11 → 64 → 64 → 6, ReLU) made of candle-nn `Linear`
//! layers, trained with candle's autograd, cross-entropy loss and AdamW on the
//! wine-quality data that `linfa-datasets` ships (1599 red wines, 11 physico-chemical
//! measurements each, a tasters' quality score of 3 to 8 as the class). A fixed seed splits
//! it once into 1280 training and 319 held-out wines.
//!
//! N worker actors each hold a replica of the model and of its optimizer. Each step takes a
//! global batch of training rows, the same for any N (a seeded permutation per epoch, as
//! PyTorch's `DistributedSampler` does), and rank k computes the loss and the gradients of
//! its share of the batch, its shard. One `allreduce([grads, loss], Avg)` averages all of
//! the model's gradient tensors, a `Vec<candle_core::Tensor>` as candle made them, in one
//! fused stage, and each worker's AdamW applies the same average. Shards of equal size make
//! that average the global batch's gradient, so N workers follow the run of 1 worker up
//! to rounding.
//!
//! Each epoch prints the mean training loss, the held-out accuracy (each worker scores its
//! share of the held-out wines in the epoch's last step) and the mean time of `execute`
//! per step. As `torchrun` does with `OMP_NUM_THREADS`, the example runs candle on one
//! thread per worker unless `RAYON_NUM_THREADS` says otherwise: the workers are the
//! parallelism. The run then checks that every worker holds bitwise-identical parameters
//! and, unless `--no-baseline` or `--workers 1`, trains the same model with 1 worker over
//! the whole data (the same batches) and checks that the N workers' final held-out
//! accuracy is at most `ACCURACY_TOLERANCE` below it. A failed check exits with status 1.
//! Everything is seeded: every run prints the same losses and accuracies.
//!
//! ```text
//! cargo run --release --features candle --example train -- [--workers N] [--epochs E]
//!     [--batch B] [--lr LR] [--no-baseline] [--checkpoint DIR] [--resume DIR]
//! ```
//!
//! With `--checkpoint DIR`, every worker saves its state at the end of each epoch, on its
//! own thread, through the graph's `try_each_workers`: its parameters, its optimizer's
//! moments and step count, and its step (the epoch and the place in it). `--resume DIR`
//! loads the newest checkpoint that every worker wrote, the same way, and trains the
//! epochs after it: the losses and accuracies it prints, and the final parameters, are
//! those of a run that never stopped, bit for bit. A job that `mpirun` ended after a lost
//! process restarts with the same command and `--resume DIR`.
//!
//! Built with the feature `mpi`, the same program also runs under `mpirun`, each process
//! hosting `--workers` of the workers (ranks global, process 0's first): the allreduce
//! then spans the processes, process 0 prints, and the losses and accuracies are the same,
//! bit for bit, as one process's with as many workers in all. Process 0 runs the baseline.
//!
//! ```text
//! cargo build --release --features candle,mpi --example train
//! mpirun -np 2 target/release/examples/train --workers 2   # prints what --workers 4 does
//! ```

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use actorgraph::candle_core;
use actorgraph::prelude::*;
use candle_core::{DType, Device, Tensor as CTensor, Var, D};
use candle_nn::{Linear, Module, ParamsAdamW};

mod support;
use support::{parse_in, Rng};

const SEED: u64 = 0x5eed;
/// Wines held out of training, to measure accuracy on.
const HELD_OUT: usize = 319;
const HIDDEN: usize = 64;
/// How far below 1 worker's final held-out accuracy N workers may end (a fraction: 0.02 is
/// 2 percentage points, 6 of the 319 held-out wines). Both runs see the same batches, so
/// only rounding (a mean of shard means against one mean) separates them.
const ACCURACY_TOLERANCE: f64 = 0.02;
const USAGE: &str = "usage: train [--workers N] [--epochs E] [--batch B] [--lr LR] [--no-baseline]
             [--checkpoint DIR] [--resume DIR]
  --workers N     data-parallel workers (of each process, under mpirun), 1..=64 (default 4);
                  the workers of all processes together divide B
  --epochs E      passes over the training set, 1..=10000 (default 30)
  --batch B       global batch, split evenly over the workers, 1..=1280 (default 64)
  --lr LR         AdamW's learning rate, 0 < LR <= 1 (default 0.003)
  --no-baseline   skip the 1-worker run that the N workers' accuracy is checked against
  --checkpoint D  save every worker's state in directory D at the end of each epoch
  --resume D      continue from the newest checkpoint in D that every worker wrote";

/// Features of `rows` wines (row-major, standardized) and their classes.
#[derive(Clone)]
struct Data {
    x: CTensor,
    y: CTensor,
}

impl Data {
    fn rows(&self) -> usize {
        self.y.dims1().unwrap_or(0)
    }
}

/// The data set, split into training and held-out wines.
struct Wine {
    train: Data,
    test: Data,
    features: usize,
    classes: usize,
}

/// The wine-quality data, shuffled by `SEED`, split, and standardized by the training
/// set's mean and deviation; the class is the quality score less the lowest score.
fn load() -> candle_core::Result<Wine> {
    let ds = linfa_datasets::winequality();
    let (records, targets) = (&ds.records, &ds.targets);
    let (rows, features) = records.dim();
    let lowest = targets.iter().copied().min().unwrap_or(0);
    let classes = targets.iter().map(|&q| q - lowest + 1).max().unwrap_or(0);
    let mut order: Vec<usize> = (0..rows).collect();
    Rng(SEED).shuffle(&mut order);
    let (train_rows, test_rows) = order.split_at(rows - HELD_OUT);

    let column = |j: usize| train_rows.iter().map(move |&i| records[[i, j]]);
    let n = train_rows.len() as f64;
    let mean: Vec<f64> = (0..features).map(|j| column(j).sum::<f64>() / n).collect();
    let std: Vec<f64> = (0..features)
        .map(|j| (column(j).map(|v| (v - mean[j]).powi(2)).sum::<f64>() / n).sqrt())
        .collect();
    let data = |picked: &[usize]| -> candle_core::Result<Data> {
        let x: Vec<f32> = picked
            .iter()
            .flat_map(|&i| (0..features).map(move |j| (i, j)))
            .map(|(i, j)| ((records[[i, j]] - mean[j]) / std[j]) as f32)
            .collect();
        let y: Vec<u32> = picked
            .iter()
            .map(|&i| (targets[i] - lowest) as u32)
            .collect();
        Ok(Data {
            x: CTensor::from_vec(x, (picked.len(), features), &Device::Cpu)?,
            y: CTensor::from_vec(y, picked.len(), &Device::Cpu)?,
        })
    };
    Ok(Wine {
        train: data(train_rows)?,
        test: data(test_rows)?,
        features,
        classes,
    })
}

/// The parameters of an MLP of layer widths `widths`, initialized as PyTorch's `Linear`
/// is (uniform in ±1/√fan_in) from `SEED`, so that every replica starts equal: weight then
/// bias of each layer.
fn init_params(widths: &[usize]) -> candle_core::Result<Vec<Var>> {
    let mut rng = Rng(SEED);
    let mut params = Vec::new();
    for pair in widths.windows(2) {
        let (fan_in, fan_out) = (pair[0], pair[1]);
        let bound = 1.0 / (fan_in as f32).sqrt();
        let mut uniform = |n: usize| (0..n).map(|_| bound * rng.uniform()).collect::<Vec<_>>();
        let w = CTensor::from_vec(uniform(fan_out * fan_in), (fan_out, fan_in), &Device::Cpu)?;
        let b = CTensor::from_vec(uniform(fan_out), fan_out, &Device::Cpu)?;
        params.push(Var::from_tensor(&w)?);
        params.push(Var::from_tensor(&b)?);
    }
    Ok(params)
}

/// The MLP: `Linear` layers over the variables (they share storage, so the optimizer's
/// updates of the variables are the layers' new weights), ReLU between them.
struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    fn new(params: &[Var]) -> Self {
        let layers = params
            .chunks(2)
            .map(|wb| Linear::new(wb[0].as_tensor().clone(), Some(wb[1].as_tensor().clone())))
            .collect();
        Mlp { layers }
    }

    fn forward(&self, x: &CTensor) -> candle_core::Result<CTensor> {
        let mut h = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h)?;
            if i + 1 < self.layers.len() {
                h = h.relu()?;
            }
        }
        Ok(h)
    }

    /// How many of `data`'s rows the model classifies right.
    fn correct(&self, data: &Data) -> candle_core::Result<usize> {
        let predicted = self.forward(&data.x)?.argmax(D::Minus1)?;
        let hits = predicted.eq(&data.y)?.to_dtype(DType::U32)?.sum_all()?;
        Ok(hits.to_scalar::<u32>()? as usize)
    }
}

/// AdamW as candle-nn's `AdamW` computes it, op for op (so a run takes the same steps, bit
/// for bit), with its state in reach: candle-nn keeps the moments and the step count
/// private, and a checkpoint must hold them to continue the same run.
struct AdamW {
    params: ParamsAdamW,
    /// Per parameter, the first and the second moment.
    m: Vec<CTensor>,
    v: Vec<CTensor>,
    /// Steps taken.
    t: usize,
}

impl AdamW {
    fn new(vars: &[Var], params: ParamsAdamW) -> candle_core::Result<Self> {
        let zeros = || -> candle_core::Result<Vec<CTensor>> {
            vars.iter().map(|p| p.as_tensor().zeros_like()).collect()
        };
        Ok(AdamW {
            params,
            m: zeros()?,
            v: zeros()?,
            t: 0,
        })
    }

    /// One step of every variable of `vars` along its gradient in `grads`.
    fn step<'g>(
        &mut self,
        vars: &[Var],
        grads: impl IntoIterator<Item = &'g CTensor>,
    ) -> candle_core::Result<()> {
        self.t += 1;
        let ParamsAdamW {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } = self.params;
        let scale_m = 1f64 / (1f64 - beta1.powi(self.t as i32));
        let scale_v = 1f64 / (1f64 - beta2.powi(self.t as i32));
        for (((theta, g), m), v) in vars.iter().zip(grads).zip(&mut self.m).zip(&mut self.v) {
            let next_m = ((&*m * beta1)? + (g * (1.0 - beta1))?)?;
            let next_v = ((&*v * beta2)? + (g.sqr()? * (1.0 - beta2))?)?;
            let m_hat = (&next_m * scale_m)?;
            let v_hat = (&next_v * scale_v)?;
            let next_theta = (theta.as_tensor() * (1f64 - lr * weight_decay))?;
            let adjusted_grad = (m_hat / (v_hat.sqrt()? + eps)?)?;
            theta.set(&(next_theta - (adjusted_grad * lr)?)?)?;
            (*m, *v) = (next_m, next_v);
        }
        Ok(())
    }
}

/// One data-parallel replica: the data, its model and optimizer, and where it is in the
/// epoch.
struct Worker {
    rank: usize,
    ranks: usize,
    train: Data,
    /// This rank's share of the held-out wines (every `ranks`-th from `rank`).
    test: Data,
    params: Vec<Var>,
    model: Mlp,
    opt: AdamW,
    batch: usize,
    /// Steps taken, and the global batches of the current epoch in order.
    step: usize,
    order: Vec<u32>,
}

/// What a worker reports of a step: the averaged loss, and its held-out score when asked.
#[derive(Clone, Copy)]
struct Report {
    loss: f32,
    correct: usize,
    scored: usize,
}

#[actor]
impl Worker {
    /// This rank's shard of the step's global batch: its loss, and the gradient of every
    /// parameter in `params` order.
    fn grads(&mut self) -> candle_core::Result<(Vec<CTensor>, f32)> {
        let steps_per_epoch = self.train.rows() / self.batch;
        let (epoch, step) = (self.step / steps_per_epoch, self.step % steps_per_epoch);
        if step == 0 || self.order.is_empty() {
            // The same permutation on every rank, as each seeds it by the epoch alone (and
            // a worker resumed from a checkpoint, by the epoch it resumes).
            self.order = (0..self.train.rows() as u32).collect();
            Rng(SEED ^ ((1 + epoch as u64) << 32)).shuffle(&mut self.order);
        }
        let share = self.batch / self.ranks;
        let first = step * self.batch + self.rank * share;
        let rows = CTensor::from_slice(&self.order[first..first + share], share, &Device::Cpu)?;
        let x = self.train.x.index_select(&rows, 0)?;
        let y = self.train.y.index_select(&rows, 0)?;
        let loss = candle_nn::loss::cross_entropy(&self.model.forward(&x)?, &y)?;
        let grads = loss.backward()?;
        let grads =
            self.params
                .iter()
                .map(|p| {
                    grads.get(p.as_tensor()).cloned().ok_or_else(|| {
                        candle_core::Error::Msg("a parameter without a gradient".into())
                    })
                })
                .collect::<candle_core::Result<Vec<_>>>()?;
        Ok((grads, loss.to_scalar::<f32>()?))
    }

    /// The optimizer's step with the averaged gradients; then, if `evaluate`, this rank's
    /// score on its share of the held-out wines.
    fn update(
        &mut self,
        grads: &Vec<CTensor>,
        loss: &f32,
        evaluate: bool,
    ) -> candle_core::Result<Report> {
        self.opt.step(&self.params, grads)?;
        self.step += 1;
        let (correct, scored) = if evaluate {
            (self.model.correct(&self.test)?, self.test.rows())
        } else {
            (0, 0)
        };
        Ok(Report {
            loss: *loss,
            correct,
            scored,
        })
    }
}

/// A worker's checkpoint: `rank-<rank>-step-<step>.safetensors` in the checkpoint's
/// directory, holding the parameters, AdamW's moments and step count, the worker's step
/// (its epoch and its place in it) and the run's batch and worker count, which a resumed
/// run must share. The order of the batches is a function of the epoch (seeded by it), so
/// the step is all of the random state there is.
impl Worker {
    fn checkpoint_file(dir: &Path, rank: usize, step: usize) -> PathBuf {
        dir.join(format!("rank-{rank}-step-{step}.safetensors"))
    }

    /// Writes this worker's checkpoint, whole or not at all (a file is renamed into place
    /// once written), and removes its checkpoints older than the one before: a process
    /// lost while others wrote this one leaves them one checkpoint ahead, and the one
    /// before is then the newest that every worker has.
    fn save(&self, dir: &Path) -> candle_core::Result<()> {
        let scalar = |v: usize| CTensor::new(&[v as u32], &Device::Cpu);
        let mut state = std::collections::HashMap::new();
        for (i, ((p, m), v)) in self
            .params
            .iter()
            .zip(&self.opt.m)
            .zip(&self.opt.v)
            .enumerate()
        {
            state.insert(format!("param.{i}"), p.as_tensor().clone());
            state.insert(format!("m.{i}"), m.clone());
            state.insert(format!("v.{i}"), v.clone());
        }
        state.insert("adam_t".into(), scalar(self.opt.t)?);
        state.insert("step".into(), scalar(self.step)?);
        state.insert("batch".into(), scalar(self.batch)?);
        state.insert("ranks".into(), scalar(self.ranks)?);
        let file = Self::checkpoint_file(dir, self.rank, self.step);
        let partial = file.with_extension("partial");
        candle_core::safetensors::save(&state, &partial)?;
        std::fs::rename(&partial, &file)?;
        let mut older = saved_steps(dir, self.rank)?;
        older.retain(|&step| step < self.step);
        // Ascending: all but the last, the checkpoint before this one.
        older.pop();
        for step in older {
            std::fs::remove_file(Self::checkpoint_file(dir, self.rank, step))?;
        }
        Ok(())
    }

    /// Loads this worker's checkpoint of step `step`; an error if it is missing or was
    /// written by a run with another batch or worker count.
    fn restore(&mut self, dir: &Path, step: usize) -> candle_core::Result<()> {
        let file = Self::checkpoint_file(dir, self.rank, step);
        let mut state = candle_core::safetensors::load(&file, &Device::Cpu)?;
        let mut take = |name: &str| {
            state.remove(name).ok_or_else(|| {
                candle_core::Error::Msg(format!("{} holds no `{name}`", file.display()))
            })
        };
        let mut scalar = |name: &str| -> candle_core::Result<usize> {
            Ok(take(name)?.to_vec1::<u32>()?.first().copied().unwrap_or(0) as usize)
        };
        let (batch, ranks) = (scalar("batch")?, scalar("ranks")?);
        if (batch, ranks) != (self.batch, self.ranks) {
            return Err(candle_core::Error::Msg(format!(
                "{} was written by a run with --batch {batch} over {ranks} workers, not --batch {} over {}",
                file.display(),
                self.batch,
                self.ranks
            )));
        }
        self.opt.t = scalar("adam_t")?;
        self.step = scalar("step")?;
        for i in 0..self.params.len() {
            self.params[i].set(&take(&format!("param.{i}"))?)?;
            self.opt.m[i] = take(&format!("m.{i}"))?;
            self.opt.v[i] = take(&format!("v.{i}"))?;
        }
        // The epoch's order is made again at the next step.
        self.order.clear();
        Ok(())
    }
}

/// The steps of rank `rank`'s checkpoints in `dir`, ascending.
fn saved_steps(dir: &Path, rank: usize) -> std::io::Result<Vec<usize>> {
    let prefix = format!("rank-{rank}-step-");
    let mut steps = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let step = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|n| n.strip_suffix(".safetensors"))
            .and_then(|n| n.parse::<usize>().ok());
        steps.extend(step);
    }
    steps.sort_unstable();
    Ok(steps)
}

/// Saves every worker's state in `dir`, each on its own thread, between two steps.
fn checkpoint(g: &mut TrainStep, dir: &Path) -> Result<(), Box<dyn Error>> {
    std::fs::create_dir_all(dir)?;
    let dir = dir.to_path_buf();
    g.try_each_workers(move |_, w| w.save(&dir))?;
    Ok(())
}

/// Loads into every worker the newest checkpoint in `dir` that every worker of every
/// process wrote, and returns the epochs it had done.
fn resume(
    g: &mut TrainStep,
    dir: &Path,
    place: Place,
    steps: usize,
) -> Result<usize, Box<dyn Error>> {
    let listed = dir.to_path_buf();
    let saved = g.try_each_workers(move |ctx, _| {
        saved_steps(&listed, ctx.rank()).map_err(|e| format!("{}: {e}", listed.display()))
    })?;
    // Each worker's newest, and of those the oldest: a process lost while the others
    // saved left them one checkpoint ahead, and they kept the one before.
    let newest = saved
        .iter()
        .map(|s| s.last().copied().unwrap_or(0))
        .min()
        .unwrap_or(0);
    let newest = processes::least(place, newest);
    if newest == 0 {
        return Err(format!("{} holds no checkpoint of every worker", dir.display()).into());
    }
    let dir = dir.to_path_buf();
    g.try_each_workers(move |_, w| w.restore(&dir, newest))?;
    Ok(newest / steps)
}

graph! {
    /// One training step: every worker's gradients, one fused average of all of them and
    /// of the loss, every worker's update (and held-out score, when `evaluate`).
    TrainStep(workers: [Worker], evaluate: bool) {
        let (grads, loss) = workers.grads();
        let (avg_grads, avg_loss) = allreduce([grads, loss], Avg);
        workers.update(avg_grads, avg_loss, evaluate)
    }
}

struct Args {
    workers: usize,
    epochs: usize,
    batch: usize,
    lr: f64,
    baseline: bool,
    /// Where to save every worker's state at the end of each epoch.
    checkpoint: Option<PathBuf>,
    /// Where to load the state to continue from.
    resume: Option<PathBuf>,
}

impl Args {
    /// The same run from scratch and without checkpoints: the 1-worker baseline's.
    fn without_checkpoints(&self) -> Args {
        Args {
            checkpoint: None,
            resume: None,
            ..*self
        }
    }
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        workers: 4,
        epochs: 30,
        batch: 64,
        lr: 0.003,
        baseline: true,
        checkpoint: None,
        resume: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--no-baseline" => {
                args.baseline = false;
                continue;
            }
            _ => {}
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            // Each worker is a thread: the cap keeps a typo from spawning a thousand.
            "--workers" => args.workers = parse_in(&flag, &value, 1, 64)?,
            "--epochs" => args.epochs = parse_in(&flag, &value, 1, 10_000)?,
            "--batch" => args.batch = parse_in(&flag, &value, 1, 1280)?,
            "--lr" => args.lr = parse_in(&flag, &value, f64::MIN_POSITIVE, 1.0)?,
            "--checkpoint" => args.checkpoint = Some(value.into()),
            "--resume" => args.resume = Some(value.into()),
            _ => return Err(format!("unknown flag `{flag}`")),
        }
    }
    if args.batch % args.workers != 0 {
        return Err(format!(
            "--batch {} does not split evenly over --workers {}: equal shards make the \
             average of the workers' gradients the batch's gradient",
            args.batch, args.workers
        ));
    }
    Ok(args)
}

/// What a training run ends with.
struct Outcome {
    accuracy: f64,
    identical: bool,
    /// The mean time of `execute` per step.
    per_step: Duration,
}

/// Which workers a process hosts: ranks `first..first + here` of `size` in all, in
/// process `process` of `processes`.
#[derive(Clone, Copy)]
struct Place {
    process: usize,
    processes: usize,
    first: usize,
    here: usize,
    size: usize,
}

impl Place {
    /// Every one of `n` workers in this process.
    fn alone(n: usize) -> Self {
        Place {
            process: 0,
            processes: 1,
            first: 0,
            here: n,
            size: n,
        }
    }

    /// Process 0 speaks for the job.
    fn leads(&self) -> bool {
        self.process == 0
    }
}

/// The workers at `place`, each with its share of the held-out wines and the same initial
/// model.
fn make_workers(wine: &Wine, args: &Args, place: Place) -> candle_core::Result<Vec<Worker>> {
    let widths = [wine.features, HIDDEN, HIDDEN, wine.classes];
    let n = place.size;
    (place.first..place.first + place.here)
        .map(|rank| {
            let mine: Vec<u32> = (rank as u32..wine.test.rows() as u32).step_by(n).collect();
            let mine = CTensor::from_slice(&mine, mine.len(), &Device::Cpu)?;
            let params = init_params(&widths)?;
            let opt = AdamW::new(
                &params,
                ParamsAdamW {
                    lr: args.lr,
                    ..ParamsAdamW::default()
                },
            )?;
            Ok(Worker {
                rank,
                ranks: n,
                train: wine.train.clone(),
                test: Data {
                    x: wine.test.x.index_select(&mine, 0)?,
                    y: wine.test.y.index_select(&mine, 0)?,
                },
                model: Mlp::new(&params),
                params,
                opt,
                batch: args.batch,
                step: 0,
                order: Vec::new(),
            })
        })
        .collect()
}

/// Trains the workers at `place` over `backend` for `args.epochs` epochs; the leading
/// process prints one line per epoch.
fn train<B: Backend>(
    wine: &Wine,
    args: &Args,
    place: Place,
    backend: B,
) -> Result<Outcome, Box<dyn Error>> {
    let steps = wine.train.rows() / args.batch;
    let mut g = TrainStep::launch(make_workers(wine, args, place)?, backend)?;
    if g.ranks("workers") != Some(place.first..place.first + place.here) {
        return Err("every process must be given the same --workers".into());
    }
    let done = match &args.resume {
        Some(dir) => resume(&mut g, dir, place, steps)?,
        None => 0,
    };
    if done >= args.epochs {
        return Err(format!(
            "the checkpoint has done {done} epochs: nothing is left of --epochs {}",
            args.epochs
        )
        .into());
    }
    let say = place.leads();
    if say {
        println!("epoch  train loss  held-out accuracy  time per step");
    }
    let (mut accuracy, mut total) = (0.0, Duration::ZERO);
    for epoch in done + 1..=args.epochs {
        let (mut loss, mut elapsed) = (0.0, Duration::ZERO);
        let (mut correct, mut scored) = (0, 0);
        for step in 0..steps {
            let start = Instant::now();
            let reports: Vec<Report> = g.execute(step + 1 == steps)?;
            elapsed += start.elapsed();
            loss += f64::from(reports[0].loss);
            correct += reports.iter().map(|r| r.correct).sum::<usize>();
            scored += reports.iter().map(|r| r.scored).sum::<usize>();
        }
        total += elapsed;
        let [correct, scored] = processes::sum(place, [correct, scored]);
        accuracy = correct as f64 / scored as f64;
        if let Some(dir) = &args.checkpoint {
            checkpoint(&mut g, dir)?;
        }
        if !say {
            continue;
        }
        println!(
            "{epoch:>5}  {:>10.4}  {:>16.1}%  {:>10.1} µs",
            loss / steps as f64,
            100.0 * accuracy,
            elapsed.as_secs_f64() * 1e6 / steps as f64
        );
    }
    if say {
        println!(
            "mean time per step: {:.1} µs over {} steps (execute only)",
            total.as_secs_f64() * 1e6 / (steps * (args.epochs - done)) as f64,
            steps * (args.epochs - done)
        );
    }
    let workers = g.teardown()?;
    let bits = |w: &Worker| -> candle_core::Result<Vec<u32>> {
        let mut bits = Vec::new();
        for p in &w.params {
            let values = p.as_tensor().flatten_all()?.to_vec1::<f32>()?;
            bits.extend(values.iter().map(|v| v.to_bits()));
        }
        Ok(bits)
    };
    let first = bits(&workers[0])?;
    if say {
        // What a resumed run and a run that never stopped compare, beside their curves.
        println!("final parameters: FNV-1a {:016x}", fnv1a(&first));
    }
    let mut diverged = Vec::new();
    for w in &workers[1..] {
        if bits(w)? != first {
            diverged.push(w.rank);
        }
    }
    // Other processes' replicas, by a hash of their first worker's parameters.
    let odd = processes::differing(place, fnv1a(&first));
    let identical = diverged.is_empty() && odd.is_empty();
    let n = place.size;
    if n == 1 {
        // One replica: nothing to compare.
    } else if identical {
        if say {
            println!("OK: all {n} workers hold bitwise-identical parameters");
        }
    } else if !diverged.is_empty() {
        eprintln!(
            "FAIL: the parameters of ranks {diverged:?} differ from rank {}'s",
            place.first
        );
    } else if say {
        eprintln!("FAIL: the parameters of processes {odd:?} differ from process 0's");
    }
    Ok(Outcome {
        accuracy,
        identical,
        per_step: total / (steps * (args.epochs - done)).max(1) as u32,
    })
}

/// FNV-1a over `words`: equal parameters give equal hashes, which processes compare.
fn fnv1a(words: &[u32]) -> u64 {
    words
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// What the processes of an `mpirun` job tell each other outside the graph: the held-out
/// scores and the replicas' hashes. One process has no one to ask.
#[cfg(feature = "mpi")]
mod processes {
    use super::Place;
    use actorgraph::mpi::rsmpi::collective::SystemOperation;
    use actorgraph::mpi::rsmpi::topology::SimpleCommunicator;
    use actorgraph::mpi::rsmpi::traits::*;

    /// Where `workers` workers of this process sit among every process's.
    pub fn place(mpi: &actorgraph::mpi::Mpi, workers: usize) -> Place {
        Place {
            process: mpi.process(),
            processes: mpi.processes(),
            first: mpi.process() * workers,
            here: workers,
            size: mpi.processes() * workers,
        }
    }

    /// `values` summed over every process.
    pub fn sum(place: Place, values: [usize; 2]) -> [usize; 2] {
        if place.processes == 1 {
            return values;
        }
        let mine = values.map(|v| v as u64);
        let mut all = [0u64; 2];
        SimpleCommunicator::world().all_reduce_into(
            &mine[..],
            &mut all[..],
            SystemOperation::sum(),
        );
        all.map(|v| v as usize)
    }

    /// The least of every process's `value`.
    pub fn least(place: Place, value: usize) -> usize {
        if place.processes == 1 {
            return value;
        }
        let mut least = 0u64;
        SimpleCommunicator::world().all_reduce_into(
            &(value as u64),
            &mut least,
            SystemOperation::min(),
        );
        least as usize
    }

    /// The processes whose `hash` differs from process 0's.
    pub fn differing(place: Place, hash: u64) -> Vec<usize> {
        if place.processes == 1 {
            return Vec::new();
        }
        let mut all = vec![0u64; place.processes];
        SimpleCommunicator::world().all_gather_into(&hash, &mut all[..]);
        (1..place.processes).filter(|&p| all[p] != all[0]).collect()
    }
}

#[cfg(not(feature = "mpi"))]
mod processes {
    use super::Place;

    pub fn sum(_: Place, values: [usize; 2]) -> [usize; 2] {
        values
    }

    pub fn differing(_: Place, _: u64) -> Vec<usize> {
        Vec::new()
    }

    pub fn least(_: Place, value: usize) -> usize {
        value
    }
}

fn run(args: &Args) -> Result<bool, Box<dyn Error>> {
    #[cfg(feature = "mpi")]
    let mpi = actorgraph::mpi::Mpi::init()?;
    #[cfg(feature = "mpi")]
    let place = processes::place(&mpi, args.workers);
    #[cfg(not(feature = "mpi"))]
    let place = Place::alone(args.workers);
    if args.batch % place.size != 0 {
        return Err(format!(
            "--batch {} does not split evenly over the {} workers of {} process(es)",
            args.batch, place.size, place.processes
        )
        .into());
    }
    let wine = load()?;
    let sizes = init_params(&[wine.features, HIDDEN, HIDDEN, wine.classes])?;
    let elems: usize = sizes.iter().map(|p| p.elem_count()).sum();
    let say = place.leads();
    if say {
        print_setup(&wine, args, place, sizes.len(), elems);
    }
    #[cfg(feature = "mpi")]
    let main = if place.processes > 1 {
        train(&wine, args, place, &mpi)?
    } else {
        train(&wine, args, place, Cpu)?
    };
    #[cfg(not(feature = "mpi"))]
    let main = train(&wine, args, place, Cpu)?;
    let mut ok = main.identical;
    if say && args.baseline && place.size > 1 {
        println!("\nbaseline: 1 worker over the same batches:");
        let base = train(&wine, &args.without_checkpoints(), Place::alone(1), Cpu)?;
        let (a, b) = (100.0 * main.accuracy, 100.0 * base.accuracy);
        let tolerance = 100.0 * ACCURACY_TOLERANCE;
        if main.accuracy >= base.accuracy - ACCURACY_TOLERANCE {
            println!(
                "OK: {} workers reach {a:.1}% held-out accuracy, 1 worker {b:.1}% (tolerance {tolerance:.0} points)",
                place.size
            );
        } else {
            eprintln!(
                "FAIL: {} workers reach {a:.1}% held-out accuracy, more than {tolerance:.0} points below 1 worker's {b:.1}%",
                place.size
            );
            ok = false;
        }
        print_speed(args, place, &main, &base);
    }
    Ok(ok)
}

/// The N workers' time per step beside 1 worker's, and why N can be slower: a worker's
/// shard of a step is `batch / N` rows, and when that is little work, N threads sharing
/// the cores and one allreduce cost more than the shard saves.
fn print_speed(args: &Args, place: Place, main: &Outcome, base: &Outcome) {
    let (n, many, one) = (place.size, main.per_step, base.per_step);
    let speedup = one.as_secs_f64() / many.as_secs_f64();
    println!(
        "\n{n} workers: {:.1} µs per step, 1 worker: {:.1} µs per step ({speedup:.2}x)",
        many.as_secs_f64() * 1e6,
        one.as_secs_f64() * 1e6
    );
    if speedup < 1.0 {
        let cores = actorgraph::threads::cores();
        println!(
            "{n} workers are slower here: each step gives each of them {} rows, little work \
             beside the cost of {n} threads sharing {cores} core(s) and of an allreduce. \
             Workers pay off with bigger shards (a larger --batch) and a core each (see \
             \"Threads and cores\" in the README).",
            args.batch / n
        );
    }
}

fn print_setup(wine: &Wine, args: &Args, place: Place, tensors: usize, elems: usize) {
    println!(
        "wine quality (linfa-datasets): {} training and {} held-out wines, {} features, {} classes",
        wine.train.rows(),
        wine.test.rows(),
        wine.features,
        wine.classes
    );
    println!(
        "MLP {}-{HIDDEN}-{HIDDEN}-{}, cross-entropy, AdamW lr {}; global batch {}, {} steps per epoch",
        wine.features,
        wine.classes,
        args.lr,
        args.batch,
        wine.train.rows() / args.batch
    );
    println!(
        "candle on the CPU, {} thread(s) per worker (RAYON_NUM_THREADS)",
        candle_core::utils::get_num_threads()
    );
    let processes = match place.processes {
        1 => String::new(),
        p => format!(" in {p} processes"),
    };
    println!(
        "\n{} workers{processes}, {} rows each per step, one allreduce of {tensors} gradient tensors ({elems} f32) and the loss:",
        place.size,
        args.batch / place.size,
    );
}

fn main() -> ExitCode {
    // The workers are the parallelism: candle's own threads (rayon's pool, shared by every
    // worker) would compete with them for the cores, and a step took 2x longer that way on
    // 2 cores. torchrun sets OMP_NUM_THREADS=1 for the same reason. A launch sets it only
    // from a process with one thread (`actorgraph::threads`), and by the time this one
    // launches, candle's pool or MPI's threads may exist: set here, before any thread
    // exists, as `set_var` requires. One thread, not the cores' share, so that every
    // worker count and process layout computes bit for bit the same.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
    support::main(USAGE, parse_args, run)
}

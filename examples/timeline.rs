//! A timeline of data-parallel training steps, as a Chrome trace (feature `tracing`).
//!
//! Four workers fit a linear model `y = x·W + b`, each on its shard: per step a `forward`
//! (the loss), a `backward` (the gradients of `W` and `b`, as a list), one fused
//! `allreduce([grads, loss], Avg)` and an `apply`. The runtime's spans (one per `execute`,
//! actor step, method call, fused stage and collective) go to
//! [`tracing-chrome`](https://docs.rs/tracing-chrome), which writes them as a Chrome trace:
//! open it in `chrome://tracing` or Perfetto, one row per thread (`actorgraph-workers-0`,
//! ..., and `main`, which runs worker 0's step itself), a bar per method and stage, its
//! fields (group, rank, method, stage, collective, bytes, dtypes) on click.
//! `scripts/timeline-svg.py` draws the same file as an SVG, one row per actor
//! (`docs/timeline.svg`).
//!
//! Each worker holds `--rows` rows (default 2048) but the last, which holds twice that: the
//! trace shows the others waiting for it in the collective, as a straggler shows in
//! `ray timeline`.
//!
//! ```text
//! cargo run --release --features tracing --example timeline -- [--out FILE] [--steps S] [--rows R]
//! python3 scripts/timeline-svg.py FILE docs/timeline.svg
//! ```
//!
//! It checks its own result: the replicas agree bit for bit, the loss fell, and the file
//! written is a trace with every actor's steps, methods and stages in it.

use std::path::PathBuf;
use std::process::ExitCode;

use actorgraph::prelude::*;
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_chrome::{ChromeLayerBuilder, EventOrSpan};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

const WORKERS: usize = 4;
const FEATURES: usize = 64;
const OUTPUTS: usize = 8;

/// One replica: its shard (row-major), its parameters and its last residuals.
struct Worker {
    x: Vec<f32>,
    y: Vec<f32>,
    w: Vec<f32>,
    b: Vec<f32>,
    residuals: Vec<f32>,
}

#[actor]
impl Worker {
    /// The loss `1/(2m) Σ ||x_i·W + b - y_i||²` on this shard; keeps the residuals.
    fn forward(&mut self) -> Tensor<f32> {
        self.residuals.clear();
        for (x, y) in self.x.chunks(FEATURES).zip(self.y.chunks(OUTPUTS)) {
            for (k, y) in y.iter().enumerate() {
                let p: f32 = (0..FEATURES).map(|j| x[j] * self.w[j * OUTPUTS + k]).sum();
                self.residuals.push(p + self.b[k] - y);
            }
        }
        let m = self.y.len() / OUTPUTS;
        let loss: f32 = self.residuals.iter().map(|r| r * r).sum();
        Tensor::scalar(loss / (2 * m) as f32)
    }

    /// The gradients of `W` and `b`, as one list: one value of the fused stage.
    fn backward(&mut self) -> Vec<Tensor<f32>> {
        let m = (self.y.len() / OUTPUTS) as f32;
        let (mut gw, mut gb) = (vec![0.0; FEATURES * OUTPUTS], vec![0.0; OUTPUTS]);
        for (x, r) in self.x.chunks(FEATURES).zip(self.residuals.chunks(OUTPUTS)) {
            for (k, r) in r.iter().enumerate() {
                gb[k] += r / m;
                for j in 0..FEATURES {
                    gw[j * OUTPUTS + k] += x[j] * r / m;
                }
            }
        }
        let gw = Tensor::from_vec(gw, [FEATURES, OUTPUTS]).expect("shape matches data");
        vec![
            gw,
            Tensor::from_vec(gb, [OUTPUTS]).expect("shape matches data"),
        ]
    }

    /// An SGD step with the averaged gradients; passes the averaged loss on.
    #[allow(clippy::ptr_arg)] // graph methods take each value's own type by reference
    fn apply(&mut self, grads: &Vec<Tensor<f32>>, loss: &Tensor<f32>, lr: f32) -> f32 {
        let params = self.w.iter_mut().chain(self.b.iter_mut());
        let grads = grads[0].as_slice().iter().chain(grads[1].as_slice());
        params.zip(grads).for_each(|(p, g)| *p -= lr * g);
        loss.as_slice()[0]
    }
}

graph! {
    /// One training step: local forward and backward, one fused average, local update.
    Step(workers: [Worker], lr: f32) {
        let loss = workers.forward();
        let grads = workers.backward();
        let (avg_grads, avg_loss) = allreduce([grads, loss], Avg);
        workers.apply(avg_grads, avg_loss, lr)
    }
}

/// SplitMix64, uniform in [-1, 1): the same data on every platform.
fn uniform(state: &mut u64) -> f32 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// The workers, each with `rows` rows but the last, with twice that.
fn make_workers(rows: usize) -> Vec<Worker> {
    let mut seed = 0x5eed;
    let w_true: Vec<f32> = (0..FEATURES * OUTPUTS)
        .map(|_| uniform(&mut seed))
        .collect();
    (0..WORKERS)
        .map(|rank| {
            // The last worker is a straggler: twice the rows.
            let rows = if rank + 1 == WORKERS { 2 * rows } else { rows };
            let x: Vec<f32> = (0..rows * FEATURES).map(|_| uniform(&mut seed)).collect();
            let y = x
                .chunks(FEATURES)
                .flat_map(|x| {
                    (0..OUTPUTS).map(|k| {
                        (0..FEATURES)
                            .map(|j| x[j] * w_true[j * OUTPUTS + k])
                            .sum::<f32>()
                    })
                })
                .collect();
            Worker {
                x,
                y,
                w: vec![0.0; FEATURES * OUTPUTS],
                b: vec![0.0; OUTPUTS],
                residuals: Vec::new(),
            }
        })
        .collect()
}

/// A span's bar label in the trace: the method or the stage, not the span's kind.
struct Label(String);

/// Labels each span (see [`Label`]) from its fields, for `tracing-chrome`'s `name_fn`.
struct Labels;

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Labels {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        struct Pick(Option<String>);
        impl tracing::field::Visit for Pick {
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                if matches!(field.name(), "method" | "stage") {
                    self.0 = Some(value.to_string());
                }
            }
            fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
        }
        let mut pick = Pick(None);
        attrs.record(&mut pick);
        if let (Some(label), Some(span)) = (pick.0, ctx.span(id)) {
            span.extensions_mut().insert(Label(label));
        }
    }
}

fn label<S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync>(
    item: &EventOrSpan<'_, '_, S>,
) -> String {
    match item {
        EventOrSpan::Span(span) => span
            .extensions()
            .get::<Label>()
            .map_or_else(|| span.name().to_string(), |l| l.0.clone()),
        EventOrSpan::Event(event) => event.metadata().name().to_string(),
    }
}

/// Trains for `steps` steps with the Chrome trace going to `out`; whether the replicas
/// agree and the loss fell.
fn train(out: &PathBuf, steps: usize, rows: usize) -> Result<bool, Box<dyn std::error::Error>> {
    let (chrome, flush) = ChromeLayerBuilder::new()
        .file(out)
        .include_args(true)
        .name_fn(Box::new(label))
        .build();
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(Labels).with(chrome),
    )?;

    let mut g = Step::launch(make_workers(rows), Cpu)?;
    let mut losses = Vec::new();
    for step in 0..steps {
        let out: Vec<f32> = g.execute(0.1)?;
        println!("step {step}: loss {:.4e}", out[0]);
        losses.push(out[0]);
    }
    let workers = g.teardown()?;
    // Every span is closed: write the file.
    drop(flush);

    let bits = |w: &Worker| {
        w.w.iter()
            .chain(&w.b)
            .map(|v| v.to_bits())
            .collect::<Vec<_>>()
    };
    let agree = workers.iter().all(|w| bits(w) == bits(&workers[0]));
    let fell = losses.last() < losses.first();
    println!("replicas bitwise identical: {agree}; loss fell: {fell}");
    Ok(agree && fell)
}

/// Checks that `file` is a Chrome trace with every worker's thread named and, for each,
/// `steps` steps, with their methods and stages.
fn check_trace(file: &PathBuf, steps: usize) -> Result<(), String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let events: Vec<serde_json::Value> = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a JSON trace: {e}", file.display()))?;
    // tracing-chrome writes every field with its `Debug`: the rank as a string.
    let begun = |name: &str, rank: usize| {
        let rank = rank.to_string();
        events
            .iter()
            .filter(|e| e["ph"] == "B" && e["name"] == name && e["args"]["rank"] == rank.as_str())
            .count()
    };
    for rank in 0..WORKERS {
        for name in ["step", "forward", "backward", "apply"] {
            let n = begun(name, rank);
            if n != steps {
                return Err(format!("{n} `{name}` spans of rank {rank}, not {steps}"));
            }
        }
        if begun("allreduce([grads, loss], Avg)", rank) != steps {
            return Err(format!("rank {rank}: not one fused stage per step"));
        }
        if rank > 0 {
            let thread = format!("actorgraph-workers-{rank}");
            if !events
                .iter()
                .any(|e| e["ph"] == "M" && e["args"]["name"] == thread.as_str())
            {
                return Err(format!("no thread named `{thread}`"));
            }
        }
    }
    let executes = events
        .iter()
        .filter(|e| e["ph"] == "B" && e["name"] == "execute")
        .count();
    if executes != steps {
        return Err(format!("{executes} `execute` spans, not {steps}"));
    }
    Ok(())
}

fn main() -> ExitCode {
    let (mut out, mut steps, mut rows) = (PathBuf::from("target/timeline.json"), 5, 2048);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match (flag.as_str(), args.next()) {
            ("--out", Some(v)) => out = v.into(),
            ("--steps", Some(v)) if v.parse::<usize>().is_ok_and(|n| (1..=1000).contains(&n)) => {
                steps = v.parse().expect("checked")
            }
            ("--rows", Some(v)) if v.parse::<usize>().is_ok_and(|n| (1..=1 << 20).contains(&n)) => {
                rows = v.parse().expect("checked")
            }
            _ => {
                eprintln!("usage: timeline [--out FILE] [--steps 1..=1000] [--rows 1..=1048576]");
                return ExitCode::from(2);
            }
        }
    }
    match train(&out, steps, rows) {
        Ok(true) => {}
        Ok(false) => return ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    match check_trace(&out, steps) {
        Ok(()) => {
            println!(
                "wrote {} (open it in chrome://tracing or Perfetto)",
                out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("FAIL: {e}");
            ExitCode::FAILURE
        }
    }
}

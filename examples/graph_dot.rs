//! Writes a graph's picture as Graphviz DOT: to stdout, or to the file given as argument.
//!
//! ```text
//! cargo run --example graph_dot | dot -Tsvg > graph.svg
//! cargo run --example graph_dot -- graph.dot
//! ```
//!
//! The graph is a small two-stage pipeline: encoders compute features and average them
//! with one fused allreduce; each head reads its own encoder's features (actor i to actor
//! i), computes a loss, and the heads sum their losses; head 0 writes a summary that goes
//! to encoder 0 alone. It also runs once, on 2 + 2 CPU actors, and says what it got on
//! stderr.

use std::process::ExitCode;

use actorgraph::prelude::*;

struct Encoder {
    rank: usize,
    log: Vec<String>,
}

#[actor]
impl Encoder {
    fn embed(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        let k = (self.rank + 1) as f32;
        Tensor::from_vec(x.as_slice().iter().map(|v| v * k).collect(), x.shape())
            .unwrap_or_else(|_| x.clone())
    }

    fn norm(&mut self, x: &Tensor<f32>) -> f32 {
        x.as_slice().iter().map(|v| v * v).sum::<f32>().sqrt()
    }

    // A graph passes its values by reference as they are: a `String` value is a `&String`.
    #[allow(clippy::ptr_arg)]
    fn record(&mut self, summary: &String) -> usize {
        self.log.push(summary.clone());
        self.log.len()
    }
}

struct Head {
    rank: usize,
}

#[actor]
impl Head {
    fn predict(&mut self, features: &Tensor<f32>, norm: &f32) -> Tensor<f32> {
        let v = features.as_slice().iter().map(|f| f / norm).collect();
        Tensor::from_vec(v, features.shape()).unwrap_or_else(|_| features.clone())
    }

    fn loss(&mut self, prediction: &Tensor<f32>) -> f32 {
        prediction.as_slice().iter().sum::<f32>() * (self.rank + 1) as f32
    }

    fn summary(&mut self, total: &f32) -> String {
        format!("total loss {total:.3}")
    }
}

graph! {
    /// Encoders share features, heads predict from their own encoder's, head 0 reports to
    /// encoder 0.
    pub Pipeline(encoders: [Encoder], heads: [Head], x: Tensor<f32>) {
        let e = encoders.embed(x);
        let n = encoders.norm(x);
        let (features, mean_norm) = allreduce([e, n], Avg);
        let p = heads.predict(features, mean_norm);
        let l = heads.loss(p);
        let total = allreduce(l);
        let summary = heads[0].summary(total);
        let logged = encoders[0].record(summary);
        (p, logged)
    }
}

fn main() -> ExitCode {
    let dot = Pipeline::to_dot();
    match std::env::args().nth(1) {
        Some(path) => {
            if let Err(e) = std::fs::write(&path, &dot) {
                eprintln!("cannot write {path}: {e}");
                return ExitCode::FAILURE;
            }
            eprintln!("wrote {path}");
        }
        None => print!("{dot}"),
    }
    match run() {
        Ok(line) => {
            eprintln!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the pipeline once on 2 encoders and 2 heads.
fn run() -> Result<String, Error> {
    let encoders: Vec<_> = (0..2)
        .map(|rank| Encoder {
            rank,
            log: Vec::new(),
        })
        .collect();
    let heads: Vec<_> = (0..2).map(|rank| Head { rank }).collect();
    let mut g = Pipeline::launch(encoders, heads, Cpu)?;
    let out = g.execute(Tensor::from_slice(&[3.0, 4.0]))?;
    let (encoders, _heads) = g.teardown()?;
    Ok(format!(
        "ran once: head 1 predicted {:?}; encoder 0 logged {:?}",
        out[1].0.to_vec(),
        encoders[0].log
    ))
}

//! A two-stage pipeline with 4 micro-batches in flight: stage one (2 actors) embeds each
//! micro-batch and averages the embeddings with one fused allreduce; stage two (2 actors)
//! reads its own stage-one actor's features and scores them. `submit` hands a micro-batch
//! to the actors and returns at once, so stage one works on micro-batch k + 1 while stage
//! two scores micro-batch k; `wait` collects the results in any order.
//!
//! ```text
//! cargo run --release --example pipeline -- [--micro-batches M]
//! ```

use std::process::ExitCode;

use actorgraph::prelude::*;

const IN_FLIGHT: usize = 4;

struct Embed {
    scale: f32,
}

#[actor]
impl Embed {
    fn embed(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        let v = x
            .as_slice()
            .iter()
            .map(|v| (v * self.scale).tanh())
            .collect();
        Tensor::from_vec(v, x.shape()).unwrap_or_else(|_| x.clone())
    }
}

struct Score {
    seen: usize,
}

#[actor]
impl Score {
    fn score(&mut self, features: &Tensor<f32>) -> (f32, usize) {
        self.seen += 1;
        (features.as_slice().iter().sum(), self.seen)
    }
}

graph! {
    /// Stage one averages its embeddings; stage two scores them, actor i reading actor i.
    Pipe(embed: [Embed], score: [Score], x: Tensor<f32>) {
        let e = embed.embed(x);
        let features = allreduce(e, Avg);
        score.score(features)
    }
}

fn run() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let micro_batches = args
        .iter()
        .position(|a| a == "--micro-batches")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(16usize);
    let embed = vec![Embed { scale: 0.5 }, Embed { scale: 1.5 }];
    let score = vec![Score { seen: 0 }, Score { seen: 0 }];
    let options = LaunchOptions::default().max_in_flight(IN_FLIGHT);
    let mut g = Pipe::launch_with(embed, score, Cpu, options)?;
    let micro = |k: usize| Tensor::full([4], k as f32 / micro_batches as f32);

    // Fill the pipeline, then keep it full: wait for the oldest, submit the next.
    let mut tickets = std::collections::VecDeque::new();
    let mut scores = Vec::with_capacity(micro_batches);
    for k in 0..micro_batches {
        if tickets.len() == IN_FLIGHT {
            let (j, ticket) = tickets.pop_front().expect("a ticket in flight");
            scores.push((j, g.wait(ticket)?));
        }
        tickets.push_back((k, g.submit(micro(k))?));
        assert!(g.in_flight() <= IN_FLIGHT);
    }
    while let Some((j, ticket)) = tickets.pop_front() {
        scores.push((j, g.wait(ticket)?));
    }
    for (k, out) in &scores {
        // Both scorers read the same averaged features, and saw the micro-batches in order.
        assert_eq!(out[0].0, out[1].0);
        assert_eq!(out[0].1, k + 1);
        println!("micro-batch {k:2}: score {:.4}", out[0].0);
    }
    let (_, score) = g.teardown()?;
    println!(
        "{micro_batches} micro-batches, {IN_FLIGHT} in flight; each scorer saw {}",
        score[0].seen
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pipeline: {e}");
            ExitCode::FAILURE
        }
    }
}

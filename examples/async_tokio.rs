//! Drives a graph from async code: a tokio task runs a few training steps with
//! `execute_async` while another task on the same runtime keeps working, since awaiting an
//! execution neither blocks nor spins the executor's thread.
//!
//! ```text
//! cargo run --example async_tokio
//! ```

use std::cell::Cell;
use std::process::ExitCode;
use std::time::Duration;

use actorgraph::prelude::*;

struct Worker {
    rank: usize,
    weight: f32,
}

#[actor]
impl Worker {
    /// A stand-in for a forward and backward pass: a gradient that depends on the rank.
    fn grad(&mut self, lr: &f32) -> Tensor<f32> {
        std::thread::sleep(Duration::from_millis(20));
        Tensor::full([4], (self.rank + 1) as f32 * self.weight * lr)
    }

    fn loss(&mut self) -> f32 {
        self.weight * self.weight
    }

    fn update(&mut self, g: &Tensor<f32>) -> f32 {
        self.weight -= g.as_slice().iter().sum::<f32>() / 100.0;
        self.weight
    }
}

graph! {
    /// One data-parallel step: gradients averaged by one fused allreduce, then applied.
    pub TrainStep(workers: [Worker], lr: f32) {
        let g = workers.grad(lr);
        let l = workers.loss();
        let (avg, total) = allreduce([g, l], Avg);
        let w = workers.update(avg);
        (w, total)
    }
}

async fn train(mut g: TrainStep, steps: usize) -> Result<TrainStep, Error> {
    for step in 0..steps {
        let out = g.execute_async(0.5).await?;
        let (weight, loss) = out[0];
        println!("step {step}: weight {weight:.4}, mean loss {loss:.4}");
    }
    Ok(g)
}

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    let workers: Vec<_> = (0..4).map(|rank| Worker { rank, weight: 1.0 }).collect();
    let g = match TrainStep::launch(workers, Cpu) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("launch failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let done = Cell::new(false);
        let training = async {
            let trained = train(g, 5).await;
            done.set(true);
            trained
        };
        let heartbeat = async {
            let mut beats = 0u64;
            while !done.get() {
                beats += 1;
                tokio::task::yield_now().await;
            }
            beats
        };
        let (trained, beats) = tokio::join!(training, heartbeat);
        println!("another task ran {beats} times on the same thread while the actors worked");
        trained
    });
    match result.and_then(TrainStep::teardown) {
        Ok(workers) => {
            println!(
                "final weights: {:?}",
                workers.iter().map(|w| w.weight).collect::<Vec<_>>()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("training failed: {e}");
            ExitCode::FAILURE
        }
    }
}

//! Your own type through a fused collective: `Grads` (a weight gradient and a bias
//! gradient) implements `Bucketable`, so `allreduce` packs it into the stage's flat buffer
//! with the other values of the bucket and hands back a `Grads` built from the reduced
//! elements. One collective per step moves the `Grads` and a plain `f32` loss together.
//!
//! ```text
//! cargo run --example custom_bucketable
//! ```

use std::process::ExitCode;

use actorgraph::prelude::*;
use actorgraph::Reduced;

/// The gradients of a linear layer: `w` (any length) and `b`.
#[derive(Clone, Debug, PartialEq)]
struct Grads {
    w: Vec<f32>,
    b: f32,
}

impl Bucketable for Grads {
    type Elem = f32;

    fn bucket_len(&self) -> usize {
        self.w.len() + 1
    }

    fn pack(&self, dst: &mut [f32]) {
        let (w, b) = dst.split_at_mut(self.w.len());
        w.copy_from_slice(&self.w);
        b[0] = self.b;
    }

    fn unpack(&self, reduced: Reduced<'_, f32>) -> Self {
        let s = reduced.as_slice();
        let (w, b) = s.split_at(self.w.len());
        Grads {
            w: w.to_vec(),
            b: b[0],
        }
    }
}

struct Worker;

#[actor]
impl Worker {
    fn backward(&mut self) -> (Grads, f32) {
        let rank = Ctx::current().expect("on an actor thread").rank() as f32;
        let grads = Grads {
            w: vec![rank, 2.0 * rank, 1.0],
            b: rank + 0.5,
        };
        (grads, rank * rank)
    }
}

graph! {
    /// The gradients and the loss of every worker, averaged by one fused stage.
    Step(workers: [Worker]) {
        let (grads, loss) = workers.backward();
        allreduce([grads, loss], Avg)
    }
}

fn run() -> Result<(), Error> {
    let mut g = Step::launch(vec![Worker, Worker, Worker, Worker], Cpu)?;
    let out = g.execute()?;
    let (grads, loss) = &out[0];
    // Ranks 0..4: mean rank 1.5, mean rank^2 3.5.
    assert_eq!(
        *grads,
        Grads {
            w: vec![1.5, 3.0, 1.0],
            b: 2.0
        }
    );
    assert_eq!(*loss, 3.5);
    assert!(out.iter().all(|o| o == &out[0]), "every rank gets the same");
    println!("averaged {grads:?} and loss {loss} in one collective");
    g.teardown()?;
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("custom_bucketable: {e}");
            ExitCode::FAILURE
        }
    }
}

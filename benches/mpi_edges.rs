//! An edge between processes against OpenMPI's own `MPI_Send`/`MPI_Recv` (through
//! rsmpi), same processes, same bytes, side by side in one run: run under `mpirun -np 2`
//! by `scripts/vs-mpi-edges.sh`.
//!
//! Both contenders make a round trip: process 0's actor sends a tensor to process 1's,
//! which sends it back (`MPI_Send` then `MPI_Recv` on process 0, `MPI_Recv` then
//! `MPI_Send` on process 1, of the tensor's bytes). One `execute` of the graph is one
//! round trip, so its time includes what an execute costs besides the edges.
//!
//! Not a criterion benchmark, for the reason `benches/mpi_procs.rs` gives: every process
//! runs the same fixed counts, `SAMPLES` samples of `iters(bytes)` round trips each, every
//! sample started after an `MPI_Barrier`. Process 0 prints, per size, the min / median /
//! max over the samples of the time per round trip.

use std::time::Duration;

use actorgraph::mpi::rsmpi::topology::SimpleCommunicator;
use actorgraph::mpi::rsmpi::traits::*;
use actorgraph::mpi::Mpi;
use actorgraph::prelude::*;

#[path = "support/mpi_samples.rs"]
mod mpi_samples;

use mpi_samples::*;

struct Worker {
    data: Tensor<f32>,
}

#[actor]
impl Worker {
    fn make(&mut self) -> Tensor<f32> {
        self.data.clone()
    }
    fn echo(&mut self, t: Tensor<f32>) -> Tensor<f32> {
        t
    }
    fn take(&mut self, t: &Tensor<f32>) -> usize {
        t.len()
    }
}

graph! {
    RoundTrip(workers: [Worker]) {
        let there = workers[0].make();
        let back = workers[1].echo(there);
        workers[0].take(back)
    }
}

/// Round trips per sample: about 16 MiB of payload each way, at least 20, at most 5000.
fn iters(bytes: usize) -> usize {
    ((16 << 20) / bytes).clamp(20, 5000)
}

fn main() -> Result<(), actorgraph::Error> {
    // `cargo bench` passes `--bench`; nothing else is read.
    let mpi = Mpi::init()?;
    let world = SimpleCommunicator::world();
    let me = mpi.process();
    assert_eq!(mpi.processes(), 2, "run under `mpirun -np 2`");
    let peer = world.process_at_rank(1 - me as i32);
    if me == 0 {
        println!("2 processes x 1 actor; {SAMPLES} samples per row, each the mean of a fixed number of round trips");
        println!();
        println!("| f32 tensor, bytes | MPI_Send + MPI_Recv round trip min / median / max | actorgraph edge round trip min / median / max | actorgraph / MPI (medians) | actorgraph - MPI (medians) |");
        println!("| --- | --- | --- | --- | --- |");
    }
    for bytes in sizes(&[4, 1 << 10, 64 << 10, 1 << 20, 16 << 20]) {
        let elems = bytes / 4;
        let n = iters(bytes);
        let mut buf = vec![1.0f32 + me as f32; elems];
        let bare = samples(&world, n, || {
            if me == 0 {
                peer.send(&buf[..]);
                peer.receive_into(&mut buf[..]);
            } else {
                peer.receive_into(&mut buf[..]);
                peer.send(&buf[..]);
            }
        });
        let mut g = RoundTrip::launch(
            vec![Worker {
                data: Tensor::full([elems], 1.0),
            }],
            &mpi,
        )?;
        let edge = samples(&world, n, || {
            std::hint::black_box(g.execute().expect("execute"));
        });
        drop(g);
        if me == 0 {
            let (mpi, ag) = (stats(bare), stats(edge));
            let three = |s: [Duration; 3]| s.map(fmt).join(" / ");
            let ratio = ag[1].as_secs_f64() / mpi[1].as_secs_f64();
            let extra = (ag[1].as_secs_f64() - mpi[1].as_secs_f64()) * 1e6;
            let size = match bytes {
                b if b >= 1 << 20 => format!("{} MiB", b >> 20),
                b if b >= 1 << 10 => format!("{} KiB", b >> 10),
                b => format!("{b} B"),
            };
            println!(
                "| {size} | {} | {} | {ratio:.2}x | {extra:+.1} µs |",
                three(mpi),
                three(ag)
            );
        }
    }
    Ok(())
}

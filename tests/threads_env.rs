//! A launch from a process with one thread sets the compute libraries' thread variables
//! to each actor's share of the cores, as `torchrun` sets `OMP_NUM_THREADS`, and keeps
//! those the user set. A test of its own, without libtest's harness, because the harness
//! runs tests on threads of their own, and a launch sets nothing then.

use actorgraph::prelude::*;
use actorgraph::threads;

struct Worker;

#[actor]
impl Worker {
    fn rayon_threads(&mut self) -> Option<String> {
        std::env::var("RAYON_NUM_THREADS").ok()
    }
}

graph! {
    G(workers: [Worker]) {
        workers.rayon_threads()
    }
}

fn main() -> Result<(), Error> {
    // The user's choice for one library, made before any thread exists; none for others.
    std::env::set_var("MKL_NUM_THREADS", "7");
    for var in [
        "RAYON_NUM_THREADS",
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
    ] {
        std::env::remove_var(var);
    }
    let mut g = G::launch(vec![Worker, Worker, Worker], Cpu)?;
    let share = threads::per_actor(3).to_string();
    for var in [
        "RAYON_NUM_THREADS",
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
    ] {
        assert_eq!(std::env::var(var).as_deref(), Ok(share.as_str()), "{var}");
    }
    assert_eq!(std::env::var("MKL_NUM_THREADS").as_deref(), Ok("7"));
    // The actors' methods see it: the variables were set before their threads started.
    assert_eq!(g.execute()?, vec![Some(share); 3]);
    g.teardown()?;
    println!("threads_env: ok");
    Ok(())
}

//! The threads each actor's compute may use, and the cores the actors' threads run on.
//!
//! A graph's actors are its parallelism: one thread each. A library that also spreads each
//! call over every core (rayon's global pool, candle's, OpenMP, a BLAS) then runs its
//! threads beside the actors' on the same cores, and the two take turns: more threads than
//! cores make every step wait for the slowest of them. `torchrun` answers this by setting
//! `OMP_NUM_THREADS` before it starts a worker; a launch does the same with the cores of
//! the process divided among its actors, through the variables those libraries read.
//!
//! Setting an environment variable is only sound while no other thread may read the
//! environment: C's `getenv` takes no lock, and a library may call it on any thread. A
//! launch therefore sets them only when the process has one thread (its caller's), which
//! no other thread can change between the check and the write: a program's first launch
//! from `main`, before it starts threads of its own. Otherwise the user's settings (the
//! shell's, or `main`'s before its first thread) are what the libraries read.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The environment variables by which the usual compute libraries size their thread
/// pools: rayon (and candle, which reads rayon's), OpenMP, OpenBLAS and MKL.
pub const THREAD_VARS: [&str; 4] = [
    "RAYON_NUM_THREADS",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
];

/// The cores this process may run on: its CPU affinity (which `mpirun` narrows to the
/// cores it binds the process to) within its cgroup's quota, at least 1.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The threads each of `actors` actors' compute may use when the process has [`cores`]
/// cores: the cores divided evenly among the actors, at least 1 (so more actors than
/// cores get 1 each, the actors being the parallelism).
pub fn per_actor(actors: usize) -> usize {
    (cores() / actors.max(1)).max(1)
}

/// Sets each of [`THREAD_VARS`] that is not set to `threads`, if the calling thread is the
/// process's only one; the names it set, in [`THREAD_VARS`]' order.
pub(crate) fn set_library_threads(threads: usize) -> Vec<&'static str> {
    if !single_threaded() {
        return Vec::new();
    }
    let value = threads.to_string();
    THREAD_VARS
        .into_iter()
        .filter(|var| std::env::var_os(var).is_none())
        .inspect(|var| std::env::set_var(var, &value))
        .collect()
}

/// Whether the process has exactly one thread. Only Linux says so cheaply
/// (`/proc/self/task` lists the threads); elsewhere the answer is no, and nothing is set.
/// Miri, which isolates the program from the file system, is elsewhere too.
fn single_threaded() -> bool {
    !cfg!(miri) && std::fs::read_dir("/proc/self/task").is_ok_and(|tasks| tasks.count() == 1)
}

/// The next block of cores to pin an actor thread to, counted over the process's life so
/// that the actors of several groups, and of later graphs, spread over the cores in turn.
static NEXT_BLOCK: AtomicUsize = AtomicUsize::new(0);

/// Pins the calling thread to the next `threads` cores of the calling thread's own CPU
/// set, in turn (wrapping around when the actors outnumber the cores); `false` where
/// nothing was pinned: outside Linux, or when the system refused.
pub(crate) fn pin_current(threads: usize) -> bool {
    let block = NEXT_BLOCK.fetch_add(1, Ordering::Relaxed);
    pin_block(block, threads.max(1))
}

#[cfg(target_os = "linux")]
fn pin_block(block: usize, threads: usize) -> bool {
    use std::mem::{size_of, zeroed};
    // SAFETY: `cpu_set_t` is a plain bit array, for which all zeros is the empty set;
    // `sched_getaffinity` and `sched_setaffinity` read or write exactly `size_of` bytes of
    // the set we own on this stack, and `CPU_ISSET`/`CPU_SET` index it below
    // `CPU_SETSIZE`, the set's size in bits (`allowed` holds only such indices).
    unsafe {
        let mut mine: libc::cpu_set_t = zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut mine) != 0 {
            return false;
        }
        let setsize = libc::CPU_SETSIZE as usize;
        let allowed: Vec<usize> = (0..setsize)
            .filter(|&c| libc::CPU_ISSET(c, &mine))
            .collect();
        if allowed.is_empty() {
            return false;
        }
        let mut pinned: libc::cpu_set_t = zeroed();
        for k in 0..threads.min(allowed.len()) {
            libc::CPU_SET(allowed[(block * threads + k) % allowed.len()], &mut pinned);
        }
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &pinned) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn pin_block(_block: usize, _threads: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cores_are_shared_out_and_every_actor_gets_one() {
        let cores = cores();
        assert_eq!(per_actor(1), cores);
        assert_eq!(per_actor(0), cores);
        assert_eq!(per_actor(cores), 1);
        assert_eq!(per_actor(cores * 4), 1);
        if cores >= 2 {
            assert_eq!(per_actor(2), cores / 2);
        }
    }

    #[test]
    fn a_test_harness_has_several_threads_so_nothing_is_set() {
        // libtest runs each test on a thread of its own beside its main thread.
        assert!(!single_threaded());
        assert!(set_library_threads(1).is_empty());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_pinned_thread_runs_on_its_block_of_cores() {
        let before = cores();
        let pinned = std::thread::spawn(|| (pin_current(1), cores()))
            .join()
            .expect("the thread runs");
        assert_eq!(pinned, (true, 1));
        // The pin is the pinned thread's alone.
        assert_eq!(cores(), before);
    }
}

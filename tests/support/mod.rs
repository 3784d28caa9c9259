//! What several integration tests share: a watchdog for tests that could hang, a backend
//! that counts what its communicators do, and an actor that blocks on a chosen rank.
//! (`counting_alloc.rs`, a global allocator, is for the allocation tests' own binary.)

pub mod counting;
pub mod gate;
pub mod lazy;
pub mod nap;
pub mod sleeper;

use std::sync::mpsc;
use std::time::Duration;

/// Runs `f` on a thread and fails the test if it does not finish in `secs` seconds: a
/// deadlock shows up as a failure, not as a hung test run. A panic in `f` is the test's.
pub fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(Ok(v)) => v,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("did not finish within {secs} s: a deadlock?"),
    }
}

//! Blocking an actor on a chosen rank, for the timeout and teardown tests. Also included,
//! alone, by `tests/nccl_gpu.rs`.

/// Blocks the calling actor of rank `rank` if `plan = (who, ms)` names it: for `ms`
/// milliseconds, or until the process ends when `ms` is 0.
pub fn nap(rank: usize, (who, ms): (usize, u64)) {
    if rank != who {
        return;
    }
    if ms == 0 {
        loop {
            std::thread::park();
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(ms));
}

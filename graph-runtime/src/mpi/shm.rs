//! The leaders' first round of a stage through memory their processes share.
//!
//! When every process runs on one machine, each group's leaders exchange their records
//! and small data (see `comm::agree`) through a segment of POSIX shared memory
//! made at launch, not through MPI messages: each leader writes its message into its own
//! mailbox and counts the round in it; the others read the message where it lies. MPI's
//! shared-memory transport copies a message twice or through the kernel (CMA), and matches
//! it to a receive first; here a leader's fold reads the other processes' values in place.
//!
//! Each process has [`BOXES`] mailboxes and uses them in turn, one per round. A leader
//! writes a mailbox again [`BOXES`] rounds later, and only after every other leader has
//! counted the round before, so after each has stopped reading it: one counter a round is
//! the only synchronisation (two mailboxes would do). A leader that gives up a round (an
//! abort) never writes its mailboxes again.

use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Release};

use ::mpi::collective::SystemOperation;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;

use super::wait::Abandoned;

/// A cache line: each counter and each message starts on one of its own.
const LINE: usize = 64;

/// Mailboxes per process, used in turn: 16 of 64 KiB rotate over 1 MiB, as much as a
/// core's L2 cache holds (512 KiB to 2 MiB on current x86). The lines of a mailbox
/// written again have then mostly left the L2 of the cores that read it, so a store into
/// one seldom waits for another core's copy of its line to be invalidated, as most would
/// with two mailboxes. See `BENCHMARKS.md#thresholds`.
const BOXES: usize = 16;

// A mailbox may be written again only after the round that read it: at least two.
const _: () = assert!(BOXES >= 2);

/// Checks of a counter before a waiting leader yields its thread between checks.
const SPINS: u32 = 256;

/// The variable that turns the shared segment off (`0`, `off` or `false` in any process):
/// the leaders then exchange their first round by MPI messages, as between machines.
pub const SHARED_MEMORY_VAR: &str = "ACTORGRAPH_MPI_SHARED_MEMORY";

/// Whether the processes of `world` may meet in shared memory: all on one machine, and no
/// process turned it off. The same answer on every process (one `MPI_Allreduce`).
pub(super) fn usable(world: &SimpleCommunicator) -> bool {
    let one_machine = world.split_shared(0).size() == world.size();
    let off = std::env::var(SHARED_MEMORY_VAR).is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "off" | "false"
        )
    });
    all(world, one_machine && !off)
}

/// Whether `mine` holds on every process of `world`.
fn all(world: &SimpleCommunicator, mine: bool) -> bool {
    let mut every = 0u8;
    world.all_reduce_into(&u8::from(mine), &mut every, SystemOperation::min());
    every == 1
}

/// A group's mailboxes: one segment mapped by every process, each process's two mailboxes
/// in it, and the rounds this process has counted.
pub(crate) struct Mailboxes {
    base: NonNull<u8>,
    len: usize,
    backing: Backing,
    processes: usize,
    process: usize,
    /// The bytes a message may have.
    cap: usize,
    /// The rounds this process has completed.
    round: u64,
    /// A round was given up: this process's mailboxes are never written again.
    broken: bool,
}

// SAFETY: the mapping belongs to this value alone (unmapped by its `Drop`), not to a
// thread; what other processes may do to it is the protocol's to keep safe (the module's
// docs), whichever thread of this process runs it.
unsafe impl Send for Mailboxes {}

impl Mailboxes {
    /// Maps a segment for `world`'s processes, each with mailboxes of `cap` bytes; `None`
    /// on every process if any process failed to (the leaders then use MPI messages). A
    /// collective call: every process of `world` makes it, and only if [`usable`] said so.
    pub(super) fn open(world: &SimpleCommunicator, cap: usize) -> Option<Self> {
        let processes = usize::try_from(world.size()).ok()?;
        let process = usize::try_from(world.rank()).ok()?;
        let cap = cap.div_ceil(LINE) * LINE;
        let len = processes * stride(cap);
        // Process 0 makes the segment and names it to the others, who map it; it unlinks
        // the name once every process has tried, so the memory goes with the last mapping.
        let mut name = [0u8; 64];
        let root = world.process_at_rank(0);
        let mut made = None;
        if process == 0 {
            let n = format!("/actorgraph-{}-{}", std::process::id(), next_segment());
            name[..n.len()].copy_from_slice(n.as_bytes());
            made = os::map(&name, len, true);
            if made.is_none() {
                os::unlink(&name);
                name = [0; 64];
            }
        }
        root.broadcast_into(&mut name[..]);
        if name[0] == 0 {
            return None;
        }
        if process != 0 {
            made = os::map(&name, len, false);
        }
        let every = all(world, made.is_some());
        if process == 0 {
            os::unlink(&name);
        }
        let base = made?;
        let boxes = Self {
            base,
            len,
            backing: Backing::Mapped,
            processes,
            process,
            cap,
            round: 0,
            broken: false,
        };
        // Dropped (unmapped) where another process failed.
        every.then_some(boxes)
    }

    /// This process's mailbox for the next round, `len` bytes of it to fill; `None` if the
    /// message would not fit or a round was given up.
    pub(super) fn outbox(&mut self, len: usize) -> Option<&mut [u8]> {
        if self.broken || len > self.cap {
            return None;
        }
        let at = self.message_at(self.process, self.round);
        // SAFETY: `at..at + len` lies in the mapping (`message_at`, `len <= cap`), which
        // lives as long as `self`. No other process reads this mailbox now: each read it
        // last `BOXES` (at least two) rounds ago, and every one of them has counted a
        // round since (the `exchange` that completed the last round waited for it, and a
        // broken one never comes here), which it does only once its reads are over. The
        // slice borrows `self` mutably, so `inbox` cannot hand out this mailbox meanwhile.
        Some(unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(at), len) })
    }

    /// Counts this round with the `len` bytes written into [`Mailboxes::outbox`] as its
    /// message, then waits until every other process has counted it too, or `stop()` says
    /// to give up (for good: this process's mailboxes are never written again).
    pub(super) fn exchange(
        &mut self,
        len: usize,
        stop: impl Fn() -> bool,
    ) -> Result<(), Abandoned> {
        if self.broken || len > self.cap {
            return Err(Abandoned);
        }
        let target = self.round + 1;
        let slot = self.length_at(self.process, self.round);
        // SAFETY: the length word lies in the mapping, aligned for `u64` (`length_at`), in
        // this process's mailbox for this round, which no other process reads now (as in
        // `outbox`) until the counter below says so.
        unsafe { self.base.as_ptr().add(slot).cast::<u64>().write(len as u64) };
        // Release: the message and its length are visible to whoever sees the count.
        self.counter(self.process).store(target, Release);
        for q in (0..self.processes).filter(|&q| q != self.process) {
            let mut spins = 0u32;
            while self.counter(q).load(Acquire) < target {
                if stop() {
                    self.broken = true;
                    return Err(Abandoned);
                }
                crate::mpi::wait::idle_after(&mut spins, SPINS);
            }
        }
        self.round = target;
        Ok(())
    }

    /// Process `q`'s message in the last round completed (empty before the first, after a
    /// round given up, or for a process beyond the group).
    pub(super) fn inbox(&self, q: usize) -> &[u8] {
        if self.round == 0 || self.broken || q >= self.processes {
            return &[];
        }
        let round = self.round - 1;
        let slot = self.length_at(q, round);
        // SAFETY: the length word lies in the mapping, aligned for `u64`; process `q` wrote
        // it before counting `round`, which `exchange` saw with `Acquire`, and writes that
        // mailbox again only after this process counts the next round (which takes `&mut
        // self`, so not while the slice below lives).
        let len = unsafe { self.base.as_ptr().add(slot).cast::<u64>().read() };
        let len = usize::try_from(len).unwrap_or(usize::MAX).min(self.cap);
        let at = self.message_at(q, round);
        // SAFETY: `at..at + len` lies in the mapping (`len <= cap`); nothing writes it while
        // the slice lives, as for the length word above.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(at), len) }
    }

    /// Process `q`'s counter of rounds.
    fn counter(&self, q: usize) -> &AtomicU64 {
        // SAFETY: `q * stride` is a multiple of `LINE` inside the mapping (`q < processes`,
        // the callers'), so aligned for `AtomicU64` (the mapping is page-aligned); every
        // process touches the counters only atomically, and the mapping lives as long as
        // `self`.
        unsafe {
            &*self
                .base
                .as_ptr()
                .add(q * stride(self.cap))
                .cast::<AtomicU64>()
        }
    }

    /// Where process `q`'s length word for `round` lies: one line per mailbox, then its
    /// message.
    fn length_at(&self, q: usize, round: u64) -> usize {
        // Below `BOXES`, so the cast back to `usize` is exact.
        let mailbox = (round % BOXES as u64) as usize;
        q * stride(self.cap) + LINE + mailbox * (LINE + self.cap)
    }

    fn message_at(&self, q: usize, round: u64) -> usize {
        self.length_at(q, round) + LINE
    }
}

/// What holds a segment's memory.
enum Backing {
    /// A mapping of shared memory, unmapped on drop.
    Mapped,
    /// Memory of this process, for the protocol's tests with threads as the processes.
    #[cfg(test)]
    Heap(#[allow(dead_code)] std::sync::Arc<[AtomicU64]>),
}

/// The bytes of one process's part of the segment: its counter's line, then [`BOXES`]
/// mailboxes (each a line for its length, then `cap` bytes).
fn stride(cap: usize) -> usize {
    LINE + BOXES * (LINE + cap)
}

impl Drop for Mailboxes {
    fn drop(&mut self) {
        if matches!(self.backing, Backing::Mapped) {
            os::unmap(self.base, self.len);
        }
    }
}

/// Segments made by this process, for unique names.
fn next_segment() -> u64 {
    static MADE: AtomicU64 = AtomicU64::new(0);
    MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[cfg(unix)]
mod os {
    use std::ffi::CStr;
    use std::ptr::NonNull;

    /// Maps `len` bytes of the shared memory object `name` (NUL-terminated in its 64
    /// bytes), made (zeroed, only by this process) if `create`; `None` on any failure.
    pub(super) fn map(name: &[u8; 64], len: usize, create: bool) -> Option<NonNull<u8>> {
        let name = CStr::from_bytes_until_nul(name).ok()?;
        let flags = match create {
            true => libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
            false => libc::O_RDWR,
        };
        let size = libc::off_t::try_from(len).ok()?;
        // SAFETY: `name` is a NUL-terminated string that outlives the call.
        let fd = unsafe { libc::shm_open(name.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` is the descriptor just opened; `stat` is plain integers, so zeroes
        // are a valid value for `fstat` to overwrite.
        let sized = unsafe {
            if create {
                libc::ftruncate(fd, size) == 0 && reserve(fd, size)
            } else {
                let mut stat: libc::stat = std::mem::zeroed();
                libc::fstat(fd, &mut stat) == 0 && stat.st_size == size
            }
        };
        // SAFETY: a shared, readable and writable mapping of the whole object, placed by
        // the kernel (no address given, so nothing of ours is replaced); `fd` is closed
        // after it, which leaves the mapping in place.
        let base = unsafe {
            let base = match sized {
                true => libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                ),
                false => libc::MAP_FAILED,
            };
            libc::close(fd);
            base
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        NonNull::new(base.cast())
    }

    /// Gives the object of `fd` its pages now: a full `/dev/shm` (64 MiB in a default
    /// container) is then a failure to map, not a `SIGBUS` at the first write.
    ///
    /// # Safety
    ///
    /// `fd` is an open descriptor.
    #[cfg(target_os = "linux")]
    unsafe fn reserve(fd: libc::c_int, size: libc::off_t) -> bool {
        // SAFETY: the caller's.
        unsafe { libc::posix_fallocate(fd, 0, size) == 0 }
    }

    #[cfg(not(target_os = "linux"))]
    unsafe fn reserve(_: libc::c_int, _: libc::off_t) -> bool {
        true
    }

    /// Removes the name `name` (the memory stays while mapped).
    pub(super) fn unlink(name: &[u8; 64]) {
        if let Ok(name) = CStr::from_bytes_until_nul(name) {
            // SAFETY: `name` is a NUL-terminated string that outlives the call.
            unsafe { libc::shm_unlink(name.as_ptr()) };
        }
    }

    pub(super) fn unmap(base: NonNull<u8>, len: usize) {
        // SAFETY: `base..base + len` is a mapping made by `map` and owned by the caller,
        // which drops every reference into it first.
        unsafe { libc::munmap(base.as_ptr().cast(), len) };
    }
}

#[cfg(not(unix))]
mod os {
    use std::ptr::NonNull;

    pub(super) fn map(_: &[u8; 64], _: usize, _: bool) -> Option<NonNull<u8>> {
        None
    }

    pub(super) fn unlink(_: &[u8; 64]) {}

    pub(super) fn unmap(_: NonNull<u8>, _: usize) {}
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    use super::{stride, Backing, Mailboxes, BOXES, LINE};

    /// Process `process`'s mailboxes in `memory`, which holds `processes` of them.
    fn on_heap(
        memory: &Arc<[AtomicU64]>,
        processes: usize,
        process: usize,
        cap: usize,
    ) -> Mailboxes {
        assert!(cap % LINE == 0 && memory.len() * 8 >= processes * stride(cap));
        let base = std::ptr::NonNull::new(memory.as_ptr().cast_mut().cast::<u8>()).unwrap();
        Mailboxes {
            base,
            len: memory.len() * 8,
            backing: Backing::Heap(Arc::clone(memory)),
            processes,
            process,
            cap,
            round: 0,
            broken: false,
        }
    }

    fn memory(processes: usize, cap: usize) -> Arc<[AtomicU64]> {
        (0..processes * stride(cap) / 8)
            .map(|_| AtomicU64::new(0))
            .collect()
    }

    /// Process `p`'s message in round `r`: its length varies, every byte says whose it is.
    fn message(p: usize, r: usize, cap: usize) -> Vec<u8> {
        let len = (p * 37 + r * 101) % (cap + 1);
        (0..len).map(|i| (p * 31 + r * 7 + i) as u8).collect()
    }

    #[test]
    fn every_process_reads_every_message_of_each_round() {
        let (processes, cap) = (3, 2 * LINE);
        // Under Miri too, every mailbox is written again.
        let rounds = if cfg!(miri) { BOXES + 3 } else { 2000 };
        let memory = memory(processes, cap);
        let threads: Vec<_> = (0..processes)
            .map(|p| {
                let mut boxes = on_heap(&memory, processes, p, cap);
                std::thread::spawn(move || {
                    for r in 0..rounds {
                        let mine = message(p, r, cap);
                        boxes.outbox(mine.len()).unwrap().copy_from_slice(&mine);
                        boxes.exchange(mine.len(), || false).unwrap();
                        for q in 0..processes {
                            assert_eq!(boxes.inbox(q), &message(q, r, cap)[..], "round {r}");
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn a_round_given_up_breaks_the_mailboxes_for_good() {
        let memory = memory(2, LINE);
        let mut boxes = on_heap(&memory, 2, 0, LINE);
        assert!(boxes.outbox(LINE + 1).is_none(), "longer than a mailbox");
        boxes.outbox(3).unwrap().copy_from_slice(b"abc");
        // Process 1 never comes.
        assert!(boxes.exchange(3, || true).is_err());
        assert!(boxes.outbox(3).is_none());
        assert!(boxes.exchange(3, || false).is_err());
        assert!(boxes.inbox(0).is_empty() && boxes.inbox(1).is_empty());
    }
}

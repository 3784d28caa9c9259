#[cfg(all(test, not(loom)))]
use std::sync::atomic::Ordering::Release;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::time::Instant;

#[cfg(all(test, not(loom)))]
use super::prims::AtomicUsize;
use super::prims::{spin_loop, yield_now, AtomicU64, Condvar, Mutex};

/// How a waiter waits before it parks: it spins only while every awake actor thread and
/// the driver can have a core of its own (then a spin ends one cache-line transfer after
/// the other side's write: the handoff round trip of `BENCHMARKS.md#floors`), and
/// otherwise yields at once, so that the thread it waits for gets the core; then it yields
/// a while, then parks (a wake-up takes a system call on each side, far more than a spin,
/// so parking is the last resort, but an idle graph must not burn cores). Spinning while
/// the threads outnumber the cores takes the core from the thread waited for, for the
/// whole spin, at every handoff (the `echo/8 actors` row of `BENCHMARKS.md` runs more
/// threads than cores). An actor thread that is parked needs no core: the first
/// actor's, when the driver runs its steps (`exec::help`), so that two actors on two cores
/// spin.
#[cfg(not(loom))]
mod budget {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use std::sync::OnceLock;

    // Under Miri every spin is interpreted, slowly: park soon.
    const SPINS: u32 = if cfg!(miri) { 0 } else { 256 };
    const MAX_SPINS: u32 = if cfg!(miri) { 0 } else { 1024 };
    const MIN_SPINS: u32 = if cfg!(miri) { 0 } else { 128 };
    pub(super) const YIELDS: u32 = if cfg!(miri) { 4 } else { 128 };

    /// Actor threads started, not ended and not parked.
    static AWAKE_ACTORS: AtomicUsize = AtomicUsize::new(0);

    thread_local! {
        static IS_ACTOR: Cell<bool> = const { Cell::new(false) };
        /// How long this thread spins before it yields, adapted to how spinning went
        /// lately (see [`spun`]).
        static SPIN_LIMIT: Cell<u32> = const { Cell::new(SPINS) };
    }

    /// Adapts this thread's spin limit to how its last spin ended: it grows by a quarter
    /// after a wait that ended while spinning, and halves after one that did not. When
    /// the machine is busy (other processes, or more threads than cores), the thread
    /// waited for is often not running and spinning only takes its core: the limit then
    /// falls to its floor within a few waits, and waits soon yield; on a quiet machine it
    /// stays near the top, where a wait costs a cache-line round trip. The floor is above a
    /// handoff's usual wait (a few round trips of `BENCHMARKS.md#floors`), so that a limit
    /// lowered by a few long waits (an idle spell, a launch) grows back: with a floor below
    /// the usual wait, every wait would fail and the limit would never grow again.
    pub(super) fn spun(ended_spinning: bool) {
        SPIN_LIMIT.with(|l| {
            let limit = l.get();
            l.set(if ended_spinning {
                (limit + limit / 4 + 1).min(MAX_SPINS)
            } else {
                (limit / 2).max(MIN_SPINS)
            })
        });
    }

    fn cores() -> usize {
        static CORES: OnceLock<usize> = OnceLock::new();
        *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// The CPU this thread runs on now ([`NO_CPU`](super::NO_CPU) where the OS does not
    /// say cheaply): on Linux the vDSO's `getcpu`, a few nanoseconds, no system call.
    pub(super) fn current_cpu() -> u32 {
        #[cfg(all(target_os = "linux", not(miri)))]
        {
            // SAFETY: `sched_getcpu` takes no arguments and only reads the CPU number.
            let cpu = unsafe { libc::sched_getcpu() };
            u32::try_from(cpu).unwrap_or(super::NO_CPU)
        }
        #[cfg(not(all(target_os = "linux", not(miri))))]
        {
            super::NO_CPU
        }
    }

    /// Whether the awake actor threads and the driver outnumber the cores, so that some
    /// of them cannot be running now.
    pub(crate) fn crowded() -> bool {
        // The driver thread counts too.
        AWAKE_ACTORS.load(Relaxed) >= cores()
    }

    pub(super) fn spins() -> u32 {
        if !crowded() {
            SPIN_LIMIT.with(Cell::get)
        } else {
            0
        }
    }

    /// Called on an actor's thread as it starts.
    pub(crate) fn actor_started() {
        IS_ACTOR.with(|a| a.set(true));
        AWAKE_ACTORS.fetch_add(1, Relaxed);
    }

    /// Called on an actor's thread as it ends.
    pub(crate) fn actor_ended() {
        IS_ACTOR.with(|a| a.set(false));
        AWAKE_ACTORS.fetch_sub(1, Relaxed);
    }

    /// While alive, this thread, if an actor's, counts as parked.
    pub(super) struct Parked(bool);

    impl Parked {
        pub(super) fn new() -> Self {
            let actor = IS_ACTOR.with(Cell::get);
            if actor {
                AWAKE_ACTORS.fetch_sub(1, Relaxed);
            }
            Self(actor)
        }
    }

    impl Drop for Parked {
        fn drop(&mut self) {
            if self.0 {
                AWAKE_ACTORS.fetch_add(1, Relaxed);
            }
        }
    }
}

// Under loom every spin is a state to explore: go straight to parking.
#[cfg(loom)]
mod budget {
    pub(super) const YIELDS: u32 = 0;
    pub(super) fn spins() -> u32 {
        0
    }
    pub(crate) fn crowded() -> bool {
        true
    }
    pub(super) fn current_cpu() -> u32 {
        super::NO_CPU
    }
    pub(super) fn spun(_: bool) {}
    pub(crate) fn actor_started() {}
    pub(crate) fn actor_ended() {}
    pub(super) struct Parked;
    impl Parked {
        pub(super) fn new() -> Self {
            Self
        }
    }
}

pub(crate) use budget::{actor_ended, actor_started, crowded};

/// How many times [`briefly`] yields at most: a yield is a cheap system call when no
/// other thread wants the core, and hands it over when one does.
const BRIEF_YIELDS: u32 = if cfg!(any(miri, loom)) { 0 } else { 32 };

/// How long [`briefly`] yields at most, however long each yield takes (on a busy machine
/// one may hand the core to another process for a while).
const BRIEF: std::time::Duration = std::time::Duration::from_micros(20);

/// Waits a little for `ready`, without parking: yields at most [`BRIEF_YIELDS`] times
/// and for at most [`BRIEF`]. Whether `ready` became true. For a caller that must not
/// block (an async poll about to return `Pending`): a step of a small graph ends within
/// that time, and finding it done here saves the executor a park and a wake-up, each a
/// trip through the scheduler. It yields rather than spins: the executor's thread is not
/// counted among the actors', so a spin could hold the core the actor it waits for needs.
pub(crate) fn briefly(mut ready: impl FnMut() -> bool) -> bool {
    if BRIEF_YIELDS == 0 {
        return ready();
    }
    let start = Instant::now();
    for _ in 0..BRIEF_YIELDS {
        if ready() {
            return true;
        }
        if start.elapsed() >= BRIEF {
            break;
        }
        yield_now();
    }
    ready()
}

/// Why a wait ended without the value moving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Interrupted {
    /// The deadline passed.
    TimedOut,
    /// The epoch was aborted.
    Aborted,
}

/// A counter that one side advances and the other waits on, spinning, then yielding,
/// then parking.
///
/// One word holds the value (from bit 2 up), an "aborted" bit and a "sleepers" bit. A
/// waiter about to park sets the sleepers bit with a read-modify-write under the lock and
/// learns the current value from the same operation; `advance` is one `fetch_add`, and only
/// when it finds the sleepers bit set does it take the lock, clear the bit and notify. Both
/// are read-modify-writes of one location, so one of them always sees the other: no wake
/// is lost, without relying on `SeqCst` store/load pairs.
pub(crate) struct Epoch {
    state: AtomicU64,
    /// The CPU its last [`advance`](Epoch::advance) ran on ([`NO_CPU`] if none yet): where
    /// the thread that advances it (the driver's `go`, an actor's `done`, an edge's sides)
    /// most likely runs. A waiter on that same CPU does not spin: the thread it waits for
    /// cannot run until it gives the CPU up, and each spin would only delay it: after a
    /// wake-up placed an actor on the driver's CPU, every handoff would spin its full limit
    /// before it yielded (the one-sided slow mode of `BENCHMARKS.md`, which
    /// `scripts/one-cpu.sh` forces). A hint only, hence a plain `std` atomic even under
    /// loom, and relaxed.
    cpu: std::sync::atomic::AtomicU32,
    lock: Mutex<()>,
    cv: Condvar,
    /// How many threads wait on `cv` now: a unit test that must know a waiter blocked
    /// before it acts waits for this (`until_parked`), not for a while.
    #[cfg(all(test, not(loom)))]
    parked: AtomicUsize,
}

/// No CPU: not known, or not advanced yet.
const NO_CPU: u32 = u32::MAX;

const SLEEPERS: u64 = 1;
const ABORTED: u64 = 2;
const ONE: u64 = 4;

impl Epoch {
    pub(crate) fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
            cpu: std::sync::atomic::AtomicU32::new(NO_CPU),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            #[cfg(all(test, not(loom)))]
            parked: AtomicUsize::new(0),
        }
    }

    /// The current value; what a waiter passes to [`Epoch::wait_past`].
    pub(crate) fn current(&self) -> u64 {
        self.state.load(Acquire) / ONE
    }

    /// Moves to the next value and wakes every waiter (release: what was written before is
    /// visible to whoever sees the new value).
    pub(crate) fn advance(&self) {
        self.cpu.store(budget::current_cpu(), Relaxed);
        let old = self.state.fetch_add(ONE, AcqRel);
        if old & SLEEPERS != 0 {
            self.wake_sleepers();
        }
    }

    /// [`advance`](Self::advance), unless the epoch is aborted: then nothing moves. So every
    /// waiter on the current value sees either the advance or the abort, never the abort
    /// first and then the advance.
    pub(crate) fn arrive(&self) -> Result<(), Interrupted> {
        self.cpu.store(budget::current_cpu(), Relaxed);
        let mut state = self.state.load(Relaxed);
        loop {
            if state & ABORTED != 0 {
                return Err(Interrupted::Aborted);
            }
            match self
                .state
                .compare_exchange(state, state + ONE, AcqRel, Relaxed)
            {
                Ok(old) => {
                    if old & SLEEPERS != 0 {
                        self.wake_sleepers();
                    }
                    return Ok(());
                }
                Err(now) => state = now,
            }
        }
    }

    /// Makes every current and future wait return [`Interrupted::Aborted`].
    pub(crate) fn abort(&self) {
        let old = self.state.fetch_or(ABORTED, AcqRel);
        if old & SLEEPERS != 0 {
            self.wake_sleepers();
        }
    }

    pub(crate) fn is_aborted(&self) -> bool {
        self.state.load(Acquire) & ABORTED != 0
    }

    #[cold]
    fn wake_sleepers(&self) {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // Every sleeper re-sets the bit under the lock before it waits again.
        self.state.fetch_and(!SLEEPERS, Relaxed);
        self.cv.notify_all();
    }

    fn check(state: u64, seen: u64, abortable: bool) -> Option<Result<u64, Interrupted>> {
        if state / ONE != seen {
            Some(Ok(state / ONE))
        } else if abortable && state & ABORTED != 0 {
            Some(Err(Interrupted::Aborted))
        } else {
            None
        }
    }

    /// Waits until the value differs from `seen` and returns it; or until the epoch is
    /// aborted or `deadline` passes.
    pub(crate) fn wait_past(
        &self,
        seen: u64,
        deadline: Option<Instant>,
    ) -> Result<u64, Interrupted> {
        self.wait_past_inner(seen, deadline, true)
    }

    /// Waits until the value differs from `seen`, whether or not the epoch is aborted.
    pub(crate) fn wait_past_unabortable(&self, seen: u64) -> u64 {
        match self.wait_past_inner(seen, None, false) {
            Ok(value) => value,
            // Unreachable: no deadline, and aborts are ignored.
            Err(_) => seen + 1,
        }
    }

    fn wait_past_inner(
        &self,
        seen: u64,
        deadline: Option<Instant>,
        abortable: bool,
    ) -> Result<u64, Interrupted> {
        let advancer = self.cpu.load(Relaxed);
        let spins = if advancer != NO_CPU && advancer == budget::current_cpu() {
            0
        } else {
            budget::spins()
        };
        for _ in 0..spins {
            if let Some(r) = Self::check(self.state.load(Acquire), seen, abortable) {
                budget::spun(true);
                return r;
            }
            spin_loop();
        }
        if spins > 0 {
            budget::spun(false);
        }
        for _ in 0..budget::YIELDS {
            if let Some(r) = Self::check(self.state.load(Acquire), seen, abortable) {
                return r;
            }
            yield_now();
        }
        self.park_past(seen, deadline, abortable)
    }

    #[cold]
    fn park_past(
        &self,
        seen: u64,
        deadline: Option<Instant>,
        abortable: bool,
    ) -> Result<u64, Interrupted> {
        let _parked = budget::Parked::new();
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let state = self.state.fetch_or(SLEEPERS, AcqRel);
            if let Some(r) = Self::check(state, seen, abortable) {
                return r;
            }
            guard = match deadline {
                None => self.waiting(|| self.cv.wait(guard).unwrap_or_else(|e| e.into_inner())),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(Interrupted::TimedOut);
                    }
                    self.waiting(|| wait_timeout(&self.cv, guard, deadline - now))
                }
            };
        }
    }

    /// Runs `wait`, a wait on `cv`, counted in `parked` in unit tests. The count goes up
    /// under the lock and after the sleepers bit is set (release): a test that sees it
    /// (acquire) and then advances or aborts is sure to wake this waiter.
    fn waiting<G>(&self, wait: impl FnOnce() -> G) -> G {
        #[cfg(all(test, not(loom)))]
        self.parked.fetch_add(1, Release);
        let guard = wait();
        #[cfg(all(test, not(loom)))]
        self.parked.fetch_sub(1, Relaxed);
        guard
    }
}

#[cfg(all(test, not(loom)))]
impl Epoch {
    /// Returns once `n` threads are parked in a wait on this epoch, so that a test acts on
    /// waiters that are blocked for sure; a watchdog fails the test if they never park.
    pub(crate) fn until_parked(&self, n: usize) {
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while self.parked.load(Acquire) < n {
            assert!(
                Instant::now() < deadline,
                "{n} waiter(s) did not park in 10 s"
            );
            std::thread::yield_now();
        }
    }
}

#[cfg(not(loom))]
fn wait_timeout<'a>(
    cv: &Condvar,
    guard: std::sync::MutexGuard<'a, ()>,
    dur: std::time::Duration,
) -> std::sync::MutexGuard<'a, ()> {
    cv.wait_timeout(guard, dur)
        .map(|(g, _)| g)
        .unwrap_or_else(|e| e.into_inner().0)
}

// Loom has no clock: a timed wait is a plain wait, and models use no deadlines.
#[cfg(loom)]
fn wait_timeout<'a>(
    cv: &Condvar,
    guard: loom::sync::MutexGuard<'a, ()>,
    _dur: std::time::Duration,
) -> loom::sync::MutexGuard<'a, ()> {
    cv.wait(guard).unwrap_or_else(|e| e.into_inner())
}

/// A reusable barrier for a fixed number of parties, spinning then parking, that can be
/// aborted: every current and future wait then fails. Each party may post a `T` for each
/// round, which its peers read after the round's wait (see [`post`](Self::post)).
///
/// Each party counts its own arrivals on a line of its own, with its posts right after it,
/// and a party passes once every peer's count has reached its own. A party's arrival is
/// one read-modify-write of a line only it writes, and a waiter reads it once it has
/// changed: between two cores, one cache-line transfer each way. A shared counter takes a
/// read-modify-write of the same line by every party, then a second line for the opening:
/// for a small stage, whose barriers are most of its time, twice the transfers.
pub(crate) struct Barrier<T = ()> {
    slots: Box<[Slot<T>]>,
}

/// A party's arrivals, and its posts for even and odd rounds.
#[repr(C, align(128))]
struct Slot<T> {
    arrivals: Epoch,
    posts: [T; 2],
}

impl<T: Default> Barrier<T> {
    pub(crate) fn new(parties: usize) -> Self {
        let slot = || Slot {
            arrivals: Epoch::new(),
            posts: [T::default(), T::default()],
        };
        Self {
            slots: (0..parties).map(|_| slot()).collect(),
        }
    }
}

impl<T> Barrier<T> {
    /// Waits until every party has called `wait` (or [`wait_all`](Self::wait_all)) as often
    /// as `party` has, this call included. Everything a party wrote before its call is
    /// visible to every party after theirs.
    ///
    /// An abort fails the wait of every party alike: either all of them pass (every party
    /// arrived before the abort reached its count) or none does, so that no party goes on
    /// to read what a party that gave up no longer keeps. A party that arrived sees every
    /// peer's arrival, aborted or not; a party whose count was aborted first never arrives,
    /// so nobody passes.
    pub(crate) fn wait(&self, party: usize) -> Result<(), Interrupted> {
        let mine = &self.slots[party].arrivals;
        let round = mine.current();
        mine.arrive()?;
        self.await_peers(party, round, |peer, seen| peer.wait_past(seen, None))
    }

    /// [`wait`](Self::wait), ignoring aborts: for a point every party is bound to reach
    /// (the later barriers of a stage that all parties entered), where a party must not
    /// leave while others may still read what it posted.
    pub(crate) fn wait_all(&self, party: usize) {
        let mine = &self.slots[party].arrivals;
        let round = mine.current();
        mine.advance();
        // Never interrupted: every wait below ignores aborts and has no deadline.
        let _ = self.await_peers(party, round, |peer, seen| {
            Ok(peer.wait_past_unabortable(seen))
        });
    }

    /// Waits, with `wait_past`, until every party but `party` has arrived at `round`.
    fn await_peers(
        &self,
        party: usize,
        round: u64,
        wait_past: impl Fn(&Epoch, u64) -> Result<u64, Interrupted>,
    ) -> Result<(), Interrupted> {
        for (q, peer) in self.slots.iter().enumerate() {
            if q != party {
                let mut seen = peer.arrivals.current();
                while seen <= round {
                    seen = wait_past(&peer.arrivals, seen)?;
                }
            }
        }
        Ok(())
    }

    /// Fails every current and future wait; the barrier cannot be used again.
    pub(crate) fn abort(&self) {
        for slot in self.slots.iter() {
            slot.arrivals.abort();
        }
    }

    /// How many times `party` has arrived: read by a party before it waits, the same
    /// number on every party for the wait they pass together (the k-th wait of each party
    /// pairs with the k-th of every other), and a different one for any other.
    pub(crate) fn generation(&self, party: usize) -> u64 {
        self.slots[party].arrivals.current()
    }

    /// `party`'s post for `round` (and for every round of its parity). A party writes its
    /// post for round r before its wait of round r; its peers read it after their wait of
    /// round r and before their wait of round r + 1, which the party must pass before it
    /// writes the post again (for round r + 2). How the writes and reads are made safe is
    /// `T`'s: the barrier only orders them.
    pub(crate) fn post(&self, party: usize, round: u64) -> &T {
        &self.slots[party].posts[(round & 1) as usize]
    }

    /// [`Epoch::until_parked`]: returns once `n` parties are parked in a wait for
    /// `party`'s arrival.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn until_parked(&self, party: usize, n: usize) {
        self.slots[party].arrivals.until_parked(n);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize as StdAtomicUsize;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn barrier_separates_rounds() {
        const N: usize = 4;
        // Under Miri every round is slow (each spin interpreted): a few rounds check the
        // memory accesses, and the loom model of the barrier checks its interleavings.
        const ROUNDS: usize = if cfg!(miri) { 100 } else { 2_000 };
        let barrier = Arc::new(Barrier::<()>::new(N));
        let counter = Arc::new(StdAtomicUsize::new(0));
        let threads: Vec<_> = (0..N)
            .map(|me| {
                let (barrier, counter) = (barrier.clone(), counter.clone());
                std::thread::spawn(move || {
                    for round in 0..ROUNDS {
                        counter.fetch_add(1, Relaxed);
                        barrier.wait(me).unwrap();
                        // Everyone has added for this round and nobody for the next one.
                        assert_eq!(counter.load(Relaxed), N * (round + 1));
                        barrier.wait(me).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn parked_waiter_is_woken() {
        let epoch = Arc::new(Epoch::new());
        let seen = epoch.current();
        let e2 = epoch.clone();
        let t = std::thread::spawn(move || e2.wait_past(seen, None));
        epoch.until_parked(1);
        epoch.advance();
        assert_eq!(t.join().unwrap(), Ok(seen + 1));
    }

    #[test]
    fn a_deadline_ends_the_wait() {
        let epoch = Epoch::new();
        let start = Instant::now();
        let r = epoch.wait_past(0, Some(start + Duration::from_millis(30)));
        assert_eq!(r, Err(Interrupted::TimedOut));
        assert!(start.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn abort_releases_a_blocked_barrier() {
        let barrier = Arc::new(Barrier::<()>::new(3));
        let waiters: Vec<_> = (0..2)
            .map(|me| {
                let b = barrier.clone();
                std::thread::spawn(move || b.wait(me))
            })
            .collect();
        // Both wait for party 2, which never comes.
        barrier.until_parked(2, 2);
        barrier.abort();
        for w in waiters {
            assert_eq!(w.join().unwrap(), Err(Interrupted::Aborted));
        }
        assert_eq!(barrier.wait(2), Err(Interrupted::Aborted));
    }
}

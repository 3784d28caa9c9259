//! The floor of an `execute`: the round trip of a value between two threads that spin,
//! the driver -> actor -> driver handoff with nothing else in it, by how the value
//! travels:
//!
//! - two spinning counters and no value: the floor itself, the cost of moving two cache
//!   lines between the cores (BENCHMARKS.md#floors);
//! - a `Mutex<VecDeque>` each way: a locked queue, whose lock and buffer are more lines
//!   that both sides write;
//! - the value in the cache line of the counter that announces it: how the driver and an
//!   actor hand over inputs and outputs (`sync::Cells`, in `exec::handoff`);
//! - a lock-free ring whose cells and counters sit on lines of their own: one line more
//!   each way than the previous one.
//!
//! The value is an `Arc`, cloned by the driver and dropped by it, as a graph's input.
//! A benchmark of the primitive, not of actorgraph (it uses nothing of it), printing the
//! mean round trip of each variant, three rounds: over 200,000 round trips, or fewer when
//! a first 1,000 show that they are slow (a machine busy with other work), so that a
//! variant takes about a second at most:
//!
//! ```sh
//! cargo bench --bench handoff
//! ```

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::Instant;

type Value = Arc<Vec<u8>>;

#[repr(align(128))]
struct Line<T>(T);

/// A counter and one value on one line, written by one side.
#[repr(align(128))]
struct Announced {
    count: AtomicU64,
    value: UnsafeCell<Option<Value>>,
}

/// A bounded queue's cells (on their own lines), its counters passed in.
struct Ring(Box<[UnsafeCell<Option<Value>>]>);

/// The driver's line and the actor's line of the ring variant.
#[repr(align(128))]
struct Counters {
    signal: AtomicU64,
    pushed: AtomicU64,
    popped: AtomicU64,
}

struct Shared {
    go: Line<AtomicU64>,
    done: Line<AtomicU64>,
    inputs: Line<Mutex<VecDeque<Value>>>,
    outputs: Line<Mutex<VecDeque<Value>>>,
    input: Announced,
    output: Announced,
    driver: Counters,
    actor: Counters,
    ring_in: Ring,
    ring_out: Ring,
}

// SAFETY: each `UnsafeCell` is accessed by one thread at a time, in turns ordered by the
// counters' release/acquire pairs (below).
unsafe impl Sync for Shared {}

impl Ring {
    /// # Safety
    /// One producer; the counters of every call.
    unsafe fn push(&self, pushed: &AtomicU64, popped: &AtomicU64, value: Value) {
        let tail = pushed.load(Relaxed);
        assert!(tail - popped.load(Acquire) < self.0.len() as u64);
        // SAFETY: the consumer is done with this cell (the check above); the caller's contract.
        unsafe { *self.0[tail as usize % self.0.len()].get() = Some(value) };
        pushed.store(tail + 1, Release);
    }

    /// # Safety
    /// One consumer; the counters of every call.
    unsafe fn pop(&self, pushed: &AtomicU64, popped: &AtomicU64) -> Option<Value> {
        let head = popped.load(Relaxed);
        if head == pushed.load(Acquire) {
            return None;
        }
        // SAFETY: the producer wrote this cell before the count seen above, and waits for
        // `popped` before it writes it again.
        let value = unsafe { (*self.0[head as usize % self.0.len()].get()).take() };
        popped.store(head + 1, Release);
        value
    }
}

/// Spins until `count` is past `past`, and returns it. After `SPINS` spins in a row the
/// other thread is not running (a round trip takes well under a microsecond when both
/// threads have a core), so the wait yields its core to it: on a machine busy with other
/// work the run stays short, and its figures say that the floor was not measured.
fn wait(count: &AtomicU64, past: u64) -> u64 {
    const SPINS: u32 = 1 << 14;
    let mut spins = 0;
    loop {
        let now = count.load(Acquire);
        if now > past {
            return now;
        }
        spins += 1;
        if spins == SPINS {
            spins = 0;
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

#[derive(Clone, Copy)]
enum Variant {
    Floor,
    MutexQueues,
    InTheLine,
    Ring,
}

/// The mean round trip, in nanoseconds.
fn run(variant: Variant, rounds: u64) -> f64 {
    let cells = || Ring((0..1).map(|_| UnsafeCell::new(None)).collect());
    let counters = || Counters {
        signal: AtomicU64::new(0),
        pushed: AtomicU64::new(0),
        popped: AtomicU64::new(0),
    };
    let shared = Arc::new(Shared {
        go: Line(AtomicU64::new(0)),
        done: Line(AtomicU64::new(0)),
        inputs: Line(Mutex::new(VecDeque::with_capacity(4))),
        outputs: Line(Mutex::new(VecDeque::with_capacity(4))),
        input: Announced {
            count: AtomicU64::new(0),
            value: UnsafeCell::new(None),
        },
        output: Announced {
            count: AtomicU64::new(0),
            value: UnsafeCell::new(None),
        },
        driver: counters(),
        actor: counters(),
        ring_in: cells(),
        ring_out: cells(),
    });
    let actor = {
        let s = shared.clone();
        std::thread::spawn(move || {
            let mut seen = 0;
            for _ in 0..rounds {
                match variant {
                    Variant::Floor => {
                        seen = wait(&s.go.0, seen);
                        s.done.0.fetch_add(1, AcqRel);
                    }
                    Variant::MutexQueues => {
                        seen = wait(&s.go.0, seen);
                        let v = s.inputs.0.lock().unwrap().pop_front();
                        s.outputs.0.lock().unwrap().extend(v);
                        s.done.0.fetch_add(1, AcqRel);
                    }
                    Variant::InTheLine => {
                        seen = wait(&s.input.count, seen);
                        // SAFETY: the driver wrote it before the count just seen, and
                        // writes it again only after this thread's next count.
                        let v = unsafe { (*s.input.value.get()).take() };
                        // SAFETY: the driver took the last output before it counted the
                        // input just seen, and takes this one only after the count below.
                        unsafe { *s.output.value.get() = v };
                        s.output.count.fetch_add(1, AcqRel);
                    }
                    Variant::Ring => {
                        seen = wait(&s.driver.signal, seen);
                        // SAFETY: this thread alone pops inputs and pushes outputs.
                        let v = unsafe { s.ring_in.pop(&s.driver.pushed, &s.actor.popped) };
                        // SAFETY: as above.
                        unsafe {
                            s.ring_out
                                .push(&s.actor.pushed, &s.driver.popped, v.unwrap())
                        };
                        s.actor.signal.fetch_add(1, AcqRel);
                    }
                }
            }
        })
    };
    let value = Arc::new(vec![1u8; 4]);
    let s = &shared;
    let start = Instant::now();
    let mut seen = 0;
    for _ in 0..rounds {
        let back = match variant {
            Variant::Floor => {
                s.go.0.fetch_add(1, AcqRel);
                seen = wait(&s.done.0, seen);
                None
            }
            Variant::MutexQueues => {
                s.inputs.0.lock().unwrap().push_back(value.clone());
                s.go.0.fetch_add(1, AcqRel);
                seen = wait(&s.done.0, seen);
                s.outputs.0.lock().unwrap().pop_front()
            }
            Variant::InTheLine => {
                // SAFETY: the actor took the last input before its last count, seen.
                unsafe { *s.input.value.get() = Some(value.clone()) };
                s.input.count.fetch_add(1, AcqRel);
                seen = wait(&s.output.count, seen);
                // SAFETY: the actor wrote it before the count just seen.
                unsafe { (*s.output.value.get()).take() }
            }
            Variant::Ring => {
                // SAFETY: this thread alone pushes inputs and pops outputs.
                unsafe {
                    s.ring_in
                        .push(&s.driver.pushed, &s.actor.popped, value.clone())
                };
                s.driver.signal.fetch_add(1, AcqRel);
                seen = wait(&s.actor.signal, seen);
                // SAFETY: as above.
                unsafe { s.ring_out.pop(&s.actor.pushed, &s.driver.popped) }
            }
        };
        drop(std::hint::black_box(back));
    }
    let nanos = start.elapsed().as_secs_f64() * 1e9 / rounds as f64;
    actor.join().unwrap();
    nanos
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read.
    let variants = [
        (Variant::Floor, "two counters, no value (the floor)"),
        (Variant::MutexQueues, "Mutex<VecDeque> each way"),
        (Variant::InTheLine, "the value in its counter's line"),
        (Variant::Ring, "lock-free ring, cells on their own lines"),
    ];
    for round in 1..=3 {
        for (variant, what) in variants {
            let probe = run(variant, 1_000);
            let rounds = ((1e9 / probe) as u64).clamp(1_000, 200_000);
            let nanos = run(variant, rounds);
            println!("round {round}  {what:42} {nanos:8.0} ns  ({rounds} round trips)");
        }
    }
}

//! A global allocator for allocation-counting tests: it counts the allocations made on
//! behalf of an actor, that is while the thread has an actor's context
//! (`actorgraph::Ctx::current()`): all the time on an actor's own thread, and only inside
//! the step on a driver thread that runs one for an actor. So the driver's own `Vec` of
//! outputs is not counted, and a step is, wherever it runs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

struct Counting;

static COUNT: AtomicUsize = AtomicUsize::new(0);

/// Whether this allocation is made on behalf of an actor. `Ctx::current` reads a `Cell`
/// thread-local with a constant initialiser and no destructor: it does not allocate and is
/// readable at any point of a thread's life, so it may be asked from inside the allocator.
fn counted_here() -> bool {
    actorgraph::Ctx::current().is_some()
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting touches
// only an atomic and a thread-local, neither of which allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counted_here() {
            COUNT.fetch_add(1, Relaxed);
        }
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if counted_here() {
            COUNT.fetch_add(1, Relaxed);
        }
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The allocations counted so far, on behalf of every actor of every graph.
pub fn counted() -> usize {
    COUNT.load(Relaxed)
}

/// The calling test's turn to count: the count is process-wide, so a test that measures
/// holds its turn while it runs, and no other test's actors count meanwhile.
pub fn turn() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

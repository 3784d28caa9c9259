//! After warm-up, the actor side of a bucketed allreduce graph allocates nothing per
//! execute: layouts, flat buffers and output views are all reused.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use actorgraph::prelude::*;

/// Counts allocations made on threads that opted in (the actor threads, through their
/// first method call), so the driver's own `Vec` of outputs is not counted.
struct Counting;

static ACTOR_ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTED.with(Cell::get) {
            ACTOR_ALLOCS.fetch_add(1, Relaxed);
        }
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTED.with(Cell::get) {
            ACTOR_ALLOCS.fetch_add(1, Relaxed);
        }
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

struct Echo;

#[actor]
impl Echo {
    fn echo(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        COUNTED.with(|c| c.set(true));
        x.clone()
    }
    fn echo_i(&mut self, x: &Tensor<i64>) -> Tensor<i64> {
        x.clone()
    }
}

graph! {
    Bucket(workers: [Echo], a: Tensor<f32>, b: Tensor<f32>, c: Tensor<i64>) {
        let x = workers.echo(a);
        let y = workers.echo(b);
        let z = workers.echo_i(c);
        allreduce([x, y, z], Avg)
    }
}

#[test]
fn steady_state_execute_allocates_nothing_on_the_actors() {
    let mut g = Bucket::launch(vec![Echo, Echo, Echo], Cpu).unwrap();
    let a = Tensor::full([1024], 1.0f32);
    let b = Tensor::full([3000], 2.0f32);
    let c = Tensor::full([5], 9i64);
    for _ in 0..10 {
        g.execute(a.clone(), b.clone(), c.clone()).unwrap();
    }
    let before = ACTOR_ALLOCS.load(Relaxed);
    for _ in 0..10_000 {
        let out = g.execute(a.clone(), b.clone(), c.clone()).unwrap();
        assert_eq!(out[2].2.as_slice()[4], 9);
    }
    let after = ACTOR_ALLOCS.load(Relaxed);
    assert_eq!(
        after - before,
        0,
        "allocations on actor threads in 10 000 executes"
    );
    // The counter is live: a held view forces a fresh buffer on the next execute.
    let held = g.execute(a.clone(), b.clone(), c.clone()).unwrap();
    g.execute(a, b, c).unwrap();
    assert!(ACTOR_ALLOCS.load(Relaxed) > after);
    drop(held);
}

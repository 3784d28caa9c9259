//! After warm-up, a graph with edges of every kind (group to group, one actor to a group,
//! one actor to another) and a collective allocates nothing on its actor threads per
//! execute: edge slots, schedules and stage buffers are all reused.

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
}

graph! {
    Pipe(first: [Echo], second: [Echo], a: Tensor<f32>) {
        let x = first.echo(a);
        let t = first[0].echo(a);
        let y = second.echo(x);
        let w = second.echo(t);
        let p = second[1].echo(y);
        let q = first[1].echo(p);
        let (s, _) = allreduce([y, w]);
        let back = first.echo(s);
        (back, q)
    }
}

#[test]
fn steady_state_edges_allocate_nothing_on_the_actors() {
    let mut g = Pipe::launch(vec![Echo, Echo, Echo], vec![Echo, Echo, Echo], Cpu).unwrap();
    let a = Tensor::full([1000], 1.0f32);
    for _ in 0..10 {
        g.execute(a.clone()).unwrap();
    }
    let before = ACTOR_ALLOCS.load(Relaxed);
    for _ in 0..5_000 {
        let out = g.execute(a.clone()).unwrap();
        assert_eq!(out[2].0.as_slice()[999], 3.0);
        assert!(out[1].1.is_some());
    }
    let after = ACTOR_ALLOCS.load(Relaxed);
    assert_eq!(
        after - before,
        0,
        "allocations on actor threads in 5 000 executes"
    );
    // The counter is live: a held view forces a fresh stage buffer on the next execute.
    let held = g.execute(a.clone()).unwrap();
    g.execute(a).unwrap();
    assert!(ACTOR_ALLOCS.load(Relaxed) > after);
    drop(held);
}

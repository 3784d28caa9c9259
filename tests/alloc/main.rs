//! After warm-up, the actor side of a graph allocates nothing per execute. A binary of its
//! own: its global allocator counts allocations process-wide (on the threads that opt in),
//! so no other test may run beside these, and these take turns ([`counting_alloc::turn`]).

#[path = "../support/counting_alloc.rs"]
mod counting_alloc;

mod allreduce;
mod edges;

//! Per-rank inputs the macro refuses: a `PerRank` without its one type, and a per-rank
//! input read by two groups (its values are split over one group's ranks).
use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn count(&mut self, n: &u32) -> u32 {
        *n
    }
}

graph! {
    NoType(workers: [Worker], n: PerRank) {
        workers.count(n)
    }

    TwoGroups(workers: [Worker], others: [Worker], n: PerRank<u32>) {
        let a = workers.count(n);
        let b = others.count(n);
        (a, b)
    }
}

fn main() {}

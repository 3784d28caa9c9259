//! One rank's value and `gather` written where they cannot be: an index past a fixed-size
//! group, an index of a value of one actor or of an input, `gather` to the whole group of
//! its value or outside a call, and a value of one actor at a rank a fixed-size output
//! does not have.
use actorgraph::prelude::*;

struct Worker;

#[actor]
impl Worker {
    fn loss(&mut self) -> f32 {
        1.0
    }
    fn see(&mut self, l: &f32) -> f32 {
        *l
    }
    fn all(&mut self, l: &[f32]) -> f32 {
        l.iter().sum()
    }
}

graph! {
    G(workers: [Worker; 2], coord: [Worker], x: f32) {
        let losses = workers.loss();
        let a = coord.see(losses[2]);
        let one = workers[0].loss();
        let b = coord.see(one[0]);
        let c = coord.see(x[0]);
        let d = workers.all(gather(losses));
        let e = gather(losses);
        (a, b, c, d)
    }

    /// A value of `coord[3]` zipped with the two workers' values: no rank 3 in the output.
    Late(workers: [Worker; 2], coord: [Worker; 4]) {
        let l = workers.loss();
        let c = coord[3].loss();
        (l, c)
    }
}

fn main() {}

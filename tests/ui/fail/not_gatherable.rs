use actorgraph::prelude::*;
use actorgraph::Reduced;

/// A value that goes through `allreduce` but has no gathered form.
struct Grad([f32; 2]);

impl Bucketable for Grad {
    type Elem = f32;
    fn bucket_len(&self) -> usize {
        2
    }
    fn pack(&self, dst: &mut [f32]) {
        dst.copy_from_slice(&self.0)
    }
    fn unpack(&self, reduced: Reduced<'_, f32>) -> Self {
        let s = reduced.as_slice();
        Grad([s[0], s[1]])
    }
}

struct Worker;

#[actor]
impl Worker {
    fn grad(&mut self) -> Grad {
        Grad([1.0, 2.0])
    }
}

graph! {
    G(workers: [Worker]) {
        let g = workers.grad();
        allgather(g)
    }
}

fn main() {}

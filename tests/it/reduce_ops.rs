//! Every reduce op on f32 and i32 over 4 actors, in one mixed-dtype bucket per op.

use actorgraph::prelude::*;

struct Ranked {
    rank: usize,
}

#[actor]
impl Ranked {
    /// `[v, -v, 0]` with `v = rank + 1`.
    fn floats(&mut self) -> Tensor<f32> {
        let v = (self.rank + 1) as f32;
        Tensor::from_slice(&[v, -v, 0.0])
    }
    fn ints(&mut self) -> Tensor<i32> {
        let v = (self.rank + 1) as i32;
        Tensor::from_slice(&[v, -v, 0])
    }
}

graph! {
    SumG(ranks: [Ranked]) { let f = ranks.floats(); let i = ranks.ints(); allreduce([f, i], Sum) }
    ProdG(ranks: [Ranked]) { let f = ranks.floats(); let i = ranks.ints(); allreduce([f, i], Prod) }
    MinG(ranks: [Ranked]) { let f = ranks.floats(); let i = ranks.ints(); allreduce([f, i], Min) }
    MaxG(ranks: [Ranked]) { let f = ranks.floats(); let i = ranks.ints(); allreduce([f, i], Max) }
    AvgG(ranks: [Ranked]) { let f = ranks.floats(); let i = ranks.ints(); allreduce([f, i], ReduceOp::Avg) }
}

fn ranks() -> Vec<Ranked> {
    (0..4).map(|rank| Ranked { rank }).collect()
}

/// Checks every rank's result against the expected values and that all ranks agree bitwise.
fn check(out: Vec<(Tensor<f32>, Tensor<i32>)>, floats: [f32; 3], ints: [i32; 3]) {
    assert_eq!(out.len(), 4);
    for (f, i) in &out {
        assert_eq!(f.to_vec(), floats.to_vec());
        assert_eq!(i.to_vec(), ints.to_vec());
    }
    let bits: Vec<Vec<u32>> = out
        .iter()
        .map(|(f, _)| f.as_slice().iter().map(|x| x.to_bits()).collect())
        .collect();
    assert!(bits.windows(2).all(|w| w[0] == w[1]));
}

// Values over ranks: v = 1, 2, 3, 4.
#[test]
fn sum() {
    let mut g = SumG::launch(ranks(), Cpu).unwrap();
    check(g.execute().unwrap(), [10.0, -10.0, 0.0], [10, -10, 0]);
}

#[test]
fn prod() {
    let mut g = ProdG::launch(ranks(), Cpu).unwrap();
    check(g.execute().unwrap(), [24.0, 24.0, 0.0], [24, 24, 0]);
}

#[test]
fn min() {
    let mut g = MinG::launch(ranks(), Cpu).unwrap();
    check(g.execute().unwrap(), [1.0, -4.0, 0.0], [1, -4, 0]);
}

#[test]
fn max() {
    let mut g = MaxG::launch(ranks(), Cpu).unwrap();
    check(g.execute().unwrap(), [4.0, -1.0, 0.0], [4, -1, 0]);
}

#[test]
fn avg() {
    let mut g = AvgG::launch(ranks(), Cpu).unwrap();
    // Integer Avg rounds toward zero: 10 / 4 = 2, -10 / 4 = -2.
    check(g.execute().unwrap(), [2.5, -2.5, 0.0], [2, -2, 0]);
}

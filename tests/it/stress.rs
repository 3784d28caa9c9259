//! Stress: 8 actors on a 2-core machine, 2 000 executions with failures injected at random
//! ranks and places, every result checked. A watchdog fails the test instead of hanging CI.

use actorgraph::prelude::*;

use crate::support::within;

/// What one execution does wrong, if anything.
#[derive(Clone, Copy, Debug)]
enum Fault {
    None,
    /// `rank` returns `Err` from the first method.
    ErrFirst(usize),
    /// `rank` returns `Err` from the method between the two collectives.
    ErrSecond(usize),
    /// `rank` returns one element too few for the first bucket.
    Short(usize),
}

#[derive(Clone, Copy, Debug)]
struct Plan {
    step: u64,
    fault: Fault,
}

struct Node {
    rank: usize,
}

#[actor]
impl Node {
    fn produce(&mut self, plan: &Plan) -> Result<(Tensor<i64>, Tensor<f64>), String> {
        if matches!(plan.fault, Fault::ErrFirst(r) if r == self.rank) {
            return Err(format!("injected at step {}", plan.step));
        }
        let short = matches!(plan.fault, Fault::Short(r) if r == self.rank);
        let n = if short { 99 } else { 100 };
        let base = plan.step as i64 + self.rank as i64;
        let ints = Tensor::from_vec((0..n).map(|i| base + i).collect(), [n as usize])
            .map_err(|e| e.to_string())?;
        Ok((ints, Tensor::full([7], self.rank as f64)))
    }

    fn rescale(&mut self, plan: &Plan, x: &Tensor<i64>) -> Result<Tensor<i64>, String> {
        if matches!(plan.fault, Fault::ErrSecond(r) if r == self.rank) {
            return Err("injected between the collectives".into());
        }
        Tensor::from_vec(
            x.as_slice()
                .iter()
                .map(|v| v * (self.rank as i64 + 1))
                .collect(),
            x.shape(),
        )
        .map_err(|e| e.to_string())
    }
}

graph! {
    Stress(nodes: [Node], plan: Plan) {
        let (ints, floats) = nodes.produce(plan);
        let (si, sf) = allreduce([ints, floats]);
        let r = nodes.rescale(plan, si);
        let m = allreduce(r, Max);
        (m, sf)
    }
}

/// xorshift64*: deterministic faults without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

const N: usize = 8;
const STEPS: u64 = 2_000;

fn run() {
    let mut g = Stress::launch((0..N).map(|rank| Node { rank }).collect::<Vec<_>>(), Cpu).unwrap();
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut counts = [0usize; 4];
    for step in 0..STEPS {
        let rank = (rng.next() % N as u64) as usize;
        let fault = match rng.next() % 20 {
            0 => Fault::ErrFirst(rank),
            1 => Fault::ErrSecond(rank),
            2 => Fault::Short(rank),
            _ => Fault::None,
        };
        let result = g.execute(Plan { step, fault });
        match (fault, result) {
            (Fault::None, Ok(out)) => {
                counts[0] += 1;
                assert_eq!(out.len(), N);
                // sum over ranks of (step + rank + i) = 8 (step + i) + 28; the max of
                // (rank + 1) times it is 8 times it.
                for (m, sf) in &out {
                    let want: Vec<i64> =
                        (0..100).map(|i| 8 * (8 * (step as i64 + i) + 28)).collect();
                    assert_eq!(m.as_slice(), &want[..], "step {step}");
                    assert_eq!(sf.to_vec(), vec![28.0; 7]);
                }
            }
            (Fault::ErrFirst(r), Err(Error::Method { rank, method, .. })) => {
                counts[1] += 1;
                assert_eq!((rank, method), (r, "produce"), "step {step}");
            }
            (Fault::ErrSecond(r), Err(Error::Method { rank, method, .. })) => {
                counts[2] += 1;
                assert_eq!((rank, method), (r, "rescale"), "step {step}");
            }
            (
                Fault::Short(r),
                Err(Error::ShapeMismatch {
                    slot, counts: c, ..
                }),
            ) => {
                counts[3] += 1;
                assert_eq!(slot, 0);
                for (q, &(_, n)) in c.iter().enumerate() {
                    assert_eq!(n, if q == r { 99 } else { 100 }, "step {step}");
                }
            }
            (fault, other) => panic!("step {step}: {fault:?} gave {other:?}"),
        }
    }
    assert!(
        counts.iter().all(|&c| c > 0),
        "every kind of fault ran: {counts:?}"
    );
    assert_eq!(g.teardown().unwrap().len(), N);
}

#[test]
fn eight_actors_two_thousand_executions_with_random_faults() {
    within(600, run);
}

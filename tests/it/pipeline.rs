//! Several executions in flight: `submit` up to `max_in_flight`, `wait` by ticket, results
//! in submission order, the bound as a typed error, failures confined to their ticket, and
//! the CPU communicator's disagreement path while ranks run ahead into the next execution.

use std::time::Duration;

use actorgraph::prelude::*;

use crate::support::within;

/// What an execution asks one rank to do wrong.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    None,
    /// `grad` returns an error on this rank.
    Fail(usize),
    /// `grad` returns a tensor of another length on this rank (the ranks disagree).
    Longer(usize),
}

struct Worker {
    rank: usize,
    calls: u64,
}

#[actor]
impl Worker {
    fn grad(&mut self, x: &f32, fault: &Fault, ms: &u64) -> Result<Tensor<f32>, String> {
        self.calls += 1;
        // Rank 0 lags, so that the others run ahead into the next executions.
        if self.rank == 0 {
            std::thread::sleep(Duration::from_millis(*ms));
        }
        match *fault {
            Fault::Fail(r) if r == self.rank => Err(format!("rank {r} fails at x = {x}")),
            Fault::Longer(r) if r == self.rank => Ok(Tensor::full([5], *x)),
            _ => Ok(Tensor::full([3], self.rank as f32 + x)),
        }
    }
}

struct Head;

#[actor]
impl Head {
    fn scale(&mut self, t: &Tensor<f32>, x: &f32) -> f32 {
        t.as_slice()[0] * x
    }
}

graph! {
    Step(workers: [Worker], x: f32, fault: Fault, ms: u64) {
        let g = workers.grad(x, fault, ms);
        allreduce(g)
    }

    Piped(workers: [Worker], heads: [Head], x: f32, fault: Fault, ms: u64) {
        let g = workers.grad(x, fault, ms);
        let s = allreduce(g);
        let h = heads.scale(s, x);
        (s, h)
    }
}

fn workers(n: usize) -> Vec<Worker> {
    (0..n).map(|rank| Worker { rank, calls: 0 }).collect()
}

fn heads(n: usize) -> Vec<Head> {
    (0..n).map(|_| Head).collect()
}

/// The allreduced value of `grad` over `n` ranks for input `x`.
fn expected(n: usize, x: f32) -> f32 {
    (0..n).map(|r| r as f32 + x).sum()
}

fn options(max: usize) -> LaunchOptions {
    LaunchOptions::default().max_in_flight(max)
}

#[test]
fn four_in_flight_come_back_in_order() -> Result<(), Error> {
    within(60, || {
        let mut g = Step::launch_with(workers(4), Cpu, options(4))?;
        for round in 0..50 {
            let base = (round * 4) as f32;
            let mut tickets = Vec::new();
            for k in 0..4 {
                tickets.push(g.submit(base + k as f32, Fault::None, 1)?);
            }
            assert_eq!(g.in_flight(), 4);
            for (k, t) in tickets.into_iter().enumerate() {
                let out = g.wait(t)?;
                assert_eq!(out[2].to_vec(), vec![expected(4, base + k as f32); 3]);
            }
            assert_eq!(g.in_flight(), 0);
        }
        let w = g.teardown()?;
        assert!(w.iter().all(|w| w.calls == 200));
        Ok(())
    })
}

#[test]
fn four_in_flight_across_groups_and_waited_out_of_order() -> Result<(), Error> {
    within(60, || {
        let mut g = Piped::launch_with(workers(3), heads(3), Cpu, options(4))?;
        let tickets = (0..4)
            .map(|k| g.submit(k as f32, Fault::None, 5))
            .collect::<Result<Vec<_>, _>>()?;
        // Wait for the last first: the earlier results are collected and kept.
        let mut tickets = tickets.into_iter().rev();
        let mut got = Vec::new();
        for t in tickets.by_ref() {
            let k = t.index() as f32;
            let out = g.wait(t)?;
            got.push(k);
            assert_eq!(out[1].0.to_vec(), vec![expected(3, k); 3]);
            assert_eq!(out[1].1, expected(3, k) * k);
        }
        assert_eq!(got, vec![3.0, 2.0, 1.0, 0.0]);
        // `execute` still works between pipelined batches.
        let out = g.execute(9.0, Fault::None, 0)?;
        assert_eq!(out[0].1, expected(3, 9.0) * 9.0);
        g.teardown().map(drop)
    })
}

/// `in_flight` counts the executions whose results are neither read nor discarded: reading
/// the newest of four frees its room while the three older ones stay held for their tickets.
#[test]
fn reading_the_newest_result_frees_its_room() -> Result<(), Error> {
    within(60, || {
        let mut g = Step::launch_with(workers(2), Cpu, options(4))?;
        let mut tickets = (0..4)
            .map(|k| g.submit(k as f32, Fault::None, 0))
            .collect::<Result<Vec<_>, _>>()?;
        let newest = tickets.pop().expect("four tickets");
        assert_eq!(g.wait(newest)?[0].to_vec(), vec![expected(2, 3.0); 3]);
        assert_eq!(g.in_flight(), 3);
        let fifth = g.submit(4.0, Fault::None, 0)?;
        assert_eq!(g.in_flight(), 4);
        assert!(matches!(
            g.submit(5.0, Fault::None, 0),
            Err(Error::InFlightFull { max_in_flight: 4 })
        ));
        // Dropping a held result's ticket discards it and frees its room too.
        drop(tickets.remove(0));
        assert_eq!(
            g.execute(5.0, Fault::None, 0)?[1].to_vec(),
            vec![expected(2, 5.0); 3]
        );
        for (t, k) in tickets.into_iter().zip([1.0, 2.0]) {
            assert_eq!(g.wait(t)?[1].to_vec(), vec![expected(2, k); 3]);
        }
        assert_eq!(g.wait(fifth)?[0].to_vec(), vec![expected(2, 4.0); 3]);
        assert_eq!(g.in_flight(), 0);
        g.teardown().map(drop)
    })
}

#[test]
fn exceeding_the_bound_is_a_typed_error_and_changes_nothing() -> Result<(), Error> {
    within(60, || {
        let mut g = Step::launch_with(workers(2), Cpu, options(2))?;
        let t0 = g.submit(0.0, Fault::None, 20)?;
        let t1 = g.submit(1.0, Fault::None, 0)?;
        assert!(matches!(
            g.submit(2.0, Fault::None, 0),
            Err(Error::InFlightFull { max_in_flight: 2 })
        ));
        assert!(matches!(
            g.execute(2.0, Fault::None, 0),
            Err(Error::InFlightFull { max_in_flight: 2 })
        ));
        assert_eq!(g.in_flight(), 2);
        assert_eq!(g.wait(t0)?[0].to_vec(), vec![expected(2, 0.0); 3]);
        // Room for one again.
        let t2 = g.submit(2.0, Fault::None, 0)?;
        assert_eq!(g.wait(t1)?[1].to_vec(), vec![expected(2, 1.0); 3]);
        assert_eq!(g.wait(t2)?[1].to_vec(), vec![expected(2, 2.0); 3]);
        // `launch` means one in flight: a held ticket leaves no room for `execute`.
        let mut one = Step::launch(workers(2), Cpu)?;
        let t = one.submit(5.0, Fault::None, 0)?;
        assert!(matches!(
            one.execute(6.0, Fault::None, 0),
            Err(Error::InFlightFull { max_in_flight: 1 })
        ));
        assert_eq!(one.wait(t)?[0].to_vec(), vec![expected(2, 5.0); 3]);
        // A ticket of another graph.
        let foreign = one.submit(1.0, Fault::None, 0)?;
        assert!(matches!(g.wait(foreign), Err(Error::ForeignTicket)));
        // ... which was dropped by that failed `wait`: abandoned, its room comes back.
        assert_eq!(
            one.execute(7.0, Fault::None, 0)?[0].to_vec(),
            vec![expected(2, 7.0); 3]
        );
        one.teardown().map(drop)?;
        g.teardown().map(drop)
    })
}

#[test]
fn a_failure_in_flight_is_reported_for_its_ticket_only() -> Result<(), Error> {
    within(60, || {
        let mut g = Piped::launch_with(workers(4), heads(4), Cpu, options(4))?;
        let faults = [Fault::None, Fault::Fail(2), Fault::Longer(3), Fault::None];
        let tickets = faults
            .iter()
            .enumerate()
            .map(|(k, f)| g.submit(k as f32, *f, 2))
            .collect::<Result<Vec<_>, _>>()?;
        let results: Vec<_> = tickets.into_iter().map(|t| g.wait(t)).collect();
        match &results[0] {
            Ok(out) => assert_eq!(out[0].0.to_vec(), vec![expected(4, 0.0); 3]),
            Err(e) => panic!("execution 0 failed: {e}"),
        }
        match &results[1] {
            Err(Error::Method {
                group: "workers",
                rank: 2,
                method: "grad",
                ..
            }) => {}
            other => panic!("expected workers[2].grad's error, got {other:?}"),
        }
        match &results[2] {
            Err(Error::ShapeMismatch {
                slot: 0, counts, ..
            }) => {
                assert_eq!(
                    counts.iter().map(|c| c.1).collect::<Vec<_>>(),
                    vec![3, 3, 3, 5]
                )
            }
            other => panic!("expected a shape mismatch, got {other:?}"),
        }
        match &results[3] {
            Ok(out) => assert_eq!(out[3].1, expected(4, 3.0) * 3.0),
            Err(e) => panic!("execution 3 failed: {e}"),
        }
        g.teardown().map(drop)
    })
}

#[test]
fn dropped_tickets_free_their_room() -> Result<(), Error> {
    within(60, || {
        let mut g = Step::launch_with(workers(3), Cpu, options(3))?;
        for k in 0..3 {
            drop(g.submit(k as f32, Fault::None, 5)?);
        }
        // Full of abandoned executions: the next submission waits for the oldest.
        let t = g.submit(10.0, Fault::None, 0)?;
        assert_eq!(g.wait(t)?[0].to_vec(), vec![expected(3, 10.0); 3]);
        assert_eq!(g.in_flight(), 0);
        for k in 0..20 {
            let out = g.execute(k as f32, Fault::None, 0)?;
            assert_eq!(out[1].to_vec(), vec![expected(3, k as f32); 3]);
        }
        g.teardown().map(drop)
    })
}

#[test]
fn disagreements_while_ranks_run_ahead_never_corrupt_or_hang() -> Result<(), Error> {
    // A one-stage graph: a rank that returns from a failed stage early reaches the same
    // stage (and its slots) again in the next execution while a lagging peer checks it.
    within(120, || {
        let mut g = Step::launch_with(workers(4), Cpu, options(4))?;
        let mut seed = 0x9e37_79b9_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..300 {
            let faults: Vec<Fault> = (0..4)
                .map(|_| match next() % 4 {
                    0 => Fault::Longer((next() % 4) as usize),
                    1 => Fault::Fail((next() % 4) as usize),
                    _ => Fault::None,
                })
                .collect();
            let tickets = faults
                .iter()
                .enumerate()
                .map(|(k, f)| g.submit((round * 4 + k) as f32, *f, (round % 2) as u64))
                .collect::<Result<Vec<_>, _>>()?;
            for ((k, f), t) in faults.iter().enumerate().zip(tickets) {
                let x = (round * 4 + k) as f32;
                match (f, g.wait(t)) {
                    (Fault::None, Ok(out)) => {
                        assert!(out.iter().all(|o| o.to_vec() == vec![expected(4, x); 3]))
                    }
                    (Fault::Fail(r), Err(Error::Method { rank, .. })) => assert_eq!(rank, *r),
                    (Fault::Longer(_), Err(Error::ShapeMismatch { .. })) => {}
                    (f, other) => panic!("round {round}, execution {k} ({f:?}): {other:?}"),
                }
            }
        }
        g.teardown().map(drop)
    })
}

#[test]
fn submit_then_wait_async_from_tokio() -> Result<(), Error> {
    within(60, || {
        let rt = match tokio::runtime::Builder::new_current_thread().build() {
            Ok(rt) => rt,
            Err(e) => panic!("no runtime: {e}"),
        };
        let mut g = Piped::launch_with(workers(2), heads(2), Cpu, options(4))?;
        rt.block_on(async {
            let tickets = (0..4)
                .map(|k| g.submit(k as f32, Fault::None, 2))
                .collect::<Result<Vec<_>, _>>()?;
            for (k, t) in tickets.into_iter().enumerate() {
                let out = g.wait_async(t).await?;
                assert_eq!(out[1].0.to_vec(), vec![expected(2, k as f32); 3]);
            }
            // `execute_async` takes its place in the pipeline like `execute`.
            let t = g.submit(7.0, Fault::None, 0)?;
            let out = g.execute_async(8.0, Fault::None, 0).await?;
            assert_eq!(out[0].1, expected(2, 8.0) * 8.0);
            assert_eq!(g.wait_async(t).await?[0].1, expected(2, 7.0) * 7.0);
            Ok::<(), Error>(())
        })?;
        g.teardown().map(drop)
    })
}

//! Stages that go on while the actors compute: a stage starts where the graph has it and
//! is completed before the first call that reads one of its results. The `Lazy` backend
//! (`tests/support/lazy.rs`) runs each deferred stage's collective only at its completion
//! and leaves zeros in its buffers meanwhile, so a result read early would be wrong; its
//! log shows which calls ran while a stage was in flight.

use actorgraph::prelude::*;

use crate::support::lazy::{note, Lazy, Log};
use crate::support::within;

/// A data-parallel worker whose backward pass comes in three segments, each giving a
/// gradient bucket of its own, as a model split for overlap would.
struct Worker {
    rank: usize,
    log: Log,
    /// The rank whose `backward_mid` fails (an error), or panics (`panics`).
    fails: Option<usize>,
    panics: bool,
}

fn workers(n: usize, log: &Log) -> Vec<Worker> {
    (0..n)
        .map(|rank| Worker {
            rank,
            log: log.clone(),
            fails: None,
            panics: false,
        })
        .collect()
}

/// A value of rank `rank` that differs per rank and per element, so that a reduction in
/// the wrong order or of the wrong elements shows.
fn grads(rank: usize, len: usize, seed: f32) -> Vec<Tensor<f32>> {
    let r = rank as f32 + 1.0;
    vec![
        Tensor::from_vec((0..len).map(|i| seed / r + i as f32 * 0.1).collect(), [len]).unwrap(),
        Tensor::full([2, 3], seed * r),
    ]
}

#[actor]
impl Worker {
    fn backward_head(&mut self, batch: &f32) -> (Vec<Tensor<f32>>, f32) {
        note(&self.log, self.rank, "head");
        (grads(self.rank, 5, *batch), *batch * 2.0)
    }
    fn backward_mid(&mut self, a: &f32) -> Result<(Tensor<f64>, f32), String> {
        note(&self.log, self.rank, "mid");
        if self.fails == Some(self.rank) {
            if self.panics {
                panic!("mid panics on rank {}", self.rank);
            }
            return Err(format!("mid fails on rank {}", self.rank));
        }
        let g = Tensor::from_vec(vec![*a as f64 / 3.0, self.rank as f64 + 0.25], [2]).unwrap();
        Ok((g, *a + 1.0))
    }
    fn backward_tail(&mut self, b: &f32) -> f32 {
        note(&self.log, self.rank, "tail");
        *b * (self.rank as f32 + 0.5)
    }
    #[allow(clippy::ptr_arg)] // graph methods take each value's own type by reference
    fn apply(&mut self, r1: &f32, r2: &Tensor<f64>, r3: &Vec<Tensor<f32>>) -> f64 {
        note(&self.log, self.rank, "apply");
        let r3: f32 = r3.iter().flat_map(|t| t.as_slice().to_vec()).sum();
        *r1 as f64 + r2.as_slice().iter().sum::<f64>() + r3 as f64
    }
    fn part(&mut self, k: &usize) -> Tensor<i64> {
        Tensor::from_vec(
            (0..*k as i64 * 4)
                .map(|i| i * (self.rank as i64 + 1))
                .collect(),
            [*k * 4],
        )
        .unwrap()
    }
    #[allow(clippy::ptr_arg)] // graph methods take each value's own type by reference
    fn total(&mut self, r: &Vec<Tensor<f32>>) -> f32 {
        r.iter().flat_map(|t| t.as_slice().to_vec()).sum()
    }
    fn other(&mut self) -> f32 {
        note(&self.log, self.rank, "other");
        self.rank as f32 * 10.0
    }
}

graph! {
    Ddp(workers: [Worker], batch: f32) {
        let (g3, a) = workers.backward_head(batch);
        let r3 = allreduce(g3, Avg);
        let (g2, b) = workers.backward_mid(a);
        let r2 = allreduce(g2, Avg);
        let g1 = workers.backward_tail(b);
        let r1 = allreduce(g1, Avg);
        let step = workers.apply(r1, r2, r3);
        (step, r1, r2, r3)
    }
}

// Every collective, each one's results read only after another call.
graph! {
    Every(workers: [Worker], batch: f32, k: usize) {
        let (g, a) = workers.backward_head(batch);
        let p = workers.part(k);
        let gathered = allgather(g);
        let o1 = workers.other();
        let chunks = reducescatter(p, Max);
        let o2 = workers.other();
        let sent = broadcast(a, 1);
        let o3 = workers.other();
        let total = reduce(g, Sum, 0);
        let o4 = workers.other();
        let (ga, aa) = allreduce([g, a]);
        let o5 = workers.other();
        (gathered, chunks, sent, total, ga, aa, o1, o2, o3, o4, o5)
    }
}

type DdpOut = Vec<(f64, f32, Tensor<f64>, Vec<Tensor<f32>>)>;

fn ddp<B: Backend>(backend: B, overlap: bool, log: &Log) -> Result<Vec<DdpOut>, Error> {
    let options = LaunchOptions::default().overlap(overlap);
    let mut g = Ddp::launch_with(workers(3, log), backend, options)?;
    (0..3).map(|step| g.execute(step as f32 + 0.5)).collect()
}

/// What `rank` did, in order (its entries of the log).
fn of_rank(log: &Log, rank: usize) -> Vec<String> {
    let prefix = format!("{rank} ");
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|e| e.strip_prefix(&prefix).map(str::to_owned))
        .collect()
}

#[test]
fn each_stage_goes_on_while_the_next_segment_computes_with_the_same_results() {
    within(60, || {
        let (log, off_log) = (Log::default(), Log::default());
        let lazy = ddp(Lazy { log: log.clone() }, true, &log).unwrap();
        let synchronous = ddp(
            Lazy {
                log: off_log.clone(),
            },
            false,
            &off_log,
        )
        .unwrap();
        let cpu = ddp(Cpu, true, &Log::default()).unwrap();
        assert_eq!(lazy, synchronous);
        assert_eq!(lazy, cpu);
        // Every rank's results are the same bits, and the average is the average.
        for out in &lazy {
            assert!(out.iter().all(|o| o == &out[0]));
        }
        // The first step's `backward_tail` gets 2.0 on every rank.
        let expected: f32 = (0..3).map(|r| 2.0 * (r as f32 + 0.5)).sum::<f32>() / 3.0;
        assert_eq!(lazy[0][0].1, expected);
        // r3 is on the wire while `backward_mid` runs, r2 while `backward_tail` runs; the
        // last one completes before `apply`, which reads all three.
        let step = [
            "head", "start", "mid", "start", "tail", "start", "complete", "complete", "complete",
            "apply",
        ];
        let once: Vec<String> = step.iter().map(|s| s.to_string()).collect();
        for rank in 0..3 {
            let did = of_rank(&log, rank);
            assert_eq!(did[..step.len()], once[..], "rank {rank}: {did:?}");
            // Off, each stage runs to its end where the graph has it.
            let off = of_rank(&off_log, rank);
            let in_order = ["head", "stage", "mid", "stage", "tail", "stage", "apply"];
            assert_eq!(off[..in_order.len()], in_order.map(String::from)[..]);
        }
    });
}

#[test]
fn every_collective_gives_the_same_results_with_overlap_on_and_off() {
    within(60, || {
        let run = |overlap: bool| {
            let log = Log::default();
            let options = LaunchOptions::default().overlap(overlap);
            let mut g = Every::launch_with(workers(4, &log), Lazy { log: log.clone() }, options)?;
            let outs = (1..4)
                .map(|k| g.execute(k as f32 * 0.75, k))
                .collect::<Result<Vec<_>, Error>>()?;
            let starts = of_rank(&log, 0).iter().filter(|e| *e == "start").count();
            Ok::<_, Error>((outs, starts))
        };
        let (on, started) = run(true).unwrap();
        let (off, none) = run(false).unwrap();
        assert_eq!(on, off);
        // Five stages per execution, each started early with overlap on, none with it off.
        assert_eq!((started, none), (15, 0));
        let mut cpu = Every::launch(workers(4, &Log::default()), Cpu).unwrap();
        assert_eq!(on[2], cpu.execute(3.0 * 0.75, 3).unwrap());
    });
}

#[test]
fn a_stage_read_right_away_runs_to_its_end_where_it_is() {
    graph! {
        Right(workers: [Worker], batch: f32) {
            let (g, a) = workers.backward_head(batch);
            let r = allreduce(g);
            let t = workers.total(r);
            let m = workers.backward_tail(a);
            (t, m)
        }
    }
    within(60, || {
        let log = Log::default();
        let mut g = Right::launch(workers(2, &log), Lazy { log: log.clone() }).unwrap();
        g.execute(1.0).unwrap();
        assert!(!of_rank(&log, 0).contains(&"start".to_string()));
    });
}

#[test]
fn a_method_error_while_a_stage_is_in_flight_fails_the_execution_and_the_next_works() {
    within(60, || {
        for backend_lazy in [true, false] {
            let log = Log::default();
            let mut ws = workers(3, &log);
            ws.iter_mut().for_each(|w| w.fails = Some(1));
            let options = LaunchOptions::default();
            let mut g = match backend_lazy {
                true => Ddp::launch_with(ws, Lazy { log: log.clone() }, options),
                false => Ddp::launch_with(ws, Cpu, options),
            }
            .unwrap();
            match g.execute(1.0) {
                Err(Error::Method {
                    rank: 1,
                    method,
                    source,
                    ..
                }) => {
                    assert_eq!(method, "backward_mid");
                    assert_eq!(source.to_string(), "mid fails on rank 1");
                }
                other => panic!("expected rank 1's error, got {other:?}"),
            }
            // Every stage this execution started was completed on every rank.
            for rank in 0..3 {
                let did = of_rank(&log, rank);
                let count = |what: &str| did.iter().filter(|e| *e == what).count();
                assert_eq!(count("start"), count("complete"), "rank {rank}: {did:?}");
            }
            // And the next execution is what it would have been without the failure.
            g.each_workers(|_, w| w.fails = None).unwrap();
            let mut reference = Ddp::launch(workers(3, &Log::default()), Cpu).unwrap();
            assert_eq!(g.execute(2.0).unwrap(), reference.execute(2.0).unwrap());
        }
    });
}

#[test]
fn a_panic_while_a_stage_is_in_flight_poisons_that_actor_only() {
    within(60, || {
        let log = Log::default();
        let mut ws = workers(2, &log);
        ws.iter_mut().for_each(|w| {
            w.fails = Some(0);
            w.panics = true;
        });
        let mut g =
            Ddp::launch_with(ws, Lazy { log: log.clone() }, LaunchOptions::default()).unwrap();
        match g.execute(1.0) {
            Err(Error::Panic {
                rank: 0, message, ..
            }) => {
                assert_eq!(message, "mid panics on rank 0")
            }
            other => panic!("expected rank 0's panic, got {other:?}"),
        }
        assert!(matches!(
            g.execute(1.0),
            Err(Error::Poisoned { rank: 0, .. })
        ));
        // Teardown hands back the intact actor and names the poisoned one.
        let mut back = g.teardown_each();
        assert!(matches!(back[0], Err(Error::Poisoned { rank: 0, .. })));
        assert_eq!(back.remove(1).ok().map(|w| w.rank), Some(1));
    });
}

#[test]
fn after_failures_with_stages_in_flight_the_graph_runs_as_new() {
    within(60, || {
        let log = Log::default();
        let mut ws = workers(2, &log);
        // Rank 1 fails in the second segment: the first stage is in flight on both
        // ranks, the second and third are skipped.
        ws[1].fails = Some(1);
        let mut g =
            Ddp::launch_with(ws, Lazy { log: log.clone() }, LaunchOptions::default()).unwrap();
        assert!(g.execute(1.0).is_err());
        assert!(g.execute(2.0).is_err());
        // Once rank 1 stops failing, the same graph gives what a graph that never failed
        // gives: no stage was left half done on either rank.
        g.each_workers(|_, w| w.fails = None).unwrap();
        let mut reference = Ddp::launch(workers(2, &Log::default()), Cpu).unwrap();
        assert_eq!(g.execute(3.0).unwrap(), reference.execute(3.0).unwrap());
        let actors = g.teardown().unwrap();
        assert_eq!(actors.len(), 2);
    });
}

//! Graphs with several groups and edges between actors: pipelines, point-to-point
//! transfers, Ray's scheduling case, several outputs, failures across an edge, and the
//! launch checks of edges and actor indices.

use std::time::Duration;

use actorgraph::prelude::*;

use crate::support::within;

fn vals(t: &Tensor<f32>) -> Vec<f32> {
    t.to_vec()
}

/// What an actor should do wrong, and when: `(group, rank, call)`, 0-based groups.
#[derive(Clone, Copy, Debug, Default)]
struct Fault {
    group: usize,
    rank: usize,
    kind: FaultKind,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum FaultKind {
    #[default]
    None,
    Err,
    Panic,
    Sleep(u64),
}

impl Fault {
    fn hits(&self, group: usize, rank: usize) -> Option<FaultKind> {
        (self.group == group && self.rank == rank && self.kind != FaultKind::None)
            .then_some(self.kind)
    }

    fn apply(&self, group: usize, rank: usize) -> Result<(), String> {
        match self.hits(group, rank) {
            Some(FaultKind::Err) => Err(format!("fault on group {group} rank {rank}")),
            Some(FaultKind::Panic) => panic!("panic on group {group} rank {rank}"),
            Some(FaultKind::Sleep(ms)) => {
                std::thread::sleep(Duration::from_millis(ms));
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

const OK: Fault = Fault {
    group: 0,
    rank: 0,
    kind: FaultKind::None,
};

/// Stage 1 of a pipeline: `x * (rank + 1)`.
struct Encoder {
    rank: usize,
    calls: usize,
}

#[actor]
impl Encoder {
    fn encode(&mut self, x: &Tensor<f32>, fault: &Fault) -> Result<Tensor<f32>, String> {
        self.calls += 1;
        fault.apply(0, self.rank)?;
        let k = (self.rank + 1) as f32;
        Ok(Tensor::from_vec(x.as_slice().iter().map(|v| v * k).collect(), x.shape()).unwrap())
    }

    /// The last stage of a round trip: the decoders' answer, plus this rank.
    fn finish(&mut self, y: &Tensor<f64>) -> Tensor<f64> {
        let r = self.rank as f64;
        Tensor::from_vec(y.as_slice().iter().map(|v| v + r).collect(), y.shape()).unwrap()
    }
}

/// Stage 2, of another actor type: widens to f64 and adds `1000 * rank`.
struct Decoder {
    rank: usize,
    seen: usize,
}

#[actor]
impl Decoder {
    fn decode(&mut self, h: &Tensor<f32>, fault: &Fault) -> Result<Tensor<f64>, String> {
        self.seen += 1;
        fault.apply(1, self.rank)?;
        let base = 1000.0 * self.rank as f64;
        let v = h.as_slice().iter().map(|&v| v as f64 + base).collect();
        Ok(Tensor::from_vec(v, h.shape()).unwrap())
    }

    /// A second method of the same actor on the same received value.
    fn norm(&mut self, h: &Tensor<f32>) -> f32 {
        h.as_slice().iter().map(|v| v * v).sum()
    }

    /// One actor's summary of the decoded values.
    fn report(&mut self, y: &Tensor<f64>) -> String {
        format!("decoder {} saw {:?}", self.rank, y.to_vec())
    }
}

fn encoders(n: usize) -> Vec<Encoder> {
    (0..n).map(|rank| Encoder { rank, calls: 0 }).collect()
}

fn decoders(n: usize) -> Vec<Decoder> {
    (0..n).map(|rank| Decoder { rank, seen: 0 }).collect()
}

graph! {
    /// Two stages of different actor types: actor i of `encoders` feeds actor i of
    /// `decoders`, and both stages' values are outputs.
    Pipeline(encoders: [Encoder], decoders: [Decoder], x: Tensor<f32>, fault: Fault) {
        let h = encoders.encode(x, fault);
        let y = decoders.decode(h, fault);
        (h, y)
    }

    /// Collectives on both sides of the edge: the failure path must still join them.
    Reduced(encoders: [Encoder], decoders: [Decoder], x: Tensor<f32>, fault: Fault) {
        let h = encoders.encode(x, fault);
        let s = allreduce(h);
        let y = decoders.decode(s, fault);
        let m = allreduce(y, Max);
        (s, m)
    }

    /// A round trip: encoders -> decoders -> encoders, with single-actor values: one of a
    /// decoder about its own value, one of an encoder about its decoder's.
    RoundTrip(encoders: [Encoder], decoders: [Decoder], x: Tensor<f32>, fault: Fault) {
        let h = encoders.encode(x, fault);
        let y = decoders.decode(h, fault);
        let z = encoders.finish(y);
        let report = decoders[0].report(y);
        let last = encoders[1].finish(y);
        (z, report, last)
    }

    /// The same actor's two methods, both on a value that came over an edge, in one bucket.
    TwoMethodsOneBucket(encoders: [Encoder], decoders: [Decoder], x: Tensor<f32>, fault: Fault) {
        let h = encoders.encode(x, fault);
        let a = decoders.decode(h, fault);
        let n = decoders.norm(h);
        allreduce([a, n])
    }
}

#[test]
fn a_two_stage_pipeline_of_different_actor_types() {
    within(60, || {
        let mut g = Pipeline::launch(encoders(3), decoders(3), Cpu).unwrap();
        assert_eq!(Pipeline::GROUPS, &["encoders", "decoders"]);
        for round in 0..50 {
            let x = Tensor::from_slice(&[1.0, round as f32]);
            let out: Vec<(Tensor<f32>, Tensor<f64>)> = g.execute(x, OK).unwrap();
            assert_eq!(out.len(), 3);
            for (rank, (h, y)) in out.iter().enumerate() {
                let k = (rank + 1) as f32;
                assert_eq!(vals(h), vec![k, k * round as f32]);
                let base = 1000.0 * rank as f64;
                assert_eq!(
                    y.to_vec(),
                    vec![k as f64 + base, (k * round as f32) as f64 + base]
                );
            }
        }
        let (enc, dec) = g.teardown().unwrap();
        assert!(enc.iter().all(|e| e.calls == 50));
        assert!(dec.iter().all(|d| d.seen == 50));
    });
}

#[test]
fn collectives_on_both_sides_of_an_edge() {
    within(60, || {
        let mut g = Reduced::launch(encoders(4), decoders(4), Cpu).unwrap();
        for _ in 0..20 {
            let out = g.execute(Tensor::from_slice(&[1.0, 2.0]), OK).unwrap();
            for (s, m) in &out {
                // Sum over ranks of (rank + 1) * x = 10 * x.
                assert_eq!(vals(s), vec![10.0, 20.0]);
                // Max over decoders of 10 * x + 1000 * rank.
                assert_eq!(m.to_vec(), vec![3010.0, 3020.0]);
            }
        }
    });
}

#[test]
fn a_round_trip_and_a_single_actor_output() {
    within(60, || {
        let mut g = RoundTrip::launch(encoders(2), decoders(2), Cpu).unwrap();
        type Out = (Tensor<f64>, Option<String>, Option<Tensor<f64>>);
        let out: Vec<Out> = g.execute(Tensor::from_slice(&[1.0]), OK).unwrap();
        assert_eq!(out[0].0.to_vec(), vec![1.0]);
        assert_eq!(out[1].0.to_vec(), vec![2.0 + 1000.0 + 1.0]);
        assert_eq!(out[0].1.as_deref(), Some("decoder 0 saw [1.0]"));
        assert_eq!(out[1].1, None);
        assert!(out[0].2.is_none());
        assert_eq!(out[1].2.as_ref().map(|t| t.to_vec()), Some(vec![1003.0]));
    });
}

#[test]
fn the_same_actors_two_methods_feed_one_bucket() {
    within(60, || {
        let mut g = TwoMethodsOneBucket::launch(encoders(2), decoders(2), Cpu).unwrap();
        let out: Vec<(Tensor<f64>, f32)> = g.execute(Tensor::from_slice(&[1.0, 2.0]), OK).unwrap();
        for (a, n) in &out {
            // decoders: (x * 1) + 0 and (x * 2) + 1000, summed.
            assert_eq!(a.to_vec(), vec![1.0 + 1002.0, 2.0 + 1004.0]);
            // norms: 1 + 4 and 4 + 16.
            assert_eq!(*n, 25.0);
        }
    });
}

/// Ray's `w0.send(inp) -> w1.recv(t)` next to a collective over both workers.
struct Peer {
    rank: usize,
}

#[actor]
impl Peer {
    fn send(&mut self, inp: &Tensor<f32>) -> Tensor<f32> {
        let k = (self.rank + 1) as f32;
        Tensor::from_vec(inp.as_slice().iter().map(|v| v * k).collect(), inp.shape()).unwrap()
    }

    fn recv(&mut self, t: &Tensor<f32>) -> Tensor<f32> {
        Tensor::from_vec(t.as_slice().iter().map(|v| v + 100.0).collect(), t.shape()).unwrap()
    }
}

graph! {
    /// Ray's test, `x = w0.send(inp); y = w1.send(inp); t = w0.send(inp); w1.recv(t);
    /// allreduce([x, y])`: a per-actor value is Ray's list with one value per actor, so
    /// `xy` is `[x, y]`, and the point-to-point `t` crosses while the collective waits.
    RayCase(workers: [Peer; 2], inp: Tensor<f32>) {
        let x = workers[0].send(inp);
        let y = workers[1].send(inp);
        let t = workers[0].send(inp);
        let r = workers[1].recv(t);
        let xy = workers.send(inp);
        let s = allreduce(xy);
        (s, x, y, r)
    }

    /// The collective written between the send and the receive of the transfer.
    CollectiveInBetween(workers: [Peer], inp: Tensor<f32>) {
        let xy = workers.send(inp);
        let t = workers[0].send(inp);
        let s = allreduce(xy);
        let r = workers[1].recv(t);
        let s2 = allreduce(s);
        (s2, r)
    }

    /// A value of one actor read by every actor of its group (rank 0 keeps its own, the
    /// others receive a clone) and then reduced with another value in one bucket.
    OneToAll(workers: [Peer], inp: Tensor<f32>) {
        let t = workers[0].send(inp);
        let r = workers.recv(t);
        let x = workers.send(inp);
        allreduce([x, r])
    }
}

#[test]
fn rays_scheduling_case_does_not_deadlock() {
    within(120, || {
        let mut g = RayCase::launch([Peer { rank: 0 }, Peer { rank: 1 }], Cpu).unwrap();
        for i in 0..500 {
            let inp = Tensor::from_slice(&[1.0, i as f32]);
            let out = g.execute(inp).unwrap();
            let (s, x, y, r) = &out[0];
            assert_eq!(vals(s), vec![3.0, 3.0 * i as f32]);
            assert_eq!(x.as_ref().map(vals), Some(vec![1.0, i as f32]));
            assert_eq!(y, &None);
            assert_eq!(r, &None);
            let (s, x, y, r) = &out[1];
            assert_eq!(vals(s), vec![3.0, 3.0 * i as f32]);
            assert_eq!(x, &None);
            assert_eq!(y.as_ref().map(vals), Some(vec![2.0, 2.0 * i as f32]));
            assert_eq!(r.as_ref().map(vals), Some(vec![101.0, 100.0 + i as f32]));
        }
        g.teardown().unwrap();
    });
}

#[test]
fn a_collective_between_a_send_and_its_receive() {
    within(120, || {
        let mut g =
            CollectiveInBetween::launch((0..3).map(|rank| Peer { rank }).collect::<Vec<_>>(), Cpu)
                .unwrap();
        for _ in 0..300 {
            let out = g.execute(Tensor::from_slice(&[1.0])).unwrap();
            assert_eq!(vals(&out[2].0), vec![18.0]);
            assert_eq!(out[1].1.as_ref().map(vals), Some(vec![101.0]));
            assert!(out[0].1.is_none() && out[2].1.is_none());
        }
    });
}

#[test]
fn one_actors_value_read_by_its_whole_group() {
    within(120, || {
        let mut g =
            OneToAll::launch((0..4).map(|rank| Peer { rank }).collect::<Vec<_>>(), Cpu).unwrap();
        for _ in 0..300 {
            let out = g.execute(Tensor::from_slice(&[2.0])).unwrap();
            for (x, r) in &out {
                assert_eq!(vals(x), vec![2.0 * 10.0]);
                assert_eq!(vals(r), vec![4.0 * 102.0]);
            }
        }
    });
}

struct Splitter {
    rank: usize,
}

#[actor]
impl Splitter {
    fn split(&mut self) -> (Tensor<f32>, u64) {
        (Tensor::full([2], self.rank as f32), 10 * self.rank as u64)
    }

    /// Takes a tuple by reference and a scalar by value.
    fn join(&mut self, pair: &(Tensor<f32>, u64), extra: u64) -> Vec<f32> {
        let (t, n) = pair;
        t.as_slice()
            .iter()
            .map(|v| v + (*n + extra) as f32 + 1000.0 * self.rank as f32)
            .collect()
    }
}

graph! {
    /// Tuples and destructuring on one actor and on a whole group, across edges.
    Plumbing(a: [Splitter], b: [Splitter]) {
        let (t, n) = a[1].split();
        let pair = (t, n);
        let j = b[0].join(pair, n);
        let (u, m) = a.split();
        let k = b.join((u, m), m);
        (j, k)
    }
}

#[test]
fn tuples_of_one_actor_and_of_a_group_cross_edges() {
    within(60, || {
        let mut g = Plumbing::launch(
            (0..2).map(|rank| Splitter { rank }).collect::<Vec<_>>(),
            (0..2).map(|rank| Splitter { rank }).collect::<Vec<_>>(),
            Cpu,
        )
        .unwrap();
        for _ in 0..20 {
            let out: Vec<(Option<Vec<f32>>, Vec<f32>)> = g.execute().unwrap();
            // a[1] splits into ([1, 1], 10); b[0] adds 10 + 10.
            assert_eq!(out[0].0, Some(vec![21.0, 21.0]));
            assert_eq!(out[1].0, None);
            // a[r] splits into ([r, r], 10 r); b[r] adds 20 r + 1000 r.
            assert_eq!(out[0].1, vec![0.0, 0.0]);
            assert_eq!(out[1].1, vec![1021.0, 1021.0]);
        }
    });
}

fn method_error(e: &Error) -> (&'static str, usize, &'static str) {
    match e {
        Error::Method {
            group,
            rank,
            method,
            ..
        } => (*group, *rank, *method),
        other => panic!("expected a method error, got {other:?}"),
    }
}

#[test]
fn a_producer_error_is_what_the_consumer_side_execute_reports() {
    within(60, || {
        let mut g = Reduced::launch(encoders(3), decoders(3), Cpu).unwrap();
        let x = || Tensor::from_slice(&[1.0]);
        for round in 0..10 {
            let fault = Fault {
                group: 0,
                rank: round % 3,
                kind: FaultKind::Err,
            };
            let err = g.execute(x(), fault).unwrap_err();
            assert_eq!(method_error(&err), ("encoders", round % 3, "encode"));
            assert_eq!(
                err.to_string(),
                format!(
                    "method `encode` failed on rank {r} of group `encoders`: fault on group 0 rank {r}",
                    r = round % 3
                )
            );
            // The next execute works: every slot and stage is clean again.
            let out = g.execute(x(), OK).unwrap();
            assert_eq!(out[1].1.to_vec(), vec![2006.0]);
        }
    });
}

#[test]
fn random_faults_on_either_side_of_the_edges_never_hang() {
    within(120, || {
        let mut g = RoundTrip::launch(encoders(3), decoders(3), Cpu).unwrap();
        let mut h = Reduced::launch(encoders(3), decoders(3), Cpu).unwrap();
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n) as usize
        };
        for _ in 0..400 {
            let fault = Fault {
                group: next(2),
                rank: next(3),
                kind: if next(3) == 0 {
                    FaultKind::None
                } else {
                    FaultKind::Err
                },
            };
            let want = (fault.kind == FaultKind::Err).then(|| {
                let (group, method) = [("encoders", "encode"), ("decoders", "decode")][fault.group];
                (group, fault.rank, method)
            });
            let x = Tensor::from_slice(&[1.0, 2.0]);
            let got = g.execute(x.clone(), fault).err();
            assert_eq!(got.as_ref().map(method_error), want);
            let got = h.execute(x, fault).err();
            assert_eq!(got.as_ref().map(method_error), want);
        }
        g.teardown().unwrap();
        h.teardown().unwrap();
    });
}

#[test]
fn a_consumer_error_names_the_consumer() {
    within(60, || {
        let mut g = RoundTrip::launch(encoders(2), decoders(2), Cpu).unwrap();
        let fault = Fault {
            group: 1,
            rank: 1,
            kind: FaultKind::Err,
        };
        let err = g.execute(Tensor::from_slice(&[1.0]), fault).unwrap_err();
        assert_eq!(method_error(&err), ("decoders", 1, "decode"));
        assert!(g.execute(Tensor::from_slice(&[1.0]), OK).is_ok());
    });
}

#[test]
fn a_producer_panic_poisons_it_and_the_consumers_come_back() {
    within(60, || {
        let mut g = RoundTrip::launch(encoders(2), decoders(2), Cpu).unwrap();
        let fault = Fault {
            group: 0,
            rank: 1,
            kind: FaultKind::Panic,
        };
        match g.execute(Tensor::from_slice(&[1.0]), fault).unwrap_err() {
            Error::Panic {
                group,
                rank,
                method,
                ..
            } => assert_eq!((group, rank, method), ("encoders", 1, Some("encode"))),
            other => panic!("unexpected {other:?}"),
        }
        for _ in 0..3 {
            match g.execute(Tensor::from_slice(&[1.0]), OK).unwrap_err() {
                Error::Poisoned { group, rank, .. } => assert_eq!((group, rank), ("encoders", 1)),
                other => panic!("unexpected {other:?}"),
            }
        }
        let (enc, dec) = g.teardown_each();
        assert!(enc[0].is_ok() && matches!(enc[1], Err(Error::Poisoned { rank: 1, .. })));
        assert!(dec.iter().all(Result::is_ok));
    });
}

#[test]
fn a_failed_point_to_point_sender_is_reported_and_the_next_execute_works() {
    struct Sender {
        rank: usize,
    }
    #[actor]
    impl Sender {
        fn send(&mut self, fail: &bool) -> Result<Tensor<f32>, String> {
            if *fail && self.rank == 0 {
                Err(format!("rank {} cannot send", self.rank))
            } else {
                Ok(Tensor::full([2], 1.0 + self.rank as f32))
            }
        }
        fn recv(&mut self, t: &Tensor<f32>) -> Tensor<f32> {
            t.clone()
        }
    }
    graph! {
        P2p(workers: [Sender], fail: bool) {
            let t = workers[0].send(fail);
            let all = workers.send(fail);
            let r = workers[1].recv(t);
            let s = allreduce(all);
            (s, r)
        }
    }
    within(60, || {
        let mut g =
            P2p::launch((0..3).map(|rank| Sender { rank }).collect::<Vec<_>>(), Cpu).unwrap();
        for _ in 0..5 {
            let err = g.execute(true).unwrap_err();
            assert_eq!(method_error(&err), ("workers", 0, "send"));
            let out = g.execute(false).unwrap();
            assert_eq!(vals(&out[0].0), vec![6.0, 6.0]);
            assert_eq!(out[1].1.as_ref().map(vals), Some(vec![1.0, 1.0]));
        }
    });
}

#[test]
fn a_stuck_producer_times_out_in_its_own_group_and_teardown_is_bounded() {
    within(60, || {
        let mut g = Reduced::launch(encoders(2), decoders(2), Cpu).unwrap();
        let fault = Fault {
            group: 0,
            rank: 1,
            kind: FaultKind::Sleep(1_500),
        };
        let err = g
            .execute_timeout(
                Tensor::from_slice(&[1.0]),
                fault,
                Duration::from_millis(100),
            )
            .unwrap_err();
        match &err {
            Error::Timeout { group, ranks, .. } => {
                assert_eq!((*group, ranks.as_slice()), ("encoders", &[1][..]))
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            g.execute(Tensor::from_slice(&[1.0]), OK),
            Err(Error::Broken { .. })
        ));
        let (enc, dec) = g.teardown().unwrap();
        assert_eq!((enc.len(), dec.len()), (2, 2));
    });
}

graph! {
    /// The consumer group declared (hence collected) first.
    ConsumerFirst(decoders: [Decoder], encoders: [Encoder], x: Tensor<f32>, fault: Fault) {
        let h = encoders.encode(x, fault);
        decoders.decode(h, fault)
    }
}

#[test]
fn a_timeout_names_the_stuck_producer_even_when_its_consumer_is_collected_first() {
    within(60, || {
        let mut g = ConsumerFirst::launch(decoders(2), encoders(2), Cpu).unwrap();
        assert!(g.execute(Tensor::from_slice(&[1.0]), OK).is_ok());
        let fault = Fault {
            group: 0,
            rank: 0,
            kind: FaultKind::Sleep(1_000),
        };
        let err = g
            .execute_timeout(
                Tensor::from_slice(&[1.0]),
                fault,
                Duration::from_millis(100),
            )
            .unwrap_err();
        match &err {
            Error::Timeout { group, ranks, .. } => {
                assert_eq!((*group, ranks.as_slice()), ("encoders", &[0][..]), "{err}")
            }
            other => panic!("unexpected {other:?}"),
        }
        let (dec, enc) = g.teardown().unwrap();
        assert_eq!((dec.len(), enc.len()), (2, 2));
    });
}

/// An input whose clone panics once its budget is spent.
struct Fragile(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Clone for Fragile {
    fn clone(&self) -> Self {
        use std::sync::atomic::Ordering::SeqCst;
        if self.0.fetch_sub(1, SeqCst) == 0 {
            panic!("clone budget exhausted");
        }
        Fragile(self.0.clone())
    }
}

struct Reader {
    rank: usize,
}

#[actor]
impl Reader {
    fn read(&mut self, _f: &Fragile) -> Tensor<f32> {
        Tensor::full([1], self.rank as f32)
    }
    fn relay(&mut self, t: &Tensor<f32>, _f: &Fragile) -> Tensor<f32> {
        t.clone()
    }
}

graph! {
    Relay(first: [Reader], second: [Reader], f: Fragile) {
        let t = first.read(f);
        second.relay(t, f)
    }
}

#[test]
fn an_execute_that_unwound_in_the_driver_breaks_the_graph() {
    within(60, || {
        let budget = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(2));
        let mut g = Relay::launch(
            (0..3).map(|rank| Reader { rank }).collect::<Vec<_>>(),
            (0..3).map(|rank| Reader { rank }).collect::<Vec<_>>(),
            Cpu,
        )
        .unwrap();
        // Some actors get their input, then a clone panics: `first` ran, `second` did not.
        let f = Fragile(budget.clone());
        let panicked =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.execute(f))).is_err();
        assert!(panicked);
        budget.store(usize::MAX / 2, std::sync::atomic::Ordering::SeqCst);
        match g.execute(Fragile(budget.clone())) {
            Err(Error::Broken { reason, .. }) => assert!(reason.contains("panicked"), "{reason}"),
            other => panic!("unexpected {:?}", other.map(|v| v.len())),
        }
        let (a, b) = g.teardown_each();
        assert_eq!((a.len(), b.len()), (3, 3));
    });
}

#[test]
fn groups_joined_by_a_per_actor_edge_must_have_the_same_size() {
    match Pipeline::launch(encoders(3), decoders(2), Cpu) {
        Err(e @ Error::EdgeSizeMismatch { .. }) => {
            assert_eq!(
                e.to_string(),
                "value `h` of group `encoders` (3 actors) is read by group `decoders` (2 actors): actor i of one feeds actor i of the other, so both groups must have the same size (between groups of different sizes, read one rank's value, `h[k]`, or every rank's on one actor, `gather(h)`)"
            );
        }
        Err(other) => panic!("unexpected {other}"),
        Ok(_) => panic!("must not launch"),
    }
}

#[test]
fn an_actor_index_past_the_group_is_a_launch_error() {
    match CollectiveInBetween::launch(vec![Peer { rank: 0 }], Cpu) {
        Err(Error::IndexOutOfRange {
            group: "workers",
            index: 1,
            size: 1,
        }) => {}
        Err(other) => panic!("unexpected {other}"),
        Ok(_) => panic!("must not launch"),
    }
}

#[test]
fn to_dot_draws_groups_stages_and_edges() {
    let dot = Reduced::to_dot();
    for needle in [
        "digraph \"Reduced\"",
        "subgraph cluster_encoders",
        "subgraph cluster_decoders",
        "label=\"encoders: [Encoder]\"",
        "in_x [label=\"x: Tensor<f32>\"",
        "allreduce(h)\\nfused stage, 1 value",
        "allreduce(y, Max)\\nfused stage, 1 value",
        "label=\"s (rank i → i)\", style=bold",
        "-> out",
    ] {
        assert!(dot.contains(needle), "{needle:?} not in\n{dot}");
    }
    let ray = RayCase::to_dot();
    assert!(ray.contains("label=\"workers: [Peer; 2]\""), "{ray}");
    assert!(ray.contains("workers[0].send"), "{ray}");
    assert!(ray.contains("t (rank 0 → 1)"), "{ray}");
    assert!(OneToAll::to_dot().contains("t (rank 0 → the others)"));
    let round_trip = RoundTrip::to_dot();
    assert!(round_trip.contains("y (rank i → i)"), "{round_trip}");
    assert!(round_trip.contains("y (rank 1 → 1)"), "{round_trip}");
    assert!(round_trip.contains("encoders[1].finish"), "{round_trip}");
}

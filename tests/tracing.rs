//! The `tracing` spans (feature `tracing`), seen by a test subscriber: one per `execute`,
//! per actor step, per method call, per fused stage and per collective, with their fields
//! and nesting; and without the feature, none at all.
//!
//! A binary of its own: the test without the feature installs a global subscriber, which
//! would see every other test's spans. CI runs it once with the feature (the README's
//! test command) and once without (`cargo test --test tracing`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use actorgraph::prelude::*;
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// One span as the subscriber saw it.
#[derive(Clone, Debug)]
struct Seen {
    name: &'static str,
    target: String,
    fields: BTreeMap<&'static str, String>,
    /// Its parent, by position in the list.
    parent: Option<usize>,
    thread: String,
}

impl Seen {
    fn field(&self, name: &str) -> &str {
        self.fields.get(name).map_or_else(
            || panic!("span `{}` has no field `{name}`: {self:?}", self.name),
            String::as_str,
        )
    }
}

/// A `Layer` that keeps every span it is told of, with its fields (also the ones recorded
/// later) and its parent.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Seen>>>);

/// A span's position in the capture, kept in the span's extensions.
struct Index(usize);

struct Fields<'a>(&'a mut BTreeMap<&'static str, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name(), value.to_string());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("a new span is in the registry");
        let parent = span
            .parent()
            .and_then(|p| p.extensions().get::<Index>().map(|i| i.0));
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let mut seen = self.0.lock().unwrap();
        seen.push(Seen {
            name: attrs.metadata().name(),
            target: attrs.metadata().target().to_string(),
            fields,
            parent,
            thread: std::thread::current().name().unwrap_or("").to_string(),
        });
        span.extensions_mut().insert(Index(seen.len() - 1));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("a recorded span is in the registry");
        let index = span.extensions().get::<Index>().map(|i| i.0);
        if let Some(i) = index {
            values.record(&mut Fields(&mut self.0.lock().unwrap()[i].fields));
        }
    }
}

impl Capture {
    fn spans(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }
}

struct Worker {
    rank: usize,
}

#[actor]
impl Worker {
    fn grads(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        Tensor::full([6], x.to_vec()[0] + self.rank as f32)
    }
    fn count(&mut self) -> i64 {
        1
    }
}

graph! {
    /// A method call per worker and one fused stage over an `f32` tensor and an `i64`.
    TracedStep(traced: [Worker], x: Tensor<f32>) {
        let g = traced.grads(x);
        let n = traced.count();
        allreduce([g, n], Sum)
    }
}

/// Runs `executions` executions of a 2-worker `TracedStep`, checking the results.
fn run(executions: usize) {
    let workers: Vec<Worker> = (0..2).map(|rank| Worker { rank }).collect();
    let mut g = TracedStep::launch(workers, Cpu).unwrap();
    for _ in 0..executions {
        let out = g.execute(Tensor::full([1], 1.0)).unwrap();
        assert_eq!(out[1].0.to_vec(), vec![3.0; 6]);
        assert_eq!(out[1].1, 2);
    }
    g.teardown().unwrap();
}

#[cfg(feature = "tracing")]
#[test]
fn every_execute_step_method_and_stage_has_a_span_with_its_fields_and_parent() {
    // A scoped subscriber: the actor threads use it too, as it was current at launch.
    let spans = captured(|| run(2));
    assert!(spans.iter().all(|s| s.target == "actorgraph"), "{spans:?}");
    let named = |name: &'static str| spans.iter().filter(move |s| s.name == name);

    let executes: Vec<_> = named("execute").collect();
    assert_eq!(executes.len(), 2, "{spans:?}");
    for (i, e) in executes.iter().enumerate() {
        assert_eq!(e.field("graph"), "TracedStep");
        assert_eq!(e.field("execution"), i.to_string());
    }

    // A step per rank per execution, on the rank's thread or, when the driver runs it
    // (rank 0's, or one no thread had started), on the driver's, inside its `execute`.
    let steps: Vec<(usize, &Seen)> = spans
        .iter()
        .enumerate()
        .filter(|(_, s)| s.name == "step")
        .collect();
    assert_eq!(steps.len(), 4, "{spans:?}");
    for execution in 0..2 {
        for rank in 0..2 {
            let (_, step) = steps
                .iter()
                .find(|(_, s)| {
                    s.field("execution") == execution.to_string()
                        && s.field("rank") == rank.to_string()
                })
                .unwrap_or_else(|| panic!("no step of rank {rank}, execution {execution}"));
            assert_eq!(step.field("group"), "traced");
            if step.thread == format!("actorgraph-traced-{rank}") {
                assert_eq!(step.parent, None);
            } else {
                // On the driver's thread: rank 0's, or a step no actor thread had started.
                let parent = &spans[step.parent.expect("inside `execute`")];
                assert_eq!(parent.name, "execute");
                assert_eq!(parent.field("execution"), execution.to_string());
            }
        }
    }
    let step_of = |s: &Seen| {
        let parent = s.parent.expect("inside a step");
        assert_eq!(spans[parent].name, "step", "{s:?}");
        &spans[parent]
    };

    let methods: Vec<_> = named("method").collect();
    assert_eq!(methods.len(), 8, "{spans:?}");
    for method in ["grads", "count"] {
        assert_eq!(
            methods
                .iter()
                .filter(|m| m.field("method") == method)
                .count(),
            4
        );
    }
    for m in &methods {
        let step = step_of(m);
        assert_eq!(m.field("group"), "traced");
        assert_eq!(m.field("rank"), step.field("rank"));
        assert!(m.field("actor").ends_with("Worker"), "{m:?}");
    }

    let stages: Vec<(usize, &Seen)> = spans
        .iter()
        .enumerate()
        .filter(|(_, s)| s.name == "stage")
        .collect();
    assert_eq!(stages.len(), 4, "{spans:?}");
    for (at, st) in &stages {
        let step = step_of(st);
        assert_eq!(st.field("rank"), step.field("rank"));
        assert_eq!(st.field("group"), "traced");
        assert_eq!(st.field("stage"), "allreduce([g, n], Sum)");
        assert_eq!(st.field("values"), "g n");
        assert_eq!(st.field("collective"), "allreduce");
        assert_eq!(st.field("op"), "sum");
        assert_eq!(st.field("slots"), "2");
        // 6 f32s and one i64.
        assert_eq!(st.field("bytes"), (6 * 4 + 8).to_string());
        assert_eq!(st.field("dtypes"), "f32:6 i64:1");
        // The collective itself, inside the stage.
        let inner: Vec<_> = spans
            .iter()
            .filter(|s| s.name == "collective" && s.parent == Some(*at))
            .collect();
        assert_eq!(inner.len(), 1, "{spans:?}");
        assert_eq!(inner[0].field("collective"), "allreduce");
        assert_eq!(inner[0].field("bytes"), "32");
    }
    assert_eq!(named("collective").count(), 4);
}

struct Coord;

#[actor]
impl Coord {
    #[allow(clippy::ptr_arg)] // graph methods take each value's own type by reference
    fn total(&mut self, counts: &Vec<i64>) -> i64 {
        counts.iter().sum()
    }
}

graph! {
    /// Values over edges: every worker's count, gathered on one coordinator.
    Gathered(gw: [Worker], coord: [Coord; 1]) {
        let n = gw.count();
        coord[0].total(gather(n))
    }
}

/// The coordinator's total, from the output of every rank of `Gathered` (one holds it).
fn total(out: Result<Vec<Option<i64>>, Error>) -> i64 {
    let totals: Vec<i64> = out.unwrap().into_iter().flatten().collect();
    assert_eq!(totals.len(), 1);
    totals[0]
}

/// A capture subscriber made the default of this thread while `f` runs; its spans.
#[cfg(feature = "tracing")]
fn captured(f: impl FnOnce()) -> Vec<Seen> {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::layer::SubscriberExt::with(
        tracing_subscriber::registry(),
        capture.clone(),
    );
    tracing::subscriber::with_default(subscriber, f);
    capture.spans()
}

#[cfg(feature = "tracing")]
#[test]
fn submit_wait_async_and_edges_have_spans() {
    let spans = captured(|| {
        let workers: Vec<Worker> = (0..3).map(|rank| Worker { rank }).collect();
        let mut g = Gathered::launch(workers, [Coord], Cpu).unwrap();
        g.execute().unwrap();
        let ticket = g.submit().unwrap();
        assert_eq!(total(g.wait(ticket)), 3);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(total(rt.block_on(g.execute_async())), 3);
        g.teardown().unwrap();
    });
    let driver: Vec<(&str, &str)> = spans
        .iter()
        .filter(|s| matches!(s.name, "submit" | "wait" | "execute"))
        .map(|s| {
            assert_eq!(s.field("graph"), "Gathered");
            (s.name, s.field("execution"))
        })
        .collect();
    assert_eq!(
        driver,
        [
            ("execute", "0"),
            ("submit", "1"),
            ("wait", "1"),
            ("execute", "2")
        ]
    );
    // Each worker sends its count over the gather edge; the coordinator receives them.
    let sends: Vec<_> = spans.iter().filter(|s| s.name == "send").collect();
    let recvs: Vec<_> = spans.iter().filter(|s| s.name == "recv").collect();
    assert_eq!((sends.len(), recvs.len()), (3 * 3, 3), "{spans:?}");
    for s in sends.iter().chain(&recvs) {
        assert_eq!(s.field("value"), "n");
        let step = &spans[s.parent.expect("inside a step")];
        assert_eq!(step.name, "step");
        let group = if s.name == "send" { "gw" } else { "coord" };
        assert_eq!(step.field("group"), group);
    }
    assert!(recvs.iter().all(|r| r.field("from_group") == "gw"));
}

#[cfg(not(feature = "tracing"))]
#[test]
fn without_the_feature_nothing_is_recorded() {
    let capture = Capture::default();
    // Global, so that the actor threads would report to it too if anything were there.
    tracing::subscriber::set_global_default(tracing_subscriber::layer::SubscriberExt::with(
        tracing_subscriber::registry(),
        capture.clone(),
    ))
    .unwrap();
    // The subscriber works: it records a span of this test's own.
    tracing::info_span!("own", feature = "off").in_scope(|| {
        run(3);
        let workers: Vec<Worker> = (0..3).map(|rank| Worker { rank }).collect();
        let mut g = Gathered::launch(workers, [Coord], Cpu).unwrap();
        let ticket = g.submit().unwrap();
        assert_eq!(total(g.wait(ticket)), 3);
    });
    let spans = capture.spans();
    assert_eq!(spans.len(), 1, "{spans:?}");
    let own = &spans[0];
    assert_eq!(
        (own.name, own.target.as_str(), own.parent),
        ("own", "tracing", None)
    );
    assert_eq!(own.field("feature"), "off");
    assert_eq!(Some(own.thread.as_str()), std::thread::current().name());
}

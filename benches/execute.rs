//! Per-execute latency of small graphs: the fixed cost of a compiled graph.

use std::hint::black_box;
use std::time::{Duration, Instant};

use actorgraph::prelude::*;
use criterion::{criterion_group, Criterion};

struct Echo;

#[actor]
impl Echo {
    fn echo(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        x.clone()
    }
}

graph! {
    EchoGraph(workers: [Echo], x: Tensor<f32>) {
        workers.echo(x)
    }
}

graph! {
    /// Each actor of `first` hands its echo to the actor of `second` with its rank: one
    /// edge per pair, crossing between threads.
    Relay(first: [Echo], second: [Echo], x: Tensor<f32>) {
        let y = first.echo(x);
        second.echo(y)
    }
}

fn echo(c: &mut Criterion) {
    let mut group = c.benchmark_group("echo");
    group.measurement_time(Duration::from_secs(5));
    for n in [1usize, 2, 4, 8] {
        let x = Tensor::full([4], 1.0f32);
        let mut graph = None;
        group.bench_function(format!("{n} actors"), |b| {
            let g = graph.get_or_insert_with(|| {
                EchoGraph::launch((0..n).map(|_| Echo).collect::<Vec<_>>(), Cpu).unwrap()
            });
            b.iter(|| g.execute(x.clone()).unwrap())
        });
    }
    group.finish();
}

/// A value over an edge: `first[i]` -> `second[i]`, `n` pairs, against `echo` of as many
/// actors (the same threads and handoffs, no edge).
fn relay(c: &mut Criterion) {
    let mut group = c.benchmark_group("relay");
    group.measurement_time(Duration::from_secs(5));
    for pairs in [1usize, 2] {
        let x = Tensor::full([4], 1.0f32);
        let echoes = || (0..pairs).map(|_| Echo).collect::<Vec<_>>();
        let mut g = Relay::launch(echoes(), echoes(), Cpu).unwrap();
        group.bench_function(format!("{pairs} pairs"), |b| {
            b.iter(|| g.execute(x.clone()).unwrap())
        });
    }
    group.finish();
}

/// `execute_async` awaited on a tokio current-thread runtime against `execute`, on the same
/// graph, alternately in one group: the cost of the async path.
fn echo_async(c: &mut Criterion) {
    let mut group = c.benchmark_group("echo async");
    group.measurement_time(Duration::from_secs(5));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for n in [1usize, 2, 8] {
        let x = Tensor::full([4], 1.0f32);
        let mut g = EchoGraph::launch((0..n).map(|_| Echo).collect::<Vec<_>>(), Cpu).unwrap();
        group.bench_function(format!("{n} actors/execute"), |b| {
            b.iter(|| g.execute(x.clone()).unwrap())
        });
        // As an async program awaits it: one `block_on` for the whole sample; then with
        // the poll running the steps no thread has started.
        let options = LaunchOptions::default().poll_runs_steps(true);
        let mut polled =
            EchoGraph::launch_with((0..n).map(|_| Echo).collect::<Vec<_>>(), Cpu, options).unwrap();
        for (name, g) in [
            ("execute_async", &mut g),
            ("execute_async poll_runs_steps", &mut polled),
        ] {
            group.bench_function(format!("{n} actors/{name}"), |b| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let start = Instant::now();
                        for _ in 0..iters {
                            black_box(g.execute_async(x.clone()).await.unwrap());
                        }
                        start.elapsed()
                    })
                })
            });
        }
        // Each call in a `block_on` of its own: the runtime's entry and exit on top.
        group.bench_function(format!("{n} actors/block_on(execute_async)"), |b| {
            b.iter(|| rt.block_on(g.execute_async(x.clone())).unwrap())
        });
    }
    group.finish();
}

/// `echo` with the feature `tracing` and a subscriber that takes every span: the
/// `tracing-subscriber` registry, which every `Layer` (a Chrome trace, a log) sits on. Made
/// the default of the launching thread, so the actor threads use it too.
#[cfg(feature = "tracing")]
fn echo_traced(c: &mut Criterion) {
    let mut group = c.benchmark_group("echo traced");
    group.measurement_time(Duration::from_secs(5));
    for n in [1usize, 2, 4, 8] {
        let x = Tensor::full([4], 1.0f32);
        tracing::subscriber::with_default(tracing_subscriber::registry(), || {
            let mut g = EchoGraph::launch((0..n).map(|_| Echo).collect::<Vec<_>>(), Cpu).unwrap();
            group.bench_function(format!("{n} actors"), |b| {
                b.iter(|| g.execute(x.clone()).unwrap())
            });
        });
    }
    group.finish();
}

/// CPU time this process uses per second of wall time while a launched 8-actor graph sits
/// idle between executes: the waiters must have parked, not be spinning or yielding.
fn idle_cpu() {
    fn cpu_seconds() -> f64 {
        // utime + stime of this process, in clock ticks (fields 14 and 15 of /proc/self/stat).
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        };
        (ticks(11) + ticks(12)) / 100.0
    }
    let mut g = EchoGraph::launch((0..8).map(|_| Echo).collect::<Vec<_>>(), Cpu).unwrap();
    for _ in 0..1000 {
        g.execute(Tensor::full([4], 1.0)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    let (cpu0, wall0) = (cpu_seconds(), std::time::Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let busy = (cpu_seconds() - cpu0) / wall0.elapsed().as_secs_f64();
    println!(
        "idle: 8 actors between executes use {:.1}% of one core",
        busy * 100.0
    );
    g.teardown().unwrap();
}

#[cfg(not(feature = "tracing"))]
criterion_group!(benches, echo, relay, echo_async);
#[cfg(feature = "tracing")]
criterion_group!(benches, echo, relay, echo_traced, echo_async);

fn main() {
    idle_cpu();
    benches();
    Criterion::default().configure_from_args().final_summary();
}

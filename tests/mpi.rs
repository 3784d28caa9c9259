//! The MPI backend over real processes: each test starts `mpirun` over this test binary
//! itself, under a watchdog, and the processes run one scenario of `worker` (chosen by
//! `ACTORGRAPH_MPI_SCENARIO`, with the actors of each process in `ACTORGRAPH_MPI_LAYOUT`,
//! e.g. `1,2,1`). Every process checks its own actors' results against
//! `reduce_reference` over every rank of the group, bit for bit, and fails (non-zero exit)
//! otherwise; the test passes when `mpirun` does.
//!
//! Needs OpenMPI's `mpirun` (`.ci/run` installs it). Runs as root too.
#![cfg(feature = "mpi")]

use actorgraph::comm::reduce_reference;
use actorgraph::half::{bf16, f16};
use actorgraph::mpi::Mpi;
use actorgraph::prelude::*;
use actorgraph::{BoxError, DType, Element, Reduced};

#[path = "support/expect.rs"]
mod expect;
#[path = "support/mpirun.rs"]
mod mpirun;

use mpirun::{mpirun, passes, SHM, TCP};

#[test]
fn collectives_2_processes_of_1_actor_over_shared_memory() {
    passes("collectives", &[1, 1], SHM);
}

#[test]
fn collectives_2_processes_of_2_actors_over_shared_memory() {
    passes("collectives", &[2, 2], SHM);
}

#[test]
fn collectives_3_processes_of_1_2_1_actors_over_shared_memory() {
    passes("collectives", &[1, 2, 1], SHM);
}

#[test]
fn collectives_2_processes_of_1_actor_over_tcp() {
    passes("collectives", &[1, 1], TCP);
}

#[test]
fn collectives_2_processes_of_2_actors_over_tcp() {
    passes("collectives", &[2, 2], TCP);
}

#[test]
fn collectives_3_processes_of_1_2_1_actors_over_tcp() {
    passes("collectives", &[1, 2, 1], TCP);
}

#[test]
fn collectives_without_shared_memory_when_one_process_turns_it_off() {
    passes("collectives_one_without_shared_memory", &[1, 2, 1], SHM);
}

#[test]
fn failures_are_the_same_error_on_every_process_and_the_graph_stays_usable() {
    passes("failures", &[1, 2, 1], SHM);
    passes("failures", &[2, 2], TCP);
}

#[test]
fn each_runs_on_the_actors_of_each_process_and_the_next_execution_sees_it() {
    passes("each", &[1, 2, 1], SHM);
}

#[test]
fn launches_that_differ_between_processes_fail_on_every_process() {
    passes("launch", &[1, 2], SHM);
}

#[test]
fn a_process_that_panics_ends_the_run_without_a_hang() {
    // Not the watchdog: MPI_Abort, from the panicking process's unwinding.
    let run = mpirun("panics", &[1, 1, 1], SHM);
    assert!(!run.success, "{}", run.output);
    assert!(
        run.output.contains("process 1 panics now"),
        "{}",
        run.output
    );
    assert!(
        run.output.contains("MPI_Abort ends every process"),
        "{}",
        run.output
    );
}

#[test]
fn a_process_that_dies_ends_the_run_without_a_hang() {
    let run = mpirun("dies", &[1, 1, 1], SHM);
    assert!(!run.success, "{}", run.output);
    assert!(run.output.contains("process 1 exits now"), "{}", run.output);
}

// ---------------------------------------------------------------------------------------
// The worker: what every process of a run does.

// ---------------------------------------------------------------------------------------
// What the docs tell a user to run.

/// The README and the reference page `reference::mpi`, by name.
fn docs() -> Vec<(&'static str, String)> {
    let root = env!("CARGO_MANIFEST_DIR");
    ["README.md", "src/reference/mpi.md"]
        .into_iter()
        .map(|name| {
            let text = std::fs::read_to_string(format!("{root}/{name}")).unwrap();
            (name, text)
        })
        .collect()
}

/// Whether `line` builds example `example` with feature `mpi`.
fn builds(line: &str, example: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |flag: &str| {
        words
            .windows(2)
            .find(|w| w[0] == flag)
            .map(|w| w[1].trim_matches(['`', '(', ')', ',']))
    };
    line.contains("cargo build")
        && after("--example") == Some(example)
        && after("--features").is_some_and(|f| f.split(',').any(|f| f == "mpi"))
}

/// A binary that `mpirun` or `srun` starts does not exist until it is built with feature
/// `mpi`: every such line of the docs comes after, in its section, the command that builds
/// it.
#[test]
fn the_docs_build_every_example_before_mpirun_or_srun_starts_it() {
    for (name, text) in docs() {
        let mut section: Vec<&str> = Vec::new();
        let mut in_code = false;
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
            } else if !in_code && line.starts_with('#') {
                section.clear();
            }
            let command = line.trim_start();
            let starts = command.starts_with("mpirun ") || command.starts_with("srun ");
            let example = line
                .split("target/release/examples/")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next());
            if let (true, Some(example)) = (starts, example) {
                assert!(
                    section.iter().any(|l| builds(l, example)),
                    "{name}:{}: `{command}` starts example `{example}`, which nothing \
                     before it in its section builds with `--features mpi`",
                    n + 1
                );
            }
            section.push(line);
        }
    }
}

/// The reference's `sbatch` script is bash that parses, asks Slurm for its layout and
/// starts the processes with `srun --mpi=pmix`.
#[test]
fn the_slurm_script_of_the_reference_parses() {
    let (_, page) = docs().pop().unwrap();
    let script = page
        .split("```sh\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .find(|block| block.starts_with("#!/bin/bash"))
        .expect("reference::mpi has an sbatch script");
    for needed in [
        "#SBATCH --nodes",
        "#SBATCH --cpus-per-task",
        "srun --mpi=pmix",
    ] {
        assert!(
            script.contains(needed),
            "the script lacks `{needed}`:\n{script}"
        );
    }
    let mut bash = std::process::Command::new("bash")
        .arg("-n")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("bash");
    use std::io::Write;
    bash.stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(bash.wait().unwrap().success(), "not bash:\n{script}");
}

#[test]
fn worker() {
    let Some((scenario, layout)) = mpirun::scenario() else {
        return; // run by `mpirun` only
    };
    let one_without = scenario == "collectives_one_without_shared_memory";
    if one_without && std::env::var("OMPI_COMM_WORLD_RANK").as_deref() == Ok("1") {
        // Before MPI starts, while this process has one thread.
        std::env::set_var(actorgraph::mpi::SHARED_MEMORY_VAR, "0");
    }
    let mpi = Mpi::init().unwrap();
    assert_eq!(mpi.processes(), layout.len());
    // Whether the leaders meet in shared memory is agreed: off everywhere if off in one.
    let shares = mpirun::shared_memory_expected() && !one_without;
    assert_eq!(mpi.shares_memory(), shares);
    let process = mpi.process();
    let first: usize = layout[..process].iter().sum();
    let size: usize = layout.iter().sum();
    let here = first..first + layout[process];
    match scenario.as_str() {
        "collectives" | "collectives_one_without_shared_memory" => collectives(&mpi, here, size),
        "failures" => failures(&mpi, here, size),
        "launch" => launch(&mpi, here),
        "each" => each(&mpi, here, size),
        "dies" => dies(&mpi, here),
        "panics" => panics(&mpi, here),
        other => panic!("no scenario {other}"),
    }
    println!("process {process}: scenario done");
}

/// A worker whose values depend on its global rank and the step.
struct W {
    rank: usize,
}

/// Rank `q`'s `i`-th `f32` in step `s`: magnitudes far apart, so that a sum in another
/// order rounds differently.
fn f(q: usize, i: usize, s: u64) -> f32 {
    let scale = [1.0e8f32, 1.0, 3.0e-3, -7.0e7][(q + i) % 4];
    scale * (1.0 + ((q * 7 + i * 3 + s as usize) % 11) as f32 / 7.0)
}

fn values(q: usize, s: u64) -> Vals {
    let a: Vec<f32> = (0..12).map(|i| f(q, i, s)).collect();
    let b: Vec<f16> = (0..8)
        .map(|i| f16::from_f32(1.0 + f(q, i, s).abs().fract() * 2.0))
        .collect();
    let c: Vec<i64> = (0..4)
        .map(|i| (q as i64 + 1) * 1_000_003 * (i as i64 - 2) + s as i64)
        .collect();
    let d: Vec<bf16> = (0..8).map(|i| bf16::from_f32(f(q, i, s) / 1.0e3)).collect();
    let e = f64::from(f(q, 5, s)) * 1.0e-3 + 1.0 / (q as f64 + 3.0);
    let u: Vec<u8> = (0..3).map(|i| (q * 31 + i + s as usize) as u8).collect();
    let t = |shape: &[usize], v: Vec<_>| Tensor::from_vec(v, shape).unwrap();
    let nested = vec![
        Tensor::from_vec(b[..2].to_vec(), [2]).unwrap(),
        Tensor::from_vec(b[3..].to_vec(), [5]).unwrap(),
    ];
    (
        t(&[4, 3], a),
        Tensor::from_vec(b, [8]).unwrap(),
        c,
        Tensor::from_vec(d, [4, 2]).unwrap(),
        e,
        Tensor::from_vec(u, [3]).unwrap(),
        nested,
    )
}

type Vals = (
    Tensor<f32>,
    Tensor<f16>,
    Vec<i64>,
    Tensor<bf16>,
    f64,
    Tensor<u8>,
    Vec<Tensor<f16>>,
);

#[actor]
impl W {
    fn vals(&mut self, step: &u64) -> Vals {
        values(self.rank, *step)
    }
}

graph! {
    Coll(workers: [W], step: u64) {
        let (a, b, c, d, e, u, n) = workers.vals(step);
        let sum = allreduce([a, n, c, d, e, u], Sum);
        let prod = allreduce([b, c, d, u], Prod);
        let min = allreduce([a, b, c, d, e], Min);
        let max = allreduce([a, d, u], Max);
        let avg = allreduce([a, b, c, d, e, u], Avg);
        let every = allgather([a, c, d, e, u]);
        let part = reducescatter([a, b, d], Avg);
        let from = broadcast([a, b, c, e], 1);
        let red = reduce([a, c, d], Sum, 1);
        (sum, prod, min, max, avg, every, part, from, red)
    }
}

/// Elements of the large values: over `SMALL`, so that a stage runs the reduce-scatter
/// and allgather of large regions; odd, so that the processes' chunks differ in length.
const BIG: usize = 40_001;
/// Rows of the large `reducescatter`: divisible by every group size of the tests.
const BIG_ROWS: usize = 24_000;
/// Rows of its second f32 value: so that a process's chunk of the f32 region crosses from
/// one value into the next.
const MORE_ROWS: usize = 12_000;
/// Elements of the longest value, broadcast with others: so that the f32 region goes in
/// several pieces whose bounds fall inside values and between them.
const LONGEST: usize = 150_001;

/// Rank `q`'s large values in step `s`.
fn big_values(q: usize, s: u64) -> Big {
    let a: Vec<f32> = (0..BIG).map(|i| f(q, i, s)).collect();
    let b: Vec<f16> = (0..BIG)
        .map(|i| f16::from_f32(1.0 + f(q, i, s).abs().fract() * 2.0))
        .collect();
    let c: Vec<i64> = (0..BIG_ROWS).map(|i| (q * 7 + i) as i64 - 3).collect();
    let d: Vec<f32> = (0..BIG_ROWS).map(|i| f(q, i + 1, s)).collect();
    let e: Vec<f32> = (0..MORE_ROWS).map(|i| f(q, i + 2, s)).collect();
    let g: Vec<f32> = (0..LONGEST).map(|i| f(q, i + 5, s)).collect();
    (
        Tensor::from_vec(a, [BIG]).unwrap(),
        Tensor::from_vec(b, [BIG]).unwrap(),
        Tensor::from_vec(c, [BIG_ROWS]).unwrap(),
        Tensor::from_vec(d, [BIG_ROWS]).unwrap(),
        Tensor::from_vec(e, [MORE_ROWS]).unwrap(),
        Tensor::from_vec(g, [LONGEST]).unwrap(),
    )
}

type Big = (
    Tensor<f32>,
    Tensor<f16>,
    Tensor<i64>,
    Tensor<f32>,
    Tensor<f32>,
    Tensor<f32>,
);

/// A worker of large values.
struct L {
    rank: usize,
}

/// Tensors in the large allgather of many values: more than the MPI backend gathers by a
/// call each, so that they go in one call per dtype region.
const MANY: usize = 20;

/// Rank `q`'s many tensors in step `s`: together over `SMALL`.
fn many_values(q: usize, s: u64) -> Vec<Tensor<f32>> {
    (0..MANY)
        .map(|k| {
            let v: Vec<f32> = (0..1000 + k).map(|i| f(q, i + k, s)).collect();
            Tensor::from_vec(v, [1000 + k]).unwrap()
        })
        .collect()
}

#[actor]
impl L {
    fn big(&mut self, step: &u64) -> Big {
        big_values(self.rank, *step)
    }
    fn many(&mut self, step: &u64) -> Vec<Tensor<f32>> {
        many_values(self.rank, *step)
    }
}

graph! {
    Large(workers: [L], step: u64) {
        let (a, b, c, d, e, g) = workers.big(step);
        let m = workers.many(step);
        let sum = allreduce([a, b, c], Sum);
        let avg = allreduce(a, Avg);
        let part = reducescatter([c, d, e], Sum);
        let red = reduce([a, b], Sum, 1);
        let every = allgather([d, c, e]);
        let from = broadcast([a, g, c, e], 1);
        let each_many = allgather(m);
        (sum, avg, part, red, every, from, each_many)
    }
}

/// Bit for bit, naming the first element that differs (the values are long).
fn same_long<T: std::fmt::Debug>(what: &str, rank: usize, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what} on rank {rank}: length");
    if let Some(i) = (0..got.len()).find(|&i| format!("{:?}", got[i]) != format!("{:?}", want[i])) {
        panic!(
            "{what} on rank {rank}: element {i} is {:?}, not {:?}",
            got[i], want[i]
        );
    }
}

/// Large stages (the reduce-scatter in rank order, then the allgather): bit for bit the
/// reference over every rank, on every rank.
fn large(mpi: &Mpi, here: std::ops::Range<usize>, size: usize) {
    let workers: Vec<L> = here.clone().map(|rank| L { rank }).collect();
    let mut g = Large::launch(workers, mpi).unwrap();
    for s in 0..2u64 {
        let all: Vec<Big> = (0..size).map(|q| big_values(q, s)).collect();
        let reduced = |op: ReduceOp, pick: &dyn Fn(&Big) -> Vec<f32>| {
            let v: Vec<Vec<f32>> = all.iter().map(pick).collect();
            reduce_reference(&v.iter().map(Vec::as_slice).collect::<Vec<_>>(), op)
        };
        let sum_a = reduced(ReduceOp::Sum, &|v| v.0.to_vec());
        let avg_a = reduced(ReduceOp::Avg, &|v| v.0.to_vec());
        let b: Vec<Vec<f16>> = all.iter().map(|v| v.1.to_vec()).collect();
        let sum_b = reduce_reference(
            &b.iter().map(Vec::as_slice).collect::<Vec<_>>(),
            ReduceOp::Sum,
        );
        let c: Vec<Vec<i64>> = all.iter().map(|v| v.2.to_vec()).collect();
        let sum_c = reduce_reference(
            &c.iter().map(Vec::as_slice).collect::<Vec<_>>(),
            ReduceOp::Sum,
        );
        let sum_d = reduced(ReduceOp::Sum, &|v| v.3.to_vec());
        let sum_e = reduced(ReduceOp::Sum, &|v| v.4.to_vec());
        let out = g.execute(s).unwrap();
        let many: Vec<Vec<Tensor<f32>>> = (0..size).map(|q| many_values(q, s)).collect();
        for (i, (sum, avg, part, red, every, from, each_many)) in out.iter().enumerate() {
            let q = here.start + i;
            same_long("large sum a", q, &sum.0.to_vec(), &sum_a);
            same_long("large sum b", q, &sum.1.to_vec(), &sum_b);
            same_long("large sum c", q, &sum.2.to_vec(), &sum_c);
            same_long("large avg a", q, &avg.to_vec(), &avg_a);
            let rows = BIG_ROWS / size;
            same_long(
                "large scatter c",
                q,
                &part.0.to_vec(),
                &sum_c[q * rows..(q + 1) * rows],
            );
            same_long(
                "large scatter d",
                q,
                &part.1.to_vec(),
                &sum_d[q * rows..(q + 1) * rows],
            );
            let more = MORE_ROWS / size;
            same_long(
                "large scatter e",
                q,
                &part.2.to_vec(),
                &sum_e[q * more..(q + 1) * more],
            );
            match (q, red) {
                (1, (Some(a), Some(b))) => {
                    same_long("large reduce a", q, &a.to_vec(), &sum_a);
                    same_long("large reduce b", q, &b.to_vec(), &sum_b);
                }
                (1, _) => panic!("the root got no reduction"),
                (_, (None, None)) => {}
                (_, _) => panic!("rank {q} is not the root but got a reduction"),
            }
            let each: Vec<f32> = all.iter().flat_map(|v| v.3.to_vec()).collect();
            same_long("large gather d", q, &every.0.to_vec(), &each);
            let each: Vec<i64> = all.iter().flat_map(|v| v.2.to_vec()).collect();
            same_long("large gather c", q, &every.1.to_vec(), &each);
            let each: Vec<f32> = all.iter().flat_map(|v| v.4.to_vec()).collect();
            same_long("large gather e", q, &every.2.to_vec(), &each);
            assert_eq!(each_many.len(), MANY);
            for (k, got) in each_many.iter().enumerate() {
                let each: Vec<f32> = many.iter().flat_map(|v| v[k].to_vec()).collect();
                same_long("large gather many", q, &got.to_vec(), &each);
            }
            same_long("large bcast a", q, &from.0.to_vec(), &all[1].0.to_vec());
            same_long("large bcast g", q, &from.1.to_vec(), &all[1].5.to_vec());
            same_long("large bcast c", q, &from.2.to_vec(), &all[1].2.to_vec());
            same_long("large bcast e", q, &from.3.to_vec(), &all[1].4.to_vec());
        }
    }
    g.teardown().unwrap();
}

/// A user's value that only packs its elements (it has no `elements`), in one stage with
/// tensors.
#[derive(Clone, Debug)]
struct Packed(Vec<f32>);

impl Bucketable for Packed {
    type Elem = f32;
    fn bucket_len(&self) -> usize {
        self.0.len()
    }
    fn pack(&self, dst: &mut [f32]) {
        dst.copy_from_slice(&self.0);
    }
    fn unpack(&self, reduced: Reduced<'_, f32>) -> Self {
        Packed(reduced.as_slice().to_vec())
    }
}

type Mix = (Tensor<f32>, Tensor<f32>, Packed, Tensor<f32>);

/// Elements of the mix's short tensor: below the bytes from which a leader keeps a lent
/// value out of its regions in a large stage, so that it is packed between two it keeps.
const SHORT: usize = 300;

/// Rank `q`'s values in step `s`: three of `len` elements each, and a short tensor.
fn mix_values(q: usize, len: usize, s: u64) -> Mix {
    let v = |k: usize| (0..len).map(|i| f(q, i + k, s)).collect::<Vec<f32>>();
    let short = (0..SHORT).map(|i| f(q, i + 3, s)).collect::<Vec<f32>>();
    (
        Tensor::from_vec(v(0), [len]).unwrap(),
        Tensor::from_vec(short, [SHORT]).unwrap(),
        Packed(v(1)),
        Tensor::from_vec(v(2), [len]).unwrap(),
    )
}

/// A worker of tensors and user values.
struct M {
    rank: usize,
}

#[actor]
impl M {
    fn mix(&mut self, len: &usize, step: &u64) -> Mix {
        mix_values(self.rank, *len, *step)
    }
}

graph! {
    Mixed(workers: [M], len: usize, step: u64) {
        let (a, short, p, b) = workers.mix(len, step);
        let sum = allreduce([a, short, p, b], Sum);
        let from = broadcast([a, p, b], 1);
        let every = allgather([a, short, b]);
        (sum, from, every)
    }
}

/// Tensors and user values in one stage, small (their data rides with the agreement)
/// and large (the leader's regions are the payload's, and its long tensors are read
/// where they are, the processes' chunks crossing from one value into the next): bit
/// for bit the reference.
fn mixed(mpi: &Mpi, here: std::ops::Range<usize>, size: usize) {
    let workers: Vec<M> = here.clone().map(|rank| M { rank }).collect();
    let mut g = Mixed::launch(workers, mpi).unwrap();
    for (s, len) in [(0u64, 7usize), (1, BIG), (2, 9)] {
        let all: Vec<Mix> = (0..size).map(|q| mix_values(q, len, s)).collect();
        let sum = |pick: &dyn Fn(&Mix) -> Vec<f32>| {
            let v: Vec<Vec<f32>> = all.iter().map(pick).collect();
            reduce_reference(
                &v.iter().map(Vec::as_slice).collect::<Vec<_>>(),
                ReduceOp::Sum,
            )
        };
        let out = g.execute(len, s).unwrap();
        let gathered =
            |pick: &dyn Fn(&Mix) -> Vec<f32>| -> Vec<f32> { all.iter().flat_map(pick).collect() };
        for (i, (sum_of, from, every)) in out.iter().enumerate() {
            let q = here.start + i;
            same_long(
                "mixed sum a",
                q,
                &sum_of.0.to_vec(),
                &sum(&|v| v.0.to_vec()),
            );
            same_long(
                "mixed sum short",
                q,
                &sum_of.1.to_vec(),
                &sum(&|v| v.1.to_vec()),
            );
            same_long("mixed sum p", q, &sum_of.2 .0, &sum(&|v| v.2 .0.clone()));
            same_long(
                "mixed sum b",
                q,
                &sum_of.3.to_vec(),
                &sum(&|v| v.3.to_vec()),
            );
            same_long("mixed bcast a", q, &from.0.to_vec(), &all[1].0.to_vec());
            same_long("mixed bcast p", q, &from.1 .0, &all[1].2 .0);
            same_long("mixed bcast b", q, &from.2.to_vec(), &all[1].3.to_vec());
            same_long(
                "mixed gather a",
                q,
                &every.0.to_vec(),
                &gathered(&|v| v.0.to_vec()),
            );
            same_long(
                "mixed gather short",
                q,
                &every.1.to_vec(),
                &gathered(&|v| v.1.to_vec()),
            );
            same_long(
                "mixed gather b",
                q,
                &every.2.to_vec(),
                &gathered(&|v| v.3.to_vec()),
            );
        }
    }
    g.teardown().unwrap();
}

/// The reduction over every rank of the slices `pick` takes from their values.
fn reduced<E: Element>(
    size: usize,
    s: u64,
    op: ReduceOp,
    pick: impl Fn(&Vals) -> Vec<E>,
) -> Vec<E> {
    let all: Vec<Vec<E>> = (0..size).map(|q| pick(&values(q, s))).collect();
    let refs: Vec<&[E]> = all.iter().map(Vec::as_slice).collect();
    reduce_reference(&refs, op)
}

/// Bit for bit: the same text of every element (`{:?}` of a float is its shortest exact
/// form, so `-0.0`, `0.0` and every other pair of distinct values print differently).
fn same<T: std::fmt::Debug>(what: &str, rank: usize, got: &[T], want: &[T]) {
    assert_eq!(
        format!("{got:?}"),
        format!("{want:?}"),
        "{what} on rank {rank}"
    );
}

fn collectives(mpi: &Mpi, here: std::ops::Range<usize>, size: usize) {
    let workers = || here.clone().map(|rank| W { rank }).collect::<Vec<_>>();
    // With overlap (the default), every stage but the first starts while another is in
    // flight, and the progress thread leads them all; without, each runs where it is.
    let off = LaunchOptions::default().overlap(false);
    let mut h = Coll::launch_with(workers(), mpi, off).unwrap();
    let in_order: Vec<String> = (0..3)
        .map(|s| format!("{:?}", h.execute(s).unwrap()))
        .collect();
    drop(h.teardown_each());
    let mut g = Coll::launch(workers(), mpi).unwrap();
    let overlapped: Vec<String> = (0..3)
        .map(|s| format!("{:?}", g.execute(s).unwrap()))
        .collect();
    assert_eq!(overlapped, in_order, "overlap on and off differ");
    assert_eq!(g.ranks("workers"), Some(here.clone()));
    assert_eq!(g.group_size("workers"), Some(size));
    if size >= 3 {
        // The test values are such that the order of a float sum matters.
        let forward = reduced(size, 0, ReduceOp::Sum, |v| v.0.to_vec());
        let mut backward: Vec<Vals> = (0..size).map(|q| values(q, 0)).collect();
        backward.reverse();
        let back: Vec<Vec<f32>> = backward.iter().map(|v| v.0.to_vec()).collect();
        let refs: Vec<&[f32]> = back.iter().map(Vec::as_slice).collect();
        assert_ne!(
            format!("{forward:?}"),
            format!("{:?}", reduce_reference(&refs, ReduceOp::Sum))
        );
    }
    for s in 0..3u64 {
        let out = g.execute(s).unwrap();
        assert_eq!(out.len(), here.len());
        for (i, o) in out.iter().enumerate() {
            let q = here.start + i;
            let (sum, prod, min, max, avg, every, part, from, red) = o;
            // allreduce, every op, a nested bucket of six dtypes
            let (a, n, c, d, e, u) = sum;
            same(
                "sum a",
                q,
                &a.to_vec(),
                &reduced(size, s, ReduceOp::Sum, |v| v.0.to_vec()),
            );
            assert_eq!(a.shape(), &[4, 3]);
            assert_eq!(
                n.iter().map(|t| t.shape().to_vec()).collect::<Vec<_>>(),
                [vec![2], vec![5]]
            );
            let flat: Vec<f16> = n.iter().flat_map(Tensor::to_vec).collect();
            let pick = |v: &Vals| v.6.iter().flat_map(Tensor::to_vec).collect::<Vec<_>>();
            same(
                "sum nested",
                q,
                &flat,
                &reduced(size, s, ReduceOp::Sum, pick),
            );
            same(
                "sum c",
                q,
                c,
                &reduced(size, s, ReduceOp::Sum, |v| v.2.clone()),
            );
            same(
                "sum d",
                q,
                &d.to_vec(),
                &reduced(size, s, ReduceOp::Sum, |v| v.3.to_vec()),
            );
            same(
                "sum e",
                q,
                &[*e],
                &reduced(size, s, ReduceOp::Sum, |v| vec![v.4]),
            );
            same(
                "sum u",
                q,
                &u.to_vec(),
                &reduced(size, s, ReduceOp::Sum, |v| v.5.to_vec()),
            );
            let (b, c, d, u) = prod;
            same(
                "prod b",
                q,
                &b.to_vec(),
                &reduced(size, s, ReduceOp::Prod, |v| v.1.to_vec()),
            );
            same(
                "prod c",
                q,
                c,
                &reduced(size, s, ReduceOp::Prod, |v| v.2.clone()),
            );
            same(
                "prod d",
                q,
                &d.to_vec(),
                &reduced(size, s, ReduceOp::Prod, |v| v.3.to_vec()),
            );
            same(
                "prod u",
                q,
                &u.to_vec(),
                &reduced(size, s, ReduceOp::Prod, |v| v.5.to_vec()),
            );
            let (a, b, c, d, e) = min;
            same(
                "min a",
                q,
                &a.to_vec(),
                &reduced(size, s, ReduceOp::Min, |v| v.0.to_vec()),
            );
            same(
                "min b",
                q,
                &b.to_vec(),
                &reduced(size, s, ReduceOp::Min, |v| v.1.to_vec()),
            );
            same(
                "min c",
                q,
                c,
                &reduced(size, s, ReduceOp::Min, |v| v.2.clone()),
            );
            same(
                "min d",
                q,
                &d.to_vec(),
                &reduced(size, s, ReduceOp::Min, |v| v.3.to_vec()),
            );
            same(
                "min e",
                q,
                &[*e],
                &reduced(size, s, ReduceOp::Min, |v| vec![v.4]),
            );
            let (a, d, u) = max;
            same(
                "max a",
                q,
                &a.to_vec(),
                &reduced(size, s, ReduceOp::Max, |v| v.0.to_vec()),
            );
            same(
                "max d",
                q,
                &d.to_vec(),
                &reduced(size, s, ReduceOp::Max, |v| v.3.to_vec()),
            );
            same(
                "max u",
                q,
                &u.to_vec(),
                &reduced(size, s, ReduceOp::Max, |v| v.5.to_vec()),
            );
            let (a, b, c, d, e, u) = avg;
            same(
                "avg a",
                q,
                &a.to_vec(),
                &reduced(size, s, ReduceOp::Avg, |v| v.0.to_vec()),
            );
            same(
                "avg b",
                q,
                &b.to_vec(),
                &reduced(size, s, ReduceOp::Avg, |v| v.1.to_vec()),
            );
            same(
                "avg c",
                q,
                c,
                &reduced(size, s, ReduceOp::Avg, |v| v.2.clone()),
            );
            same(
                "avg d",
                q,
                &d.to_vec(),
                &reduced(size, s, ReduceOp::Avg, |v| v.3.to_vec()),
            );
            same(
                "avg e",
                q,
                &[*e],
                &reduced(size, s, ReduceOp::Avg, |v| vec![v.4]),
            );
            same(
                "avg u",
                q,
                &u.to_vec(),
                &reduced(size, s, ReduceOp::Avg, |v| v.5.to_vec()),
            );
            // allgather: every rank's value in rank order
            let (a, c, d, e, u) = every;
            let each: Vec<Vals> = (0..size).map(|p| values(p, s)).collect();
            assert_eq!(a.shape(), &[4 * size, 3]);
            same(
                "gather a",
                q,
                &a.to_vec(),
                &each.iter().flat_map(|v| v.0.to_vec()).collect::<Vec<_>>(),
            );
            same(
                "gather c",
                q,
                c,
                &each.iter().flat_map(|v| v.2.clone()).collect::<Vec<_>>(),
            );
            same(
                "gather d",
                q,
                &d.to_vec(),
                &each.iter().flat_map(|v| v.3.to_vec()).collect::<Vec<_>>(),
            );
            same(
                "gather e",
                q,
                e,
                &each.iter().map(|v| v.4).collect::<Vec<_>>(),
            );
            same(
                "gather u",
                q,
                &u.to_vec(),
                &each.iter().flat_map(|v| v.5.to_vec()).collect::<Vec<_>>(),
            );
            // reducescatter: this rank's rows of the reduction
            let (a, b, d) = part;
            fn rows<T: Clone>(full: Vec<T>, q: usize, size: usize) -> Vec<T> {
                let chunk = full.len() / size;
                full[q * chunk..(q + 1) * chunk].to_vec()
            }
            assert_eq!(a.shape(), &[4 / size, 3]);
            same(
                "scatter a",
                q,
                &a.to_vec(),
                &rows(reduced(size, s, ReduceOp::Avg, |v| v.0.to_vec()), q, size),
            );
            same(
                "scatter b",
                q,
                &b.to_vec(),
                &rows(reduced(size, s, ReduceOp::Avg, |v| v.1.to_vec()), q, size),
            );
            same(
                "scatter d",
                q,
                &d.to_vec(),
                &rows(reduced(size, s, ReduceOp::Avg, |v| v.3.to_vec()), q, size),
            );
            // broadcast from rank 1, wherever it is
            let (a, b, c, e) = from;
            let root = values(1, s);
            same("bcast a", q, &a.to_vec(), &root.0.to_vec());
            same("bcast b", q, &b.to_vec(), &root.1.to_vec());
            same("bcast c", q, c, &root.2);
            same("bcast e", q, &[*e], &[root.4]);
            // reduce to rank 1
            match (q, red) {
                (1, (Some(a), Some(c), Some(d))) => {
                    same(
                        "reduce a",
                        q,
                        &a.to_vec(),
                        &reduced(size, s, ReduceOp::Sum, |v| v.0.to_vec()),
                    );
                    same(
                        "reduce c",
                        q,
                        c,
                        &reduced(size, s, ReduceOp::Sum, |v| v.2.clone()),
                    );
                    same(
                        "reduce d",
                        q,
                        &d.to_vec(),
                        &reduced(size, s, ReduceOp::Sum, |v| v.3.to_vec()),
                    );
                }
                (1, _) => panic!("the root got no reduction"),
                (_, (None, None, None)) => {}
                (_, _) => panic!("rank {q} is not the root but got a reduction"),
            }
        }
    }
    let back = g.teardown().unwrap();
    assert_eq!(
        back.iter().map(|w| w.rank).collect::<Vec<_>>(),
        here.clone().collect::<Vec<_>>()
    );
    large(mpi, here.clone(), size);
    mixed(mpi, here.clone(), size);

    // Pipelining: four executions in flight, their stages in submission order everywhere.
    let options = LaunchOptions::default().max_in_flight(4);
    let actors = Actors::from(here.map(|rank| F { rank }).collect::<Vec<_>>());
    let mut g = Fails::launch_actors(actors, mpi, options).unwrap();
    let tickets: Vec<Ticket> = (0..4).map(|_| g.submit(Trouble::None).unwrap()).collect();
    assert_eq!(g.in_flight(), 4);
    let total = (0..size).map(|q| q as f32).sum::<f32>();
    for t in tickets {
        for out in g.wait(t).unwrap() {
            assert_eq!(out.to_vec(), vec![total; 4]);
        }
    }
    g.teardown().unwrap();
}

/// A worker that fails on request.
struct F {
    rank: usize,
}

#[derive(Clone, Copy)]
enum Trouble {
    None,
    /// The rank whose tensor is one element longer.
    Shape(usize),
    /// The rank whose method returns `Err`.
    Err(usize),
    /// The rank whose method panics.
    Panic(usize),
    /// Two ranks whose methods return `Err`.
    Errs(usize, usize),
}

#[actor]
impl F {
    fn make(&mut self, trouble: &Trouble) -> Result<Tensor<f32>, BoxError> {
        let rank = self.rank;
        match *trouble {
            Trouble::Shape(r) if r == rank => Ok(Tensor::full([5], 1.0)),
            Trouble::Err(r) if r == rank => Err(format!("rank {rank} refused").into()),
            Trouble::Errs(a, b) if a == rank || b == rank => {
                Err(format!("rank {rank} refused").into())
            }
            Trouble::Panic(r) if r == rank => panic!("rank {rank} gave up"),
            _ => Ok(Tensor::full([4], rank as f32)),
        }
    }
}

graph! {
    Fails(workers: [F], trouble: Trouble) {
        allreduce(workers.make(trouble), Sum)
    }
}

graph! {
    InFlight(workers: [F], first: Trouble, then: Trouble) {
        let a = allreduce(workers.make(first), Sum);
        let b = workers.make(then);
        let c = allreduce(b, Max);
        (a, c)
    }
}

/// Failures while a stage is in flight (led by the progress thread while `make` runs):
/// the same error on every process, and the graph stays usable.
fn in_flight(mpi: &Mpi, here: std::ops::Range<usize>, size: usize) {
    let workers = || here.clone().map(|rank| F { rank }).collect::<Vec<_>>();
    let mut g = InFlight::launch(workers(), mpi).unwrap();
    let (total, max) = ((0..size).map(|q| q as f32).sum::<f32>(), (size - 1) as f32);
    let fine = |g: &mut InFlight| {
        for (a, c) in g.execute(Trouble::None, Trouble::None).unwrap() {
            assert_eq!((a.to_vec(), c.to_vec()), (vec![total; 4], vec![max; 4]));
        }
    };
    fine(&mut g);
    let last = size - 1;
    expect::refused(g.execute(Trouble::None, Trouble::Err(last)), "make", last);
    fine(&mut g);
    expect::refused(g.execute(Trouble::None, Trouble::Errs(1, last)), "make", 1);
    fine(&mut g);
    // The first stage fails on every rank, the second is skipped by every rank.
    expect::refused(g.execute(Trouble::Err(last), Trouble::None), "make", last);
    fine(&mut g);
    match g.execute(Trouble::None, Trouble::Shape(last)) {
        Err(Error::ShapeMismatch { shapes, .. }) => assert_eq!(shapes[last], vec![5]),
        other => panic!("expected a shape mismatch, got {other:?}"),
    }
    fine(&mut g);
    expect::panicked(
        g.execute(Trouble::None, Trouble::Panic(1)),
        "make",
        1,
        "rank 1 gave up",
    );
    expect::poisoned(g.execute(Trouble::None, Trouble::None), 1);
    drop(g.teardown_each());
}

fn failures(mpi: &Mpi, here: std::ops::Range<usize>, size: usize) {
    two_groups(mpi, here.clone(), size);
    in_flight(mpi, here.clone(), size);
    let mut g =
        Fails::launch(here.clone().map(|rank| F { rank }).collect::<Vec<_>>(), mpi).unwrap();
    let total = (0..size).map(|q| q as f32).sum::<f32>();
    let fine = |g: &mut Fails| {
        for t in g.execute(Trouble::None).unwrap() {
            assert_eq!(t.to_vec(), vec![total; 4]);
        }
    };
    fine(&mut g);
    // A shape mismatch between ranks of different processes: the last rank's tensor.
    let last = size - 1;
    match g.execute(Trouble::Shape(last)) {
        Err(Error::ShapeMismatch { counts, shapes, .. }) => {
            let want: Vec<(DType, usize)> = (0..size)
                .map(|q| (DType::F32, if q == last { 5 } else { 4 }))
                .collect();
            assert_eq!(counts, want);
            assert_eq!(shapes[last], vec![5]);
        }
        other => panic!("expected a shape mismatch, got {other:?}"),
    }
    fine(&mut g);
    // A method error on a rank of the last process: the same error everywhere.
    expect::refused(g.execute(Trouble::Err(last)), "make", last);
    fine(&mut g);
    // Method errors on ranks of two processes: the first failed rank's error everywhere,
    // also on the process whose own rank failed later.
    expect::refused(g.execute(Trouble::Errs(1, last)), "make", 1);
    fine(&mut g);
    // A panic on rank 1 (of process 0 or 1): the same error everywhere, then the actor is
    // poisoned, on every process's watch.
    expect::panicked(g.execute(Trouble::Panic(1)), "make", 1, "rank 1 gave up");
    expect::poisoned(g.execute(Trouble::None), 1);
    drop(g.teardown_each());
}

graph! {
    Pair(left: [F], right: [F], trouble: Trouble) {
        let a = allreduce(left.make(trouble), Sum);
        let b = allreduce(right.make(trouble), Max);
        (a, b)
    }
}

/// Two groups, whose leaders run their stages at the same time on communicators of their
/// own.
fn two_groups(mpi: &Mpi, here: std::ops::Range<usize>, size: usize) {
    let make = || here.clone().map(|rank| F { rank }).collect::<Vec<_>>();
    let mut g = Pair::launch(make(), make(), mpi).unwrap();
    assert_eq!(g.ranks("right"), Some(here.clone()));
    let total = (0..size).map(|q| q as f32).sum::<f32>();
    for _ in 0..3 {
        for (a, b) in g.execute(Trouble::None).unwrap() {
            assert_eq!(a.to_vec(), vec![total; 4]);
            assert_eq!(b.to_vec(), vec![(size - 1) as f32; 4]);
        }
    }
    g.teardown().unwrap();
}

graph! {
    Other(workers: [F], trouble: Trouble) {
        allreduce(workers.make(trouble), Max)
    }
}

fn launch(mpi: &Mpi, here: std::ops::Range<usize>) {
    let make = || here.clone().map(|rank| F { rank }).collect::<Vec<_>>();
    // Process 1 launches another graph.
    let launched = if mpi.process() == 1 {
        Other::launch(make(), mpi).map(drop)
    } else {
        Fails::launch(make(), mpi).map(drop)
    };
    match launched {
        Err(Error::GraphMismatch { process: 1, .. }) => {}
        other => panic!("expected a graph mismatch, got {:?}", other.map(drop)),
    }
    // Process 1 gives the group no actor.
    let actors = if mpi.process() == 1 {
        Vec::new()
    } else {
        make()
    };
    match Fails::launch(actors, mpi) {
        Err(Error::ProcessLayout {
            group: "workers",
            process: 1,
        }) => {}
        other => panic!("expected a layout error, got {:?}", other.map(drop)),
    }
    // Process 0's actor cannot be made: its launch fails, and so does every other's.
    // (`Actors::try_each` hands each actor its rank in the whole group.)
    let actors = Actors::try_each(here.len(), move |rank, _| {
        if rank == 0 {
            Err("no actor 0 today")
        } else {
            Ok(F { rank })
        }
    });
    match (
        mpi.process(),
        Fails::launch_actors(actors, mpi, LaunchOptions::default()),
    ) {
        (0, Err(Error::ActorInit { rank: 0, .. })) => {}
        (
            p,
            Err(Error::ProcessLaunch {
                process: 0, reason, ..
            }),
        ) if p > 0 => {
            assert!(reason.contains("no actor 0 today"), "{reason}");
        }
        (p, other) => panic!(
            "process {p}: expected a failed launch, got {:?}",
            other.map(drop)
        ),
    }
    // And then a launch that works.
    let mut g = Fails::launch(make(), mpi).unwrap();
    assert_eq!(g.execute(Trouble::None).unwrap().len(), here.len());
}

fn panics(mpi: &Mpi, here: std::ops::Range<usize>) {
    let mut g = Fails::launch(here.map(|rank| F { rank }).collect::<Vec<_>>(), mpi).unwrap();
    g.execute(Trouble::None).unwrap();
    if mpi.process() == 1 {
        // Unwinds with the graph and MPI alive.
        panic!("process 1 panics now");
    }
    // The others wait in the next stage for process 1, until MPI_Abort ends them.
    let _ = g.execute(Trouble::None);
    panic!("a stage completed without process 1");
}

fn dies(mpi: &Mpi, here: std::ops::Range<usize>) {
    let mut g = Fails::launch(here.map(|rank| F { rank }).collect::<Vec<_>>(), mpi).unwrap();
    g.execute(Trouble::None).unwrap();
    if mpi.process() == 1 {
        println!("process 1 exits now");
        std::process::exit(3);
    }
    // The others wait in the next stage for process 1, until the MPI runtime ends them.
    let _ = g.execute(Trouble::None);
    // Only reached if MPI let the stage through without process 1.
    panic!("a stage completed without process 1");
}

/// A worker whose scale `each_workers` sets between executions.
struct Scaled {
    rank: usize,
    scale: f32,
}

#[actor]
impl Scaled {
    fn scaled(&mut self) -> f32 {
        self.scale * self.rank as f32
    }
}

graph! {
    ScaledSum(workers: [Scaled]) {
        allreduce(workers.scaled(), Sum)
    }
}

/// `each_workers` over processes: each process runs the closure on its own actors, by
/// global rank, with no collective; what every process changed, the next execution sees.
fn each(mpi: &Mpi, here: std::ops::Range<usize>, size: usize) {
    let workers: Vec<_> = here
        .clone()
        .map(|rank| Scaled { rank, scale: 1.0 })
        .collect();
    let mut g = ScaledSum::launch(workers, mpi).unwrap();
    let seen = g
        .each_workers(|ctx, w| (ctx.rank(), ctx.size(), w.rank))
        .unwrap();
    let want: Vec<_> = here.clone().map(|rank| (rank, size, rank)).collect();
    assert_eq!(seen, want);
    g.each_workers(|ctx, w| w.scale = ctx.rank() as f32)
        .unwrap();
    let total: f32 = (0..size).map(|q| (q * q) as f32).sum();
    assert_eq!(g.execute().unwrap(), vec![total; here.len()]);
    // An `Err` on the last rank is its own process's error only.
    let last = size - 1;
    let result = g.try_each_workers(move |ctx, _| {
        if ctx.rank() == last {
            Err("no room")
        } else {
            Ok(())
        }
    });
    if here.contains(&last) {
        match result {
            Err(Error::Method {
                rank,
                method: "each",
                ..
            }) => assert_eq!(rank, last),
            other => panic!("expected rank {last}'s error, got {other:?}"),
        }
    } else {
        result.unwrap();
    }
    assert_eq!(g.execute().unwrap(), vec![total; here.len()]);
    g.teardown().unwrap();
}

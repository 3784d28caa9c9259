//! Fused collectives: the cost of a bucketed allreduce, what fusing buys over one stage per
//! tensor, and the bandwidth of a large allreduce against a two-thread `c = a + b` over the
//! same bytes, measured in the same binary.
//!
//! The graphs with 64 values are written by one `macro_rules!` macro (`graph_of_64`).

use std::time::Duration;

use actorgraph::prelude::*;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// Eight tensors, one bucket.
type Eight = (
    Tensor<f32>,
    Tensor<f32>,
    Tensor<f32>,
    Tensor<f32>,
    Tensor<f32>,
    Tensor<f32>,
    Tensor<f32>,
    Tensor<f32>,
);

/// Holds its bucket's tensors and returns them by reference count: the benchmark measures
/// the graph, not tensor creation.
struct Holder {
    parts: Vec<Tensor<f32>>,
    next: usize,
}

#[actor]
impl Holder {
    fn part(&mut self, i: &usize) -> Tensor<f32> {
        self.parts[*i].clone()
    }
    /// The parts in turn: a graph calls it once per value of its bucket.
    fn next(&mut self) -> Tensor<f32> {
        let t = self.parts[self.next % self.parts.len()].clone();
        self.next += 1;
        t
    }
    fn all8(&mut self) -> Eight {
        let p = &self.parts;
        (
            p[0].clone(),
            p[1].clone(),
            p[2].clone(),
            p[3].clone(),
            p[4].clone(),
            p[5].clone(),
            p[6].clone(),
            p[7].clone(),
        )
    }
}

fn holders(n: usize, k: usize, len: usize) -> Vec<Holder> {
    (0..n)
        .map(|r| Holder {
            parts: (0..k)
                .map(|i| Tensor::full([len], (r + i) as f32))
                .collect(),
            next: 0,
        })
        .collect()
}

graph! {
    Bucket8(workers: [Holder]) {
        let (a, b, c, d, e, f, g, h) = workers.all8();
        allreduce([a, b, c, d, e, f, g, h])
    }

    Single(workers: [Holder], i: usize) {
        let t = workers.part(i);
        allreduce(t)
    }



    Separate64(workers: [Holder]) {
        let t0 = workers.next();
        let r0 = allreduce(t0);
        let t1 = workers.next();
        let r1 = allreduce(t1);
        let t2 = workers.next();
        let r2 = allreduce(t2);
        let t3 = workers.next();
        let r3 = allreduce(t3);
        let t4 = workers.next();
        let r4 = allreduce(t4);
        let t5 = workers.next();
        let r5 = allreduce(t5);
        let t6 = workers.next();
        let r6 = allreduce(t6);
        let t7 = workers.next();
        let r7 = allreduce(t7);
        let t8 = workers.next();
        let r8 = allreduce(t8);
        let t9 = workers.next();
        let r9 = allreduce(t9);
        let t10 = workers.next();
        let r10 = allreduce(t10);
        let t11 = workers.next();
        let r11 = allreduce(t11);
        let t12 = workers.next();
        let r12 = allreduce(t12);
        let t13 = workers.next();
        let r13 = allreduce(t13);
        let t14 = workers.next();
        let r14 = allreduce(t14);
        let t15 = workers.next();
        let r15 = allreduce(t15);
        let t16 = workers.next();
        let r16 = allreduce(t16);
        let t17 = workers.next();
        let r17 = allreduce(t17);
        let t18 = workers.next();
        let r18 = allreduce(t18);
        let t19 = workers.next();
        let r19 = allreduce(t19);
        let t20 = workers.next();
        let r20 = allreduce(t20);
        let t21 = workers.next();
        let r21 = allreduce(t21);
        let t22 = workers.next();
        let r22 = allreduce(t22);
        let t23 = workers.next();
        let r23 = allreduce(t23);
        let t24 = workers.next();
        let r24 = allreduce(t24);
        let t25 = workers.next();
        let r25 = allreduce(t25);
        let t26 = workers.next();
        let r26 = allreduce(t26);
        let t27 = workers.next();
        let r27 = allreduce(t27);
        let t28 = workers.next();
        let r28 = allreduce(t28);
        let t29 = workers.next();
        let r29 = allreduce(t29);
        let t30 = workers.next();
        let r30 = allreduce(t30);
        let t31 = workers.next();
        let r31 = allreduce(t31);
        let t32 = workers.next();
        let r32 = allreduce(t32);
        let t33 = workers.next();
        let r33 = allreduce(t33);
        let t34 = workers.next();
        let r34 = allreduce(t34);
        let t35 = workers.next();
        let r35 = allreduce(t35);
        let t36 = workers.next();
        let r36 = allreduce(t36);
        let t37 = workers.next();
        let r37 = allreduce(t37);
        let t38 = workers.next();
        let r38 = allreduce(t38);
        let t39 = workers.next();
        let r39 = allreduce(t39);
        let t40 = workers.next();
        let r40 = allreduce(t40);
        let t41 = workers.next();
        let r41 = allreduce(t41);
        let t42 = workers.next();
        let r42 = allreduce(t42);
        let t43 = workers.next();
        let r43 = allreduce(t43);
        let t44 = workers.next();
        let r44 = allreduce(t44);
        let t45 = workers.next();
        let r45 = allreduce(t45);
        let t46 = workers.next();
        let r46 = allreduce(t46);
        let t47 = workers.next();
        let r47 = allreduce(t47);
        let t48 = workers.next();
        let r48 = allreduce(t48);
        let t49 = workers.next();
        let r49 = allreduce(t49);
        let t50 = workers.next();
        let r50 = allreduce(t50);
        let t51 = workers.next();
        let r51 = allreduce(t51);
        let t52 = workers.next();
        let r52 = allreduce(t52);
        let t53 = workers.next();
        let r53 = allreduce(t53);
        let t54 = workers.next();
        let r54 = allreduce(t54);
        let t55 = workers.next();
        let r55 = allreduce(t55);
        let t56 = workers.next();
        let r56 = allreduce(t56);
        let t57 = workers.next();
        let r57 = allreduce(t57);
        let t58 = workers.next();
        let r58 = allreduce(t58);
        let t59 = workers.next();
        let r59 = allreduce(t59);
        let t60 = workers.next();
        let r60 = allreduce(t60);
        let t61 = workers.next();
        let r61 = allreduce(t61);
        let t62 = workers.next();
        let r62 = allreduce(t62);
        let t63 = workers.next();
        let r63 = allreduce(t63);
        (r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15, r16, r17, r18, r19, r20, r21, r22, r23, r24, r25, r26, r27, r28, r29, r30, r31, r32, r33, r34, r35, r36, r37, r38, r39, r40, r41, r42, r43, r44, r45, r46, r47, r48, r49, r50, r51, r52, r53, r54, r55, r56, r57, r58, r59, r60, r61, r62, r63)
    }
}

fn bucket8(c: &mut Criterion) {
    let mut group = c.benchmark_group("allreduce 8x1024 f32");
    for n in [2usize, 4, 8] {
        let mut graph = None;
        group.bench_function(format!("{n} actors"), |b| {
            let g = graph.get_or_insert_with(|| Bucket8::launch(holders(n, 8, 1024), Cpu).unwrap());
            b.iter(|| g.execute().unwrap())
        });
    }
    group.finish();
}

/// A graph of 64 `next()` calls per actor (`t0` to `t63`) whose output is `$out`.
macro_rules! graph_of_64 {
    ($name:ident => $out:expr) => {
        graph_of_64!(@ $name, $out, t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15, t16, t17, t18, t19, t20, t21, t22, t23, t24, t25, t26, t27, t28, t29, t30, t31, t32, t33, t34, t35, t36, t37, t38, t39, t40, t41, t42, t43, t44, t45, t46, t47, t48, t49, t50, t51, t52, t53, t54, t55, t56, t57, t58, t59, t60, t61, t62, t63);
    };
    (@ $name:ident, $out:expr, $($t:ident),*) => {
        graph! {
            $name(workers: [Holder]) {
                $(let $t = workers.next();)*
                $out
            }
        }
    };
}

graph_of_64!(Fused64 => allreduce([t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15, t16, t17, t18, t19, t20, t21, t22, t23, t24, t25, t26, t27, t28, t29, t30, t31, t32, t33, t34, t35, t36, t37, t38, t39, t40, t41, t42, t43, t44, t45, t46, t47, t48, t49, t50, t51, t52, t53, t54, t55, t56, t57, t58, t59, t60, t61, t62, t63]));

// The same 64 calls without the stage: the outputs are then the actors' own tensors
// (whose counts the caller's drop takes from the actors' cores), not views of one
// reduced buffer, so this is an upper bound of what the fused row spends outside the
// stage.
graph_of_64!(Unreduced64 => (t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15, t16, t17, t18, t19, t20, t21, t22, t23, t24, t25, t26, t27, t28, t29, t30, t31, t32, t33, t34, t35, t36, t37, t38, t39, t40, t41, t42, t43, t44, t45, t46, t47, t48, t49, t50, t51, t52, t53, t54, t55, t56, t57, t58, t59, t60, t61, t62, t63));

/// 64 tensors of `len` f32 per actor as one fused stage, against 64 stages, the same calls
/// with no stage, and one tensor of the same bytes.
fn fusion_of(c: &mut Criterion, len: usize) {
    let mut group = c.benchmark_group(format!("64x{len} f32, 2 actors"));
    let mut fused = None;
    group.bench_function("one fused stage", |b| {
        let g = fused.get_or_insert_with(|| Fused64::launch(holders(2, 64, len), Cpu).unwrap());
        b.iter(|| g.execute().unwrap())
    });
    drop(fused);
    let mut unreduced = None;
    group.bench_function("no stage", |b| {
        let g =
            unreduced.get_or_insert_with(|| Unreduced64::launch(holders(2, 64, len), Cpu).unwrap());
        b.iter(|| g.execute().unwrap())
    });
    drop(unreduced);
    let mut separate = None;
    group.bench_function("64 stages", |b| {
        let g =
            separate.get_or_insert_with(|| Separate64::launch(holders(2, 64, len), Cpu).unwrap());
        b.iter(|| g.execute().unwrap())
    });
    drop(separate);
    // The same bytes per actor as one tensor: what fusing 64 values costs over one value
    // of their bytes (the layout, the 64 lends and views), beside the fold's own time.
    let mut one = None;
    group.bench_function("one tensor of the same bytes", |b| {
        let g = one.get_or_insert_with(|| Single::launch(holders(2, 1, 64 * len), Cpu).unwrap());
        b.iter(|| g.execute(0).unwrap())
    });
    group.finish();
}

/// 64 values of 4 KiB, and of 1 KiB.
fn fusion(c: &mut Criterion) {
    fusion_of(c, 1024);
    fusion_of(c, 256);
}

/// Two threads computing `c[i] = a[i] + b[i]` over the same bytes as the allreduce, each
/// on its half: the machine's memory-bandwidth reference for the bandwidth target.
fn add_reference(a: &[f32], b: &[f32], out: &mut [f32]) {
    let half = a.len() / 2;
    let (o0, o1) = out.split_at_mut(half);
    std::thread::scope(|s| {
        s.spawn(|| {
            o0.iter_mut()
                .zip(&a[..half])
                .zip(&b[..half])
                .for_each(|((o, x), y)| *o = x + y)
        });
        o1.iter_mut()
            .zip(&a[half..])
            .zip(&b[half..])
            .for_each(|((o, x), y)| *o = x + y);
    });
}

fn bandwidth(c: &mut Criterion) {
    let mut group = c.benchmark_group("bandwidth");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    let len = 64 << 20 >> 2; // 64 MiB of f32 per rank
    group.throughput(Throughput::Bytes((len * 4) as u64));
    // Built on first use, so that selecting another benchmark does not allocate 64 MiB.
    let mut graph = None;
    group.bench_function("allreduce 2 x 64 MiB", |b| {
        let g = graph.get_or_insert_with(|| Single::launch(holders(2, 1, len), Cpu).unwrap());
        b.iter(|| g.execute(0).unwrap())
    });
    drop(graph);
    let mut arrays = None;
    group.bench_function("two-thread c = a + b, 64 MiB", |b| {
        let (a, b2, out) =
            arrays.get_or_insert_with(|| (vec![1.0f32; len], vec![2.0f32; len], vec![0.0f32; len]));
        b.iter(|| add_reference(a, b2, out))
    });
    group.finish();
}

fn scaling(c: &mut Criterion) {
    let mut group = c.benchmark_group("scaling");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for n in [1usize, 2, 4, 8] {
        for kib in [1usize, 16, 256, 4096, 65536, 262144] {
            let len = kib * 256;
            group.throughput(Throughput::Bytes((len * 4) as u64));
            let mut graph = None;
            group.bench_with_input(
                BenchmarkId::new(format!("{n} actors"), format!("{kib} KiB")),
                &(),
                |b, _| {
                    let g = graph
                        .get_or_insert_with(|| Single::launch(holders(n, 1, len), Cpu).unwrap());
                    b.iter(|| g.execute(0).unwrap())
                },
            );
        }
    }
    group.finish();
}

/// One allreduce of one f32 tensor of each size per actor, the sizes and rank counts that
/// `scripts/vs-mpi.sh` runs OpenMPI's `MPI_Allreduce` with (it prints both side by side).
fn vs_mpi(c: &mut Criterion) {
    let mut group = c.benchmark_group("vs-mpi");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for n in [2usize, 4] {
        for bytes in [
            4usize,
            1 << 10,
            32 << 10,
            256 << 10,
            1 << 20,
            16 << 20,
            64 << 20,
        ] {
            let mut graph = None;
            group.bench_with_input(
                BenchmarkId::new(format!("{n} actors"), bytes),
                &(),
                |b, _| {
                    let g = graph.get_or_insert_with(|| {
                        Single::launch(holders(n, 1, bytes / 4), Cpu).unwrap()
                    });
                    b.iter(|| g.execute(0).unwrap())
                },
            );
        }
    }
    group.finish();
}

/// The rows of [`vs_mpi`] up to 1 KiB with `DEPTH` executions in flight (`submit`, then
/// `wait` for the oldest): the time per execution in a steady pipeline. An actor then has
/// its next `go` before it finishes a step, as an MPI rank in a loop of allreduces has its
/// next call, so with more ranks than cores a thread may run the end of one stage and the
/// start of the next in one turn on its core (see BENCHMARKS.md).
fn vs_mpi_pipelined(c: &mut Criterion) {
    use std::collections::VecDeque;
    const DEPTH: usize = 4;
    let mut group = c.benchmark_group("vs-mpi pipelined");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for n in [2usize, 4] {
        for bytes in [4usize, 1 << 10] {
            let options = LaunchOptions::default().max_in_flight(DEPTH);
            let mut g = Single::launch_with(holders(n, 1, bytes / 4), Cpu, options).unwrap();
            let mut tickets = VecDeque::with_capacity(DEPTH);
            group.bench_with_input(
                BenchmarkId::new(format!("{n} actors"), bytes),
                &(),
                |b, _| {
                    b.iter(|| {
                        if tickets.len() == DEPTH {
                            let oldest = tickets.pop_front().unwrap();
                            drop(g.wait(oldest).unwrap());
                        }
                        tickets.push_back(g.submit(0).unwrap());
                    })
                },
            );
            for t in tickets.drain(..) {
                g.wait(t).unwrap();
            }
        }
    }
    group.finish();
}

/// The CPU communicator alone, without a graph: `n` threads, each with its rank's endpoint,
/// run allreduces of one value of 4 B or 1 KiB back to back, as MPI ranks run
/// `MPI_Allreduce` (`scripts/vs-mpi.sh` runs the same sizes). The time is rank 0's, per
/// stage.
fn stage_alone(c: &mut Criterion) {
    use actorgraph::comm::{Collective, Header, SlotData, SlotDesc, Status};
    use actorgraph::{Backend, Communicator, DType, Element};
    use std::time::Instant;

    /// Runs `iters` allreduces of one value of `len` f32 on `comm`.
    fn run(comm: &mut actorgraph::comm::CpuComm, iters: u64, len: usize) {
        let mut data = vec![comm.rank() as f32; len];
        let mut input = data.clone();
        let slots = [SlotDesc::flat(DType::F32, len)];
        for _ in 0..iters {
            input.copy_from_slice(&data);
            let input_data = [SlotData::new(&input[..])];
            let header = Header {
                status: Status::Ok,
                slots: &slots,
                dims: &[],
                data: &input_data,
            };
            let mut regions = [f32::region_mut(&mut data)];
            let sum = Collective::AllReduce(ReduceOp::Sum);
            comm.stage(&header, sum, &mut regions, &mut []).unwrap();
        }
    }

    let mut group = c.benchmark_group("stage alone");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for n in [2usize, 4] {
        for bytes in [4usize, 1 << 10] {
            let len = bytes / 4;
            group.bench_function(BenchmarkId::new(format!("{n} ranks"), bytes), |b| {
                b.iter_custom(|iters| {
                    let mut comms = Cpu.communicators(n).unwrap();
                    let mut first = comms.remove(0);
                    let peers: Vec<_> = comms
                        .into_iter()
                        .map(|mut comm| std::thread::spawn(move || run(&mut comm, iters, len)))
                        .collect();
                    let start = Instant::now();
                    run(&mut first, iters, len);
                    let elapsed = start.elapsed();
                    for p in peers {
                        p.join().unwrap();
                    }
                    elapsed
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bucket8, fusion, bandwidth);
criterion_group!(scale, scaling);
criterion_group!(mpi, vs_mpi, vs_mpi_pipelined, stage_alone);
criterion_main!(benches, scale, mpi);

//! The GPU tests on a simulated GPU, so that they run on every machine with a C compiler:
//! `tests/fake_gpu/` holds a CUDA driver and an NCCL written for this (two GPUs whose
//! memory is host memory, one worker thread per stream, collectives between the ranks'
//! threads), built here and loaded instead of the real libraries by running this test
//! binary again with them first on `LD_LIBRARY_PATH`.
//!
//! The simulation checks what a GPU would not report: every device address lies in a live
//! allocation of the right GPU when the stream reaches it (so a free that overtakes a use
//! on another stream is caught), the ranks' NCCL calls pair up, no communicator is used
//! after its abort, peers have access to the pool memory they use, and no wait lasts
//! long; a violation aborts the run with a message. Where the hardware is strict it is
//! too: pageable uploads wait for their stream, peers connect lazily unless told not to,
//! one rank takes NCCL's shortcut, an abort discards queued work (docs/nccl.md lists it
//! all). It also injects faults (a failed allocation, free or NCCL call, a collective that
//! never completes, a slow GPU), which real GPUs give no way to do: the tests of the
//! failure model below need it and skip without it.
//!
//! It shows nothing about kernels, speed or real NCCL; `scripts/gpu-check.sh` runs the
//! same tests on real GPUs.

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::*;
use actorgraph::nccl::cudarc;

const SUITE: &str = "simulated::the_gpu_tests_pass_on_a_simulated_gpu";

/// Builds `libcuda.so` and `libnccl.so` from `tests/fake_gpu/` into `dir`.
fn build_fakes(dir: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fake-gpu.sh");
    let output = Command::new("sh")
        .arg(&script)
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "{} failed (it needs a C compiler: $CC, or `cc`):\n{}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
#[cfg(target_os = "linux")]
fn the_gpu_tests_pass_on_a_simulated_gpu() {
    if std::env::var_os("ACTORGRAPH_SIMULATED_GPU").is_some() {
        return; // the run below
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fake_gpu");
    build_fakes(&dir);
    let mut path = dir.clone().into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    let log = |name: &str| std::fs::File::create(dir.join(name)).unwrap();
    // One test at a time: libtest then names each before it runs, so a run that the
    // simulation aborts names its test.
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--test-threads=1", "--skip", SUITE])
        .env("LD_LIBRARY_PATH", path)
        .env("ACTORGRAPH_SIMULATED_GPU", "1")
        .env("ACTORGRAPH_REQUIRE_GPU", "1")
        .env("FAKE_GPU_COUNT", "2")
        .env("FAKE_GPU_TIMEOUT_S", "30")
        // The backend's own choice (connect at init) is under test.
        .env_remove("NCCL_RUNTIME_CONNECT")
        .stdin(Stdio::null())
        .stdout(log("stdout.txt"))
        .stderr(log("stderr.txt"))
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let (stdout, stderr) = (read("stdout.txt"), read("stderr.txt"));
    let Some(status) = status else {
        panic!("the simulated-GPU run took over 300 s:\n{stdout}\n{stderr}");
    };
    assert!(
        status.success(),
        "the GPU tests failed on the simulated GPU ({status}):\n{stdout}\n{stderr}"
    );
    let summary = stdout.lines().filter(|l| l.starts_with("test result"));
    eprintln!("simulated GPU: {}", summary.collect::<Vec<_>>().join(" "));
}

/// The simulation's controls: fault injection and NCCL counters.
struct Sim {
    fail_alloc: unsafe extern "C" fn(c_int, usize),
    fail_nccl_call: unsafe extern "C" fn(c_int, c_int),
    nccl_counts: unsafe extern "C" fn(c_int, *mut u64, *mut u64),
    host_waits: unsafe extern "C" fn(c_int) -> u64,
    slow_jobs: unsafe extern "C" fn(c_int, u32),
    async_error: unsafe extern "C" fn(c_int, c_int),
    delay_next: unsafe extern "C" fn(c_int, u32),
    fail_free: unsafe extern "C" fn(c_int),
    /// The test's turn on the GPUs, held as long as the controls.
    _turn: Turn,
}

/// The controls, with the test's turn on the GPUs, or `None` (after saying why) when this
/// process does not run on the simulation.
fn sim() -> Option<Sim> {
    let turn = gpu_turn(2)?;
    // SAFETY: the libraries are loaded (`gpus` asked the driver); the symbols, where they
    // exist, are the simulation's functions of these signatures (tests/fake_gpu/fake.h).
    let found = unsafe {
        let cuda = cudarc::driver::sys::culib();
        let nccl = cudarc::nccl::sys::culib();
        (
            cuda.get::<unsafe extern "C" fn(c_int, usize)>(b"fake_gpu_fail_alloc\0")
                .map(|f| *f),
            nccl.get::<unsafe extern "C" fn(c_int, c_int)>(b"fake_nccl_fail_call\0")
                .map(|f| *f),
            nccl.get::<unsafe extern "C" fn(c_int, *mut u64, *mut u64)>(b"fake_nccl_counts\0")
                .map(|f| *f),
            cuda.get::<unsafe extern "C" fn(c_int) -> u64>(b"fake_gpu_host_waits\0")
                .map(|f| *f),
            cuda.get::<unsafe extern "C" fn(c_int, u32)>(b"fake_gpu_slow_jobs\0")
                .map(|f| *f),
            nccl.get::<unsafe extern "C" fn(c_int, c_int)>(b"fake_nccl_async_error\0")
                .map(|f| *f),
            nccl.get::<unsafe extern "C" fn(c_int, u32)>(b"fake_nccl_delay_next\0")
                .map(|f| *f),
            cuda.get::<unsafe extern "C" fn(c_int)>(b"fake_gpu_fail_free\0")
                .map(|f| *f),
        )
    };
    match found {
        (
            Ok(fail_alloc),
            Ok(fail_nccl_call),
            Ok(nccl_counts),
            Ok(host_waits),
            Ok(slow_jobs),
            Ok(async_error),
            Ok(delay_next),
            Ok(fail_free),
        ) => Some(Sim {
            fail_alloc,
            fail_nccl_call,
            nccl_counts,
            host_waits,
            slow_jobs,
            async_error,
            delay_next,
            fail_free,
            _turn: turn,
        }),
        _ => {
            eprintln!("skipped: needs the simulated GPU (its fault injection and counters)");
            None
        }
    }
}

impl Sim {
    /// The next allocation of at least `bytes` on GPU `device` fails.
    fn fail_alloc(&self, device: usize, bytes: usize) {
        // SAFETY: a plain call into the simulation.
        unsafe { (self.fail_alloc)(device as c_int, bytes) }
    }

    /// The `nth` NCCL collective called from now on GPU `device` fails.
    fn fail_nccl_call(&self, device: usize, nth: usize) {
        // SAFETY: a plain call into the simulation.
        unsafe { (self.fail_nccl_call)(device as c_int, nth as c_int) }
    }

    /// NCCL kernel launches (a group, or a call outside one) and collective calls so far
    /// on GPU `device`.
    fn nccl_counts(&self, device: usize) -> (u64, u64) {
        let (mut launches, mut calls) = (0, 0);
        // SAFETY: a plain call into the simulation, writing two locals.
        unsafe { (self.nccl_counts)(device as c_int, &mut launches, &mut calls) };
        (launches, calls)
    }

    /// Every job on a stream of GPU `device` first sleeps `us` microseconds (0: no more).
    fn slow_jobs(&self, device: usize, us: u32) {
        // SAFETY: a plain call into the simulation.
        unsafe { (self.slow_jobs)(device as c_int, us) }
    }

    /// The `nth` NCCL collective called from now on GPU `device` never completes, and
    /// NCCL reports an error for its communicator (as for a broken connection).
    fn async_error(&self, device: usize, nth: usize) {
        // SAFETY: a plain call into the simulation.
        unsafe { (self.async_error)(device as c_int, nth as c_int) }
    }

    /// The next batch of NCCL collectives on GPU `device` first waits `ms` milliseconds.
    fn delay_next(&self, device: usize, ms: u32) {
        // SAFETY: a plain call into the simulation.
        unsafe { (self.delay_next)(device as c_int, ms) }
    }

    /// The next `cuMemFreeAsync` of memory of GPU `device` fails.
    fn fail_free(&self, device: usize) {
        // SAFETY: a plain call into the simulation.
        unsafe { (self.fail_free)(device as c_int) }
    }

    /// Host calls so far that waited for, or polled, a stream of GPU `device`.
    fn host_waits(&self, device: usize) -> u64 {
        // SAFETY: a plain call into the simulation.
        unsafe { (self.host_waits)(device as c_int) }
    }
}

const LONG: Duration = Duration::from_secs(60);

fn pair_sum() -> PairSum {
    PairSum::launch(
        vec![Pair { rank: 0 }, Pair { rank: 1 }],
        Nccl::new([0, 1]).unwrap(),
    )
    .unwrap()
}

/// The outcome of an execution after a failure that ended the group.
fn assert_broken<T: std::fmt::Debug>(outcome: Result<T, Error>) {
    assert!(
        matches!(outcome, Err(Error::Broken { .. })),
        "expected Error::Broken, got {outcome:?}"
    );
}

fn assert_exact_sums(g: &mut PairSum) {
    let want = pair_sums();
    let out = g.execute_timeout(LONG).unwrap();
    for (t, l) in &out {
        assert_eq!((host(t), *l), (want.clone(), 3.0));
    }
}

#[test]
fn a_failed_stage_buffer_allocation_on_one_gpu_fails_that_execute_only() {
    let Some(sim) = sim() else { return };
    let mut g = pair_sum();
    // The stage's f32 buffer: the gradient's 2^16 elements and the loss. The gradient
    // itself (2^18 bytes) is below the threshold.
    sim.fail_alloc(1, (1 << 18) + 1);
    match g.execute_timeout(LONG) {
        Err(Error::Gpu { call, message }) => {
            assert_eq!(call, "cuMemAlloc");
            assert_eq!(message, "CUDA_ERROR_OUT_OF_MEMORY: out of memory");
        }
        other => panic!("expected the allocation's error, got {other:?}"),
    }
    // The failure reached the peer through the agreement: the group goes on.
    assert_exact_sums(&mut g);
    assert_exact_sums(&mut g);
    g.teardown().unwrap();
}

type Outcome = Result<(), Error>;

/// One good execution, then the `nth` NCCL call on GPU 1 fails: the next execution's
/// outcome, and two more.
fn fail_then_run(
    sim: &Sim,
    nth: usize,
    mut execute: impl FnMut() -> Outcome,
) -> (Outcome, Vec<Outcome>) {
    execute().unwrap();
    sim.fail_nccl_call(1, nth);
    let first = execute();
    (first, (0..2).map(|_| execute()).collect())
}

#[test]
fn a_failed_nccl_call_on_one_rank_ends_the_group_without_a_hang() {
    let Some(sim) = sim() else { return };
    // A failed call leaves the peer's collective waiting on its GPU for a partner that
    // will never come, until the group is aborted. The first call of PairSum's one-call
    // group; the third of MixedSum's five (NCCL then launches none of the group).
    let mut g = pair_sum();
    let pair = fail_then_run(&sim, 1, || g.execute_timeout(LONG).map(drop));
    g.teardown().unwrap();
    let makers = vec![Maker { calls: 0 }, Maker { calls: 0 }];
    let mut g = MixedSum::launch(makers, Nccl::new([0, 1]).unwrap()).unwrap();
    let mixed = fail_then_run(&sim, 3, || g.execute_timeout(LONG).map(drop));
    g.teardown().unwrap();
    for ((first, then), name) in [(pair, "ns"), (mixed, "ws")] {
        match first {
            Err(Error::Gpu { call, message }) => {
                assert_eq!(
                    (call, message.as_str()),
                    ("ncclAllReduce", "ncclInternalError")
                )
            }
            other => panic!("expected ncclAllReduce's error, got {other:?}"),
        }
        // NCCL calls can no longer pair up: the group is over, and says so.
        for r in then {
            match r {
                Err(Error::Broken { group, reason }) => {
                    assert_eq!(group, name);
                    assert!(reason.contains("aborted"), "{reason}");
                }
                other => panic!("expected Error::Broken, got {other:?}"),
            }
        }
    }
}

#[test]
fn a_stage_of_gpu_values_is_one_nccl_launch_and_never_waits_for_the_gpu() {
    let Some(sim) = sim() else { return };
    let makers = || vec![Maker { calls: 0 }, Maker { calls: 0 }];
    // Per GPU: (NCCL launches, NCCL calls, host waits on its streams) during `run`.
    let during = |run: &mut dyn FnMut()| {
        let count = |d| {
            let (launches, calls) = sim.nccl_counts(d);
            [launches, calls, sim.host_waits(d)]
        };
        let before = [count(0), count(1)];
        run();
        (0..2)
            .map(|d| {
                let after = count(d);
                [0, 1, 2].map(|i| after[i] - before[d][i])
            })
            .collect::<Vec<_>>()
    };

    // Seven values of five dtypes in one allreduce: one group of five calls (one per
    // dtype region); the agreement is on the host, and nothing waits for a GPU.
    let mut g = MixedSum::launch(makers(), Nccl::new([0, 1]).unwrap()).unwrap();
    for _ in 0..3 {
        let counts = during(&mut || drop(g.execute_timeout(LONG).unwrap()));
        assert_eq!(counts, vec![[1, 5, 0]; 2]);
    }
    g.teardown().unwrap();

    // Two stages (allreduce, allgather) over an empty f32, a 4-element f32 and an empty
    // i32: empty regions and values make no call.
    let mut g = Empties::launch(makers(), Nccl::new([0, 1]).unwrap()).unwrap();
    for _ in 0..3 {
        let counts = during(&mut || drop(g.execute_timeout(LONG).unwrap()));
        assert_eq!(counts, vec![[2, 2, 0]; 2]);
    }
    g.teardown().unwrap();
}

graph! {
    /// PairSum without the host value: the stage never waits for its collective.
    PairGrad(ns: [Pair]) {
        let g = ns.grad();
        allreduce(g)
    }
}

#[test]
fn results_handed_out_stay_right_when_a_later_stage_fails() {
    let Some(sim) = sim() else { return };
    let want = pair_sums();
    let pairs = vec![Pair { rank: 0 }, Pair { rank: 1 }];
    let mut g = PairGrad::launch(pairs, Nccl::new([0, 1]).unwrap()).unwrap();
    for t in g.execute_timeout(LONG).unwrap() {
        assert_eq!(host(&t), want);
    }
    // GPU 1 lags: this execution's allreduce is still queued on both GPUs when `execute`
    // returns its views, and when rank 1's next NCCL call fails.
    sim.slow_jobs(1, 20_000);
    let held = g.execute_timeout(LONG).unwrap();
    sim.fail_nccl_call(1, 1);
    let failed = g.execute_timeout(LONG).map(drop);
    sim.slow_jobs(1, 0);
    assert!(matches!(failed, Err(Error::Gpu { .. })), "{failed:?}");
    // Rank 0's collective of the failed stage waits for calls that NCCL dropped: rank 0
    // aborted it before `execute` returned (after its earlier ones finished), or these
    // copies, queued behind it, would wait for ever.
    for t in &held {
        let got = host(t);
        assert!(
            got == want,
            "a result handed out before the failure changed"
        );
    }
    assert_broken(g.execute_timeout(LONG));
    g.teardown().unwrap();
}

#[test]
fn an_nccl_error_reported_later_fails_the_stage_that_waits_for_it() {
    let Some(sim) = sim() else { return };
    // PairSum's loss is a host value: the stage waits for its collective, which on rank 1
    // never completes; NCCL reports why.
    let mut g = pair_sum();
    assert_exact_sums(&mut g);
    sim.async_error(1, 1);
    match g.execute_timeout(LONG) {
        Err(Error::Gpu { call, message }) => {
            assert_eq!(
                (call, message.as_str()),
                ("ncclCommGetAsyncError", "ncclSystemError")
            )
        }
        other => panic!("expected the asynchronous NCCL error, got {other:?}"),
    }
    assert_broken(g.execute_timeout(LONG));
    g.teardown().unwrap();

    // All on the GPU, nothing waits: the next stage reports it.
    let makers = vec![Maker { calls: 0 }, Maker { calls: 0 }];
    let mut g = MixedSum::launch(makers, Nccl::new([0, 1]).unwrap()).unwrap();
    g.execute_timeout(LONG).unwrap();
    sim.async_error(1, 1);
    let _ = g.execute_timeout(LONG);
    match g.execute_timeout(LONG).map(drop) {
        Err(Error::Gpu { call, .. }) => assert_eq!(call, "ncclCommGetAsyncError"),
        other => panic!("expected the asynchronous NCCL error, got {other:?}"),
    }
    assert_broken(g.execute_timeout(LONG));
    g.teardown().unwrap();
}

#[test]
fn results_held_across_teardown_stay_right() {
    let Some(sim) = sim() else { return };
    let want = pair_sums();
    let pairs = vec![Pair { rank: 0 }, Pair { rank: 1 }];
    let mut g = PairGrad::launch(pairs, Nccl::new([0, 1]).unwrap()).unwrap();
    g.execute_timeout(LONG).unwrap();
    // This execution's allreduce is still queued at teardown, and stays so for longer
    // than a failing rank would wait before aborting (2 s): a healthy teardown waits for
    // it and destroys the communicators (an abort would discard it).
    sim.delay_next(1, 3_000);
    let held = g.execute_timeout(LONG).unwrap();
    assert!(g.teardown().is_ok());
    for t in &held {
        let got = host(t);
        assert!(got == want, "a result handed out before teardown changed");
    }
}

/// Pair's gradient, after rank 1 naps.
struct Lag {
    rank: usize,
}

#[actor]
impl Lag {
    fn grad(&mut self, nap_ms: &u64) -> Result<Tensor<f32>, BoxError> {
        if self.rank == 1 {
            std::thread::sleep(Duration::from_millis(*nap_ms));
        }
        Pair { rank: self.rank }.grad()
    }
}

graph! {
    LagGrad(ns: [Lag], nap_ms: u64) {
        let g = ns.grad(nap_ms);
        allreduce(g)
    }
}

#[test]
fn results_held_across_a_timeout_stay_right() {
    let Some(sim) = sim() else { return };
    let want = pair_sums();
    let lags = vec![Lag { rank: 0 }, Lag { rank: 1 }];
    let mut g = LagGrad::launch(lags, Nccl::new([0, 1]).unwrap()).unwrap();
    g.execute_timeout(0, LONG).unwrap();
    // This execution's allreduce is still queued when the next one times out in the
    // agreement (rank 1 naps in its method) and the group is aborted.
    sim.slow_jobs(1, 20_000);
    let held = g.execute_timeout(0, LONG).unwrap();
    match g.execute_timeout(300, Duration::from_millis(20)) {
        Err(Error::Timeout { ranks, .. }) => assert_eq!(ranks, vec![1]),
        other => panic!("expected Error::Timeout, got {:?}", other.map(drop)),
    }
    assert_broken(g.execute_timeout(0, LONG));
    sim.slow_jobs(1, 0);
    for t in &held {
        let got = host(t);
        assert!(
            got == want,
            "a result handed out before the timeout changed"
        );
    }
    g.teardown().unwrap();
}

graph! {
    GradThenLoss(ns: [Pair]) {
        let g = ns.grad();
        let l = ns.loss();
        let rg = allreduce(g);
        let rl = allreduce(l);
        (rg, rl)
    }
}

#[test]
fn a_host_value_queued_behind_a_stuck_collective_fails_the_stage_without_a_hang() {
    let Some(sim) = sim() else { return };
    let want = pair_sums();
    let pairs = vec![Pair { rank: 0 }, Pair { rank: 1 }];
    let mut g = GradThenLoss::launch(pairs, Nccl::new([0, 1]).unwrap()).unwrap();
    for (t, l) in g.execute_timeout(LONG).unwrap() {
        assert_eq!((host(&t), l), (want.clone(), 3.0));
    }
    // The gradient's allreduce never completes on GPU 1 (and so on GPU 0, which waits for
    // it): the loss, a host value, is then uploaded behind it on both streams. From
    // pageable memory the simulation's upload waits for the stream, as a GPU's may; the
    // staged upload returns, and the stage reports NCCL's error.
    sim.async_error(1, 1);
    match g.execute_timeout(LONG).map(drop) {
        Err(Error::Gpu { call, .. }) => assert_eq!(call, "ncclCommGetAsyncError"),
        other => panic!("expected the asynchronous NCCL error, got {other:?}"),
    }
    assert_broken(g.execute_timeout(LONG));
    g.teardown().unwrap();
}

#[test]
fn a_rank_whose_first_large_collective_fails_leaves_no_peer_connecting() {
    let Some(sim) = sim() else { return };
    // The group's first large collective: NCCL connects its peers there when it connects
    // lazily, and rank 0 would wait inside its launch for rank 1, whose call fails.
    // `Nccl` makes NCCL connect at init (NCCL_RUNTIME_CONNECT=0).
    let pairs = vec![Pair { rank: 0 }, Pair { rank: 1 }];
    let mut g = PairGrad::launch(pairs, Nccl::new([0, 1]).unwrap()).unwrap();
    assert_eq!(std::env::var("NCCL_RUNTIME_CONNECT").as_deref(), Ok("0"));
    sim.fail_nccl_call(1, 1);
    let failed = g.execute_timeout(LONG).map(drop);
    assert!(matches!(failed, Err(Error::Gpu { .. })), "{failed:?}");
    assert_broken(g.execute_timeout(LONG));
    g.teardown().unwrap();
}

#[test]
fn a_free_that_fails_on_the_callers_thread_does_not_end_the_group() {
    let Some(sim) = sim() else { return };
    let want = pair_sums();
    let pairs = vec![Pair { rank: 0 }, Pair { rank: 1 }];
    let mut g = PairGrad::launch(pairs, Nccl::new([0, 1]).unwrap()).unwrap();
    // Held across the next execution, which then takes new stage buffers: dropping these
    // views frees the old ones, here, on this thread.
    let held = g.execute_timeout(LONG).unwrap();
    g.execute_timeout(LONG).unwrap();
    sim.fail_free(1);
    drop(held);
    // cudarc keeps the failed free's error in GPU 1's context, for the next call there
    // to return: the drop reads it (and says so on stderr), so rank 1's next stage does
    // not fail under another call's name, ending a healthy group.
    for t in g.execute_timeout(LONG).unwrap() {
        assert_eq!(host(&t), want);
    }
    g.teardown().unwrap();
}

#[test]
fn a_free_that_fails_on_an_actors_thread_fails_its_next_stage_by_name() {
    let Some(sim) = sim() else { return };
    let want = pair_sums();
    let pairs = vec![Pair { rank: 0 }, Pair { rank: 1 }];
    let mut g = PairGrad::launch(pairs, Nccl::new([0, 1]).unwrap()).unwrap();
    g.execute_timeout(LONG).unwrap();
    // Rank 1's gradient, packed into the stage and then dropped on its thread, is the
    // next memory of GPU 1 freed.
    sim.fail_free(1);
    let outcomes: Vec<_> = (0..2).map(|_| g.execute_timeout(LONG).map(drop)).collect();
    let named = |r: &Result<(), Error>| matches!(r, Err(Error::Gpu { call, .. }) if call.starts_with("cuMemFreeAsync"));
    assert!(
        outcomes.iter().filter(|r| named(r)).count() == 1
            && outcomes.iter().filter(|r| r.is_ok()).count() == 1,
        "expected one execute to fail with the free's error: {outcomes:?}"
    );
    for t in g.execute_timeout(LONG).unwrap() {
        assert_eq!(host(&t), want);
    }
    g.teardown().unwrap();
}

#[test]
fn a_one_rank_group_takes_nccls_shortcut() {
    let Some(sim) = sim() else { return };
    let launches = |run: &mut dyn FnMut()| {
        let before = sim.nccl_counts(0);
        run();
        let after = sim.nccl_counts(0);
        (after.0 - before.0, after.1 - before.1)
    };
    // One rank, as on a one-GPU machine: NCCL's in-place collectives other than Avg issue
    // no work at all (the results are the inputs, already in place), so a one-GPU run
    // exercises none of NCCL's data path. Five calls (one per dtype), no launch.
    let mut g = MixedSum::launch(vec![Maker { calls: 0 }], Nccl::new([0]).unwrap()).unwrap();
    for s in 1..=2 {
        let mut out = Vec::new();
        assert_eq!(launches(&mut || out = g.execute().unwrap()), (0, 5));
        assert_eq!(host(&out[0].0), values::<f32>(s, 0, 1000));
    }
    g.teardown().unwrap();
    // Avg scales (a kernel), allgather and reducescatter write separate outputs (a copy);
    // broadcast and reduce are in place: three launches.
    let mut g = HostOnly::launch(host_vals(1), Nccl::new([0]).unwrap()).unwrap();
    let mut out = Vec::new();
    assert_eq!(launches(&mut || out = g.execute().unwrap()).0, 3);
    let (ar, ag, _, bc, _) = &out[0];
    assert_eq!((ar.0, ag.0.clone(), bc.0), (0.5, vec![0.5], 0.5));
    g.teardown().unwrap();
}

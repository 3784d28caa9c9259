//! The launcher of the MPI tests: a test starts `mpirun` over its own test binary, under a
//! watchdog, and every process runs that binary's `worker` test, which reads the scenario
//! from `ACTORGRAPH_MPI_SCENARIO` and the actors of each process from
//! `ACTORGRAPH_MPI_LAYOUT` (e.g. `1,2,1`; see [`layout`]). A test binary includes this file
//! with `#[path = "support/mpirun.rs"] mod mpirun;`.
#![allow(dead_code)] // each test binary uses its own part

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use actorgraph::mpi::SHARED_MEMORY_VAR;

pub const SCENARIO: &str = "ACTORGRAPH_MPI_SCENARIO";
pub const LAYOUT: &str = "ACTORGRAPH_MPI_LAYOUT";
/// How long one `mpirun` may take before the watchdog kills it and fails the test.
pub const WATCHDOG: Duration = Duration::from_secs(120);

/// What `mpirun` did: whether it succeeded, its exit code (`None` if a signal ended it),
/// and its output.
pub struct Run {
    pub success: bool,
    pub code: Option<i32>,
    pub output: String,
}

/// Runs `scenario` over `layout` (actors per process) with the byte transfer layer `btl`,
/// under the watchdog: a run that does not end in time fails the test.
pub fn mpirun(scenario: &str, layout: &[usize], btl: &str) -> Run {
    mpirun_env(scenario, layout, btl, &[])
}

/// [`mpirun`], with the variables `env` set in every process.
pub fn mpirun_env(scenario: &str, layout: &[usize], btl: &str, env: &[(&str, &str)]) -> Run {
    let layout_arg = layout
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "mpi-{scenario}-{}-{}",
        layout_arg.replace(',', "_"),
        btl.replace(',', "_")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "-np", &layout.len().to_string()])
        .args(["--mca", "btl", btl, "--mca", "pml", "ob1"]);
    if btl.contains("tcp") {
        // Loopback stands in for the network between machines, which share no memory:
        // the leaders meet by MPI messages only.
        cmd.args(["--mca", "btl_tcp_if_include", "lo"])
            .args(["-x", &format!("{SHARED_MEMORY_VAR}=0")]);
    }
    for &(name, value) in env {
        cmd.args(["-x", name]).env(name, value);
    }
    cmd.args(["-x", SCENARIO, "-x", LAYOUT])
        .arg(std::env::current_exe().unwrap());
    watch(cmd, scenario, &layout_arg, &dir)
}

/// Runs `scenario` as one process started without `mpirun` (MPI's singleton), hosting
/// `actors` actors, under the watchdog.
pub fn alone(scenario: &str, actors: usize) -> Run {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("alone-{scenario}"));
    std::fs::create_dir_all(&dir).unwrap();
    let cmd = Command::new(std::env::current_exe().unwrap());
    watch(cmd, scenario, &actors.to_string(), &dir)
}

/// Runs `cmd`, whose last argument is this test binary, as the `worker` test of
/// `scenario` over `layout`, and waits for it under the watchdog, its output in `dir`.
fn watch(mut cmd: Command, scenario: &str, layout: &str, dir: &std::path::Path) -> Run {
    // One run at a time: on a small machine, several at once oversubscribe it.
    static SERIAL: Mutex<()> = Mutex::new(());
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let log = |name: &str| std::fs::File::create(dir.join(name)).unwrap();
    let child = cmd
        .args(["--exact", "worker", "--nocapture", "--test-threads=1"])
        .env(SCENARIO, scenario)
        .env(LAYOUT, layout)
        // CI runs as root, which OpenMPI refuses unless told.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .stdout(log("stdout.txt"))
        .stderr(log("stderr.txt"))
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            let program = cmd.get_program().to_string_lossy().into_owned();
            panic!(
                "could not start `{program}` ({e}): install OpenMPI (libopenmpi-dev openmpi-bin)"
            )
        }
    };
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > WATCHDOG {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let output = format!("{}\n{}", read("stdout.txt"), read("stderr.txt"));
    let Some(status) = status else {
        panic!("{scenario} over [{layout}] hung: killed after {WATCHDOG:?}\n{output}");
    };
    Run {
        success: status.success(),
        code: status.code(),
        output,
    }
}

/// Runs `scenario` and fails the test if any process failed.
pub fn passes(scenario: &str, layout: &[usize], btl: &str) {
    passes_env(scenario, layout, btl, &[]);
}

/// [`passes`], with the variables `env` set in every process.
pub fn passes_env(scenario: &str, layout: &[usize], btl: &str, env: &[(&str, &str)]) {
    let run = mpirun_env(scenario, layout, btl, env);
    assert!(
        run.success,
        "{scenario} over {layout:?} ({btl}) failed:\n{}",
        run.output
    );
    // Each process says it finished, so that a scenario that ran nothing cannot pass.
    let done = run.output.matches("scenario done").count();
    assert_eq!(done, layout.len(), "{}", run.output);
}

pub const SHM: &str = "self,vader";
pub const TCP: &str = "self,tcp";

/// In a process that `mpirun` started: the scenario and the actors of each process; `None`
/// in a plain `cargo test`, where `worker` has nothing to do.
pub fn scenario() -> Option<(String, Vec<usize>)> {
    let scenario = std::env::var(SCENARIO).ok()?;
    Some((scenario, layout()))
}

/// In a process that `mpirun` started: whether its group leaders should meet in shared
/// memory (every run but one over TCP, which stands in for separate machines).
pub fn shared_memory_expected() -> bool {
    std::env::var(SHARED_MEMORY_VAR).is_err()
}

/// The actors of each process, from `ACTORGRAPH_MPI_LAYOUT`.
pub fn layout() -> Vec<usize> {
    std::env::var(LAYOUT)
        .expect("ACTORGRAPH_MPI_LAYOUT is set by `mpirun`")
        .split(',')
        .map(|n| n.parse().expect("a layout is a list of numbers"))
        .collect()
}

//! How the NCCL backend finds its libraries, checked on any machine, GPU or not.
//!
//! A missing CUDA driver or NCCL is an error, not a panic. NCCL installed only under its
//! soname `libnccl.so.2` (which cudarc does not look for) gets an error naming the file
//! and the link to make, and that link works: a stub `libnccl.so.2` built here with `cc`
//! stands in for NCCL, and a child process (this test binary, re-run with another
//! `LD_LIBRARY_PATH`, which the loader reads only at start) reports what it opens.
#![cfg(feature = "nccl")]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use actorgraph::nccl;
use actorgraph::Error;

/// Set in the child's environment; without it `probe_child` does nothing.
const CHILD_ENV: &str = "ACTORGRAPH_PROBE_CHILD";
const BEGIN: &str = "<<probe-result>>";
const END: &str = "<</probe-result>>";

/// The version the stub reports: NCCL 2.23.4.
const STUB_C: &str = "int ncclGetVersion(int *version) { *version = 22304; return 0; }\n";

fn cuda_present() -> bool {
    // SAFETY: opens the libraries cudarc itself opens on its first driver call.
    unsafe { nccl::cudarc::driver::sys::is_culib_present() }
}

fn nccl_present() -> bool {
    // SAFETY: opens the libraries cudarc itself opens on its first NCCL call.
    unsafe { nccl::cudarc::nccl::sys::is_culib_present() }
}

#[test]
fn missing_driver_is_an_error_not_a_panic() {
    match (cuda_present(), nccl::device_count()) {
        (true, Ok(_)) => {}
        (false, Err(e @ Error::LibraryMissing { .. })) => {
            let message = e.to_string();
            assert!(message.contains("libcuda"), "{message}");
            assert!(message.contains("libcuda.so.1"), "{message}");
        }
        (present, result) => {
            panic!("libcuda present: {present}, but device_count() returned {result:?}")
        }
    }
}

#[test]
fn missing_nccl_is_an_error_not_a_panic() {
    match (nccl_present(), nccl::nccl_version()) {
        (true, Ok((major, _, _))) => assert_eq!(major, 2),
        (false, Err(e @ Error::LibraryMissing { .. })) => {
            let message = e.to_string();
            assert!(message.contains("libnccl"), "{message}");
            assert!(message.contains("\"libnccl.so\""), "{message}");
            assert!(message.contains("\"libnccl.so.2\""), "{message}");
        }
        (present, result) => {
            panic!("NCCL present: {present}, but nccl_version() returned {result:?}")
        }
    }
}

/// Run only as a child of the test below: prints what `nccl_version()` returns between
/// [`BEGIN`] and [`END`].
#[test]
#[ignore = "run by nccl_installed_only_as_its_soname_gets_a_working_fix in a child process"]
fn probe_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let result = match nccl::nccl_version() {
        Ok((major, minor, patch)) => format!("ok {major}.{minor}.{patch}"),
        Err(e @ Error::LibraryMissing { .. }) => format!("library-missing\n{e}"),
        Err(e) => format!("other-error\n{e}"),
    };
    println!("\n{BEGIN}\n{result}\n{END}");
}

#[test]
fn nccl_installed_only_as_its_soname_gets_a_working_fix() {
    let dir = TempDir::new("nccl_installed_only_as_its_soname");
    let stub = build_stub(&dir.0);
    let stub_dir = stub.parent().unwrap();

    // (a) Only libnccl.so.2 can be opened: the error names it and the link to make.
    if nccl_present() {
        eprintln!(
            "skipping the libnccl.so.2-only case: this machine has an NCCL that cudarc opens \
             without help, which would be found before the stub"
        );
    } else {
        let result = run_child(&[("LD_LIBRARY_PATH", &prepend_path(stub_dir))]);
        let message = result
            .strip_prefix("library-missing\n")
            .unwrap_or_else(|| panic!("expected LibraryMissing, got: {result}"));
        let stub_path = stub.to_str().unwrap();
        assert!(message.contains(stub_path), "{message}");
        assert!(
            message.contains(&format!("libnccl.so -> {stub_path}")),
            "{message}"
        );
        assert!(
            message.contains(&format!("ln -sf {stub_path} ")),
            "{message}"
        );
        assert!(message.contains("export LD_LIBRARY_PATH="), "{message}");

        // The hint's commands, run as given (in a shell, with a HOME of our own, and the
        // stub's directory no longer on LD_LIBRARY_PATH), make cudarc open the stub.
        let commands: Vec<&str> = message
            .lines()
            .filter_map(|line| line.strip_prefix("    "))
            .collect();
        assert_eq!(
            commands.len(),
            3,
            "expected mkdir, ln and export: {message}"
        );
        let home = dir.0.join("home");
        let result = run_child_in_shell(&commands.join("\n"), &home);
        assert_eq!(result, "ok 2.23.4", "following the hint: {message}");
        assert!(home
            .join(".local/lib/actorgraph-nccl/libnccl.so")
            .is_symlink());
    }

    // (b) With the link `libnccl.so -> libnccl.so.2` beside it, cudarc's own loader opens
    // the stub and calls it.
    std::os::unix::fs::symlink("libnccl.so.2", stub_dir.join("libnccl.so")).unwrap();
    let result = run_child(&[("LD_LIBRARY_PATH", &prepend_path(stub_dir))]);
    assert_eq!(result, "ok 2.23.4");
}

/// Compiles [`STUB_C`] into `dir/libnccl.so.2` and returns its canonical path (the form
/// the process maps show).
fn build_stub(dir: &Path) -> PathBuf {
    let source = dir.join("stub.c");
    let library = dir.join("libnccl.so.2");
    fs::write(&source, STUB_C).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let output = Command::new(&cc)
        .args(["-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o"])
        .arg(&library)
        .arg(&source)
        .output()
        .unwrap_or_else(|e| {
            panic!("this test needs a C compiler (`{cc}`, from $CC or `cc`) to build a stub libnccl.so.2: {e}")
        });
    assert!(
        output.status.success(),
        "`{cc}` failed to build the stub libnccl.so.2: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    library.canonicalize().unwrap()
}

/// `dir` followed by this process's `LD_LIBRARY_PATH`, so the child finds everything the
/// parent does, and the stub first.
fn prepend_path(dir: &Path) -> String {
    match std::env::var("LD_LIBRARY_PATH") {
        Ok(rest) if !rest.is_empty() => format!("{}:{rest}", dir.display()),
        _ => dir.display().to_string(),
    }
}

fn child_command() -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--ignored",
            "--exact",
            "probe_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1");
    command
}

fn run_child(env: &[(&str, &str)]) -> String {
    let mut command = child_command();
    command.envs(env.iter().copied());
    child_result(command)
}

/// Runs `script` in `sh` with `HOME=home`, then the child from that shell.
fn run_child_in_shell(script: &str, home: &Path) -> String {
    let child = child_command();
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(format!("set -e\n{script}\nexec \"$0\" \"$@\""))
        .arg(child.get_program())
        .args(child.get_args())
        .env(CHILD_ENV, "1")
        .env("HOME", home);
    child_result(command)
}

fn child_result(mut command: Command) -> String {
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the child failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let start = stdout
        .find(BEGIN)
        .unwrap_or_else(|| panic!("the child printed no result:\n{stdout}\n{stderr}"));
    let rest = &stdout[start + BEGIN.len()..];
    let end = rest
        .find(END)
        .unwrap_or_else(|| panic!("the child's result is cut short:\n{stdout}\n{stderr}"));
    rest[..end].trim().to_string()
}

/// A fresh directory for one test of this process, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(test: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "actorgraph-nccl-loader-{}-{test}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

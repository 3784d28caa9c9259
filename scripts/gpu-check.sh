#!/usr/bin/env bash
# The NCCL backend's checks on a machine with a GPU (one is enough):
#   1. builds the three NCCL test files and the example below (release, feature `nccl`),
#   2. runs the GPU tests (tests/nccl_gpu.rs: on the real GPUs; their run on simulated GPUs
#      is CI's), the library-loading tests (tests/nccl_loader.rs) and tests/nccl_cpu.rs,
#   3. runs the example that checks and times a fused allreduce (examples/nccl_allreduce.rs),
# each under a time limit (170 + 70 + 50 s by default, so the whole script stays under
# 5 minutes); then a summary. The exit status is 0 only if every step passed.
#
# Usage, from anywhere in the repository:
#     scripts/gpu-check.sh                   build here, then run
#     scripts/gpu-check.sh --build-bundle [DIR]
#         on a machine with cargo (no GPU needed): build the binaries (release, stripped,
#         about 5 MiB; they need glibc 2.34 or newer) into DIR (default target/gpu-bundle),
#         and stop
#     scripts/gpu-check.sh --bundle [DIR]
#         on a GPU machine: run the binaries of DIR, without building
#
# A GPU machine with no Rust toolchain or no network (as this project's lent device machine
# is) takes the bundle: build it here, carry DIR there, run `scripts/gpu-check.sh --bundle`
# there. Dry run without a GPU, on the simulated one (see README, "Testing without a GPU"):
#     sh scripts/fake-gpu.sh && LD_LIBRARY_PATH=$PWD/target/fake_gpu \
#         scripts/gpu-check.sh --bundle
#
# Needs the NVIDIA driver, NCCL 2 (a system package, or the nvidia-nccl-cu12/-cu13 wheel
# that PyTorch installs) and a C compiler (`cc`, for the stub library tests/nccl_loader.rs
# builds); to build, the Rust toolchain. No CUDA toolkit: the libraries are opened at run
# time.
#
# Crates, when building: cargo must find every dependency without the network if the
# machine has none: a populated ~/.cargo registry (or a vendored source in
# .cargo/config.toml). Set CARGO_OFFLINE=1 to pass --offline, so that cargo fails at once
# instead of trying to reach crates.io.
#
# Environment:
#   CARGO_OFFLINE=1        pass --offline to cargo
#   BUILD_TIMEOUT=seconds  limit for the build (default 170)
#   TEST_TIMEOUT=seconds   limit for running the GPU tests (default 70)
#   EXAMPLE_TIMEOUT=secs   limit for running the example (default 50)
#   EXAMPLE_ARGS="..."     arguments for the example (default: every GPU, 50 steps)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

mode=build
bundle=target/gpu-bundle
case "${1:-}" in
    --build-bundle) mode=build-bundle ;;
    --bundle) mode=bundle ;;
    "") ;;
    *)
        echo "usage: $0 [--build-bundle [DIR] | --bundle [DIR]]" >&2
        exit 2
        ;;
esac
if [[ $mode != build && -n "${2:-}" ]]; then
    bundle="$2"
fi
# The run on the simulated GPU belongs to CI (it needs the sources and a C compiler).
skip_simulated=(--skip simulated::the_gpu_tests_pass_on_a_simulated_gpu)
tests=(nccl_gpu nccl_loader nccl_cpu)

BUILD_TIMEOUT="${BUILD_TIMEOUT:-170}"
TEST_TIMEOUT="${TEST_TIMEOUT:-70}"
EXAMPLE_TIMEOUT="${EXAMPLE_TIMEOUT:-50}"
read -r -a EXAMPLE_ARGS <<<"${EXAMPLE_ARGS:-}"

cargo_flags=(--release --features nccl)
if [[ -n "${CARGO_OFFLINE:-}" && "${CARGO_OFFLINE}" != 0 ]]; then
    cargo_flags+=(--offline)
fi

if [[ $mode == build-bundle ]]; then
    mkdir -p "$bundle"
    # Copies the executables of cargo's JSON messages (on stdin) whose target kind is $1.
    copy_built() {
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and sys.argv[1] in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])
' "$1" | while read -r name exe; do
            cp "$exe" "$bundle/$name"
        done
    }
    cargo test "${cargo_flags[@]}" --no-run "${tests[@]/#/--test=}" --message-format=json |
        copy_built test
    cargo build "${cargo_flags[@]}" --example nccl_allreduce --message-format=json |
        copy_built example
    strip "$bundle"/* 2>/dev/null || true
    ls -l "$bundle"
    for t in "${tests[@]}" nccl_allreduce; do
        [[ -x "$bundle/$t" ]] || { echo "missing $bundle/$t" >&2; exit 1; }
    done
    echo "bundle ready: carry $bundle, then run scripts/gpu-check.sh --bundle $bundle"
    exit 0
fi

section() { printf '\n=== %s ===\n' "$*"; }

section "GPUs"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L || echo "nvidia-smi -L failed (status $?)"
else
    echo "nvidia-smi not found (the tests ask the CUDA driver directly)"
fi

section "NCCL"
# cudarc opens NCCL by the name `libnccl.so` (and a few versioned names), never by its
# soname `libnccl.so.2`. `libnccl.so` comes only with the development package
# (libnccl-dev); the runtime package (libnccl2) and the nvidia-nccl-cu12 wheel install only
# `libnccl.so.2`. The dynamic loader reads LD_LIBRARY_PATH when a process starts, so a
# link `libnccl.so -> .../libnccl.so.2` in a directory of its own, put on LD_LIBRARY_PATH
# here, makes every test and example below find NCCL.

# Prints the first file called $1 in LD_LIBRARY_PATH's directories, or in the loader's cache.
find_lib() {
    local name="$1" dir
    local IFS=:
    for dir in ${LD_LIBRARY_PATH:-}; do
        if [[ -n "$dir" && -e "$dir/$name" ]]; then
            echo "$dir/$name"
            return 0
        fi
    done
    if command -v ldconfig >/dev/null 2>&1 || [[ -x /sbin/ldconfig ]]; then
        # Lines look like: "	libnccl.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnccl.so.2"
        { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true; } |
            awk -v n="$name" '$1 == n && !done { print $NF; done = 1 }'
    fi
}

nccl_note=""
if found="$(find_lib libnccl.so)" && [[ -n "$found" ]]; then
    echo "libnccl.so: $found (cudarc opens it as is)"
    nccl_note="system libnccl.so"
else
    soname="$(find_lib libnccl.so.2 || true)"
    if [[ -z "$soname" ]]; then
        # The nvidia-nccl-cu12 wheel (e.g. installed with PyTorch).
        wheel_dir="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
        if [[ -n "$wheel_dir" && -e "$wheel_dir/lib/libnccl.so.2" ]]; then
            soname="$wheel_dir/lib/libnccl.so.2"
        fi
    fi
    if [[ -z "$soname" ]]; then
        for dir in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/local/cuda/lib64 /usr/lib64 /usr/local/lib; do
            if [[ -e "$dir/libnccl.so.2" ]]; then
                soname="$dir/libnccl.so.2"
                break
            fi
        done
    fi
    if [[ -n "$soname" ]]; then
        link_dir="$(mktemp -d "${TMPDIR:-/tmp}/actorgraph-nccl.XXXXXX")"
        trap 'rm -rf "$link_dir"' EXIT
        ln -s "$soname" "$link_dir/libnccl.so"
        export LD_LIBRARY_PATH="$link_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "libnccl.so.2: $soname"
        echo "no libnccl.so: linked $link_dir/libnccl.so -> $soname, put first on LD_LIBRARY_PATH"
        nccl_note="linked $soname"
    else
        echo "NCCL not found (no libnccl.so or libnccl.so.2 in LD_LIBRARY_PATH, the loader cache,"
        echo "the nvidia-nccl-cu12 wheel or the usual directories): the GPU tests will fail and"
        echo "say how to install it"
        nccl_note="NOT FOUND"
    fi
fi

# Skipping the GPU tests for want of a GPU is a failure here.
export ACTORGRAPH_REQUIRE_GPU=1

declare -a names=() results=() times=()
# run NAME SECONDS COMMAND...: runs COMMAND under a time limit, records how it went.
run() {
    local name="$1" limit="$2"
    shift 2
    section "$name (limit ${limit}s)"
    echo "+ $*"
    local start status=0
    start=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" || status=$?
    local took=$(($(date +%s) - start))
    names+=("$name")
    times+=("${took}s")
    case "$status" in
        0) results+=("ok") ;;
        124 | 137) results+=("TIMED OUT") ;;
        *) results+=("FAILED (status $status)") ;;
    esac
}

if [[ $mode == bundle ]]; then
    run "GPU tests" "$TEST_TIMEOUT" "$bundle/nccl_gpu" --nocapture "${skip_simulated[@]}"
    if command -v "${CC:-cc}" >/dev/null 2>&1; then
        run "loader tests" 30 "$bundle/nccl_loader" --nocapture
    else
        # They build a stub library with a C compiler; CI runs them anyway (no GPU needed).
        section "loader tests"
        echo "no C compiler (${CC:-cc}) here: skipped (CI runs them)"
        names+=("loader tests")
        results+=("skipped (no cc)")
        times+=("-")
    fi
    run "NCCL CPU-side tests" 30 "$bundle/nccl_cpu" --nocapture
    # `${a[@]+...}`: an empty array under `set -u` in bash before 4.4.
    run "nccl_allreduce example" "$EXAMPLE_TIMEOUT" \
        "$bundle/nccl_allreduce" ${EXAMPLE_ARGS[@]+"${EXAMPLE_ARGS[@]}"}
else
    run "build" "$BUILD_TIMEOUT" \
        cargo build "${cargo_flags[@]}" "${tests[@]/#/--test=}" --example nccl_allreduce
    if [[ "${results[0]}" == ok ]]; then
        run "GPU and loader tests" "$TEST_TIMEOUT" \
            cargo test "${cargo_flags[@]}" --no-fail-fast "${tests[@]/#/--test=}" -- --nocapture \
            "${skip_simulated[@]}"
        run "nccl_allreduce example" "$EXAMPLE_TIMEOUT" \
            cargo run "${cargo_flags[@]}" --example nccl_allreduce -- ${EXAMPLE_ARGS[@]+"${EXAMPLE_ARGS[@]}"}
    fi
fi

section "Summary"
echo "NCCL: $nccl_note"
failed=0
for i in "${!names[@]}"; do
    printf '  %-26s %-22s %s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}"
    [[ "${results[$i]}" == ok || "${results[$i]}" == skipped* ]] || failed=1
done
if ((failed)); then
    echo "GPU check FAILED"
    exit 1
fi
echo "GPU check passed"

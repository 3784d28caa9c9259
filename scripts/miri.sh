#!/usr/bin/env bash
# Runs the code with `unsafe` in it, and what it relies on, under Miri: once with Stacked
# Borrows (Miri's default) and once with Tree Borrows, both with strict provenance.
#
# What runs (about 6 minutes on a 2-core machine, 9 with a cold build: the two models run
# side by side; `.ci/run` calls this):
#   - the unit tests of graph-runtime's tensor, bucket (the fused stage, and its property
#     tests with PROPTEST_CASES cases), comm (the CPU communicator and its kernels),
#     sync (the barrier), exec::edge, exec::links and exec::pipeline, and element;
#   - tests/it/soundness.rs (module `soundness` of the `it` test binary): the soundness
#     regressions, and two 2-actor allreduces through `graph!`, below and above the size
#     from which ranks share one result buffer.
# Under `cfg(miri)` the tests shrink their data (the kernels' block is 8 elements and the
# shared-result threshold 1 KiB there). Not run: the loom models (`cfg(loom)` only),
# the NCCL backend and its simulated GPU (C code behind FFI; feature `nccl` stays off),
# the trybuild and child-process tests, and the other modules of `it`.
#
# Installs what it needs: the nightly toolchain (minimal profile) if missing, Miri and
# rust-src. Builds in target/miri, apart from the other builds.
#
# Usage: scripts/miri.sh [stacked|tree]   (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal
fi
rustup component add miri rust-src --toolchain nightly
cargo +nightly miri setup

export PROPTEST_CASES=${PROPTEST_CASES:-2}
[ $# -gt 0 ] || set -- stacked tree

# One borrow model's runs.
run() {
    case $1 in
        stacked) flags="" ;;
        tree) flags="-Zmiri-tree-borrows" ;;
        *) echo "unknown borrow model: $1 (stacked or tree)" >&2; return 2 ;;
    esac
    echo "== Miri, $1 borrows, strict provenance"
    export MIRIFLAGS="-Zmiri-strict-provenance -Zmiri-env-forward=PROPTEST_CASES $flags"
    cargo +nightly miri test --target-dir target/miri -p actorgraph-runtime --lib -- \
        tensor:: bucket:: comm:: sync:: exec::edge:: exec::links:: exec::pipeline:: element::
    cargo +nightly miri test --target-dir target/miri -p actorgraph --test it -- soundness::
    # The MPI leaders' mailboxes, with threads as the processes (needs MPI to build:
    # scripts/install-mpi.sh).
    cargo +nightly miri test --target-dir target/miri -p actorgraph-runtime --features mpi --lib -- mpi::shm::
}

if [ $# -eq 1 ]; then
    run "$1"
    exit
fi
# Miri interprets on one thread: the models run side by side, one per core, each into a
# log printed when both are done. The builds are the same for both (the borrow model is a
# run-time flag): the second waits for the first's build, then reuses it.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for model in "$@"; do
    run "$model" >"$logs/$model" 2>&1 &
    pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || failed=1
    cat "$logs/${*:i+1:1}"
done
exit $failed

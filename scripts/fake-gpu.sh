#!/usr/bin/env sh
# Builds the simulated CUDA driver and NCCL of tests/fake_gpu/ into DIR (default
# target/fake_gpu) as libcuda.so and libnccl.so. Put DIR first on LD_LIBRARY_PATH to run
# the NCCL backend on two simulated GPUs (FAKE_GPU_COUNT to change that), e.g.:
#
#   sh scripts/fake-gpu.sh && LD_LIBRARY_PATH=target/fake_gpu \
#       cargo run --features nccl --example nccl_allreduce -- --elems 4096
#
# tests/nccl_gpu.rs does this itself. Needs a C compiler ($CC, default cc).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/target/fake_gpu}
mkdir -p "$dir"
cd "$dir"
cc=${CC:-cc}
flags="-shared -fPIC -O1 -g -Wall -Wextra -Werror -pthread"
# shellcheck disable=SC2086
$cc $flags -o libcuda.so "$root/tests/fake_gpu/cuda.c"
# shellcheck disable=SC2086
$cc $flags -o libnccl.so "$root/tests/fake_gpu/nccl.c" -L. -lcuda

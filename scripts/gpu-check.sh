#!/usr/bin/env bash
# The NCCL backend's checks on a machine with a GPU (one is enough):
#   1. builds the three NCCL test files and the example below (release, feature `nccl`),
#   2. runs the GPU tests (tests/nccl_gpu.rs: on the real GPUs; their run on simulated GPUs
#      is CI's), the library-loading tests (tests/nccl_loader.rs) and tests/nccl_cpu.rs,
#   3. runs the example that checks and times a fused allreduce (examples/nccl_allreduce.rs),
# each under a time limit (170 + 70 + 50 s by default, so the whole script stays under
# 5 minutes); then a summary. The exit status is 0 only if every step passed.
#
# First it says what it runs on: each GPU's name, driver and bus id, the topology (two GPUs
# or more), the NCCL library it found and NCCL's own version line, whether each GPU has
# memory pools and which peers it can access; with one GPU, that NCCL's data path between
# GPUs, peer access and abort were NOT exercised. It stops at once, saying where it looked,
# if it finds no NCCL.
#
# Usage, from anywhere in the repository:
#     scripts/gpu-check.sh                   build here, then run
#     scripts/gpu-check.sh --build-bundle [DIR]
#         on a machine with cargo (no GPU needed): build the binaries (release, stripped,
#         about 5 MiB; they need glibc 2.34 or newer) into DIR (default target/gpu-bundle),
#         and stop
#     scripts/gpu-check.sh --bundle [DIR]
#         on a GPU machine: run the binaries of DIR, without building
#     --log FILE (with any of the above; or GPU_CHECK_LOG=FILE)
#         also write everything printed to FILE, e.g. to bring it back from a remote machine
#
# A GPU machine with no Rust toolchain or no network (as this project's lent device machine
# is) takes the bundle: build it here, carry DIR there, run `scripts/gpu-check.sh --bundle`
# there. Dry run without a GPU, on the simulated one (see docs/nccl.md, "Testing without a GPU"):
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
#   NCCL_LIB=path          the libnccl.so.2 (or libnccl.so) to use, instead of searching
#   NCCL_DEBUG=level       NCCL's logging (default WARN)
#   GPU_CHECK_LOG=file     as --log
#   CARGO_OFFLINE=1        pass --offline to cargo
#   BUILD_TIMEOUT=seconds  limit for the build (default 170)
#   TEST_TIMEOUT=seconds   limit for running the GPU tests (default 70)
#   EXAMPLE_TIMEOUT=secs   limit for running the example (default 50)
#   EXAMPLE_ARGS="..."     arguments for the example (default: every GPU, 50 steps)
set -euo pipefail

start_dir="$PWD"
cd "$(dirname "${BASH_SOURCE[0]}")/.."

args=("$@")
mode=build
bundle=target/gpu-bundle
log="${GPU_CHECK_LOG:-}"
usage() {
    echo "usage: $0 [--build-bundle [DIR] | --bundle [DIR]] [--log FILE]" >&2
    exit 2
}
while (($#)); do
    case "$1" in
        --build-bundle | --bundle)
            mode="${1#--}"
            if [[ -n "${2:-}" && "$2" != --* ]]; then
                bundle="$2"
                shift
            fi
            ;;
        --log)
            [[ -n "${2:-}" ]] || usage
            log="$2"
            shift
            ;;
        *) usage ;;
    esac
    shift
done
if [[ -n "$log" && -z "${GPU_CHECK_LOGGING:-}" ]]; then
    # Run again with everything going to the log too; keep that run's exit status. Paths
    # given on the command line are the caller's.
    [[ "$log" == /* ]] || log="$start_dir/$log"
    mkdir -p "$(dirname "$log")"
    set +e
    (cd "$start_dir" && GPU_CHECK_LOGGING=1 "$OLDPWD/scripts/gpu-check.sh" ${args[@]+"${args[@]}"}) 2>&1 |
        tee "$log"
    exit "${PIPESTATUS[0]}"
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

if [[ $mode == bundle ]]; then
    for t in "${tests[@]}" nccl_allreduce; do
        if [[ ! -x "$bundle/$t" ]]; then
            echo "$bundle/$t is missing: build the bundle with scripts/gpu-check.sh --build-bundle" >&2
            exit 2
        fi
    done
fi

export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
gpus=""
driver=""

section "GPUs"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id,memory.total --format=csv ||
        echo "nvidia-smi --query-gpu failed (status $?)"
    gpus="$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l || true)"
    driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 || true)"
    if ((${gpus:-0} >= 2)); then
        nvidia-smi topo -m || echo "nvidia-smi topo -m failed (status $?)"
    fi
else
    echo "nvidia-smi not found (the tests ask the CUDA driver directly)"
fi

section "NCCL"
# cudarc opens NCCL by the name `libnccl.so` (and a few versioned names), never by its
# soname `libnccl.so.2`. `libnccl.so` comes only with the development package
# (libnccl-dev); the runtime package (libnccl2) and the nvidia-nccl-cu12/-cu13 wheels
# install only `libnccl.so.2`. The dynamic loader reads LD_LIBRARY_PATH when a process
# starts, so a link `libnccl.so -> .../libnccl.so.2` in a directory of its own, put on
# LD_LIBRARY_PATH here, makes every test and example below find NCCL.

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

# The Python interpreters whose site-packages may hold the nvidia-nccl wheel: the first
# python3 on PATH, an active virtual environment or conda, virtual environments under /opt
# and the home directories, and the system's.
pythons() {
    local p
    for p in python3 "${VIRTUAL_ENV:-}/bin/python3" "${CONDA_PREFIX:-}/bin/python3" \
        /opt/*/.venv/bin/python3 /opt/*/venv/bin/python3 /opt/*/bin/python3 \
        /opt/conda/bin/python3 /root/.venv/bin/python3 /home/*/.venv/bin/python3 \
        /usr/local/bin/python3 /usr/bin/python3; do
        command -v "$p" 2>/dev/null || true
    done | awk '!seen[$0]++'
}

# Prints the NCCL library to use, searching in this order: NCCL_LIB, libnccl.so and
# libnccl.so.2 on LD_LIBRARY_PATH or in the loader cache, the nvidia.nccl package of every
# Python interpreter above, the usual site-packages folders (a torch installation's bundled
# libraries too), conda, the system's folders, then a bounded `find`.
find_nccl() {
    local f dir py
    if [[ -n "${NCCL_LIB:-}" ]]; then
        echo "$NCCL_LIB"
        return
    fi
    for f in libnccl.so libnccl.so.2; do
        dir="$(find_lib "$f" || true)"
        [[ -n "$dir" ]] && { echo "$dir"; return; }
    done
    while read -r py; do
        dir="$("$py" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
        if [[ -n "$dir" && -e "$dir/lib/libnccl.so.2" ]]; then
            echo "$dir/lib/libnccl.so.2"
            return
        fi
    done < <(pythons)
    shopt -s nullglob
    for f in \
        "${VIRTUAL_ENV:-/nonexistent}"/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 \
        /opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 \
        /opt/*/venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 \
        /opt/*/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 \
        /root/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 \
        /home/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 \
        /root/.local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 \
        /home/*/.local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 \
        /usr/lib/python3*/{site,dist}-packages/nvidia/nccl/lib/libnccl.so.2 \
        /usr/local/lib/python3*/{site,dist}-packages/nvidia/nccl/lib/libnccl.so.2 \
        /opt/*/.venv/lib/python3*/site-packages/torch/lib/libnccl.so* \
        /usr{,/local}/lib/python3*/{site,dist}-packages/torch/lib/libnccl.so* \
        "${CONDA_PREFIX:-/nonexistent}"/lib/libnccl.so.2 /opt/conda/lib/libnccl.so.2 \
        /usr/lib/x86_64-linux-gnu/libnccl.so.2 /usr/lib/aarch64-linux-gnu/libnccl.so.2 \
        /usr/local/cuda/lib64/libnccl.so.2 /usr/lib64/libnccl.so.2 /usr/local/lib/libnccl.so.2; do
        if [[ -e "$f" ]]; then
            shopt -u nullglob
            echo "$f"
            return
        fi
    done
    shopt -u nullglob
    # Last: a bounded search of the places software is installed (20 s at most).
    timeout 20 find /opt /usr /home /root /srv /workspace -xdev -maxdepth 10 \
        -name 'libnccl.so*' \( -type f -o -type l \) 2>/dev/null | sort | head -1 || true
}

nccl="$(find_nccl)"
if [[ -z "$nccl" || ! -e "$nccl" ]]; then
    echo "NCCL NOT FOUND${NCCL_LIB:+ (NCCL_LIB=$NCCL_LIB does not exist)}. Looked in: LD_LIBRARY_PATH,"
    echo "the loader cache, the nvidia.nccl package of: $(pythons | tr '\n' ' ')"
    echo "site-packages of /opt/*/.venv, /opt/*/venv, ~/.venv, ~/.local, /usr{,/local}/lib/python3*"
    echo "(nvidia/nccl/lib and torch/lib), \$CONDA_PREFIX/lib, /opt/conda/lib, the system's lib"
    echo "folders, and everything under /opt /usr /home /root /srv /workspace (find, 10 levels)."
    echo "Install NCCL (the libnccl2 package, or pip install nvidia-nccl-cu12 / -cu13), or set"
    echo "NCCL_LIB=/path/to/libnccl.so.2, then run this again. Nothing was run."
    exit 3
fi
nccl="$(readlink -f "$nccl")"
echo "NCCL library: $nccl"
# Whatever it is called, give it the name cudarc opens, first on the loader's path.
link_dir="$(mktemp -d "${TMPDIR:-/tmp}/actorgraph-nccl.XXXXXX")"
trap 'rm -rf "$link_dir"' EXIT
ln -s "$nccl" "$link_dir/libnccl.so"
export LD_LIBRARY_PATH="$link_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "linked $link_dir/libnccl.so -> it, first on LD_LIBRARY_PATH"
nccl_note="$nccl"

# NCCL's version line (NCCL_DEBUG=VERSION prints it when NCCL initialises, which
# ncclGetUniqueId does), and the CUDA driver's view of each GPU: memory pools (the stage
# buffers come from them) and peer access. Through ctypes, so that nothing needs building.
py="$(pythons | head -1)"
if [[ -n "$py" ]]; then
    NCCL_DEBUG=VERSION "$py" - "$nccl" <<'PY' || echo "(the NCCL and CUDA report failed, status $?)"
import ctypes, sys

nccl = ctypes.CDLL(sys.argv[1])
v = ctypes.c_int()
nccl.ncclGetVersion(ctypes.byref(v))
print(f"ncclGetVersion: {v.value}", flush=True)
uid = ctypes.create_string_buffer(128)
r = nccl.ncclGetUniqueId(uid)
if r != 0:
    print(f"ncclGetUniqueId failed: {r}")
cuda = None
for name in ("libcuda.so.1", "libcuda.so"):
    try:
        cuda = ctypes.CDLL(name)
        break
    except OSError:
        pass
if cuda is None or cuda.cuInit(0) != 0:
    print("CUDA driver: not loadable or no device (cuInit failed)")
    sys.exit(0)
dv = ctypes.c_int()
cuda.cuDriverGetVersion(ctypes.byref(dv))
n = ctypes.c_int()
cuda.cuDeviceGetCount(ctypes.byref(n))
print(f"CUDA driver API {dv.value // 1000}.{dv.value % 1000 // 10}, {n.value} GPU(s)")
MEMORY_POOLS_SUPPORTED, CC_MAJOR, CC_MINOR = 115, 75, 76
for d in range(n.value):
    name = ctypes.create_string_buffer(256)
    cuda.cuDeviceGetName(name, 256, d)
    attr = lambda a: (cuda.cuDeviceGetAttribute(ctypes.byref(v), a, d), v.value)[1]
    peers = []
    for p in range(n.value):
        can = ctypes.c_int()
        if p != d and cuda.cuDeviceCanAccessPeer(ctypes.byref(can), d, p) == 0 and can.value:
            peers.append(p)
    print(f"GPU {d}: {name.value.decode()}, compute {attr(CC_MAJOR)}.{attr(CC_MINOR)}, "
          f"memory pools {'yes' if attr(MEMORY_POOLS_SUPPORTED) else 'NO'}, "
          f"peer access to {peers if peers else 'none'}")
if n.value:
    print(f"GPU_COUNT={n.value}")
PY
else
    echo "no python3: NCCL's version line and the per-GPU report are skipped"
fi 2>&1 | tee "$link_dir/report" | grep -v '^GPU_COUNT='
cuda_gpus="$(sed -n 's/^GPU_COUNT=//p' "$link_dir/report")"
gpus="${cuda_gpus:-$gpus}"
# The cu13 builds of NCCL need a CUDA 13 driver: 580 or newer. Without nvidia-smi, the
# driver API version the CUDA driver reports (13.0 or newer) says the same.
api_major="$(sed -n 's/^CUDA driver API \([0-9]*\)\..*/\1/p' "$link_dir/report" | head -1)"
if grep -qiE 'cu13|cuda13|cuda 13' <(echo "$nccl"; cat "$link_dir/report"); then
    if [[ -n "$driver" ]] && ((${driver%%.*} < 580)); then
        echo "WARNING: this NCCL is built for CUDA 13, which needs driver 580 or newer; this machine has $driver"
    elif [[ -z "$driver" && -n "$api_major" ]] && ((api_major < 13)); then
        echo "WARNING: this NCCL is built for CUDA 13, which needs driver 580 or newer (CUDA driver API 13); this driver's API is $api_major"
    fi
fi
one_gpu_note=""
if [[ "${gpus:-0}" == 1 ]]; then
    one_gpu_note="ONE GPU: NCCL takes its one-rank shortcuts, so NCCL's data path between GPUs, peer access and abort across ranks were NOT exercised"
    echo "$one_gpu_note"
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
[[ -z "$one_gpu_note" ]] || echo "$one_gpu_note"
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

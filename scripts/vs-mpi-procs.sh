#!/usr/bin/env bash
# The MPI backend (feature `mpi`) against OpenMPI's MPI_Allreduce through rsmpi: the same
# processes, the same bytes, side by side in one run (benches/mpi_procs.rs under mpirun).
# A benchmark, not a test: CI does not run it.
#
# usage: scripts/vs-mpi-procs.sh [PROCESSES]     (default: 2, one actor each)
# Installs OpenMPI and libclang with apt-get if missing.
set -euo pipefail
cd "$(dirname "$0")/.."

procs=${1:-2}
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null \
    || ! ldconfig -p | grep -q libclang; then
    echo "== installing OpenMPI and libclang"
    sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        sudo=(sudo)
    fi
    "${sudo[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends \
        openmpi-bin libopenmpi-dev libclang-dev
fi

bench=$(cargo bench --features mpi --bench mpi_procs --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "mpi_procs" and m.get("executable"):
        print(m["executable"])')

mpi_flags=(--oversubscribe --mca btl self,vader)
if [ "$(id -u)" -eq 0 ]; then
    mpi_flags+=(--allow-run-as-root)
fi
echo "== load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
mpirun "${mpi_flags[@]}" -np "$procs" "$bench" --bench
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

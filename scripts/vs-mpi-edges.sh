#!/usr/bin/env bash
# An edge of the MPI backend (feature `mpi`) between two processes against MPI_Send and
# MPI_Recv through rsmpi: the same processes, the same bytes, side by side in one run
# (benches/mpi_edges.rs under mpirun). BTL: self,vader (shared memory); pass another as
# the first argument (e.g. self,tcp).
# A benchmark, not a test: CI does not run it.
#
# usage: scripts/vs-mpi-edges.sh [BTL]     (2 processes, one actor each)
# Installs OpenMPI and libclang with apt-get if missing (scripts/install-mpi.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

procs=2
btl=${1:-self,vader}
scripts/install-mpi.sh

bench=$(cargo bench --features mpi --bench mpi_edges --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "mpi_edges" and m.get("executable"):
        print(m["executable"])')

mpi_flags=(--oversubscribe --mca btl "$btl" --mca pml ob1)
if [[ $btl == *tcp* ]]; then
    mpi_flags+=(--mca btl_tcp_if_include lo)
fi
if [ "$(id -u)" -eq 0 ]; then
    mpi_flags+=(--allow-run-as-root)
fi
echo "== load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
mpirun "${mpi_flags[@]}" -np "$procs" "$bench" --bench
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

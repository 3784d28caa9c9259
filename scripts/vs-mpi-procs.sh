#!/usr/bin/env bash
# The MPI backend (feature `mpi`) against OpenMPI's MPI_Allreduce through rsmpi: the same
# processes, the same bytes, side by side in one run (benches/mpi_procs.rs under mpirun).
# A benchmark, not a test: CI does not run it.
#
# usage: scripts/vs-mpi-procs.sh [PROCESSES]     (default: 2, one actor each)
# Installs OpenMPI and libclang with apt-get if missing (scripts/install-mpi.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

procs=${1:-2}
scripts/install-mpi.sh

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

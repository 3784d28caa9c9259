#!/usr/bin/env bash
# The MPI backend (feature `mpi`) against OpenMPI's MPI_Allreduce through rsmpi: the same
# processes, the same bytes, side by side in one run (benches/mpi_procs.rs under mpirun).
# A benchmark, not a test: CI does not run it.
#
# usage: scripts/vs-mpi-procs.sh [PROCESSES]     (default: 2, one actor each), and the
#                                                 bound of its 64 x 1 KiB row on this
#                                                 machine (scripts/vs-mpi/floor.c)
#        BENCH=hier scripts/vs-mpi-procs.sh       2 processes x 2 actors (a fused allreduce)
#                                                 against MPI_Allreduce over 4 flat
#                                                 processes, from 1 MiB, ROUNDS (3) runs of
#                                                 each, alternating
#        BENCH=others scripts/vs-mpi-procs.sh     reducescatter, allgather, broadcast and
#                                                 reduce against their MPI calls, 2
#                                                 processes x 1 actor (or PROCESSES)
#        BENCH=all scripts/vs-mpi-procs.sh        every table
# Installs OpenMPI and libclang with apt-get if missing (scripts/install-mpi.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

procs=${1:-2}
bench_kind=${BENCH:-procs}
rounds=${ROUNDS:-3}
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
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$bench_kind" = procs ] || [ "$bench_kind" = all ]; then
    # The bound of the 64 x 1 KiB row: one copy into shared memory and one fold of 64 KiB
    # per rank (scripts/vs-mpi/floor.c), before and after the run (the host's speed moves).
    mkdir -p target/vs-mpi
    cc -O3 -march=native -pthread -o target/vs-mpi/floor scripts/vs-mpi/floor.c
    floor() { target/vs-mpi/floor "$procs" 65536 | awk '{printf "%.2f / %.2f / %.2f µs", $2 / 1e3, $3 / 1e3, $4 / 1e3}'; }
    before=$(floor)
    mpirun "${mpi_flags[@]}" -np "$procs" "$bench" --bench
    echo
    echo "copy and fold of 64 KiB between $procs ranks (scripts/vs-mpi/floor.c), min / median / max: $before before, $(floor) after"
fi
if [ "$bench_kind" = others ] || [ "$bench_kind" = all ]; then
    echo
    MPI_PROCS_BENCH=others mpirun "${mpi_flags[@]}" -x MPI_PROCS_BENCH -np "$procs" "$bench" --bench
fi
if [ "$bench_kind" = hier ] || [ "$bench_kind" = all ]; then
    samples=$(mktemp)
    for _ in $(seq "$rounds"); do
        MPI_PROCS_BENCH=hier MPI_PROCS_ACTORS=2 mpirun "${mpi_flags[@]}" -x MPI_PROCS_BENCH \
            -x MPI_PROCS_ACTORS -np 2 "$bench" --bench >>"$samples"
        MPI_PROCS_BENCH=flat mpirun "${mpi_flags[@]}" -x MPI_PROCS_BENCH -np 4 "$bench" \
            --bench >>"$samples"
    done
    echo
    echo "2 processes x 2 actors (fused allreduce) against 4 processes (MPI_Allreduce); $rounds runs of each, alternating"
    python3 - "$samples" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 4 and f[0] == "sample":
        rows.setdefault(int(f[2]), {}).setdefault(f[1], []).append(int(f[3]))
def fmt(ns):
    return f"{ns / 1e6:.3f} ms" if ns >= 1e6 else f"{ns / 1e3:.2f} µs"
def three(v):
    v = sorted(v)
    return v[0], v[len(v) // 2], v[-1]
print()
print("| f32 allreduce, bytes per rank | flat MPI_Allreduce, 4 processes min / median / max | actorgraph 2 x 2 min / median / max | actorgraph / MPI (medians) |")
print("| --- | --- | --- | --- |")
for b in sorted(rows):
    m, a = three(rows[b]["flat"]), three(rows[b]["hier"])
    print(f"| {b >> 20} MiB | {' / '.join(map(fmt, m))} | {' / '.join(map(fmt, a))} | {a[1] / m[1]:.2f}x |")
PY
    rm -f "$samples"
fi
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

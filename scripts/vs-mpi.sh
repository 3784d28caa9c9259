#!/usr/bin/env bash
# actorgraph's fused allreduce against OpenMPI's MPI_Allreduce of the same bytes per rank,
# between the same number of ranks (threads of one process against processes on the same
# machine), back to back, as one table: min / median / max per allreduce and the ratio of
# the medians. A benchmark, not a test: CI does not run it.
#
# usage: scripts/vs-mpi.sh [RANKS...]      (default: 2 4)
# Installs OpenMPI (and libclang) with apt-get if missing (scripts/install-mpi.sh). Builds in target/vs-mpi.
set -euo pipefail
cd "$(dirname "$0")/.."

ranks=("$@")
if [ ${#ranks[@]} -eq 0 ]; then
    ranks=(2 4)
fi
# 4 B, 1 KiB, 32 KiB, 256 KiB, 1 MiB, 16 MiB, 64 MiB: the sizes of `vs-mpi` in
# benches/collectives.rs.
sizes=(4 1024 32768 262144 1048576 16777216 67108864)

scripts/install-mpi.sh

out=target/vs-mpi
mkdir -p "$out"
mpicc -O2 -o "$out/allreduce" scripts/vs-mpi/allreduce.c

mpi_flags=(--oversubscribe)
if [ "$(id -u)" -eq 0 ]; then
    mpi_flags+=(--allow-run-as-root)
fi

echo "== load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for n in "${ranks[@]}"; do
    echo "== MPI_Allreduce, $n processes"
    mpirun "${mpi_flags[@]}" -n "$n" "$out/allreduce" "${sizes[@]}" | tee "$out/mpi-$n.txt"
done

echo "== actorgraph, cargo bench --bench collectives -- vs-mpi"
filter="^vs-mpi/($(IFS='|'; echo "${ranks[*]}")) actors/"
cargo bench --bench collectives -- "$filter"
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$out" "${ranks[*]}" "${sizes[*]}" <<'PY'
import json, pathlib, statistics, sys

out, ranks, sizes = pathlib.Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3].split()

def fmt(ns):
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"

def size(b):
    b = int(b)
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b // scale} {unit}"
    return f"{b} B"

print("| ranks | bytes per rank | MPI min / median / max | actorgraph min / median / max | actorgraph / MPI (medians) |")
print("| --- | --- | --- | --- | --- |")
for n in ranks:
    mpi = {}
    for line in (out / f"mpi-{n}.txt").read_text().split("\n"):
        f = line.split()
        if len(f) == 5:
            mpi[f[0]] = [float(x) for x in f[1:4]]
    for b in sizes:
        sample = pathlib.Path("target/criterion/vs-mpi") / f"{n} actors" / b / "new/sample.json"
        if b not in mpi or not sample.exists():
            print(f"| {n} | {size(b)} | missing | missing | |")
            continue
        data = json.loads(sample.read_text())
        per_iter = [t / k for t, k in zip(data["times"], data["iters"])]
        ag = [min(per_iter), statistics.median(per_iter), max(per_iter)]
        m = mpi[b]
        print(f"| {n} | {size(b)} | {' / '.join(map(fmt, m))} | {' / '.join(map(fmt, ag))} "
              f"| {ag[1] / m[1]:.2f}x |")
PY

#!/usr/bin/env bash
# A slow network on one machine: runs COMMAND in a network namespace of its own, whose
# loopback (the only interface there) sends at most RATE, through a token bucket (tc's
# `tbf`). MPI over TCP between processes of this machine then crosses a link of that
# rate, as between machines (see BENCHMARKS.md, "A slow network").
#
# usage: scripts/slow-net.sh RATE COMMAND [ARG...]
#   RATE  tc's syntax (100mbit, 1gbit, 10gbit), or `none`: the namespace without a limit
#         (the comparison on the same path)
#
# COMMAND runs from the repository root with these set (a command-line `--mca` overrides
# them): OMPI_MCA_pml=ob1, OMPI_MCA_btl=self,tcp and OMPI_MCA_{btl,oob}_tcp_if_include=lo
# (OpenMPI's messages go over TCP on the loopback, not shared memory),
# ACTORGRAPH_MPI_SHARED_MEMORY=0 (actorgraph's leaders meet by MPI messages, as between
# machines) and OMPI_ALLOW_RUN_AS_ROOT{,_CONFIRM}=1 (this runs as root). So a plain
# `mpirun -np 2 PROGRAM` inside crosses the slow link. The exit status is COMMAND's;
# afterwards the bytes the loopback carried (and the bucket's drops) go to stderr.
#
# Needs root (a network namespace, and tc on its loopback), unshare (util-linux), and ip
# and tc (iproute2: scripts/install-mpi.sh installs it). Changes nothing outside the
# namespace, which ends with COMMAND.
#
#   scripts/slow-net.sh 1gbit mpirun -np 2 target/debug/examples/mpi_allreduce --steps 5
set -euo pipefail
# ip and tc are in /usr/sbin, which a PATH may lack.
PATH="$PATH:/usr/sbin:/sbin"

die() {
    printf 'slow-net.sh: %s\n' "$*" >&2
    exit 2
}

# Inside the namespace (the script runs itself again under `unshare --net`):
# `--inside NS RATE COMMAND...`, NS the namespace it was started from.
if [ "${1:-}" = --inside ]; then
    [ $# -ge 4 ] || die "--inside NS RATE COMMAND... is for the script's own use"
    outer=$2 rate=$3
    shift 3
    # Never throttle the machine's own loopback: go on only in a namespace other than the
    # one the script started in, and a new one (nothing there but a loopback still down).
    [[ $outer =~ ^net:\[[0-9]+\]$ && "$(readlink /proc/self/ns/net)" != "$outer" ]] ||
        die "--inside: not in a namespace of its own"
    [ "$(ip -o link show | awk '{ print $2 $3 }')" = "lo:<LOOPBACK>" ] ||
        die "--inside: not in a new namespace (more links than a loopback down)"
    # An MTU of 9000 (jumbo frames, as on a datacenter link) keeps each packet well under
    # the bucket's burst: a packet larger than the burst could never be sent.
    ip link set lo mtu 9000
    ip link set lo up
    if [ "$rate" != none ]; then
        # `latency`: how long a packet may queue before it is dropped (a 25 MB queue at
        # 1gbit), so that TCP's window, not drops, holds a sender back.
        tc qdisc add dev lo root tbf rate "$rate" burst 1mb latency 200ms ||
            die "tc could not limit the loopback to $rate (is RATE in tc's syntax, e.g. 1gbit? is the kernel's sch_tbf there?)"
    fi
    export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,tcp
    export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
    export ACTORGRAPH_MPI_SHARED_MEMORY=0
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    if [ "$rate" = none ]; then limit="no limit"; else limit="limited to $rate"; fi
    echo "== slow-net: the loopback, $limit: $*" >&2
    status=0
    "$@" || status=$?
    # /proc/net/dev is this namespace's (sysfs would show the machine's).
    # (The counters may touch the name: `lo:123`.)
    awk -v rate="$rate" 'sub(/^ *lo:/, "lo ") {
            printf "== slow-net (%s): the loopback carried %.1f MiB in %d packets\n",
                rate, $10 / 1048576, $11
        }' /proc/net/dev >&2
    if [ "$rate" != none ]; then
        tc -s qdisc show dev lo | sed -n 's/^ *Sent/== slow-net: tbf: Sent/p' >&2
    fi
    exit "$status"
fi

[ $# -ge 2 ] || die "usage: scripts/slow-net.sh RATE COMMAND [ARG...]  (RATE: 1gbit, 10gbit, ... or none)"
rate=$1
shift
[[ $rate == none || $rate =~ ^[0-9]+(\.[0-9]+)?[A-Za-z]*$ ]] ||
    die "RATE is tc's syntax (1gbit, 10gbit, 500mbit) or none, not '$rate'"
[ "$(id -u)" -eq 0 ] ||
    die "needs root, for a network namespace and a limit on its loopback (run it with sudo)"
for tool in unshare ip tc; do
    command -v "$tool" >/dev/null ||
        die "$tool is missing: install util-linux and iproute2 (scripts/install-mpi.sh does)"
done
if ! err=$(unshare --net -- true 2>&1); then
    die "cannot make a network namespace ($err): a container needs CAP_SYS_ADMIN (docker run --privileged)"
fi

self=$(realpath "$0")
cd "$(dirname "$self")/.."
exec unshare --net -- "$self" --inside "$(readlink /proc/self/ns/net)" "$rate" "$@"

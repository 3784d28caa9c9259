/* The bandwidth between 2 MPI processes: what `scripts/slow-net.sh RATE` leaves of a link.
 *
 * one way:   rank 0 sends BYTES to rank 1, which answers with 1 byte when all arrived;
 * both ways: each rank sends BYTES to the other at once (MPI_Sendrecv), so the bytes of
 *            the two directions share the link.
 * Each rank checks every byte it received. Prints, on rank 0, per mode: the min / median /
 * max time of REPS transfers after one warm-up, and the median's rate (bytes that crossed
 * the link, in Gbit/s of 10^9 bits, as tc counts a rate).
 *
 * usage: mpirun -np 2 bandwidth [MIB] [REPS]   (default 64 MiB, 5 reps) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static unsigned char pattern(int from, long i) { return (unsigned char)(i * 131 + from * 7 + i / 4099); }

static void fill(unsigned char *buf, long n, int from) {
    for (long i = 0; i < n; i++) buf[i] = pattern(from, i);
}

static void check(const unsigned char *buf, long n, int from) {
    for (long i = 0; i < n; i++)
        if (buf[i] != pattern(from, i)) {
            fprintf(stderr, "bandwidth: byte %ld from rank %d is wrong\n", i, from);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        if (rank == 0) fprintf(stderr, "bandwidth: run it on 2 processes (mpirun -np 2)\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long bytes = (argc > 1 ? atol(argv[1]) : 64) << 20;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (bytes <= 0 || bytes > (1L << 30) || reps <= 0) {
        if (rank == 0) fprintf(stderr, "usage: mpirun -np 2 bandwidth [MIB (1-1024)] [REPS]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int peer = 1 - rank;
    unsigned char *out = malloc(bytes), *in = malloc(bytes), ack = 1;
    fill(out, bytes, rank);
    double *t = malloc(sizeof(double) * reps);
    for (int mode = 0; mode < 2; mode++) {
        for (int r = -1; r < reps; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if (mode == 0 && rank == 0) {
                MPI_Send(out, (int)bytes, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
                MPI_Recv(&ack, 1, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else if (mode == 0) {
                MPI_Recv(in, (int)bytes, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(&ack, 1, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
            } else {
                MPI_Sendrecv(out, (int)bytes, MPI_BYTE, peer, 2, in, (int)bytes, MPI_BYTE, peer, 2,
                             MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            }
            double dt = MPI_Wtime() - t0;
            if (r >= 0) t[r] = dt;
            if (mode == 1 || rank == 1) check(in, bytes, peer);
        }
        if (rank == 0) {
            qsort(t, reps, sizeof t[0], cmp);
            double med = reps % 2 ? t[reps / 2] : (t[reps / 2 - 1] + t[reps / 2]) / 2;
            long crossed = mode == 0 ? bytes : 2 * bytes;
            printf("%-9s %4ld MiB: %8.1f / %8.1f / %8.1f ms  %6.2f Gbit/s\n",
                   mode == 0 ? "one way" : "both ways", crossed >> 20, t[0] * 1e3, med * 1e3,
                   t[reps - 1] * 1e3, crossed * 8 / med / 1e9);
            fflush(stdout);
        }
    }
    free(t);
    free(in);
    free(out);
    MPI_Finalize();
    return 0;
}

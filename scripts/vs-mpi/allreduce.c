/* MPI_Allreduce (sum of f32) of the same bytes per rank as actorgraph's `vs-mpi` benchmark
 * (benches/collectives.rs), timed the way criterion times it: samples, each the mean time
 * of one batch of iterations, after a warm-up.
 *
 * usage: mpirun -n RANKS allreduce BYTES...
 * prints, on rank 0, one line per size: "BYTES MIN_NS MEDIAN_NS MAX_NS SAMPLES" */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SAMPLES 30
#define SAMPLE_NS 40e6 /* about 40 ms per sample: 1.2 s per size */

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The mean time of `iters` allreduces, in ns, as rank 0 agrees with everyone on it. */
static double batch(float *in, float *out, int count, long iters) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (long i = 0; i < iters; i++)
        MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double ns = (MPI_Wtime() - t0) * 1e9 / (double)iters;
    /* Every rank runs the same number of iterations: rank 0 decides. */
    MPI_Bcast(&ns, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return ns;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int a = 1; a < argc; a++) {
        long bytes = atol(argv[a]);
        int count = (int)(bytes / 4 > 0 ? bytes / 4 : 1);
        float *in = malloc((size_t)count * 4), *out = malloc((size_t)count * 4);
        for (int i = 0; i < count; i++) in[i] = (float)(rank + i % 7);
        memset(out, 0, (size_t)count * 4);
        /* Warm-up, and the batch size that makes a sample about SAMPLE_NS long. */
        double est = batch(in, out, count, 10);
        est = batch(in, out, count, (long)(2e8 / est) + 1) ;
        long iters = (long)(SAMPLE_NS / est) + 1;
        double t[SAMPLES];
        for (int s = 0; s < SAMPLES; s++) t[s] = batch(in, out, count, iters);
        qsort(t, SAMPLES, sizeof t[0], cmp);
        if (rank == 0)
            printf("%ld %.1f %.1f %.1f %d\n", bytes, t[0], (t[SAMPLES / 2 - 1] + t[SAMPLES / 2]) / 2,
                   t[SAMPLES - 1], SAMPLES);
        fflush(stdout);
        free(in);
        free(out);
    }
    MPI_Finalize();
    return 0;
}

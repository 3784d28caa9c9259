/* The copy-and-fold bound of an allreduce (sum of f32) through shared memory between
 * processes, on this machine: what any implementation that has no kernel-assisted copy
 * pays, MPI's shared-memory transport and actorgraph's MPI stage alike. Each rank (a
 * thread here: the same caches and lines as processes) copies its input into its own
 * mailbox, counts the round, waits until every other rank has counted it, and sums every
 * rank's mailbox, in rank order, into its result. BOXES mailboxes per rank, used in turn,
 * so one counter a round is the only synchronisation, and a mailbox written again has
 * left the readers' caches (as in actorgraph's `mpi/shm.rs`; BOXES=2 shows the cost of
 * writing lines another core still holds).
 * No headers, no agreement, no failure model. Not a bound for threads of one process,
 * which read each other's values where they are (actorgraph's `Cpu` backend does).
 * Timed as allreduce.c times MPI_Allreduce; FLOOR_PIN=1 pins rank r to CPU r.
 *
 * usage: [BOXES=16] floor RANKS BYTES...
 * prints one line per size: "BYTES MIN_NS MEDIAN_NS MAX_NS SAMPLES" */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SAMPLES 30
#define SAMPLE_NS 40e6
#define SPINS 256
#define MAX_RANKS 64
#define MAX_BOXES 64

struct rank {
    _Alignas(64) atomic_long round;
    float *mailbox[MAX_BOXES];
};

static struct rank ranks[MAX_RANKS];
static int nranks;
static int nboxes = 16;
static long count;
static pthread_barrier_t gate;
/* Set by rank 0 between two passes of `gate`, read by every rank after the second. */
static long shared_iters;
static double shared_ns;

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void allreduce(int me, long round, const float *restrict in, float *restrict out) {
    float *mine = ranks[me].mailbox[round % nboxes];
    memcpy(mine, in, (size_t)count * 4);
    atomic_store_explicit(&ranks[me].round, round, memory_order_release);
    for (int q = 0; q < nranks; q++) {
        int spins = 0;
        while (atomic_load_explicit(&ranks[q].round, memory_order_acquire) < round) {
            if (++spins < SPINS)
                __builtin_ia32_pause();
            else
                sched_yield();
        }
    }
    const float *restrict first = ranks[0].mailbox[round % nboxes];
    for (long i = 0; i < count; i++) out[i] = first[i];
    for (int q = 1; q < nranks; q++) {
        const float *restrict src = ranks[q].mailbox[round % nboxes];
        for (long i = 0; i < count; i++) out[i] += src[i];
    }
}

/* The mean time of `iters` allreduces on rank 0, in ns, shared with every rank. */
static double batch(int me, long *round, const float *in, float *out, long iters) {
    pthread_barrier_wait(&gate);
    double t0 = now_ns();
    for (long i = 0; i < iters; i++) allreduce(me, ++*round, in, out);
    if (me == 0) shared_ns = (now_ns() - t0) / (double)iters;
    pthread_barrier_wait(&gate);
    return shared_ns;
}

struct job {
    int me;
    int nsizes;
    char **sizes;
};

static void *run(void *arg) {
    struct job *job = arg;
    int me = job->me;
    if (getenv("FLOOR_PIN")) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(me % sysconf(_SC_NPROCESSORS_ONLN), &set);
        pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    }
    long round = 0;
    for (int a = 0; a < job->nsizes; a++) {
        long bytes = atol(job->sizes[a]);
        /* Rank 0 sizes the mailboxes; the others wait for it. */
        if (me == 0) {
            count = bytes / 4 > 0 ? bytes / 4 : 1;
            for (int q = 0; q < nranks; q++)
                for (int m = 0; m < nboxes; m++) {
                    free(ranks[q].mailbox[m]);
                    ranks[q].mailbox[m] = aligned_alloc(64, ((size_t)count * 4 + 63) / 64 * 64);
                    memset(ranks[q].mailbox[m], 0, (size_t)count * 4);
                }
        }
        pthread_barrier_wait(&gate);
        float *in = malloc((size_t)count * 4), *out = malloc((size_t)count * 4);
        for (long i = 0; i < count; i++) in[i] = (float)(me + i % 7);
        double est = batch(me, &round, in, out, 10);
        est = batch(me, &round, in, out, (long)(2e8 / est) + 1);
        if (me == 0) shared_iters = (long)(SAMPLE_NS / est) + 1;
        pthread_barrier_wait(&gate);
        long iters = shared_iters;
        double t[SAMPLES];
        for (int s = 0; s < SAMPLES; s++) t[s] = batch(me, &round, in, out, iters);
        if (me == 0) {
            qsort(t, SAMPLES, sizeof t[0], cmp);
            printf("%ld %.1f %.1f %.1f %d\n", bytes, t[0],
                   (t[SAMPLES / 2 - 1] + t[SAMPLES / 2]) / 2, t[SAMPLES - 1], SAMPLES);
            fflush(stdout);
        }
        free(in);
        free(out);
        /* Every rank is done with the mailboxes before rank 0 frees them. */
        pthread_barrier_wait(&gate);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (getenv("BOXES")) nboxes = atoi(getenv("BOXES"));
    if (argc < 3 || (nranks = atoi(argv[1])) < 1 || nranks > MAX_RANKS || nboxes < 2 ||
        nboxes > MAX_BOXES) {
        fprintf(stderr, "usage: [BOXES=2..%d] %s RANKS BYTES...\n", MAX_BOXES, argv[0]);
        return 2;
    }
    pthread_barrier_init(&gate, NULL, (unsigned)nranks);
    pthread_t threads[MAX_RANKS];
    struct job jobs[MAX_RANKS];
    for (int q = 0; q < nranks; q++) {
        jobs[q] = (struct job){q, argc - 2, argv + 2};
        if (q > 0) pthread_create(&threads[q], NULL, run, &jobs[q]);
    }
    run(&jobs[0]);
    for (int q = 1; q < nranks; q++) pthread_join(threads[q], NULL);
    return 0;
}

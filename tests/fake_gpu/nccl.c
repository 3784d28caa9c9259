/* A simulated NCCL, built as libnccl.so over the simulated driver (cuda.c): the ranks of
 * a communicator are threads of this process or of several (one communicator over every
 * GPU of every process, as under MPI), collectives run on the stream workers and meet in
 * a rendezvous, with NCCL's arithmetic (float Avg pre-multiplied by 1/n, integer
 * Avg divided after the sum, each step rounded to the element type).
 *
 * What it checks, aborting the process with a message where real NCCL would hang,
 * corrupt memory or misbehave: the ranks' calls pair up (the same collective, count,
 * type, operation and root, in the same order), every buffer is live memory of the
 * communicator's GPU when the collective runs, send and receive buffers are the same (in
 * place, as NCCL defines it per collective) or do not overlap, one GPU is not in a
 * communicator twice, a communicator is not used after ncclCommAbort, and a collective
 * whose peer aborted waits (as on a GPU) until its own communicator is aborted.
 *
 * As in NCCL, a call that fails inside ncclGroupStart/ncclGroupEnd cancels the whole
 * group: the outermost ncclGroupEnd launches none of its calls and returns the error.
 *
 * As NCCL does too: a one-rank communicator takes NCCL's shortcut (an in-place collective
 * other than Avg issues no work); unless NCCL_RUNTIME_CONNECT=0, peers connect lazily (a
 * rank's first launch of a small, then of a large, collective waits on the host for every
 * rank to make it); ncclCommAbort discards the rank's queued collectives and
 * ncclCommDestroy first waits for them; peers read and write each other's buffers
 * directly, so pool memory must grant them access (cuda.c's memory pools).
 *
 * Across processes: the unique id names a POSIX shared-memory segment (`shm_open`) where
 * every rank of every process registers at ncclCommInitRank. A communicator whose ranks
 * are all in this process then runs as above; one whose ranks span processes meets in the
 * segment (a process-shared mutex and condition variable): each rank posts its call and
 * its send buffer there, and once every rank has, each computes its own result from all
 * of them with the same arithmetic, so every rank of every process gets the same bits.
 * The same checks hold across processes (calls that pair up, an abort that leaves the
 * peers' collectives waiting, lazy connection); simulated GPUs of different processes are
 * different GPUs, even with the same ordinal. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake.h"

typedef int ncclResult_t;
enum {
    ncclSuccess = 0,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
};

typedef struct {
    char internal[128];
} ncclUniqueId;

enum kind { ALL_REDUCE, BROADCAST, REDUCE, ALL_GATHER, REDUCE_SCATTER };
static const char *kind_names[] = {"AllReduce", "Broadcast", "Reduce", "AllGather",
                                   "ReduceScatter"};
enum red { SUM, PROD, MAX, MIN, AVG };
enum dtype { I8, U8, I32, U32, I64, U64, F16, F32, F64, BF16, N_TYPES };
static const size_t type_size[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

struct comm;
struct shared;

typedef struct {
    int kind;
    const void *send;
    void *recv;
    size_t count;
    int dtype, red, root;
    struct comm *comm;
    fake_stream *stream;
    int stuck; /* fake_nccl_async_error: never completes */
} op;

typedef struct clique {
    ncclUniqueId id;
    int nranks, joined;
    struct comm **ranks;
    /* The rendezvous of the collective in progress. */
    op *ops;
    int arrived;
    unsigned long long generation;
    int broken; /* a rank aborted: collectives never complete again */
    /* Lazy connection (NCCL_RUNTIME_CONNECT not 0): per size class of a launch (small,
     * large), how many ranks have connected it. */
    int lazy, connected[2];
    /* Ranks in other processes: the rendezvous is in this shared memory (see "Across
     * processes"), and `ranks` holds this process's ranks only. NULL: all ranks here. */
    struct shared *shm;
    struct clique *next;
} clique;

typedef struct comm {
    clique *clique;
    int rank, device, aborted;
    ncclResult_t async_error; /* what ncclCommGetAsyncError says */
    unsigned long long queued; /* collectives launched on a stream and not yet run */
    int joined[2];             /* which size classes this rank has connected */
} comm;

static clique *cliques;

ncclResult_t ncclGetVersion(int *version) {
    *version = 22304;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static unsigned long long next;
    memset(id, 0, sizeof *id);
    fake_lock();
    unsigned long long n = ++next;
    fake_unlock();
    /* Unique across processes too: it names the communicator's shared memory. */
    snprintf(id->internal, sizeof id->internal, "/fake-nccl-%ld-%llu", (long)getpid(), n);
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    default: return "error";
    }
}

const char *ncclGetLastError(comm *c) {
    (void)c;
    return "";
}

/* ---- across processes ---- */

#define SHM_RANKS 64

/* A rank's call, as its peers in other processes see it. */
typedef struct {
    int kind, dtype, red, root;
    size_t count;
} call_desc;

/* A communicator's segment, named after its unique id. Every field after `ready` is read
 * and written under `mu`; `cond` is broadcast on every change. */
typedef struct shared {
    int ready; /* set (atomically) once the creator has initialized the rest */
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int nranks, joined;
    long pids[SHM_RANKS];
    /* The collective in progress: as the clique's rendezvous. */
    int arrived;
    unsigned long long generation;
    int broken;
    int connected[2];
    /* Per parity of the generation and rank: its call and, in `data`, its send buffer.
     * A rank posts for generation g + 2 only after every rank arrived at g + 1, so after
     * each has read what it needed of g. */
    call_desc calls[2][SHM_RANKS];
    size_t slot_bytes;
    size_t data_offset;
} shared;

/* The bytes each rank can send in one collective (FAKE_NCCL_SHM_SLOT_MIB, default 64):
 * the segment is sparse, so only what is used takes memory. */
static size_t slot_bytes(void) {
    const char *v = getenv("FAKE_NCCL_SHM_SLOT_MIB");
    long mib = v ? atol(v) : 0;
    return (size_t)(mib > 0 ? mib : 64) << 20;
}

static unsigned char *shm_slot(shared *s, int parity, int rank) {
    return (unsigned char *)s + s->data_offset +
           ((size_t)parity * (size_t)s->nranks + (size_t)rank) * s->slot_bytes;
}

/* Waits on the segment's condition (its mutex held), as fake_wait does on the process's. */
static void shm_wait(shared *s, const char *what, double *waited) {
    fake_cond_wait(&s->cond, &s->mu, 20, what, waited);
}

static void shm_lock(shared *s) { pthread_mutex_lock(&s->mu); }
static void shm_unlock(shared *s) { pthread_mutex_unlock(&s->mu); }

/* Maps the segment of `id`, creating and initializing it if this is the first rank to
 * come, of any process. */
static shared *shm_open_id(const ncclUniqueId *id, int nranks) {
    size_t head = (sizeof(shared) + 4095) & ~(size_t)4095, slot = slot_bytes();
    size_t bytes = head + 2 * (size_t)nranks * slot;
    int created = 1;
    int fd = shm_open(id->internal, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno == EEXIST) {
        created = 0;
        fd = shm_open(id->internal, O_RDWR, 0600);
    }
    if (fd < 0)
        fake_die("ncclCommInitRank: shm_open(%s): %s", id->internal, strerror(errno));
    if (created && ftruncate(fd, (off_t)bytes))
        fake_die("ncclCommInitRank: ftruncate(%s): %s", id->internal, strerror(errno));
    /* A peer that did not create it waits for the creator's ftruncate. */
    struct stat st;
    double waited = 0;
    while (!fstat(fd, &st) && (size_t)st.st_size < bytes) {
        usleep(1000);
        if ((waited += 0.001) > fake_timeout_s())
            fake_die("ncclCommInitRank: the segment %s never got its size", id->internal);
    }
    shared *s = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s == MAP_FAILED)
        fake_die("ncclCommInitRank: mmap(%s): %s", id->internal, strerror(errno));
    if (created) {
        pthread_mutexattr_t ma;
        pthread_condattr_t ca;
        pthread_mutexattr_init(&ma);
        pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
        pthread_condattr_init(&ca);
        pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
        pthread_mutex_init(&s->mu, &ma);
        pthread_cond_init(&s->cond, &ca);
        s->nranks = nranks;
        s->slot_bytes = slot;
        s->data_offset = head;
        __atomic_store_n(&s->ready, 1, __ATOMIC_RELEASE);
    }
    waited = 0;
    while (!__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE)) {
        usleep(1000);
        if ((waited += 0.001) > fake_timeout_s())
            fake_die("ncclCommInitRank: the segment %s was never initialized", id->internal);
    }
    return s;
}

/* Registers `rank` in the communicator's segment and waits there for every rank of every
 * process, as ncclCommInitRank does. Returns the segment, or NULL (unmapped) when every
 * rank is in this process. */
static shared *shm_join(const ncclUniqueId *id, int nranks, int rank) {
    if (nranks > SHM_RANKS)
        fake_die("ncclCommInitRank: %d ranks; the simulation takes at most %d", nranks,
                 SHM_RANKS);
    shared *s = shm_open_id(id, nranks);
    shm_lock(s);
    if (s->nranks != nranks)
        fake_die("ncclCommInitRank: rank %d says %d ranks, another said %d", rank, nranks,
                 s->nranks);
    if (s->pids[rank])
        fake_die("ncclCommInitRank: rank %d joined twice", rank);
    s->pids[rank] = (long)getpid();
    if (++s->joined == nranks)
        shm_unlink(id->internal); /* every rank has it mapped */
    pthread_cond_broadcast(&s->cond);
    double waited = 0;
    while (s->joined < nranks)
        shm_wait(s, "ncclCommInitRank waiting for the other ranks (of every process)", &waited);
    int here = 1;
    for (int r = 0; r < nranks; r++)
        here &= s->pids[r] == (long)getpid();
    shm_unlock(s);
    if (!here)
        return s;
    munmap(s, s->data_offset + 2 * (size_t)nranks * s->slot_bytes);
    return NULL;
}

/* A rank aborted or is stuck: collectives of the communicator never complete again, in
 * any process. The fake lock held. */
static void break_clique(clique *c) {
    c->broken = 1;
    if (c->shm) {
        shm_lock(c->shm);
        c->shm->broken = 1;
        pthread_cond_broadcast(&c->shm->cond);
        shm_unlock(c->shm);
    }
    fake_broadcast();
}

ncclResult_t ncclCommInitRank(comm **out, int nranks, ncclUniqueId id, int rank) {
    int device = fake_current_device();
    if (device < 0) {
        fprintf(stderr, "fake NCCL: ncclCommInitRank without a current CUDA context\n");
        return ncclInvalidUsage;
    }
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    /* Every rank of every process first meets in the id's shared memory, which says
     * whether they are all here. */
    shared *shm = shm_join(&id, nranks, rank);
    fake_lock();
    clique *c = cliques;
    while (c && memcmp(&c->id, &id, sizeof id))
        c = c->next;
    if (!c) {
        c = fake_xcalloc(1, sizeof *c);
        c->id = id;
        c->nranks = nranks;
        c->ranks = fake_xcalloc((size_t)nranks, sizeof *c->ranks);
        c->ops = fake_xcalloc((size_t)nranks, sizeof *c->ops);
        /* NCCL >= 2.22 connects peers inside the first collective that needs them unless
         * NCCL_RUNTIME_CONNECT=0, which connects everything here, in the init. */
        const char *rc = getenv("NCCL_RUNTIME_CONNECT");
        c->lazy = !(rc && !strcmp(rc, "0"));
        c->shm = shm;
        c->next = cliques;
        cliques = c;
    }
    if (c->nranks != nranks)
        fake_die("ncclCommInitRank: rank %d says %d ranks, another said %d", rank, nranks,
                 c->nranks);
    if (c->ranks[rank])
        fake_die("ncclCommInitRank: rank %d joined twice", rank);
    for (int r = 0; r < nranks; r++) {
        if (c->ranks[r] && c->ranks[r]->device == device) {
            fake_unlock();
            fprintf(stderr, "fake NCCL: duplicate GPU %d (ranks %d and %d)\n", device, r, rank);
            return ncclInvalidUsage;
        }
    }
    comm *me = fake_xcalloc(1, sizeof *me);
    *me = (comm){c, rank, device, 0, ncclSuccess, 0, {0, 0}};
    c->ranks[rank] = me;
    c->joined++;
    fake_broadcast();
    double waited = 0;
    /* Across processes every rank has joined already (in the shared memory). */
    while (!c->shm && c->joined < c->nranks)
        fake_wait("ncclCommInitRank waiting for the other ranks", &waited);
    fake_unlock();
    *out = me;
    return ncclSuccess;
}

/* Discards this rank's queued collectives (they run as no-ops: their results are never
 * written); its peers' collectives never complete again (until their own communicators
 * are aborted), as on GPUs. */
ncclResult_t ncclCommAbort(comm *c) {
    if (!c)
        return ncclSuccess;
    fake_lock();
    if (c->aborted)
        fake_die("ncclCommAbort or ncclCommDestroy twice on rank %d", c->rank);
    c->aborted = 1;
    break_clique(c->clique);
    fake_unlock();
    return ncclSuccess;
}

/* As NCCL's (which finalizes first): waits, on the host, until this rank's queued
 * collectives have run, so their results are kept, then frees the communicator. A
 * collective that cannot complete (a peer aborted) makes it wait until the timeout. */
ncclResult_t ncclCommDestroy(comm *c) {
    if (!c)
        return ncclSuccess;
    fake_lock();
    if (c->aborted)
        fake_die("ncclCommDestroy after ncclCommAbort or ncclCommDestroy on rank %d", c->rank);
    double waited = 0;
    while (c->queued)
        fake_wait("ncclCommDestroy waiting for the rank's queued collectives", &waited);
    c->aborted = 1;
    fake_broadcast();
    fake_unlock();
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const comm *c, int *count) {
    *count = c->clique->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const comm *c, int *rank) {
    *rank = c->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const comm *c, int *device) {
    *device = c->device;
    return ncclSuccess;
}

/* ncclSuccess, unless fake_nccl_async_error broke one of this rank's collectives. */
ncclResult_t ncclCommGetAsyncError(comm *c, ncclResult_t *result) {
    if (!c)
        return ncclInvalidArgument;
    fake_lock();
    *result = c->async_error;
    fake_unlock();
    return ncclSuccess;
}

/* ---- arithmetic ---- */

static float from_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint32_t to_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000 | (man << 13);
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) {
        /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    } else {
        bits = sign;
    }
    return from_bits(bits);
}

static uint16_t float_to_half(float f) {
    uint32_t x = to_bits(f);
    uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff, man = x & 0x7fffff;
    if (exp == 0xff)
        return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f)
        return (uint16_t)(sign | 0x7c00);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - e), half = man >> shift, rest = man & ((1u << shift) - 1),
                 mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)e << 10) | (man >> 13), rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (half & 1)))
        half++; /* may carry into the exponent, up to infinity: correct */
    return (uint16_t)(sign | half);
}

static float bf16_to_float(uint16_t b) { return from_bits((uint32_t)b << 16); }

static uint16_t float_to_bf16(float f) {
    uint32_t x = to_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000)
        return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

static float fred(int red, float a, float b) {
    switch (red) {
    case PROD: return a * b;
    case MAX: return b > a ? b : a;
    case MIN: return b < a ? b : a;
    default: return a + b;
    }
}

static double dred(int red, double a, double b) {
    switch (red) {
    case PROD: return a * b;
    case MAX: return b > a ? b : a;
    case MIN: return b < a ? b : a;
    default: return a + b;
    }
}

#define INT_STEP(T, UT)                                                                    \
    {                                                                                      \
        T *a = acc;                                                                        \
        const T *b = x;                                                                    \
        for (size_t i = 0; i < n; i++) {                                                   \
            T v = first ? (T)0 : a[i];                                                     \
            switch (red) {                                                                 \
            case PROD: v = first ? b[i] : (T)((UT)v * (UT)b[i]); break;                    \
            case MAX: v = first || b[i] > v ? b[i] : v; break;                             \
            case MIN: v = first || b[i] < v ? b[i] : v; break;                             \
            default: v = (T)((UT)v + (UT)b[i]);                                            \
            }                                                                              \
            a[i] = v;                                                                      \
        }                                                                                  \
    }

/* acc = acc (op) x, elementwise over n elements (acc = x's term when `first`). Avg: a
 * float term is x * (1 / nranks); integers sum here and divide in `finish`. */
static void step(int dtype, int red, void *acc, const void *x, size_t n, int first, int nranks) {
    int avg = red == AVG;
    switch (dtype) {
    case I8: INT_STEP(int8_t, uint8_t) break;
    case U8: INT_STEP(uint8_t, uint8_t) break;
    case I32: INT_STEP(int32_t, uint32_t) break;
    case U32: INT_STEP(uint32_t, uint32_t) break;
    case I64: INT_STEP(int64_t, uint64_t) break;
    case U64: INT_STEP(uint64_t, uint64_t) break;
    case F32: {
        float *a = acc;
        const float *b = x;
        for (size_t i = 0; i < n; i++) {
            float t = avg ? b[i] * (1.0f / (float)nranks) : b[i];
            a[i] = first ? t : fred(red, a[i], t);
        }
        break;
    }
    case F64: {
        double *a = acc;
        const double *b = x;
        for (size_t i = 0; i < n; i++) {
            double t = avg ? b[i] * (1.0 / nranks) : b[i];
            a[i] = first ? t : dred(red, a[i], t);
        }
        break;
    }
    case F16:
    case BF16: {
        uint16_t *a = acc;
        const uint16_t *b = x;
        for (size_t i = 0; i < n; i++) {
            float bx = dtype == F16 ? half_to_float(b[i]) : bf16_to_float(b[i]);
            float t = avg ? bx * (1.0f / (float)nranks) : bx;
            float ax = dtype == F16 ? half_to_float(a[i]) : bf16_to_float(a[i]);
            float r = first ? t : fred(red, ax, t);
            a[i] = dtype == F16 ? float_to_half(r) : float_to_bf16(r);
        }
        break;
    }
    }
}

#define INT_DIV(T)                                                                         \
    {                                                                                      \
        T *a = acc;                                                                        \
        for (size_t i = 0; i < n; i++)                                                     \
            a[i] = (T)(a[i] / (T)nranks);                                                  \
    }

static void finish(int dtype, int red, void *acc, size_t n, int nranks) {
    if (red != AVG)
        return;
    switch (dtype) {
    case I8: INT_DIV(int8_t) break;
    case U8: INT_DIV(uint8_t) break;
    case I32: INT_DIV(int32_t) break;
    case U32: INT_DIV(uint32_t) break;
    case I64: INT_DIV(int64_t) break;
    case U64: INT_DIV(uint64_t) break;
    default: break;
    }
}

/* The reduction of `n` elements at element offset `at` of every rank's send buffer. */
static void reduce_all(const op *ops, int nranks, size_t at, size_t n, void *acc) {
    const op *o = ops;
    size_t sz = type_size[o->dtype];
    for (int r = 0; r < nranks; r++)
        step(o->dtype, o->red, acc, (const char *)ops[r].send + at * sz, n, r == 0, nranks);
    finish(o->dtype, o->red, acc, n, nranks);
}

/* ---- collectives ---- */

static void describe(const op *o, char *buf, size_t len) {
    snprintf(buf, len, "%s(count %zu, type %d, op %d, root %d)", kind_names[o->kind], o->count,
             o->dtype, o->red, o->root);
}

/* The bytes a rank's call reads from its send buffer and writes to its receive buffer. */
static void io_bytes(const op *o, int nranks, size_t *send, size_t *recv) {
    size_t bytes = o->count * type_size[o->dtype];
    *send = *recv = bytes;
    if (o->kind == ALL_GATHER)
        *recv *= (size_t)nranks;
    if (o->kind == REDUCE_SCATTER)
        *send *= (size_t)nranks;
    if (o->kind == BROADCAST && o->comm->rank != o->root)
        *send = 0;
    if (o->kind == REDUCE && o->comm->rank != o->root)
        *recv = 0;
}

static void check_buffers(const op *o, int nranks) {
    size_t send, recv;
    io_bytes(o, nranks, &send, &recv);
    char what[96];
    snprintf(what, sizeof what, "nccl%s send buffer of rank %d", kind_names[o->kind],
             o->comm->rank);
    fake_check_device_range((unsigned long long)(uintptr_t)o->send, send, o->comm->device, what);
    snprintf(what, sizeof what, "nccl%s receive buffer of rank %d", kind_names[o->kind],
             o->comm->rank);
    fake_check_device_range((unsigned long long)(uintptr_t)o->recv, recv, o->comm->device, what);
    /* Ranks in one process read and write each other's buffers directly (those of
     * other processes, NULL here, through the network or shared memory). */
    for (int p = 0; p < nranks; p++) {
        if (!o->comm->clique->ranks[p])
            continue;
        int peer = o->comm->clique->ranks[p]->device;
        snprintf(what, sizeof what, "nccl%s buffers of rank %d, used by rank %d",
                 kind_names[o->kind], o->comm->rank, p);
        fake_check_peer_access((unsigned long long)(uintptr_t)o->send, send, peer, what);
        fake_check_peer_access((unsigned long long)(uintptr_t)o->recv, recv, peer, what);
    }
}

/* Dies unless the `n` ranks' calls pair up. */
static void check_paired(const op *ops, int n) {
    const op *o = ops;
    for (int r = 1; r < n; r++) {
        const op *p = &ops[r];
        if (p->kind != o->kind || p->count != o->count || p->dtype != o->dtype ||
            (p->kind != BROADCAST && p->kind != ALL_GATHER && p->red != o->red) ||
            ((p->kind == BROADCAST || p->kind == REDUCE) && p->root != o->root)) {
            char a[128], b[128];
            describe(o, a, sizeof a);
            describe(p, b, sizeof b);
            fake_die("NCCL calls out of step: rank 0 called %s, rank %d called %s", a, r, b);
        }
    }
}

/* Runs the collective over the `n` ranks' calls: writes the results of every rank, or
 * of rank `only` alone when it is not negative. */
static void compute(const op *ops, int n, int only) {
    const op *o = ops;
    size_t sz = type_size[o->dtype], count = o->count, bytes = count * sz;
    /* Into a scratch buffer first: the collectives may run in place. */
    size_t total = o->kind == ALL_GATHER || o->kind == REDUCE_SCATTER ? bytes * (size_t)n : bytes;
    unsigned char *tmp = fake_xmalloc(total);
    switch (o->kind) {
    case ALL_REDUCE:
    case REDUCE:
        reduce_all(ops, n, 0, count, tmp);
        for (int r = 0; r < n; r++)
            if ((o->kind == ALL_REDUCE || r == o->root) && (only < 0 || r == only))
                memcpy(ops[r].recv, tmp, bytes);
        break;
    case BROADCAST:
        memcpy(tmp, ops[o->root].send, bytes);
        for (int r = 0; r < n; r++)
            if (only < 0 || r == only)
                memcpy(ops[r].recv, tmp, bytes);
        break;
    case ALL_GATHER:
        for (int r = 0; r < n; r++)
            memcpy(tmp + (size_t)r * bytes, ops[r].send, bytes);
        for (int r = 0; r < n; r++)
            if (only < 0 || r == only)
                memcpy(ops[r].recv, tmp, total);
        break;
    case REDUCE_SCATTER:
        for (int r = 0; r < n; r++)
            reduce_all(ops, n, (size_t)r * count, count, tmp + (size_t)r * bytes);
        for (int r = 0; r < n; r++)
            if (only < 0 || r == only)
                memcpy(ops[r].recv, tmp + (size_t)r * bytes, bytes);
        break;
    }
    free(tmp);
}

/* A collective of a communicator across processes (the fake lock held, as on return):
 * posts this rank's call and send buffer in the shared memory, waits there for every
 * rank of every process, and computes its own result from theirs. */
static void run_remote(op *o) {
    comm *me = o->comm;
    clique *c = me->clique;
    shared *s = c->shm;
    int n = c->nranks;
    size_t send, recv;
    io_bytes(o, n, &send, &recv);
    if (send > s->slot_bytes)
        fake_die("nccl%s on rank %d sends %zu bytes; FAKE_NCCL_SHM_SLOT_MIB allows %zu",
                 kind_names[o->kind], me->rank, send, s->slot_bytes);
    double waited = 0;
    shm_lock(s);
    if (s->broken) {
        shm_unlock(s);
    } else {
        unsigned long long g = s->generation;
        int parity = (int)(g & 1);
        s->calls[parity][me->rank] = (call_desc){o->kind, o->dtype, o->red, o->root, o->count};
        memcpy(shm_slot(s, parity, me->rank), o->send, send);
        /* The other streams of this process go on while this one waits for its peers. */
        fake_unlock();
        if (++s->arrived == n) {
            s->arrived = 0;
            s->generation++;
            pthread_cond_broadcast(&s->cond);
        }
        while (s->generation == g && !s->broken)
            shm_wait(s, "an NCCL collective waiting for its peers (of every process)", &waited);
        int done = s->generation != g;
        shm_unlock(s);
        if (done) {
            /* Parity `g` stays as it is until this rank arrives at the next collective. */
            op *ops = fake_xcalloc((size_t)n, sizeof *ops);
            for (int r = 0; r < n; r++) {
                const call_desc *d = &s->calls[parity][r];
                ops[r] = (op){d->kind, shm_slot(s, parity, r), NULL, d->count,
                              d->dtype, d->red, d->root, NULL, NULL, 0};
            }
            check_paired(ops, n);
            unsigned char *mine = fake_xmalloc(recv);
            ops[me->rank].recv = mine;
            compute(ops, n, me->rank);
            fake_lock();
            /* The receive buffer must still be live now that the result lands in it. */
            char what[96];
            snprintf(what, sizeof what, "nccl%s receive buffer of rank %d", kind_names[o->kind],
                     me->rank);
            fake_check_device_range((unsigned long long)(uintptr_t)o->recv, recv, me->device,
                                    what);
            memcpy(o->recv, mine, recv);
            free(mine);
            free(ops);
            return;
        }
        fake_lock();
    }
    while (!me->aborted)
        fake_wait("an NCCL collective of a communicator whose peer aborted (this rank's own "
                  "communicator is never aborted)",
                  &waited);
}

static void run_op(op *o) {
    comm *me = o->comm;
    clique *c = me->clique;
    double waited = 0;
    if (me->aborted)
        return;
    if (o->stuck) {
        /* A kernel stuck on a broken connection: the peers' matching collectives never
         * get this rank's data, so they wait as for an aborted peer. */
        break_clique(c);
        while (!me->aborted)
            fake_wait("an NCCL collective stuck by fake_nccl_async_error (this rank's "
                      "communicator is never aborted)",
                      &waited);
        return;
    }
    if (c->shm && !c->broken) {
        check_buffers(o, c->nranks);
        run_remote(o);
        return;
    }
    if (!c->broken) {
        check_buffers(o, c->nranks);
        c->ops[me->rank] = *o;
        if (++c->arrived == c->nranks) {
            check_paired(c->ops, c->nranks);
            compute(c->ops, c->nranks, -1);
            c->arrived = 0;
            c->generation++;
            fake_broadcast();
            return;
        }
        unsigned long long g = c->generation;
        while (c->generation == g && !c->broken)
            fake_wait("an NCCL collective waiting for its peers", &waited);
        if (c->generation != g)
            return;
    }
    while (!me->aborted)
        fake_wait("an NCCL collective of a communicator whose peer aborted (this rank's own "
                  "communicator is never aborted)",
                  &waited);
}

typedef struct {
    size_t n;
    op ops[];
} batch;

/* Test control: the next batch of collectives on GPU `delay_device` first waits
 * `delay_ms` milliseconds (a slow GPU, so that a host thread meets the work still
 * queued long after it was launched). */
static int delay_device = -1;
static unsigned delay_ms;

void fake_nccl_delay_next(int device, unsigned ms) {
    fake_lock();
    delay_device = device;
    delay_ms = ms;
    fake_unlock();
}

static void batch_job(void *arg) {
    batch *b = arg;
    if (b->n && b->ops[0].comm->device == delay_device) {
        unsigned ms = delay_ms;
        delay_device = -1;
        fake_unlock();
        usleep((useconds_t)ms * 1000);
        fake_lock();
    }
    for (size_t i = 0; i < b->n; i++) {
        run_op(&b->ops[i]);
        b->ops[i].comm->queued--;
    }
    fake_broadcast();
}

/* The calls between ncclGroupStart and ncclGroupEnd on this thread, and the first error
 * one of them returned (which cancels the group). */
static __thread int group_depth;
static __thread op *pending;
static __thread size_t n_pending, cap_pending;
static __thread ncclResult_t group_error;

/* Per GPU: kernel launches (a group, or a call outside one) and collective calls. */
static unsigned long long launches[64], calls[64];

void fake_nccl_counts(int device, unsigned long long *n_launches, unsigned long long *n_calls) {
    fake_lock();
    *n_launches = device >= 0 && device < 64 ? launches[device] : 0;
    *n_calls = device >= 0 && device < 64 ? calls[device] : 0;
    fake_unlock();
}

/* Launches of at least this many bytes (per communicator) need the connections of a
 * large collective: a different algorithm or protocol than a small one, which NCCL
 * connects separately. */
#define LARGE_BYTES ((size_t)64 << 10)

/* A lazily connecting communicator's first launch of a size class connects it: the host
 * thread waits there, inside the NCCL call, until every rank has connected it too (a peer
 * that never launches it keeps it waiting; only this communicator's own abort, from
 * another thread, would release it). The lock held. */
static void connect_lazily(comm *me, size_t bytes) {
    clique *c = me->clique;
    int k = bytes >= LARGE_BYTES;
    if (!c->lazy || me->joined[k])
        return;
    me->joined[k] = 1;
    if (c->shm) {
        /* Across processes: the count is in the shared memory. An abort of this
         * communicator breaks the clique there too, which wakes this wait. */
        shared *s = c->shm;
        shm_lock(s);
        s->connected[k]++;
        pthread_cond_broadcast(&s->cond);
        fake_unlock();
        double waited = 0;
        while (s->connected[k] < s->nranks && !__atomic_load_n(&me->aborted, __ATOMIC_SEQ_CST))
            shm_wait(s, "an NCCL launch connecting its peers lazily, across processes",
                     &waited);
        shm_unlock(s);
        fake_lock();
        return;
    }
    c->connected[k]++;
    fake_broadcast();
    double waited = 0;
    while (c->connected[k] < c->nranks && !me->aborted)
        fake_wait(k ? "an NCCL launch connecting its peers lazily (its first large "
                      "collective; NCCL_RUNTIME_CONNECT=0 connects at init)"
                    : "an NCCL launch connecting its peers lazily (its first collective; "
                      "NCCL_RUNTIME_CONNECT=0 connects at init)",
                  &waited);
}

static size_t op_bytes(const op *o) {
    size_t bytes = o->count * type_size[o->dtype], n = (size_t)o->comm->clique->nranks;
    return o->kind == ALL_GATHER || o->kind == REDUCE_SCATTER ? bytes * n : bytes;
}

static void launch(op *ops, size_t n) {
    fake_lock();
    for (size_t i = 0; i < n; i++) {
        if (!ops[i].comm)
            continue;
        size_t bytes = 0;
        for (size_t j = 0; j < n; j++)
            if (ops[j].comm == ops[i].comm)
                bytes += op_bytes(&ops[j]);
        connect_lazily(ops[i].comm, bytes);
    }
    fake_unlock();
    /* One job per stream, in call order: a group is one launch per stream. */
    for (size_t i = 0; i < n; i++) {
        if (!ops[i].comm)
            continue;
        fake_stream *s = ops[i].stream;
        int device = ops[i].comm->device;
        fake_lock();
        if (device < 64)
            launches[device]++;
        fake_unlock();
        size_t k = 0;
        for (size_t j = i; j < n; j++)
            if (ops[j].comm && ops[j].stream == s)
                k++;
        batch *b = fake_xmalloc(sizeof *b + k * sizeof(op));
        b->n = 0;
        fake_lock();
        for (size_t j = i; j < n; j++) {
            if (ops[j].comm && ops[j].stream == s) {
                ops[j].comm->queued++;
                b->ops[b->n++] = ops[j];
                ops[j].comm = NULL;
            }
        }
        fake_unlock();
        fake_enqueue(s, batch_job, b);
    }
}

/* Fault injection, for tests: the `fail_nth`-th collective called from now on GPU
 * `fail_device` fails with ncclInternalError (as an asynchronous NCCL error would). */
static int fail_device = -1, fail_nth;

void fake_nccl_fail_call(int device, int nth) {
    fake_lock();
    fail_device = device;
    fail_nth = nth;
    fake_unlock();
}

/* Fault injection, for tests: the `stuck_nth`-th collective accepted from now on GPU
 * `stuck_device` returns ncclSuccess but never completes, as a kernel stuck on a broken
 * connection: its stream stops there until the rank's communicator is aborted, and from
 * that call on ncclCommGetAsyncError says ncclSystemError. */
static int stuck_device = -1, stuck_nth;

void fake_nccl_async_error(int device, int nth) {
    fake_lock();
    stuck_device = device;
    stuck_nth = nth;
    fake_unlock();
}

/* NCCL's in-place rules: a collective runs in place when its buffers are related as
 * below, and gives undefined results when they overlap in any other way. Only the bytes
 * a rank reads and writes count (a non-root Broadcast reads no send buffer, a non-root
 * Reduce writes no receive buffer). */
static void check_in_place(const op *o) {
    uintptr_t send = (uintptr_t)o->send, recv = (uintptr_t)o->recv;
    size_t nranks = (size_t)o->comm->clique->nranks, rank = (size_t)o->comm->rank;
    size_t bytes = o->count * type_size[o->dtype], send_bytes = bytes, recv_bytes = bytes;
    int in_place;
    const char *rule;
    switch (o->kind) {
    case ALL_GATHER:
        recv_bytes *= nranks;
        in_place = send == recv + rank * bytes;
        rule = "send == recv + rank * count * size";
        break;
    case REDUCE_SCATTER:
        send_bytes *= nranks;
        in_place = recv == send + rank * bytes;
        rule = "recv == send + rank * recvcount * size";
        break;
    default:
        if (o->kind == BROADCAST && o->comm->rank != o->root)
            send_bytes = 0;
        if (o->kind == REDUCE && o->comm->rank != o->root)
            recv_bytes = 0;
        in_place = send == recv;
        rule = "send == recv";
    }
    if (in_place || !send_bytes || !recv_bytes || send + send_bytes <= recv ||
        recv + recv_bytes <= send)
        return;
    fake_die("nccl%s on rank %d: the send buffer (%zu bytes at %#lx) overlaps the receive "
             "buffer (%zu bytes at %#lx) but is not in place (%s): NCCL's results are "
             "undefined",
             kind_names[o->kind], o->comm->rank, send_bytes, (unsigned long)send, recv_bytes,
             (unsigned long)recv, rule);
}

static ncclResult_t queue_op(op o) {
    if (!o.comm)
        return ncclInvalidArgument;
    fake_lock();
    int aborted = o.comm->aborted;
    int fail = o.comm->device == fail_device && --fail_nth == 0;
    if (fail)
        fail_device = -1;
    fake_unlock();
    if (fail)
        return ncclInternalError;
    if (aborted)
        fake_die("nccl%s on rank %d after ncclCommAbort", kind_names[o.kind], o.comm->rank);
    if (o.dtype < 0 || o.dtype >= N_TYPES || o.red < 0 || o.red > AVG)
        return ncclInvalidArgument;
    if ((o.kind == BROADCAST || o.kind == REDUCE) &&
        (o.root < 0 || o.root >= o.comm->clique->nranks))
        return ncclInvalidArgument;
    if (fake_stream_device(o.stream) != o.comm->device)
        fake_die("nccl%s on rank %d: a stream of GPU %d, the communicator is on GPU %d",
                 kind_names[o.kind], o.comm->rank, fake_stream_device(o.stream),
                 o.comm->device);
    check_in_place(&o);
    fake_lock();
    if (o.comm->device < 64)
        calls[o.comm->device]++;
    o.stuck = o.comm->device == stuck_device && --stuck_nth == 0;
    if (o.stuck) {
        stuck_device = -1;
        o.comm->async_error = ncclSystemError;
    }
    fake_unlock();
    /* NCCL's one-rank shortcut: with a single rank, an in-place collective other than Avg
     * (which scales) issues no work at all: nothing goes on the stream, the buffers are
     * not touched, nothing waits. (Out-of-place ones become a copy, and Avg a kernel: the
     * ordinary path computes exactly that.) */
    if (o.comm->clique->nranks == 1 && !o.stuck && o.send == o.recv &&
        !(o.red == AVG && (o.kind == ALL_REDUCE || o.kind == REDUCE ||
                           o.kind == REDUCE_SCATTER)))
        return ncclSuccess;
    if (group_depth == 0) {
        launch(&o, 1);
        return ncclSuccess;
    }
    if (n_pending == cap_pending) {
        cap_pending = cap_pending ? 2 * cap_pending : 16;
        pending = fake_xrealloc(pending, cap_pending * sizeof *pending);
    }
    pending[n_pending++] = o;
    return ncclSuccess;
}

static ncclResult_t submit(op o) {
    ncclResult_t r = queue_op(o);
    if (r != ncclSuccess && group_depth > 0 && group_error == ncclSuccess)
        group_error = r;
    return r;
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

/* The outermost ncclGroupEnd launches the group's calls, or, when one of them failed,
 * none of them, and returns that call's error (as NCCL does). */
ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0)
        return ncclInvalidUsage;
    if (--group_depth > 0)
        return ncclSuccess;
    ncclResult_t r = group_error;
    group_error = ncclSuccess;
    if (r == ncclSuccess)
        launch(pending, n_pending);
    n_pending = 0;
    return r;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int red,
                           comm *c, fake_stream *s) {
    return submit((op){ALL_REDUCE, send, recv, count, dtype, red, 0, c, s, 0});
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, int dtype, int root,
                           comm *c, fake_stream *s) {
    return submit((op){BROADCAST, send, recv, count, dtype, SUM, root, c, s, 0});
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, int dtype, int red, int root,
                        comm *c, fake_stream *s) {
    return submit((op){REDUCE, send, recv, count, dtype, red, root, c, s, 0});
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, int dtype, comm *c,
                           fake_stream *s) {
    return submit((op){ALL_GATHER, send, recv, count, dtype, SUM, 0, c, s, 0});
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, int dtype, int red,
                               comm *c, fake_stream *s) {
    return submit((op){REDUCE_SCATTER, send, recv, count, dtype, red, 0, c, s, 0});
}
